"""FakeQueue: a test double standing in for the DATABASE LAYER, not a test of it.

It implements the same function signatures as :mod:`mailq_db.procedures`
(claim_mail, mark_sent, mark_failed, extend_lease, release_mail, ...) over an
in-memory list, with the documented contract (token fencing raising
LeaseLostError and writing nothing, Wait refunding the attempt and blocking
the account, Release refunding the attempt), and records every call.  The
worker is tested against it; the procedures themselves are tested by the
integration suite against SQL Server.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta, timezone
from typing import Any, Iterable

from mailq_db.errors import LeaseLostError
from mailq_db.procedures import (
    AckResult, ClaimBudget, ClaimedMail, EnqueuePolicy, EnqueueResult, Lease, QueueStats, held_bytes,
)


def utcnow() -> datetime:
    return datetime.now(timezone.utc).replace(tzinfo=None)


class FakeConnection:
    """What ``open_connection`` returns when the database is a FakeQueue."""

    def __init__(self) -> None:
        self.closed = False

    def close(self) -> None:
        self.closed = True

    def cursor(self) -> "FakeCatalogCursor":
        return FakeCatalogCursor()


class FakeCatalogCursor:
    """Answers doctor's one catalog query (owner login, TRUSTWORTHY, chaining)."""

    owner_login: str | None = "sa"
    trustworthy: int = 0
    db_chaining: int = 0
    server_chaining: int = 0

    def execute(self, sql: str, *params: Any) -> "FakeCatalogCursor":
        return self

    def fetchone(self) -> tuple[str | None, int, int, int]:
        return (self.owner_login, self.trustworthy, self.db_chaining, self.server_chaining)

    def close(self) -> None:
        pass


@dataclass
class Row:
    mail: ClaimedMail
    status: str = "UnSent"
    token: str | None = None
    lease_expires: datetime | None = None
    due: datetime = field(default_factory=lambda: datetime(2000, 1, 1))
    attempts_remaining: int = 5
    attempts: int = 0
    last_error: str | None = None
    dispositions: list[str] = field(default_factory=list)
    dry_run: bool = False
    claimed_dry_run: bool = False  # ClaimMail's DryRun stamp (revision 0015)
    smtp_code: int | None = None
    smtp_text: str | None = None
    sent_by: str | None = None  # the token whose MarkSent made it Sent
    possible_duplicate: bool = False  # set when a lease that ran out is reclaimed (ClaimMail)
    #: address (lower case) -> (outcome, code, text), like mailq.MailRecipientOutcome
    recipients: dict[str, tuple[str, int | None, str | None]] = field(default_factory=dict)


def make_mail(mail_id: int, **overrides: Any) -> ClaimedMail:
    """A ClaimedMail as ClaimMail would return it (lease fields are set at claim)."""
    values: dict[str, Any] = dict(
        id=mail_id, message_id=f"<{mail_id}.test@mailq.example>", account_name="default",
        app_name=None, from_name=None, from_address="sender@example.com", reply_to=None,
        to_address=f"rcpt{mail_id}@example.com", cc=None, bcc=None, subject=f"mail {mail_id}",
        body=f"body of mail {mail_id}", body_format="Text", text_body=None, headers={},
        priority=5, attempt_no=0, attempts_remaining=5, lease_expires_utc=datetime(2000, 1, 1),
        possible_duplicate=False, dt_stamp=datetime(2024, 5, 1, 12, 0, 0), attachments=[],
    )
    values.update(overrides)
    return ClaimedMail(**values)


