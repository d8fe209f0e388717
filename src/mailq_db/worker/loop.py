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
import math
import re
import smtplib
import threading
import time
import uuid
from collections import Counter, OrderedDict
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from typing import Any, Callable, Iterable

from .. import procedures
from ..connection import Backoff, ReconnectingConnection
from ..errors import DatabaseError, LeaseLostError
from ..procedures import ClaimedMail
from .classify import RETRY, STOP, WAIT, Outcome, classify_exception, classify_reply, permanent
from .config import AccountConfig, Config
from .lazy import LazyContentError, needs_preparing, prepare
from .logs import event
from ..bounces.outgoing import prepare as prepare_outgoing
from .message import MalformedMail, Outgoing, build
from .metrics import Metrics
from .smtp import ConnectionGone, MessageTooBig, OutcomeUnknown, SendResult, SmtpSession

log = logging.getLogger("mailq_db.worker")

#: Mark*/Release error texts are cut to what the column keeps.
MAX_ERROR = 2000
#: Postfix's rejections of the client, not of the mail (logged at ERROR for the operator)
CLIENT_REJECTED = re.compile(r"Helo command rejected|Client host rejected|Sender address rejected", re.IGNORECASE)
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
    text: str | None  # the server's final reply (the same rule for every outcome)
    account: str | None = None
    dry_run: bool = False  # recorded as DryRun (worker dry-run, or the application's, revision 0015)


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
        sleep: Callable[[float], Any] | None = None,
        generators: Any = None,
    ):
        self.config = config
        self.settings = config.worker
        self.db = db
        self.procs = procs
        self.stop = stop or threading.Event()
        self.metrics = metrics or Metrics()
        self.session_factory = session_factory
        self.clock = clock
        #: waits for the login interval; returns early when ``stop`` is set
        self.sleep = sleep or self.stop.wait
        self.name = name or self.settings.worker_name
        self.dry_run = self.settings.dry_run if dry_run is None else dry_run
        #: attachment generators by name (None: the installed entry points)
        self.generators = generators
        self.token = uuid.uuid4()
        self.held: dict[int, ClaimedMail] = {}  # leased, not yet acknowledged/failed/released
        self.pending: list[_Pending] = []  # sent, acknowledgement not yet written
        self._pending_since = 0.0
        self._finalized_at = float("-inf")  # maybe_finalize: never yet
        #: set when the database has no mailq.AcquireLoginSlot (below revision 0012)
        self._no_login_slots = False
        #: consecutive Waits per account (the growing back-off); reset by a send
        self.waits: dict[str, int] = {}
        #: mail ID -> {address: outcome} of recipients handled in earlier attempts
        self.done_recipients: dict[int, dict[str, str]] = {}

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
            run_modes=list(s.run_modes),
        )
        self.metrics.observe_claim(time.monotonic() - started)
        self.metrics.inc("claims")
        if not mails:
            return 0
        self.metrics.inc("claimed", len(mails))
        self.held = {m.id: m for m in mails}
        mails = self._prepare_lazy(mails)
        self.done_recipients = self._recipients_done(mails)
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

    def _prepare_lazy(self, mails: list[ClaimedMail]) -> list[ClaimedMail]:
        """Render template mail and generate lazy attachments (worker/lazy.py),
        before any login.  A mail whose content cannot be made is stopped with
        the reason (what and where), so a fixed template + RequeueMail sends it;
        one whose generator raised, or failed in a way not foreseen, is deferred
        (Retry).  Either way the rest of the batch goes on."""
        ready: list[ClaimedMail] = []
        for mail in mails:
            if not needs_preparing(mail):
                ready.append(mail)
                continue
            # Rendering and generators take time (a deadline per render, none per
            # generator): the batch's leases are kept alive between two mails, as
            # the send loop does, so none runs out while the rest is prepared.
            self.maintain_leases()
            if mail.id not in self.held:
                continue  # lease lost meanwhile: another worker has the mail
            try:
                prepared = prepare(mail, registry=self.generators)
            except LazyContentError as exc:
                self.metrics.inc("lazy_content_errors")
                # A template/model error or a refused attachment: Stop (a fix +
                # RequeueMail sends it).  A generator that raised: Retry, one
                # attempt spent, as a mail server defers what may be transient.
                self.fail([mail], Outcome(RETRY if exc.retry else STOP, exc.reason, "lazy content", None, None,
                                          "mail"))
                continue
            except Exception as exc:  # noqa: BLE001 - one mail's content must not abandon the batch
                # Not foreseen by lazy.py (e.g. a generator returning a bytes content
                # type): escaping here, before run_batch's try, abandoned the whole
                # batch on every claim, attempts refunded, so the mail blocked its
                # batch forever.  Deferred (Retry, one attempt spent): not
                # foreseen means not known to be permanent; the attempts bound it.
                self.metrics.inc("lazy_content_errors")
                log.warning("lazy content of mail %s failed unexpectedly", mail.id, exc_info=True)
                self.fail([mail], Outcome(RETRY, f"lazy content could not be made: {type(exc).__name__}: {exc}",
                                          "lazy content", None, None, "mail"))
                continue
            # Held at once, so later lease extensions update this object.
            self.held[mail.id] = prepared
            ready.append(prepared)
        return [m for m in ready if m.id in self.held]

    # ------------------------------------------------------------ one account

    def send_account(self, account_name: str, mails: list[ClaimedMail]) -> None:
        account = self.config.accounts.get(account_name)
        if account is None:
            self.fail(mails, Outcome(WAIT, f"account {account_name!r} is not in this worker's "
                                     "configuration: add [accounts." + account_name + "]",
                                     "unknown account", None, 300, "account"))
            return
        queue = list(mails)
        session: SmtpSession | None = None
        connection_failures = 0
        reconnected: set[int] = set()  # mails resent once after a dead idle connection
        login_slept = 0.0  # seconds slept for the login interval before the next connection
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
                    out = self._outgoing(mail)
                except MalformedMail as exc:
                    self.fail([mail], permanent(f"malformed mail: {exc}"))
                    continue
                if out is None:
                    continue  # every recipient was handled in an earlier attempt: acknowledged
                if self.dry_run or mail.dry_run:
                    # The worker's dry-run, or the application's (ClaimMail
                    # said DryRun = 1, revision 0015): the whole path but SMTP.
                    # Before any connection: no login slot asked, no session.
                    reason = "dry run: nothing sent" if self.dry_run else \
                        f"dry run of application {mail.app_name!r}: nothing sent"
                    self.accepted(mail, out, SendResult(0, reason))
                    continue
                if session is None or not session.connected:
                    # The account's minimum interval between logins (mailq.AcquireLoginSlot):
                    # every connection, the first and each reconnection, asks first.
                    wait = self._login_wait(account)
                    if wait is not None:
                        if self._sleeps_for_login(account, mail, wait, login_slept):
                            login_slept += wait
                            queue.insert(0, mail)
                            continue  # back to the top: stop, leases and the slot checked again
                        self._defer_for_login(account, [mail, *queue], wait)
                        return
                    login_slept = 0.0
                    session = self.session_factory(account)
                    try:
                        session.open()
                        self.metrics.inc("smtp_connections", account=account.name)
                    except Exception as exc:  # noqa: BLE001 - classified
                        outcome = classify_exception(exc, session.stage)
                        if session.stage == "auth" and isinstance(exc, smtplib.SMTPAuthenticationError):
                            event(log, logging.ERROR, f"authentication failed for account {account.name}",
                                  account=account.name, user=account.user, smtp_code=exc.smtp_code,
                                  reply=_reply_text(exc.smtp_error),
                                  fix=f"check the password in ${account.password_env} and the user name")
                        self.fail([mail, *queue], self._account_wait(account, outcome))
                        return
                started = time.monotonic()
                try:
                    result = session.send(out)
                except ConnectionGone as exc:
                    # Closed by the server while idle: nothing of this mail was sent.
                    session.abort()
                    if mail.id not in reconnected:
                        reconnected.add(mail.id)
                        event(log, logging.INFO, "connection closed while idle; reconnecting",
                              account=account.name, mail_id=mail.id, reason=str(exc))
                        queue.insert(0, mail)
                        continue
                    self.fail([mail, *queue], self._account_wait(account, Outcome(
                        WAIT, f"the connection to {account.host}:{account.port} died twice at MAIL FROM: {exc}",
                        "dead connection", None, 60, "connection")))
                    return
                except Exception as exc:  # noqa: BLE001 - classified
                    outcome = self._classify_send_error(exc, session.stage)
                    self.metrics.observe_send(time.monotonic() - started, account.name, outcome.smtp_code)
                    if outcome.disposition == WAIT:  # a Wait is account-wide (scope "account"/"connection")
                        self._client_rejected(account, outcome)
                        self.fail([mail, *queue], self._account_wait(account, outcome))
                        return
                    self.fail([mail], outcome)
                    if not session.connected:
                        connection_failures += 1
                        if connection_failures >= MAX_CONNECTION_FAILURES and queue:
                            self.fail(queue, self._account_wait(account, Outcome(
                                WAIT, f"the connection to {account.host}:{account.port} failed "
                                f"{connection_failures} times in one batch; last: {outcome.reason}",
                                "unstable connection", None, 60, "connection")))
                            return
                    continue
                self.metrics.observe_send(time.monotonic() - started, account.name, result.code)
                self.waits.pop(account.name, None)
                self.metrics.set_blocked(account.name, False)
                wait = self.accepted(mail, out, result)
                if wait is not None:
                    self.fail(queue, self._account_wait(account, wait))
                    return
        finally:
            if session is not None:
                session.close()

    def _login_wait(self, account: AccountConfig) -> float | None:
        """None when the login is granted (the slot is stamped in the database),
        else the seconds until the account's next login is allowed."""
        acquire = getattr(self.procs, "acquire_login_slot", None)
        if acquire is None or self._no_login_slots:  # no such procedure: no interval
            return None
        try:
            slot = self.db.call(acquire, account_name=account.name)
        except DatabaseError as exc:
            if exc.number != 2812:  # anything but "could not find stored procedure"
                raise
            # A database below revision 0012 (workers upgraded first): it cannot
            # hold an interval either, so every login is allowed, as before.
            self._no_login_slots = True
            event(log, logging.WARNING, "mailq.AcquireLoginSlot is missing (database below revision 0012): "
                  "no minimum interval between logins is enforced", account=account.name, error=str(exc))
            return None
        if slot.granted:
            return None
        return max(slot.wait_ms, 1) / 1000.0

    def _sleeps_for_login(self, account: AccountConfig, mail: ClaimedMail, wait: float,
                          slept: float = 0.0) -> bool:
        """Sleep when the next login is near (at most login_sleep_max_seconds away,
        counting what was already slept for this connection) and the lease still
        covers the wait plus the safety margin; True when it slept.  Without the
        count, a worker that other workers beat to the slot after every sleep
        slept again and again (its leases extended meanwhile), holding its whole
        batch, other accounts' mail included, for as long as it kept losing."""
        if slept + wait > account.login_sleep_max_seconds:
            return False
        if self._lease_left(mail) - wait < self.settings.lease_safety_margin_seconds:
            return False
        self.metrics.inc("login_sleeps", account=account.name)
        event(log, logging.INFO, "waiting for the account's minimum interval between logins",
              account=account.name, mail_id=mail.id, wait_seconds=round(wait, 3))
        self.sleep(wait)
        return True

    def _defer_for_login(self, account: AccountConfig, mails: list[ClaimedMail], wait: float) -> None:
        """The next login is too far away: the batch goes back as a Wait for exactly
        that long (the attempt is refunded and the account blocked until then, so no
        worker claims it sooner).  Not the provider's throttling: the growing
        back-off of _account_wait is neither used nor reset."""
        self.metrics.inc("login_deferrals", account=account.name)
        self.fail(mails, Outcome(
            WAIT, f"minimum interval between logins on account {account.name!r}: the next login is "
            f"allowed in {wait:.3f} s (more than login_sleep_max_seconds = {account.login_sleep_max_seconds:g}, "
            "or the lease would not cover the wait)", "login interval", None, max(1, math.ceil(wait)), "account"))

    def _classify_send_error(self, exc: BaseException, stage: str) -> Outcome:
        if isinstance(exc, MessageTooBig):
            return Outcome(STOP, str(exc), "message larger than the server's SIZE", 552, None, "mail")
        if isinstance(exc, OutcomeUnknown):
            # RFC 5321 4.5.3.2.6 / docs/guarantees.md: the server may have the mail.  Retried
            # on purpose (at-least-once, same Message-ID and Date); counted as an attempt.
            return Outcome(RETRY, f"outcome unknown: {exc}; retried with the same Message-ID "
                           "(at-least-once)", "outcome unknown after the final dot", None, None, "mail")
        return classify_exception(exc, stage)

    def _account_wait(self, account: AccountConfig, outcome: Outcome) -> Outcome:
        """A Wait whose block time grows with each consecutive Wait of the account."""
        if outcome.disposition != WAIT:
            return outcome
        n = self.waits.get(account.name, 0) + 1
        self.waits[account.name] = n
        base = account.wait_min_seconds or outcome.retry_after_seconds or 60
        seconds = int(min(account.wait_max_seconds, base * 2 ** (n - 1)))
        self.metrics.set_blocked(account.name, True)
        return replace(outcome, retry_after_seconds=max(1, seconds))

    def _client_rejected(self, account: AccountConfig, outcome: Outcome) -> None:
        if CLIENT_REJECTED.search(outcome.reason or ""):
            event(log, logging.ERROR, f"the server refuses this client for account {account.name}: "
                  "the operator must fix the configuration", account=account.name, reason=outcome.reason,
                  fix="HELO: set local_hostname to this machine's fully qualified name; client host: "
                  "ask the provider to allow this address; sender: use an address the account may send as")

    # ------------------------------------------------------------ recipients

    def _recipients_done(self, mails: list[ClaimedMail]) -> dict[int, dict[str, str]]:
        """Recipients already delivered or refused in earlier attempts (mails claimed before)."""
        again = [m.id for m in mails if (m.attempt_no or 0) > 1]
        if not again or not hasattr(self.procs, "get_recipient_outcomes"):
            return {}
        try:
            return self.db.call(self.procs.get_recipient_outcomes, ids=again, lock_token=self.token)
        except LeaseLostError:
            return {}

    def _outgoing(self, mail: ClaimedMail) -> Outgoing | None:
        # VERP return path and bulk mail's List-Unsubscribe (mailq_db.bounces.outgoing)
        out = prepare_outgoing(mail, self.config.accounts.get(mail.account_name), build)
        done = {a.lower(): o for a, o in self.done_recipients.get(mail.id, {}).items()
                if o in ("Delivered", "Refused")}
        if not done:
            return out
        left = tuple(r for r in out.recipients if r.lower() not in done)
        if left:
            event(log, logging.INFO, "sending to the recipients left from an earlier attempt",
                  mail_id=mail.id, recipients=list(left), already=sorted(done))
            return replace(out, recipients=left)
        self._ack(mail.id, None, "every recipient was handled in an earlier attempt")
        return None

    # ------------------------------------------------------------- outcomes

    def accepted(self, mail: ClaimedMail, out: Outgoing, result: SendResult) -> Outcome | None:
        """The server took the mail for some or all recipients.  Refused recipients
        are classified one by one: 5xx is final for that recipient, 4xx is retried
        later for that recipient only (the mail goes back as a Retry), and a reply
        that blocks the account is returned as the Wait for the rest of the batch."""
        refused: dict[str, tuple[int, str]] = {}
        deferred: dict[str, tuple[int, str]] = {}
        wait: Outcome | None = None
        for rcpt, (code, text) in result.refused.items():
            verdict = classify_reply(code, text, "rcpt")
            if verdict.disposition == STOP:
                refused[rcpt] = (code, text)
            else:
                deferred[rcpt] = (code, text)
                if verdict.disposition == WAIT and wait is None:
                    wait = verdict
        event(log, logging.INFO, "sent", account=mail.account_name, mail_id=mail.id,
              message_id=mail.message_id, queue_id=result.queue_id, smtp_code=result.code,
              smtp_text=result.text, recipients=len(result.accepted), transactions=result.transactions,
              refused=sorted(refused) or None, deferred=sorted(deferred) or None,
              dry_run=(self.dry_run or mail.dry_run) or None)
        text = result.text
        if result.code:
            text = f"{result.code} {result.text}"
        if refused or deferred:
            text += "; " + "; ".join(
                f"{'deferred' if r in deferred else 'refused'} {r}: {c} {t}"
                for r, (c, t) in [*refused.items(), *deferred.items()])
        if (refused or deferred) and hasattr(self.procs, "record_recipient_outcomes"):
            outcomes = [{"address": r, "outcome": "Delivered", "code": result.code or None,
                         "text": result.text[:1000]} for r in result.accepted]
            outcomes += [{"address": r, "outcome": "Refused", "code": c, "text": t[:1000]}
                         for r, (c, t) in refused.items()]
            outcomes += [{"address": r, "outcome": "Deferred", "code": c, "text": t[:1000]}
                         for r, (c, t) in deferred.items()]
            try:
                self.db.call(self.procs.record_recipient_outcomes, mail_id=mail.id, lock_token=self.token,
                             outcomes=outcomes)
            except LeaseLostError as exc:
                self.held.pop(mail.id, None)
                self.metrics.inc("lease_lost")
                event(log, logging.ERROR, "lease lost after the SMTP server accepted the mail: "
                      "possibly sent twice", mail_id=mail.id, error=str(exc))
                return wait
        if deferred:
            self.fail([mail], Outcome(
                RETRY, f"delivered to {len(result.accepted)} recipient(s); deferred, retried later for "
                f"those only: {text}", "recipients deferred (4xx)", min(c for c, _ in deferred.values()),
                None, "recipient"))
            return wait
        self._ack(mail.id, result.code or None, text)
        return wait

    def _ack(self, mail_id: int, code: int | None, text: str | None) -> None:
        if not self.pending:
            self._pending_since = time.monotonic()
        mail = self.held.get(mail_id)
        self.pending.append(_Pending(mail_id, code, text, mail.account_name if mail else None,
                                     self.dry_run or bool(mail and mail.dry_run)))

    def flush_acks(self) -> None:
        """Write every pending acknowledgement: one MarkSent per distinct reply text."""
        if not self.pending:
            return
        pending, self.pending = self.pending, []
        # Every mail stores its own final reply (with the server's queue ID); mails
        # with the same reply share one MarkSent call.
        # Dry-run mails (the worker's or their application's) are acknowledged
        # apart, with @DryRun = 1.
        groups: OrderedDict[tuple[int | None, str | None, bool], list[int]] = OrderedDict()
        accounts = {p.mail_id: p.account for p in pending}
        for p in pending:
            groups.setdefault((p.code, p.text, p.dry_run), []).append(p.mail_id)
        for (code, text, dry), ids in groups.items():
            done = self._each(
                ids, lambda chunk: self.db.call(
                    self.procs.mark_sent, ids=chunk, lock_token=self.token, smtp_code=code,
                    smtp_text=text[:MAX_ERROR] if text else None, dry_run=dry),
                lost="lease lost after the SMTP server accepted the mail: possibly sent twice")
            for account, n in Counter(accounts[i] for i in done).items():
                self.metrics.inc("sent", n, account=account, code=code)
            event(log, logging.INFO, "acknowledged", count=len(done), ids=done, dry_run=dry)

    def fail(self, mails: Iterable[ClaimedMail], outcome: Outcome) -> None:
        mails = list(mails)
        accounts = {m.id: m.account_name for m in mails}
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
        done_set = set(done)
        for account, n in Counter(accounts[i] for i in done_set).items():
            self.metrics.inc(counter, n, account=account, code=outcome.smtp_code)

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


def _reply_text(reply: bytes | str | None) -> str:
    return reply.decode("utf-8", "replace") if isinstance(reply, bytes) else (reply or "")


def group_by_account(mails: Iterable[ClaimedMail]) -> "OrderedDict[str, list[ClaimedMail]]":
    """Mails per account, accounts in the order of their first (highest-priority) mail."""
    groups: OrderedDict[str, list[ClaimedMail]] = OrderedDict()
    for m in mails:
        groups.setdefault(m.account_name, []).append(m)
    return groups
