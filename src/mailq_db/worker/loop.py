"""The sender worker: claim, send per account over one connection, acknowledge.

One :class:`Worker` is one thread with its own database connection and lock
token.  It only touches data through the procedure wrappers it is given
(``procs``, normally :mod:`mailq_db.procedures`; tests pass a fake with the
same signatures).

What it guarantees (docs/guarantees.md, docs/operator-guide.md):

* **A mail the server accepted is never given back.**  Its acknowledgement
  (RecordRecipientOutcomes, then MarkSent or MarkFailed) is kept until it is
  written: a failed write is retried (the procedures are repeatable under the
  lease's token), and a mail with an unwritten acknowledgement is never
  released.  Where the worker must give up (the lease ran out, or shutdown
  after ``ack_shutdown_wait_seconds``), the mail is left to its lease: the
  reclaim flags it PossibleDuplicate, and one WARNING line per mail says so.
* **Leases are kept during any blocking work** (SMTP, templates, generators):
  that work runs in a helper thread while this one extends the leases, and a
  generator has a time limit; a stop request (SIGTERM) interrupts the
  preparation of lazy content.
* **Leases are judged by the database's clock**: the deadline of a lease is
  this process's monotonic time taken before the claim or extension, plus the
  seconds the database granted (its ``LeaseSecondsRemaining``, else the
  seconds asked for, which can only be longer than what remains).  The wall
  clock of this host is never compared with the database's.
* No SMTP transaction starts on a mail whose lease has less than
  ``lease_safety_margin_seconds`` left (it is released, attempt refunded).
* A batch holds at most ``batch_memory_budget_bytes`` of mail (or its first mail
  alone when larger), from the claim on: the claim's content is read within it,
  the mails claimed last given up first; they are given back at once and the
  next claims are smaller.
"""

from __future__ import annotations

import functools
import logging
import math
import threading
import time
import uuid
from collections import Counter, OrderedDict
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from typing import Any, Callable, Iterable, TypeVar

from .. import procedures
from ..connection import Backoff, ReconnectingConnection, is_transient
from ..errors import DatabaseError, LeaseLostError
from ..procedures import ClaimedMail, held_bytes
from .account import AccountSender, SenderPauses
from .classify import RETRY, STOP, WAIT, Escalation, Outcome
from .config import AccountConfig, Config
from .lazy import LazyContentError, needs_preparing, prepare
from .logs import event, mail_state
from .metrics import Metrics
from .smtp import SmtpSession

log = logging.getLogger("mailq_db.worker")

T = TypeVar("T")

#: Mark*/Release error texts are cut to what the column keeps.
MAX_ERROR = 2000
#: How often each worker runs mailq.FinalizeMail (expired and out-of-attempts
#: mail, which the claim no longer touches); see docs/operator-guide.md.
FINALIZE_INTERVAL_SECONDS = 60.0
#: While blocking work runs in a helper thread, leases and stop are looked at this often.
POLL_SECONDS = 0.2
#: Back-off between two attempts at writing the same acknowledgements.
ACK_RETRY_MIN_SECONDS, ACK_RETRY_MAX_SECONDS = 0.05, 5.0
#: IDs per acknowledgement call (the procedures take 1-1000).
ACK_CHUNK = 1000


def utcnow() -> datetime:
    """Naive UTC, like the procedures' DATETIME2 values."""
    return datetime.now(timezone.utc).replace(tzinfo=None)


class Interrupted(Exception):
    """A stop request arrived while interruptible blocking work ran."""


class TimedOut(Exception):
    """Blocking work took longer than its limit (it is abandoned in its thread)."""