class FakeQueue:
    """In-memory stand-in for mailq_db.procedures (thread-safe)."""

    def __init__(self, mails: Iterable[ClaimedMail] = (), *, lease_override_seconds: float | None = None,
                 report_seconds_remaining: bool = True):
        self.lock = threading.RLock()
        self.rows: dict[int, Row] = {}
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.blocked_until: dict[str, datetime] = {}
        self.lease_override_seconds = lease_override_seconds
        #: ClaimMail/ExtendLease report LeaseSecondsRemaining (False: a database that does not)
        self.report_seconds_remaining = report_seconds_remaining
        self.extend_fails = False
        #: procedure -> [(committed?, error)] of the next calls to fail
        self.drops: dict[str, list[tuple[bool, BaseException]]] = {}
        self.stats = QueueStats([], [], [], [])
        #: what mailq.GetEventStreamStall answers (None: nothing held back)
        self.stall: Any = None
        self.health: list[dict[str, Any]] = []
        self.delay_findings: list[dict[str, Any]] = []
        #: applications in dry-run (mailq.Application.DryRun, revision 0015)
        self.dry_run_apps: set[str] = set()
        for m in mails:
            self.rows[m.id] = Row(m, attempts_remaining=m.attempts_remaining)

    # -- test helpers ----------------------------------------------------
    def status(self, mail_id: int) -> str:
        return self.rows[mail_id].status

    def statuses(self) -> dict[int, str]:
        return {i: r.status for i, r in self.rows.items()}

    def calls_to(self, name: str) -> list[dict[str, Any]]:
        return [kw for n, kw in self.calls if n == name]

    def drop_connection(self, procedure: str, *, committed: bool) -> None:
        """Make the next call of ``procedure`` fail as a dropped connection,
        after (committed=True) or before applying it."""
        self.fail_next(procedure, ConnectionResetError(f"fake: connection dropped during {procedure}"),
                       committed=committed)

    def fail_next(self, procedure: str, error: BaseException, *, committed: bool = False) -> None:
        """Make the next call of ``procedure`` raise ``error``, after (committed=True)
        or before applying it (a deadlock victim, an Azure failover, ...)."""
        self.drops.setdefault(procedure, []).append((committed, error))

    def _record(self, name: str, kwargs: dict[str, Any]) -> tuple[bool, BaseException] | None:
        self.calls.append((name, kwargs))
        queue = self.drops.get(name)
        return queue.pop(0) if queue else None

    def _held(self, ids: Iterable[int], token: Any, accept_sent_by_token: bool = False) -> list[Row]:
        """The rows to change; like mailq.LockLeasedMail, all or nothing.  With
        ``accept_sent_by_token`` a mail this token already marked Sent is accepted
        and left out (MarkSent repeated after a dropped connection)."""
        token = str(token)
        rows = []
        for i in ids:
            row = self.rows.get(i)
            if accept_sent_by_token and row is not None and row.status == "Sent" and row.sent_by == token:
                continue
            if row is None or row.status != "Sending":
                raise LeaseLostError(50203, f"mail {i} is not leased")
            if row.token != token:
                raise LeaseLostError(50202, f"mail {i} is leased to another token")
            rows.append(row)
        return rows

    def _apply(self, name: str, kwargs: dict[str, Any], fn: Any) -> Any:
        with self.lock:
            drop = self._record(name, kwargs)
            if drop is not None and not drop[0]:
                raise drop[1]
            result = fn()
            if drop is not None:
                raise drop[1]
            return result

    def expire_leases(self) -> None:
        """Pretend every lease has run out (e.g. after a worker was killed)."""
        with self.lock:
            for row in self.rows.values():
                if row.status == "Sending":
                    row.lease_expires = utcnow() - timedelta(seconds=1)

    # -- the procedure signatures -----------------------------------------
    def claim_mail(self, conn: Any, *, batch_size: int, lock_token: Any, lease_seconds: int,
                   app_name: str | None = None, worker_name: str | None = None,
                   account_names: Any = None, run_modes: Any = None,
                   max_batch_bytes: int | None = None) -> list[ClaimedMail]:
        # ClaimMail's contract (revision 0015): only the run modes served
        # (NULL: ["prod"]); DryRun stamped from the application at every claim.
        modes = set(run_modes) if run_modes is not None else {"prod"}

        def run() -> list[ClaimedMail]:
            now = utcnow()
            due = [
                r for r in self.rows.values()
                if ((r.status == "UnSent" and r.due <= now and r.attempts_remaining > 0
                     and self.blocked_until.get(r.mail.account_name, now) <= now)
                    or (r.status == "Sending" and r.lease_expires and r.lease_expires <= now))
                and (app_name is None or r.mail.app_name == app_name)
                and (account_names is None or r.mail.account_name in account_names)
                and r.mail.run_mode in modes
            ]
            due.sort(key=lambda r: (-r.mail.priority, r.mail.id))
            lease = self.lease_override_seconds if self.lease_override_seconds is not None else lease_seconds
            out = []
            for r in due[:batch_size]:
                if r.status == "Sending":  # a lease that ran out: ClaimMail flags a possible duplicate
                    r.possible_duplicate = True
                r.status, r.token = "Sending", str(lock_token)
                r.lease_expires = now + timedelta(seconds=lease)
                r.attempts_remaining -= 1
                r.attempts += 1
                r.claimed_dry_run = r.mail.app_name in self.dry_run_apps
                out.append(replace(r.mail, lease_expires_utc=r.lease_expires, attempt_no=r.attempts,
                                   attempts_remaining=r.attempts_remaining,
                                   attachments=list(r.mail.attachments), dry_run=r.claimed_dry_run,
                                   possible_duplicate=r.possible_duplicate,
                                   lease_seconds_remaining=int(lease) if self.report_seconds_remaining else None))
            return read_within_budget(out, max_batch_bytes)
        return self._apply("claim_mail", dict(batch_size=batch_size, lock_token=lock_token,
                                              lease_seconds=lease_seconds, app_name=app_name,
                                              worker_name=worker_name, account_names=account_names,
                                              run_modes=run_modes), run)

    def mark_sent(self, conn: Any, *, ids: Iterable[int], lock_token: Any, smtp_code: int | None = None,
                  smtp_text: str | None = None, dry_run: bool = False) -> list[AckResult]:
        ids = list(ids)

        def run() -> list[AckResult]:
            rows = self._held(ids, lock_token, accept_sent_by_token=True)  # all or nothing
            for r in rows:
                # MarkSent keeps the claim's DryRun stamp (revision 0015).
                r.status, r.token, r.sent_by = "Sent", None, str(lock_token)
                r.dry_run = dry_run or r.claimed_dry_run
                r.smtp_code, r.smtp_text = smtp_code, smtp_text
            return [AckResult(i, "Sent", None) for i in ids]
        return self._apply("mark_sent", dict(ids=ids, lock_token=lock_token, smtp_code=smtp_code,
                                             smtp_text=smtp_text, dry_run=dry_run), run)

    def mark_failed(self, conn: Any, *, ids: Iterable[int], lock_token: Any, disposition: str, error: str,
                    retry_after_seconds: int | None = None, smtp_code: int | None = None,
                    possible_duplicate: bool = False) -> list[AckResult]:
        ids = list(ids)
        assert disposition in ("Retry", "Wait", "Stop"), disposition

        def run() -> list[AckResult]:
            rows = self._held(ids, lock_token)
            now = utcnow()
            for r in rows:
                r.token, r.last_error = None, error
                r.dispositions.append(disposition)
                r.possible_duplicate = r.possible_duplicate or possible_duplicate  # MarkFailed @PossibleDuplicate
                r.smtp_code = smtp_code
                if disposition == "Stop" or (disposition == "Retry" and r.attempts_remaining <= 0):
                    r.status = "Failed"
                elif disposition == "Retry":
                    r.status, r.due = "UnSent", now + timedelta(seconds=retry_after_seconds or 30)
                else:
                    r.status = "UnSent"
                    r.attempts_remaining += 1
                    self.blocked_until[r.mail.account_name] = now + timedelta(
                        seconds=retry_after_seconds or 60)
            return [AckResult(r.mail.id, r.status, None) for r in rows]
        return self._apply("mark_failed", dict(ids=ids, lock_token=lock_token, disposition=disposition,
                                               error=error, retry_after_seconds=retry_after_seconds,
                                               smtp_code=smtp_code, possible_duplicate=possible_duplicate), run)

    def extend_lease(self, conn: Any, *, ids: Iterable[int], lock_token: Any,
                     lease_seconds: int) -> dict[int, Lease]:
        ids = list(ids)

        def run() -> dict[int, Lease]:
            if self.extend_fails:
                from mailq_db.errors import DatabaseError
                raise DatabaseError(1205, "fake: deadlock victim")
            out = {}
            for i in ids:
                r = self.rows.get(i)
                if r and r.status == "Sending" and r.token == str(lock_token):
                    r.lease_expires = utcnow() + timedelta(seconds=lease_seconds)
                    out[i] = Lease(r.lease_expires, lease_seconds if self.report_seconds_remaining else None)
            return out
        return self._apply("extend_lease", dict(ids=ids, lock_token=lock_token,
                                                lease_seconds=lease_seconds), run)

    def release_mail(self, conn: Any, *, ids: Iterable[int], lock_token: Any) -> list[AckResult]:
        ids = list(ids)

        def run() -> list[AckResult]:
            rows = self._held(ids, lock_token)
            for r in rows:
                r.status, r.token = "UnSent", None
                r.attempts_remaining += 1
            return [AckResult(r.mail.id, r.status, None) for r in rows]
        return self._apply("release_mail", dict(ids=ids, lock_token=lock_token), run)

    def record_recipient_outcomes(self, conn: Any, *, mail_id: int, lock_token: Any,
                                  outcomes: Iterable[dict[str, Any]]) -> None:
        """Like mailq.RecordRecipientOutcomes: fenced by the token, all or nothing;
        a Deferred recipient is replaced by a later outcome, Delivered/Refused are final."""
        outcomes = [dict(o) for o in outcomes]

        def run() -> None:
            addresses = [o["address"].lower() for o in outcomes]
            assert len(set(addresses)) == len(addresses), "50184: an address twice"
            for o in outcomes:
                assert o["outcome"] in ("Delivered", "Deferred", "Refused"), o  # 50182
            [row] = self._held([mail_id], lock_token)
            for o in outcomes:
                old = row.recipients.get(o["address"].lower())
                if old is None or old[0] == "Deferred":
                    row.recipients[o["address"].lower()] = (o["outcome"], o.get("code"), o.get("text"))
        return self._apply("record_recipient_outcomes",
                           dict(mail_id=mail_id, lock_token=lock_token, outcomes=outcomes), run)

    def get_recipient_outcomes(self, conn: Any, *, ids: Iterable[int],
                               lock_token: Any) -> dict[int, dict[str, str]]:
        """Like mailq.GetRecipientOutcomes: mail ID -> {address: outcome} of mails leased by the token."""
        ids = list(ids)

        def run() -> dict[int, dict[str, str]]:
            out: dict[int, dict[str, str]] = {}
            for i in ids:
                r = self.rows.get(i)
                if r and r.status == "Sending" and r.token == str(lock_token) and r.recipients:
                    out[i] = {a: v[0] for a, v in r.recipients.items()}
            return out
        return self._apply("get_recipient_outcomes", dict(ids=ids, lock_token=lock_token), run)

    def enqueue_mail(self, conn: Any, **kwargs: Any) -> EnqueueResult:
        def run() -> EnqueueResult:
            mail_id = max(self.rows, default=0) + 1
            attachments = list(kwargs.pop("attachments", ()) or ())
            fields = {k: v for k, v in kwargs.items() if k in ClaimedMail.__dataclass_fields__ and v is not None}
            mail = make_mail(mail_id, attachments=attachments, **fields)
            self.rows[mail_id] = Row(mail)
            return EnqueueResult(mail_id, mail.message_id, True)
        return self._apply("enqueue_mail", dict(kwargs), run)

    def get_queue_stats(self, conn: Any, *, recent_failures: int | None = None,
                        finished_hours: int | None = None) -> QueueStats:
        return self._apply("get_queue_stats", dict(recent_failures=recent_failures,
                                                   finished_hours=finished_hours), lambda: self.stats)

    def get_event_stream_stall(self, conn: Any, *, min_open_seconds: int | None = None) -> Any:
        from mailq_db.procedures import EventStreamStall

        def run() -> EventStreamStall:
            return self.stall or EventStreamStall(False, 1001, 1001, True, "VIEW SERVER STATE", None, [])
        return self._apply("get_event_stream_stall", dict(min_open_seconds=min_open_seconds), run)

    def get_installation_health(self, conn: Any) -> list[dict[str, Any]]:
        return self._apply("get_installation_health", {}, lambda: self.health)

    def get_enqueue_policy(self, conn: Any) -> EnqueuePolicy:
        """A closed installation whose every enqueuing user is mapped (doctor: all OK)."""
        return self._apply("get_enqueue_policy", {}, lambda: EnqueuePolicy(False, None, None, True, []))

    def monitor_delayed_execution(self, conn: Any, *, apply: bool = True, raise_on_critical: bool = False,
                                  overdue_limit: int = 0, schedule_missing: bool = False,
                                  max_rows: int = 1000) -> list[dict[str, Any]]:
        return self._apply("monitor_delayed_execution",
                           dict(apply=apply, raise_on_critical=raise_on_critical),
                           lambda: list(self.delay_findings))


def read_within_budget(mails: list[ClaimedMail], max_batch_bytes: int | None) -> list[ClaimedMail]:
    """procedures.claim_mail's reading of the result sets, on mails already whole: the bodies
    in claim order, then the stored attachments by mail ID, each through ClaimBudget."""
    budget = ClaimBudget(max_batch_bytes)
    pieces = {m.id: m.attachments for m in mails}
    for m in mails:
        m.attachments = []
        budget.admit(m, held_bytes(m))
    for m in sorted(mails, key=lambda m: m.id):
        for a in pieces[m.id]:
            budget.attach(m, a)
    return mails
