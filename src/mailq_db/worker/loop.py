"""The sender worker: claim, send per account over one connection, acknowledge.

One :class:`Worker` is one thread with its own database connection and lock
token.  It only touches data through the procedure wrappers it is given
(``procs``, normally :mod:`mailq_db.procedures`; tests pass a fake with the
same signatures).

Delivery guarantee (DESIGN.md "Delivery guarantee"): a mail is acknowledged
only after the server accepted it; the window between acceptance and
``MarkSent`` is the only place a duplicate can come from.  The worker keeps it
small: acknowledgements are flushed at the end of each account batch and at
least every ``ack_interval_seconds``; leases are extended when half of
``lease_seconds`` has passed; and no SMTP transaction starts on a mail whose
lease has less than ``lease_safety_margin_seconds`` left (it is released).
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections import OrderedDict
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Callable, Iterable

from .. import procedures
from ..connection import Backoff, ReconnectingConnection
from ..errors import DatabaseError, LeaseLostError
from ..procedures import ClaimedMail
from .classify import RETRY, STOP, WAIT, Outcome, classify_exception, permanent
from .config import AccountConfig, Config
from .logs import event
from .message import MalformedMail, build
from .metrics import Metrics
from .smtp import SendResult, SmtpSession

log = logging.getLogger("mailq_db.worker")

#: Mark*/Release error texts are cut to what the column keeps.
MAX_ERROR = 2000
#: After this many dropped SMTP connections in one account batch, the rest Waits.
MAX_CONNECTION_FAILURES = 2
#: How often each worker runs mailq.FinalizeMail (expired and out-of-attempts
#: mail, which the claim no longer touches); see docs/operator-guide.md.
FINALIZE_INTERVAL_SECONDS = 60.0


def utcnow() -> datetime:
    """Naive UTC, like the procedures' DATETIME2 values."""
    return datetime.now(timezone.utc).replace(tzinfo=None)


@dataclass
class _Pending:
    mail_id: int
    code: int | None
    text: str | None  # None: a plain acceptance, acknowledged in the account's batch call