@dataclass
class _Ack:
    """What is still to be written for one decided mail."""

    mail_id: int
    account: str
    outcome: Outcome | None  # None: sent (MarkSent); else MarkFailed with it
    code: int | None = None
    text: str | None = None
    dry_run: bool = False
    #: RecordRecipientOutcomes rows, written first; None once written (or none to write)
    recipients: list[dict[str, Any]] | None = None
    #: a temporary failure waiting for the account's verdict: decided when a mail
    #: of the account is accepted or its batch ends (a Retry, charged), or turned
    #: into the account's Wait when its failures escalate (refunded)
    undecided: bool = False
    message_id: str | None = None
    queue_id: str | None = None  # the relay's queue ID from its final reply
    #: the server may have the mail (no reply after the final dot): MarkFailed
    #: flags it PossibleDuplicate
    possible_duplicate: bool = False


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
        monotonic: Callable[[], float] = time.monotonic,
        name: str | None = None,
        dry_run: bool | None = None,
        sleep: Callable[[float], Any] | None = None,
        pause: Callable[[float], Any] = time.sleep,
        generators: Any = None,
        escalation: Escalation | None = None,
        sender_pauses: SenderPauses | None = None,
    ):
        self.config = config
        self.settings = config.worker
        self.db = db
        self.procs = procs
        self.stop = stop or threading.Event()
        self.metrics = metrics or Metrics()
        self.session_factory = session_factory
        #: this host's wall clock: logs only, never a lease (see the module docstring)
        self.clock = clock
        self.monotonic = monotonic
        #: waits for the login interval; returns early when ``stop`` is set
        self.sleep = sleep or self.stop.wait
        #: waits between two attempts at writing acknowledgements (also while stopping)
        self.pause = pause
        self.name = name or self.settings.worker_name
        self.dry_run = self.settings.dry_run if dry_run is None else dry_run
        #: attachment generators by name (None: the installed entry points)
        self.generators = generators
        #: shared by the threads of a process (runner.run_workers passes one)
        self.escalation = escalation or Escalation(config.escalation)
        self.pauses = sender_pauses or SenderPauses(monotonic)
        self.token = uuid.uuid4()
        self.held: dict[int, ClaimedMail] = {}  # leased, not yet decided
        self.maybe_delivered: set[int] = set()  # held mails the server may already have
        self.acks: OrderedDict[int, _Ack] = OrderedDict()  # decided, not yet written
        self._failed_status: dict[int, str] = {}  # MarkFailed's status per mail, for its state line
        self.leases: dict[int, float] = {}  # monotonic deadline of every lease held (held and acks)
        self._acks_since = 0.0
        self._stopping_since: float | None = None
        self._finalized_at = float("-inf")  # maybe_finalize: never yet
        #: set when the database has no mailq.AcquireLoginSlot (older than this worker)
        self._no_login_slots = False
        #: mail ID -> {address: outcome} of recipients handled in earlier attempts
        self.done_recipients: dict[int, dict[str, str]] = {}
        #: mails to ask for at the next claim (smaller after large mails: the memory budget)
        self.claim_size = self.settings.batch_size

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
                log.exception("batch abandoned; its undecided leases were given back or will expire")
                self.db.discard()
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
        mails = self._claim()
        claimed = len(mails)
        if not mails:
            return 0
        try:
            mails = self._within_budget(mails)
            mails = self._prepare_lazy(mails)
            self.done_recipients = self._recipients_done(mails)
            groups = group_by_account(mails)
            mails = []  # the groups hold the mails; each is dropped once sent
            while groups and not self.stop.is_set():
                account, group = groups.popitem(last=False)
                self.send_account(account, group)
                self.flush_acks(wait=True)
        finally:
            self._finish_batch()
        return claimed

    def _claim(self) -> list[ClaimedMail]:
        s = self.settings
        if not self.held and not self.acks:
            # A new token per claimed batch (ClaimMail's contract): a token names one lease of one batch.
            self.token = uuid.uuid4()
        started = self.monotonic()
        mails: list[ClaimedMail] = self.db.call(
            self.procs.claim_mail, batch_size=self.claim_size, lock_token=self.token,
            lease_seconds=s.lease_seconds, app_name=s.app_name, worker_name=self.name,
            account_names=list(self.config.accounts), run_modes=list(s.run_modes),
            max_batch_bytes=s.batch_memory_budget_bytes,
        )
        self.metrics.observe_claim(self.monotonic() - started)
        self.metrics.inc("claims")
        if mails:
            self.metrics.inc("claimed", len(mails))
        for m in mails:
            self.held[m.id] = m
            self.leases[m.id] = started + self._granted(getattr(m, "lease_seconds_remaining", None))
            mail_state(log, mail_id=m.id, account=m.account_name, message_id=m.message_id, status="Sending",
                       outcome="Claimed", attempt=m.attempt_no, worker=self.name)
            if m.possible_duplicate:
                event(log, logging.WARNING, "claimed a mail whose earlier lease ran out (PossibleDuplicate): "
                      "a copy may already have reached its recipients", mail_id=m.id, message_id=m.message_id,
                      attempt_no=m.attempt_no)
        return mails

    def _granted(self, seconds_remaining: int | None) -> float:
        """The seconds a claim or extension granted: what the database reports, else
        what was asked for (the database counted from a later moment: never less)."""
        return float(self.settings.lease_seconds if seconds_remaining is None else seconds_remaining)

    def _finish_batch(self) -> None:
        """Write what is pending (waiting while the leases last, at most
        ack_shutdown_wait_seconds when stopping), give back what was not sent,
        and leave what could not be written to lease expiry."""
        for account in {a.account for a in self.acks.values() if a.undecided}:
            self.decide(account)
        try:
            self.flush_acks(wait=True)
        finally:
            if self.held:
                self.release(list(self.held.values()), "worker stopping" if self.stop.is_set() else "batch ended")
            self._give_up_acks()
            self.done_recipients = {}
            self.maybe_delivered.clear()  # each entry became its mail's acknowledgement flag

    # ------------------------------------------------------------ memory

    def _within_budget(self, mails: list[ClaimedMail]) -> list[ClaimedMail]:
        """Gives back at once the mails the claim left over the batch memory budget
        (their content was dropped as it arrived: ClaimBudget); the next claim asks
        for as many mails of the largest size seen as the budget holds."""
        budget = self.settings.batch_memory_budget_bytes
        largest = max([m.content_bytes for m in mails] + [1])
        self.claim_size = max(1, min(self.settings.batch_size, budget // largest))
        over = [m for m in mails if m.over_budget]
        if over:
            self.metrics.inc("budget_releases", len(over))
            self.release(over, f"over the batch memory budget ({budget} bytes)")
        return [m for m in mails if not m.over_budget]

    # ------------------------------------------------------------ lazy content

    def _prepare_lazy(self, mails: list[ClaimedMail]) -> list[ClaimedMail]:
        """Render template mail and generate lazy attachments before any login, each
        mail within generator_timeout_seconds while the leases are kept.  A mail
        whose content cannot be made is stopped with the reason (a fix + RequeueMail
        sends it); one whose generator raised, failed in a way not foreseen or took
        too long is deferred (Retry).  A stop request ends the preparation: the
        mails not prepared are released."""
        ready: list[ClaimedMail] = []
        used, largest, budget = 0, 1, self.settings.batch_memory_budget_bytes
        for mail in mails:
            if self.stop.is_set():
                break
            if needs_preparing(mail):
                self.maintain_leases(flush=False)
            if mail.id not in self.held:
                continue  # lease lost meanwhile: another worker has the mail
            prepared = self._prepare_one(mail) if needs_preparing(mail) else mail
            if prepared is None:
                continue
            size = held_bytes(prepared)
            largest = max(largest, size)
            if ready and used + size > budget:
                self.metrics.inc("budget_releases")
                self.release([mail], "over the batch memory budget once its content was made")
                continue
            used += size
            self.held[mail.id] = prepared
            ready.append(prepared)
        # made content counts for the next claim's size too, or the same mails are made again and again
        self.claim_size = max(1, min(self.claim_size, budget // largest))
        return [m for m in ready if m.id in self.held]

    def _prepare_one(self, mail: ClaimedMail) -> ClaimedMail | None:
        allowed = self.config.generators_for(mail.app_name)
        limit = self.settings.generator_timeout_seconds
        try:
            return self.blocking(lambda: prepare(mail, registry=self.generators, allowed=allowed),
                                 limit=limit, interruptible=True)
        except Interrupted:
            return None  # released with the rest when the batch ends
        except TimedOut:
            reason, retry = (f"lazy content took longer than {limit:g} s (generator_timeout_seconds); "
                             "the generator was abandoned"), True
        except LazyContentError as exc:
            reason, retry = exc.reason, exc.retry
        except Exception as exc:  # noqa: BLE001 - one mail's content must not abandon the batch
            # Not foreseen by lazy.py: deferred (not known to be permanent; the attempts bound it).
            log.warning("lazy content of mail %s failed unexpectedly", mail.id, exc_info=True)
            reason, retry = f"lazy content could not be made: {type(exc).__name__}: {exc}", True
        self.metrics.inc("lazy_content_errors")
        self.fail([mail], Outcome(RETRY if retry else STOP, reason, "lazy content", None, None, "mail"))
        return None

    # ------------------------------------------------------------ blocking work

    def blocking(self, work: Callable[[], T], *, limit: float | None = None, interruptible: bool = False) -> T:
        """``work()`` in a helper thread while this thread keeps the leases (and, when
        ``interruptible``, watches ``stop``); raises what ``work`` raised,
        :class:`Interrupted` or :class:`TimedOut` (the thread is then abandoned:
        Python cannot end it, its result is ignored)."""
        box: dict[str, Any] = {}
        done = threading.Event()

        def target() -> None:
            try:
                box["result"] = work()
            except BaseException as exc:  # noqa: BLE001 - handed to the caller
                box["error"] = exc
            finally:
                done.set()

        threading.Thread(target=target, name=f"{threading.current_thread().name}-work", daemon=True).start()
        started = self.monotonic()
        while not done.wait(POLL_SECONDS):
            self.maintain_leases(flush=False)
            if interruptible and self.stop.is_set():
                raise Interrupted()
            if limit is not None and self.monotonic() - started > limit:
                raise TimedOut()
        if "error" in box:
            raise box["error"]
        result: T = box["result"]
        return result

    # ------------------------------------------------------------ one account

    def send_account(self, account_name: str, mails: list[ClaimedMail]) -> None:
        account = self.config.accounts.get(account_name)
        if account is None:
            self.fail(mails, Outcome(WAIT, f"account {account_name!r} is not in this worker's "
                                     "configuration: add [accounts." + account_name + "]",
                                     "unknown account", None, 300, "account"))
            return
        AccountSender(self, account, mails).run()

    def account_wait(self, account: AccountConfig, outcome: Outcome, *, observed: bool = False) -> Outcome:
        """A Wait of ``account`` with its block time: the account's wait_min_seconds at
        least, lengthened by the escalation while Waits keep coming back, capped at
        wait_max_seconds."""
        if outcome.disposition != WAIT:
            return outcome
        if account.wait_min_seconds and not observed:
            outcome = replace(outcome, retry_after_seconds=int(max(1, account.wait_min_seconds)))
        if not observed:
            outcome = self.escalation.observe(account.name, outcome)
        seconds = min(outcome.retry_after_seconds or 60, account.wait_max_seconds)
        self.metrics.set_blocked(account.name, True)
        return replace(outcome, retry_after_seconds=max(1, int(seconds)))

    def login_wait(self, account: AccountConfig) -> float | None:
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
            # A database without mailq.AcquireLoginSlot (workers upgraded first):
            # it cannot hold an interval either, so every login is allowed.
            self._no_login_slots = True
            event(log, logging.WARNING, "mailq.AcquireLoginSlot is missing (the database is older than "
                  "this worker): no minimum interval between logins is enforced", account=account.name,
                  error=str(exc))
            return None
        if slot.granted:
            return None
        return float(max(slot.wait_ms, 1)) / 1000.0

    def sleeps_for_login(self, account: AccountConfig, mail: ClaimedMail, wait: float, slept: float = 0.0) -> bool:
        """Sleep when the next login is near (at most login_sleep_max_seconds away,
        counting what was already slept for this connection) and the lease still
        covers the wait plus the safety margin; True when it slept.  The count
        keeps a worker that other workers beat to the slot from sleeping again
        and again while holding its whole batch."""
        if slept + wait > account.login_sleep_max_seconds:
            return False
        if self.lease_left(mail.id) - wait < self.settings.lease_safety_margin_seconds:
            return False
        self.metrics.inc("login_sleeps", account=account.name)
        event(log, logging.INFO, "waiting for the account's minimum interval between logins",
              account=account.name, mail_id=mail.id, wait_seconds=round(wait, 3))
        self.sleep(wait)
        return True

    def defer_for_login(self, account: AccountConfig, mails: list[ClaimedMail], wait: float) -> None:
        """The next login is too far away: the batch goes back as a Wait for exactly
        that long (the attempt is refunded and the account blocked until then, so no
        worker claims it sooner).  Not the provider's throttling: the escalation's
        back-off is neither used nor reset."""
        self.metrics.inc("login_deferrals", account=account.name)
        self.fail(mails, Outcome(
            WAIT, f"minimum interval between logins on account {account.name!r}: the next login is "
            f"allowed in {wait:.3f} s (more than login_sleep_max_seconds = {account.login_sleep_max_seconds:g}, "
            "or the lease would not cover the wait)", "login interval", None, max(1, math.ceil(wait)), "account"))

    # ------------------------------------------------------------ recipients

    def _recipients_done(self, mails: list[ClaimedMail]) -> dict[int, dict[str, str]]:
        """Recipients already delivered or refused in earlier attempts (mails claimed before).
        A failure here ends the batch before any mail is sent: every mail is released."""
        again = [m.id for m in mails if (m.attempt_no or 0) > 1]
        if not again or not hasattr(self.procs, "get_recipient_outcomes"):
            return {}
        try:
            done: dict[int, dict[str, str]] = self.db.call(self.procs.get_recipient_outcomes, ids=again,
                                                           lock_token=self.token)
        except LeaseLostError:
            return {}
        return done

    # ------------------------------------------------------------ decisions

    def ack(self, mail: ClaimedMail, code: int | None, text: str | None, *,
            recipients: list[dict[str, Any]] | None = None, queue_id: str | None = None) -> None:
        """The server accepted ``mail``: its MarkSent is kept until written (with the
        recipients' outcomes first)."""
        self._decided(mail, _Ack(mail.id, mail.account_name, None, code, text,
                                 self.dry_run or bool(mail.dry_run), recipients,
                                 message_id=mail.message_id, queue_id=queue_id))

    def fail(self, mails: Iterable[ClaimedMail], outcome: Outcome, *, undecided: bool = False,
             recipients: list[dict[str, Any]] | None = None) -> None:
        """Record ``outcome`` (Retry, Wait or Stop) for ``mails``: written at once, and
        kept until written when the database fails.  ``undecided``: held until the
        account's verdict (see :class:`_Ack`)."""
        mails = [m for m in mails if m.id in self.held]
        if not mails:
            return
        level = logging.ERROR if outcome.disposition == STOP else logging.WARNING
        event(log, level, outcome.disposition, ids=[m.id for m in mails], reason=outcome.reason,
              rule=outcome.rule, smtp_code=outcome.smtp_code, retry_after_seconds=outcome.retry_after_seconds,
              undecided=undecided or None)
        for m in mails:
            self._decided(m, _Ack(m.id, m.account_name, outcome, recipients=recipients, undecided=undecided,
                                  message_id=m.message_id))
        if not undecided:
            self._write_acks(sent=False)

    def decide(self, account: str, wait: Outcome | None = None) -> None:
        """The account's undecided failures get their verdict: ``wait`` (the account's
        failures escalated: refunded) or their own Retry (charged)."""
        changed = False
        for a in self.acks.values():
            if a.undecided and a.account == account:
                a.undecided = False
                if wait is not None:
                    a.outcome = wait  # one MarkFailed for the account's whole Wait
                changed = True
        if changed:
            self._write_acks(sent=False)

    def _decided(self, mail: ClaimedMail, ack: _Ack) -> None:
        self.held.pop(mail.id, None)
        if mail.id in self.maybe_delivered:
            self.maybe_delivered.discard(mail.id)
            ack.possible_duplicate = ack.outcome is not None
        if not self.acks:
            self._acks_since = self.monotonic()
        self.acks[mail.id] = ack

    def release(self, mails: Iterable[ClaimedMail], why: str) -> None:
        """Give back undecided mails now (attempt refunded).  A mail with a decided,
        unwritten acknowledgement is never among them."""
        ids = [m.id for m in mails if m.id in self.held]
        if not ids:
            return
        by_id = {m.id: m for m in mails if m.id in ids}
        for i in ids:
            self.held.pop(i, None)
        done: list[int] = []

        def lost(i: int, exc: BaseException) -> None:
            event(log, logging.WARNING, "release refused; the lease will expire", mail_id=i, error=str(exc))

        try:
            for chunk in _chunks(ids):
                done += self._apply(chunk, lambda c: self.db.call(self.procs.release_mail, ids=c,
                                                                  lock_token=self.token), lost)
        except Exception as exc:  # noqa: BLE001 - a release that fails leaves the lease to expire
            event(log, logging.WARNING, "release failed; the leases will expire", ids=ids, error=str(exc))
        for i in ids:
            self.leases.pop(i, None)
        if done:
            self.metrics.inc("released", len(done))
            event(log, logging.INFO, "released", ids=done, why=why)
        for i in done:
            mail_state(log, mail_id=i, account=by_id[i].account_name, message_id=by_id[i].message_id,
                       status="UnSent", outcome="Released", reason=why)

    # ------------------------------------------------------------ writing acknowledgements

    def flush_acks(self, *, wait: bool = False) -> None:
        """Write every pending acknowledgement.  ``wait``: retry what failed with a
        transient error (backoff) while the leases it is fenced by last and at most
        lease_seconds (when stopping, at most ack_shutdown_wait_seconds more)."""
        if not self.acks:
            return
        self._write_acks()
        if not wait:
            return
        backoff = Backoff(ACK_RETRY_MIN_SECONDS, ACK_RETRY_MAX_SECONDS)
        started = self.monotonic()
        while self._unwritten() and self.monotonic() < self._ack_deadline(started):
            self.pause(min(backoff.next(), max(0.0, self._ack_deadline(started) - self.monotonic())))
            self.maintain_leases(flush=False)
            self._write_acks()

    def _unwritten(self) -> bool:
        return any(not a.undecided for a in self.acks.values())

    def _ack_deadline(self, started: float) -> float:
        pending = [self.leases.get(a.mail_id, started) for a in self.acks.values() if not a.undecided]
        deadline = min([started + self.settings.lease_seconds, *pending])
        if self.stop.is_set():
            if self._stopping_since is None:
                self._stopping_since = self.monotonic()
            deadline = min(deadline, self._stopping_since + self.settings.ack_shutdown_wait_seconds)
        return deadline

    def _write_acks(self, *, sent: bool = True) -> None:
        """One attempt at the pending acknowledgements (recipients' outcomes first,
        then failures, then, with ``sent``, MarkSent); what failed with a
        transient error stays pending."""
        try:
            self._write_recipients()
            self._write_failures()
            if sent:
                self._write_sent()
        except Exception as exc:  # noqa: BLE001 - only transient errors come out of the writers
            self.metrics.inc("ack_retries")
            event(log, logging.WARNING, "acknowledgements not written yet: kept and retried",
                  pending=len(self.acks), error=str(exc))

    def _write_recipients(self) -> None:
        for a in [a for a in self.acks.values() if a.recipients is not None and not a.undecided]:
            rows = a.recipients

            def record(ids: list[int], rows: list[dict[str, Any]] | None = rows) -> None:
                self.db.call(self.procs.record_recipient_outcomes, mail_id=ids[0], lock_token=self.token,
                             outcomes=rows)

            if not hasattr(self.procs, "record_recipient_outcomes") or self._apply([a.mail_id], record, self._lost):
                a.recipients = None

    def _write_failures(self) -> None:
        groups: OrderedDict[tuple[Outcome, bool], list[int]] = OrderedDict()
        for a in self.acks.values():
            if a.outcome is not None and a.recipients is None and not a.undecided:
                groups.setdefault((a.outcome, a.possible_duplicate), []).append(a.mail_id)
        for (outcome, possible_duplicate), ids in groups.items():
            mark = functools.partial(self._mark_failed, outcome, possible_duplicate)
            for chunk in _chunks(ids):
                done = self._apply(chunk, mark, self._lost)
                self._written(done, {STOP: "failed", RETRY: "retried", WAIT: "waited"}[outcome.disposition],
                              outcome.smtp_code)

    def _mark_failed(self, outcome: Outcome, possible_duplicate: bool, ids: list[int]) -> None:
        rows = self.db.call(self.procs.mark_failed, ids=ids, lock_token=self.token, disposition=outcome.disposition,
                            error=outcome.reason[:MAX_ERROR], retry_after_seconds=outcome.retry_after_seconds,
                            smtp_code=outcome.smtp_code, possible_duplicate=possible_duplicate)
        for r in rows or []:  # the status MarkFailed left each mail in (UnSent or Failed), for its state line
            self._failed_status[r.mail_id] = r.status

    def _mark_sent(self, code: int | None, text: str | None, dry: bool, ids: list[int]) -> None:
        self.db.call(self.procs.mark_sent, ids=ids, lock_token=self.token, smtp_code=code,
                     smtp_text=text[:MAX_ERROR] if text else None, dry_run=dry)

    def _write_sent(self) -> None:
        # Every mail stores its own final reply (with the server's queue ID); mails
        # with the same reply share one MarkSent call, dry-run ones apart (@DryRun = 1).
        groups: OrderedDict[tuple[int | None, str | None, bool], list[int]] = OrderedDict()
        for a in self.acks.values():
            if a.outcome is None and a.recipients is None:
                groups.setdefault((a.code, a.text, a.dry_run), []).append(a.mail_id)
        for (code, text, dry), ids in groups.items():
            mark = functools.partial(self._mark_sent, code, text, dry)
            for chunk in _chunks(ids):
                done = self._apply(chunk, mark, self._lost)
                self._written(done, "sent", code)
                if done:
                    event(log, logging.INFO, "acknowledged", count=len(done), ids=done, dry_run=dry)

    def _written(self, ids: list[int], counter: str, code: int | None) -> None:
        accounts = Counter(self.acks[i].account for i in ids if i in self.acks)
        for i in ids:
            a = self.acks.pop(i, None)
            self.leases.pop(i, None)
            if a is not None:
                self._state_line(a)
        for account, n in accounts.items():
            self.metrics.inc(counter, n, account=account, code=code)

    def _state_line(self, a: _Ack) -> None:
        """The mail's state-change line, once the database has its acknowledgement."""
        if a.outcome is None:
            mail_state(log, mail_id=a.mail_id, account=a.account, message_id=a.message_id, status="Sent",
                       outcome="DryRun" if a.dry_run else "Sent", queue_id=a.queue_id, smtp_code=a.code)
            return
        level = logging.ERROR if a.outcome.disposition == STOP else logging.WARNING
        mail_state(log, mail_id=a.mail_id, account=a.account, message_id=a.message_id,
                   status=self._failed_status.pop(a.mail_id, None), outcome=a.outcome.disposition,
                   smtp_code=a.outcome.smtp_code, reason=a.outcome.reason, level=level)

    def _apply(self, ids: list[int], call: Callable[[list[int]], Any],
               failed: Callable[[int, BaseException], None]) -> list[int]:
        """``call(ids)`` at once; when a lease is lost or the database refuses the
        call (it wrote nothing), once per mail so the valid ones are still written.
        Returns the IDs written; ``failed(id, error)`` for each refused one.  A
        transient error is raised: the caller keeps everything not yet written."""
        try:
            call(ids)
            return list(ids)
        except Exception as exc:
            if is_transient(exc):
                raise
            if len(ids) == 1:
                failed(ids[0], exc)
                return []
        done: list[int] = []
        for i in ids:
            try:
                call([i])
                done.append(i)
            except Exception as exc:
                if is_transient(exc):
                    self._written_partly(done)
                    raise
                failed(i, exc)
        return done

    def _written_partly(self, ids: list[int]) -> None:
        for i in ids:
            if i in self.acks and self.acks[i].recipients is not None:
                self.acks[i].recipients = None

    def _lost(self, mail_id: int, exc: BaseException) -> None:
        """The database refused an acknowledgement for good (lease lost, mail gone):
        it is not retried; an accepted mail may then be sent twice."""
        a = self.acks.pop(mail_id, None)
        self.leases.pop(mail_id, None)
        if isinstance(exc, LeaseLostError):
            self.metrics.inc("lease_lost")
        if a is None:
            return
        if a.outcome is None:
            event(log, logging.ERROR, "lease lost after the SMTP server accepted the mail: possibly sent twice"
                  if isinstance(exc, LeaseLostError) else
                  "the database refused the acknowledgement of a mail the server accepted: possibly sent twice",
                  mail_id=mail_id, error=str(exc))
        else:
            event(log, logging.WARNING, "lease lost before the failure was recorded; the new owner decides"
                  if isinstance(exc, LeaseLostError) else "the database refused the failure; the lease will expire",
                  mail_id=mail_id, error=str(exc))

    def _give_up_acks(self) -> None:
        """What could not be written is left to lease expiry: the reclaim flags the
        mail PossibleDuplicate.  One WARNING line per mail."""
        for mail_id, a in list(self.acks.items()):
            self.metrics.inc("acks_abandoned")
            event(log, logging.WARNING,
                  "acknowledgement not written: the mail is left to lease expiry and its reclaim flags it "
                  "PossibleDuplicate" if a.outcome is None else
                  "failure not written: the mail is left to lease expiry",
                  mail_id=mail_id, account=a.account, disposition=a.outcome.disposition if a.outcome else "Sent")
            self.leases.pop(mail_id, None)
        self.acks.clear()

    # ---------------------------------------------------------------- leases

    def lease_left(self, mail_id: int) -> float:
        """Seconds left on this worker's lease of ``mail_id`` (by this process's monotonic clock)."""
        return self.leases.get(mail_id, float("-inf")) - self.monotonic()

    def maintain_leases(self, *, flush: bool = True) -> None:
        """Write old acknowledgements (``flush``); extend every lease held once half of it is used up."""
        if flush and self.acks and self.monotonic() - self._acks_since >= self.settings.ack_interval_seconds:
            self._write_acks()
            self._acks_since = self.monotonic()
        if not self.leases or min(self.leases.values()) - self.monotonic() >= self.settings.lease_seconds / 2:
            return
        ids = list(self.leases)
        started = self.monotonic()
        try:
            new = self._extend(ids)
        except Exception as exc:  # noqa: BLE001 - the leases run on; the margin protects the sends
            event(log, logging.WARNING, "lease extension failed", error=str(exc))
            return
        self.metrics.inc("lease_extensions")
        for i in ids:
            if i in new:
                self.leases[i] = started + self._granted(new[i].seconds_remaining)
            elif i in self.held:
                self.held.pop(i)
                self.leases.pop(i, None)
                self.metrics.inc("lease_lost")
                event(log, logging.WARNING, "lease lost before sending; another worker has the mail", mail_id=i)
            # a mail with a pending acknowledgement: its write tells whether the lease was lost

    def _extend(self, ids: list[int]) -> dict[int, procedures.Lease]:
        def extend(chunk: list[int]) -> dict[int, procedures.Lease]:
            result: dict[int, procedures.Lease] = self.db.call(
                self.procs.extend_lease, ids=chunk, lock_token=self.token, lease_seconds=self.settings.lease_seconds)
            return result

        try:
            return extend(ids)
        except LeaseLostError:
            new: dict[int, procedures.Lease] = {}
            for i in ids:
                try:
                    new.update(extend([i]))
                except LeaseLostError:
                    pass
            return new


def _chunks(ids: list[int]) -> list[list[int]]:
    return [ids[i:i + ACK_CHUNK] for i in range(0, len(ids), ACK_CHUNK)]


def group_by_account(mails: Iterable[ClaimedMail]) -> "OrderedDict[str, list[ClaimedMail]]":
    """Mails per account, accounts in the order of their first (highest-priority) mail."""
    groups: OrderedDict[str, list[ClaimedMail]] = OrderedDict()
    for m in mails:
        groups.setdefault(m.account_name, []).append(m)
    return groups