class Worker:
    """Claims batches and sends them; see the module docstring."""

    def __init__(
        self,
        config: Config,
        db: ReconnectingConnection,
        *,
        procs: Any = procedures,
        stop: threading.Event | None = None,
        metrics: Metrics | None = None,
        session_factory: Callable[[AccountConfig], SmtpSession] = SmtpSession,
        clock: Callable[[], datetime] = utcnow,
        name: str | None = None,
        dry_run: bool | None = None,
    ):
        self.config = config
        self.settings = config.worker
        self.db = db
        self.procs = procs
        self.stop = stop or threading.Event()
        self.metrics = metrics or Metrics()
        self.session_factory = session_factory
        self.clock = clock
        self.name = name or self.settings.worker_name
        self.dry_run = self.settings.dry_run if dry_run is None else dry_run
        self.token = uuid.uuid4()
        self.held: dict[int, ClaimedMail] = {}  # leased, not yet acknowledged/failed/released
        self.pending: list[_Pending] = []  # sent, acknowledgement not yet written
        self._pending_since = 0.0
        self._finalized_at = float("-inf")  # maybe_finalize: never yet

    # ------------------------------------------------------------------ loop

    def run(self, *, once: bool = False) -> None:
        """Claim and send until ``stop`` is set (or, with ``once``, until nothing is due)."""
        s = self.settings
        idle = Backoff(s.idle_backoff_min_seconds, s.idle_backoff_max_seconds, jitter=False)
        while not self.stop.is_set():
            self.maybe_finalize()
            try:
                claimed = self.run_batch()
            except Exception:  # noqa: BLE001 - one bad batch must not kill the worker
                self.metrics.inc("errors")
                log.exception("batch abandoned; unacknowledged leases will expire and be retried")
                self._abandon()
                if once:
                    raise
                self.stop.wait(idle.next())
                continue
            if claimed:
                idle.reset()
            elif once:
                return
            else:
                self.stop.wait(idle.next())

    def maybe_finalize(self) -> None:
        """Run mailq.FinalizeMail at most every FINALIZE_INTERVAL_SECONDS.  Its
        failure is logged and never stops sending (the next timer retries)."""
        finalize = getattr(self.procs, "finalize_mail", None)
        now = time.monotonic()
        if finalize is None or now - self._finalized_at < FINALIZE_INTERVAL_SECONDS:
            return
        self._finalized_at = now
        try:
            result = self.db.call(finalize)
        except Exception as exc:  # noqa: BLE001 - finalization is housekeeping
            log.warning("mailq.FinalizeMail failed (%s); retried in %.0f s", exc, FINALIZE_INTERVAL_SECONDS)
            return
        if result.failed or result.expired:
            event(log, logging.INFO, "finalized mail", failed=result.failed, expired=result.expired,
                  more_left=result.more_left)

    def run_batch(self) -> int:
        """Claim one batch and process it; returns how many mails were claimed."""
        s = self.settings
        started = time.monotonic()
        # A new token per claimed batch (ClaimMail's contract): a token names
        # one lease of one batch.  Kept while acknowledgements of the previous
        # batch are still unwritten (a database outage), so they stay valid.
        if not self.pending and not self.held:
            self.token = uuid.uuid4()
        mails = self.db.call(
            self.procs.claim_mail, batch_size=s.batch_size, lock_token=self.token,
            lease_seconds=s.lease_seconds, app_name=s.app_name, worker_name=self.name,
            account_names=list(self.config.accounts),
        )
        self.metrics.observe_claim(time.monotonic() - started)
        self.metrics.inc("claims")
        if not mails:
            return 0
        self.metrics.inc("claimed", len(mails))
        self.held = {m.id: m for m in mails}
        try:
            for account, group in group_by_account(mails).items():
                if self.stop.is_set():
                    break
                self.send_account(account, group)
                self.flush_acks()
        finally:
            self.flush_acks()
            if self.held:
                self.release(list(self.held.values()), "worker stopping")
        return len(mails)

    # ------------------------------------------------------------ one account

    def send_account(self, account_name: str, mails: list[ClaimedMail]) -> None:
        account = self.config.accounts.get(account_name)
        if account is None:
            self.fail(mails, Outcome(WAIT, f"account {account_name!r} is not in this worker's "
                                     "configuration: add [accounts." + account_name + "]",
                                     "unknown account", None, 300))
            return
        queue = list(mails)
        session: SmtpSession | None = None
        connection_failures = 0
        try:
            while queue:
                if self.stop.is_set():
                    return  # the rest is released by run_batch
                self.maintain_leases()
                mail = queue.pop(0)
                if mail.id not in self.held:
                    continue  # lease lost while extending
                if self._lease_left(mail) < self.settings.lease_safety_margin_seconds:
                    self.release([mail], "lease shorter than the safety margin")
                    continue
                try:
                    out = build(mail)
                except MalformedMail as exc:
                    self.fail([mail], permanent(f"malformed mail: {exc}"))
                    continue
                if self.dry_run:
                    self.accepted(mail, SendResult(0, "dry run: nothing sent"))
                    continue
                if session is None or not session.connected:
                    session = self.session_factory(account)
                    try:
                        session.open()
                        self.metrics.inc("smtp_connections")
                    except Exception as exc:  # noqa: BLE001 - classified
                        outcome = classify_exception(exc, session.stage)
                        self.fail([mail, *queue], outcome)
                        return
                try:
                    result = session.send(out)
                except Exception as exc:  # noqa: BLE001 - classified
                    outcome = classify_exception(exc, session.stage)
                    if outcome.account_wide:
                        self.fail([mail, *queue], outcome)
                        return
                    self.fail([mail], outcome)
                    if not session.connected:
                        connection_failures += 1
                        if connection_failures >= MAX_CONNECTION_FAILURES and queue:
                            self.fail(queue, Outcome(
                                WAIT, f"the connection to {account.host}:{account.port} failed "
                                f"{connection_failures} times in one batch; last: {outcome.reason}",
                                "unstable connection", None, 60))
                            return
                    continue
                self.accepted(mail, result)
        finally:
            if session is not None:
                session.close()

    # ------------------------------------------------------------- outcomes

    def accepted(self, mail: ClaimedMail, result: SendResult) -> None:
        text = None
        if result.refused:
            text = "accepted for some recipients; refused: " + "; ".join(
                f"{rcpt} ({code} {reply})" for rcpt, (code, reply) in result.refused.items())
            event(log, logging.WARNING, "recipients refused, mail sent to the others",
                  mail_id=mail.id, account=mail.account_name, refused=list(result.refused))
        event(log, logging.DEBUG, "accepted", mail_id=mail.id, account=mail.account_name,
              smtp_code=result.code, smtp_text=result.text)
        if not self.pending:
            self._pending_since = time.monotonic()
        self.pending.append(_Pending(mail.id, result.code or None, text or result.text))

    def flush_acks(self) -> None:
        """Write every pending acknowledgement: one MarkSent per distinct reply text."""
        if not self.pending:
            return
        pending, self.pending = self.pending, []
        groups: OrderedDict[tuple[int | None, str | None], list[int]] = OrderedDict()
        common = {p.text for p in pending if p.text and not p.text.startswith("accepted for some")}
        for p in pending:
            text = p.text
            if text and not text.startswith("accepted for some") and len(common) > 1:
                text = f"{p.code} accepted (per-mail replies in the worker log)"
            groups.setdefault((p.code, text), []).append(p.mail_id)
        for (code, text), ids in groups.items():
            done = self._each(
                ids, lambda chunk: self.db.call(
                    self.procs.mark_sent, ids=chunk, lock_token=self.token, smtp_code=code,
                    smtp_text=text[:MAX_ERROR] if text else None, dry_run=self.dry_run),
                lost="lease lost after the SMTP server accepted the mail: possibly sent twice")
            self.metrics.inc("sent", len(done))
            event(log, logging.INFO, "acknowledged", count=len(done), ids=done, dry_run=self.dry_run)

    def fail(self, mails: Iterable[ClaimedMail], outcome: Outcome) -> None:
        ids = [m.id for m in mails if m.id in self.held]
        if not ids:
            return
        level = logging.ERROR if outcome.disposition == STOP else logging.WARNING
        event(log, level, outcome.disposition, ids=ids, reason=outcome.reason, rule=outcome.rule,
              smtp_code=outcome.smtp_code, retry_after_seconds=outcome.retry_after_seconds)
        done = self._each(
            ids, lambda chunk: self.db.call(
                self.procs.mark_failed, ids=chunk, lock_token=self.token,
                disposition=outcome.disposition, error=outcome.reason[:MAX_ERROR],
                retry_after_seconds=outcome.retry_after_seconds, smtp_code=outcome.smtp_code),
            lost="lease lost before the failure was recorded; the new owner decides")
        counter = {STOP: "failed", RETRY: "retried", WAIT: "waited"}[outcome.disposition]
        self.metrics.inc(counter, len(done))

    def release(self, mails: Iterable[ClaimedMail], why: str) -> None:
        ids = [m.id for m in mails if m.id in self.held]
        if not ids:
            return
        try:
            done = self._each(
                ids, lambda chunk: self.db.call(self.procs.release_mail, ids=chunk, lock_token=self.token),
                lost="lease already lost; nothing to release")
        except DatabaseError as exc:
            for i in ids:
                self.held.pop(i, None)
            event(log, logging.WARNING, "release failed; the leases will expire", ids=ids, error=str(exc))
            return
        self.metrics.inc("released", len(done))
        event(log, logging.INFO, "released", ids=done, why=why)

    def _each(self, ids: list[int], call: Callable[[list[int]], Any], *, lost: str) -> list[int]:
        """``call(ids)`` all at once; when a lease is lost (the call wrote nothing),
        once per mail so the valid ones are still recorded.  Returns the IDs done."""
        try:
            call(ids)
            done = list(ids)
        except LeaseLostError:
            done = []
            for i in ids:
                try:
                    call([i])
                    done.append(i)
                except LeaseLostError as exc:
                    self.metrics.inc("lease_lost")
                    event(log, logging.ERROR, lost, mail_id=i, error=str(exc))
        for i in ids:
            self.held.pop(i, None)
        return done

    # ---------------------------------------------------------------- leases

    def _lease_left(self, mail: ClaimedMail) -> float:
        return (mail.lease_expires_utc - self.clock()).total_seconds()

    def maintain_leases(self) -> None:
        """Flush old acknowledgements; extend the leases once half of them is used up."""
        if self.pending and time.monotonic() - self._pending_since >= self.settings.ack_interval_seconds:
            self.flush_acks()
        if not self.held:
            return
        soonest = min(self._lease_left(m) for m in self.held.values())
        if soonest >= self.settings.lease_seconds / 2:
            return
        ids = list(self.held)
        try:
            new = self.db.call(self.procs.extend_lease, ids=ids, lock_token=self.token,
                               lease_seconds=self.settings.lease_seconds)
        except LeaseLostError:
            new = {}
            for i in ids:
                try:
                    new.update(self.db.call(self.procs.extend_lease, ids=[i], lock_token=self.token,
                                            lease_seconds=self.settings.lease_seconds))
                except LeaseLostError:
                    pass
        except DatabaseError as exc:
            event(log, logging.WARNING, "lease extension failed", error=str(exc))
            return
        self.metrics.inc("lease_extensions")
        pending = {p.mail_id for p in self.pending}
        for i in ids:
            if i in new:
                self.held[i].lease_expires_utc = new[i]
                continue
            self.held.pop(i)
            self.metrics.inc("lease_lost")
            if i in pending:
                event(log, logging.ERROR, "lease lost after the SMTP server accepted the mail: "
                      "possibly sent twice", mail_id=i)
                self.pending = [p for p in self.pending if p.mail_id != i]
            else:
                event(log, logging.WARNING, "lease lost before sending; another worker has the mail",
                      mail_id=i)

    def _abandon(self) -> None:
        """After an unexpected error: best-effort acknowledgements and releases, then forget."""
        for step in (self.flush_acks, lambda: self.release(list(self.held.values()), "error")):
            try:
                step()
            except Exception:  # noqa: BLE001
                log.warning("cleanup after error failed", exc_info=True)
        self.held.clear()
        self.pending.clear()
        self.db.discard()


def group_by_account(mails: Iterable[ClaimedMail]) -> "OrderedDict[str, list[ClaimedMail]]":
    """Mails per account, accounts in the order of their first (highest-priority) mail."""
    groups: OrderedDict[str, list[ClaimedMail]] = OrderedDict()
    for m in mails:
        groups.setdefault(m.account_name, []).append(m)
    return groups
