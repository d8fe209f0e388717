"""The mails of one account in one claimed batch, over one SMTP connection.

:class:`AccountSender` is the per-account loop of :class:`~mailq_db.worker.loop.Worker`:
it opens the session (asking the account's login slot first), sends the mails
one by one, and turns each outcome into what it concerns (the scope of
:mod:`mailq_db.worker.classify`):

* a recipient: that recipient's outcome is recorded, the others get the mail;
* the mail: Retry or Stop for that mail;
* the sender address: a Stop fails that mail, a Retry pauses that From address
  (:class:`SenderPauses`) and the account's other mail goes on;
* the connection or the server: the session is dropped and the mail is sent
  again on a new one (once); repeated, :class:`~classify.Escalation` makes
  it an account pause, and the mails whose failure was the server's are given
  back uncharged with the rest (see "undecided" in Worker.fail);
* the account: a Wait for this mail and the rest of the account's batch.

The worker never writes to the database from here except through its own
methods (``fail``, ``ack``, ``record``), which keep every acknowledgement until
it is written.
"""

from __future__ import annotations

import logging
import math
import smtplib
import threading
import time
from dataclasses import replace
from typing import TYPE_CHECKING, Callable

from ..bounces.outgoing import prepare as prepare_outgoing
from ..procedures import ClaimedMail
from .classify import (
    ACCOUNT, CONNECTION, MAIL, RETRY, SENDER, STOP, WAIT, Outcome, classify_exception, classify_reply, permanent,
    reply_text, resolve_provider,
)
from .config import AccountConfig
from .logs import event
from .message import MalformedMail, Outgoing, build
from .sasl import auth_fix
from .smtp import ConnectionGone, MessageTooBig, OutcomeUnknown, SendResult, SmtpSession

if TYPE_CHECKING:  # pragma: no cover
    from .loop import Worker

log = logging.getLogger("mailq_db.worker")

#: Postfix's rejections of the client, not of the mail (logged at ERROR for the operator)
CLIENT_REJECTED = ("Helo command rejected", "Client host rejected")
#: A sender-address Retry pauses the From address this long when its rule names no time.
DEFAULT_SENDER_PAUSE = 300


class SenderPauses:
    """From addresses paused after a temporary refusal of the sender address, per
    account, shared by the worker threads of one process (thread-safe).

    The pause lives in this process: another worker process learns it from its own
    refusal.  A mail whose From is paused is given back as a Retry due when the
    pause ends (an attempt is spent, as a refused attempt would spend it), without
    talking to the server."""

    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self._clock = clock
        self._until: dict[tuple[str, str], tuple[float, str]] = {}
        self._lock = threading.Lock()

    def pause(self, account: str, address: str, seconds: float, reason: str) -> None:
        with self._lock:
            self._until[(account, address.lower())] = (self._clock() + seconds, reason)

    def remaining(self, account: str, address: str) -> tuple[float, str] | None:
        """(seconds left, the refusal that paused it), or None when not paused."""
        key = (account, address.lower())
        with self._lock:
            until, reason = self._until.get(key, (0.0, ""))
            left = until - self._clock()
            if left <= 0:
                self._until.pop(key, None)
                return None
            return left, reason



class AccountSender:
    """Sends one account's share of a batch; see the module docstring."""

    def __init__(self, worker: "Worker", account: AccountConfig, mails: list[ClaimedMail]):
        self.w = worker
        self.account = account
        self.queue = list(mails)
        self.session: SmtpSession | None = None
        self.provider: str | None = resolve_provider(account.provider, account.host)
        self.resent: set[int] = set()  # mails sent again once on a new session
        self.login_slept = 0.0  # seconds slept for the login interval before the next connection

    # ------------------------------------------------------------ the loop
    def run(self) -> None:
        try:
            while self.queue and not self.w.stop.is_set():  # when stopping, run_batch releases the rest
                self.w.maintain_leases()
                mail = self.queue.pop(0)
                if not self._ready(mail):
                    continue
                out = self._outgoing(mail)
                if out is None:
                    continue
                if self.w.dry_run or mail.dry_run:
                    self._dry_run(mail, out)
                    continue
                state = self._connect_for(mail)
                if state == _AGAIN:
                    continue  # back to the top: stop, leases and the login slot checked again
                if state == _DONE:
                    return
                self._send(mail, out)
        finally:
            if self.session is not None:
                self.session.close()
            self.w.decide(self.account.name)

    def _ready(self, mail: ClaimedMail) -> bool:
        """Still ours, with enough lease left, and its From address not paused."""
        w = self.w
        if mail.id not in w.held:
            return False  # lease lost while extending
        if w.lease_left(mail.id) < w.settings.lease_safety_margin_seconds:
            w.release([mail], "lease shorter than the safety margin")
            return False
        paused = w.pauses.remaining(self.account.name, mail.from_address)
        if paused is not None:
            left, reason = paused
            w.fail([mail], Outcome(RETRY, f"the From address {mail.from_address} is paused for {left:.0f} s "
                                   f"more after: {reason}", "sender address paused", None,
                                   max(1, math.ceil(left)), SENDER))
            return False
        return True

    def _outgoing(self, mail: ClaimedMail) -> Outgoing | None:
        """The message to send, without the recipients handled in earlier attempts;
        None when there is nothing (left) to send."""
        w = self.w
        try:
            # VERP return path and bulk mail's List-Unsubscribe (mailq_db.bounces.outgoing)
            out = prepare_outgoing(mail, self.account, build)
        except MalformedMail as exc:
            w.fail([mail], permanent(f"malformed mail: {exc}"))
            return None
        earlier = {a.lower(): o for a, o in w.done_recipients.get(mail.id, {}).items()
                   if o in ("Delivered", "Refused")}
        if not earlier:
            return out
        left = tuple(r for r in out.recipients if r.lower() not in earlier)
        if left:
            event(log, logging.INFO, "sending to the recipients left from an earlier attempt",
                  mail_id=mail.id, recipients=list(left), already=sorted(earlier))
            return replace(out, recipients=left)
        if "Delivered" in earlier.values():
            w.ack(mail, None, "every recipient was handled in an earlier attempt")
        else:
            w.fail([mail], Outcome(STOP, "every recipient was refused in an earlier attempt",
                                   "recipients refused", None, None, "recipient"))
        return None

    def _dry_run(self, mail: ClaimedMail, out: Outgoing) -> None:
        # The worker's dry-run, or the application's (ClaimMail said DryRun = 1):
        # the whole path but SMTP, before any connection or login slot.
        reason = "dry run: nothing sent" if self.w.dry_run else \
            f"dry run of application {mail.app_name!r}: nothing sent"
        self.settle(mail, out, SendResult(0, reason, accepted=list(out.recipients)))

    # ------------------------------------------------------------ the session
    def _connect_for(self, mail: ClaimedMail) -> str:
        """_SEND when a session is open for ``mail``; _AGAIN when the mail went back to
        the head of the queue after a sleep for the login interval; _DONE when the
        account's batch ended here (given back as a Wait)."""
        if self.session is not None and self.session.connected:
            return _SEND
        wait = self.w.login_wait(self.account)
        if wait is not None:
            if self.w.sleeps_for_login(self.account, mail, wait, self.login_slept):
                self.login_slept += wait
                self.queue.insert(0, mail)
                return _AGAIN
            self.w.defer_for_login(self.account, [mail, *self.queue], wait)
            self.queue.clear()
            return _DONE
        self.login_slept = 0.0
        return _SEND if self._open(mail) else _DONE

    def _open(self, mail: ClaimedMail) -> bool:
        session = self.w.session_factory(self.account)
        self.session = session
        try:
            self.w.blocking(session.open)
        except Exception as exc:  # noqa: BLE001 - classified
            self._open_failed(session, exc, mail)
            return False
        self.w.metrics.inc("smtp_connections", account=self.account.name)
        self.provider = resolve_provider(self.account.provider, self.account.host,
                                         getattr(session, "greeting", None), getattr(session, "ehlo_domain", None))
        return True

    def _open_failed(self, session: SmtpSession, exc: BaseException, mail: ClaimedMail) -> None:
        a = self.account
        outcome = classify_exception(exc, session.stage, self.provider)
        if session.stage == "auth" and isinstance(exc, smtplib.SMTPAuthenticationError):
            event(log, logging.ERROR, f"authentication failed for account {a.name}",
                  account=a.name, user=a.user, smtp_code=exc.smtp_code, reply=reply_text(exc.smtp_error),
                  fix=auth_fix(a, outcome))
        self._wait_all(mail, outcome)

    # ------------------------------------------------------------ one mail
    def _send(self, mail: ClaimedMail, out: Outgoing) -> None:
        session = self.session
        assert session is not None
        started = time.monotonic()
        try:
            result = self.w.blocking(lambda: session.send(out))
        except ConnectionGone as exc:
            self._gone(mail, exc)
            return
        except smtplib.SMTPRecipientsRefused as exc:
            # Every recipient refused: each refusal is judged for its recipient (a
            # Wait or a sender refusal among them decides for the whole mail).
            self.w.metrics.observe_send(time.monotonic() - started, self.account.name, None)
            refused = {r: (c, reply_text(t)) for r, (c, t) in exc.recipients.items()}
            self._after(mail, self.settle(mail, out, SendResult(0, "", refused=refused)))
            return
        except Exception as exc:  # noqa: BLE001 - classified
            if isinstance(exc, OutcomeUnknown):
                self.w.maybe_delivered.add(mail.id)
            outcome = self._classify_send_error(exc, session.stage)
            self.w.metrics.observe_send(time.monotonic() - started, self.account.name, outcome.smtp_code)
            self._failed(mail, outcome)
            return
        self.w.metrics.observe_send(time.monotonic() - started, self.account.name, result.code)
        if result.outcome_unknown:
            self.w.maybe_delivered.add(mail.id)
        self._after(mail, self.settle(mail, out, result))

    def _after(self, mail: ClaimedMail, wait: Outcome | None) -> None:
        """A Wait found among the recipients' replies: the rest of the batch waits too."""
        if wait is not None:
            self.w.fail(self.queue, self.w.account_wait(self.account, wait))
            self.queue.clear()

    def _gone(self, mail: ClaimedMail, exc: ConnectionGone) -> None:
        """Closed by the server while idle: nothing of this mail was sent."""
        if self.session is not None:
            self.session.abort()
        if mail.id not in self.resent:
            self.resent.add(mail.id)
            event(log, logging.INFO, "connection closed while idle; reconnecting",
                  account=self.account.name, mail_id=mail.id, reason=str(exc))
            self.queue.insert(0, mail)
            return
        a = self.account
        self._wait_all(mail, Outcome(WAIT, f"the connection to {a.host}:{a.port} died twice at MAIL FROM: {exc}",
                                     "dead connection", None, 60, ACCOUNT))

    def _classify_send_error(self, exc: BaseException, stage: str) -> Outcome:
        if isinstance(exc, MessageTooBig):
            return Outcome(STOP, str(exc), "message larger than the server's SIZE", 552, None, "mail")
        if isinstance(exc, OutcomeUnknown):
            # RFC 5321 4.5.3.2.6 / docs/guarantees.md: the server may have the mail.  Retried
            # on purpose (at-least-once, same Message-ID and Date); counted as an attempt.
            return Outcome(RETRY, f"outcome unknown: {exc}; retried with the same Message-ID "
                           "(at-least-once)", "outcome unknown after the final dot", None, None, "mail")
        return classify_exception(exc, stage, self.provider)

    def _failed(self, mail: ClaimedMail, outcome: Outcome) -> None:
        """One mail's send failed with ``outcome``: act on what it concerns."""
        if outcome.disposition == WAIT:
            self._client_rejected(outcome)
            self._wait_all(mail, outcome)
        elif outcome.disposition == STOP:
            self.w.fail([mail], outcome)
        elif outcome.scope == SENDER:
            self.pause_sender(mail, outcome)
            self.w.fail([mail], outcome)
        else:
            self._temporary(mail, outcome)

    def _temporary(self, mail: ClaimedMail, outcome: Outcome, *,
                   recipients: list[dict[str, object]] | None = None) -> None:
        """A Retry of scope mail or connection: the account's temporary failure
        (``recipients``: the outcomes to record with it, when it came at RCPT)."""
        w = self.w
        seen = w.escalation.observe(self.account.name, outcome)
        if seen.disposition == WAIT:  # escalated: the server is in trouble, not the mails
            w.metrics.inc("escalations", account=self.account.name)
            self._wait_all(mail, seen, observed=True, recipients=recipients)
            return
        if outcome.scope == CONNECTION and mail.id not in self.resent:
            # the session's trouble: send the mail once more on a new one (no recipient
            # has it: the recipients' outcomes of this try are not recorded)
            self.resent.add(mail.id)
            if self.session is not None:
                self.session.abort()
            self.queue.insert(0, mail)
            return
        w.fail([mail], outcome, recipients=recipients, undecided=True)

    def _wait_all(self, mail: ClaimedMail, outcome: Outcome, *, observed: bool = False,
                  recipients: list[dict[str, object]] | None = None) -> None:
        """This mail, the account's undecided failures and the rest of its batch wait
        (attempts refunded, the account blocked, the reason in the event stream)."""
        wait = self.w.account_wait(self.account, outcome, observed=observed)
        self.w.fail([mail], wait, recipients=recipients, undecided=True)
        self.w.fail(self.queue, wait, undecided=True)
        self.w.decide(self.account.name, wait)  # written together, in one MarkFailed
        self.queue.clear()

    def pause_sender(self, mail: ClaimedMail, outcome: Outcome) -> None:
        seconds = outcome.retry_after_seconds or DEFAULT_SENDER_PAUSE
        self.w.pauses.pause(self.account.name, mail.from_address, seconds, outcome.reason)
        self.w.metrics.inc("sender_pauses", account=self.account.name)
        event(log, logging.WARNING, "From address paused on this account", account=self.account.name,
              from_address=mail.from_address, seconds=seconds, reason=outcome.reason)

    def _client_rejected(self, outcome: Outcome) -> None:
        a = self.account
        if any(marker.lower() in (outcome.reason or "").lower() for marker in CLIENT_REJECTED):
            event(log, logging.ERROR, f"the server refuses this client for account {a.name}: "
                  "the operator must fix the configuration", account=a.name, reason=outcome.reason,
                  fix="HELO: set local_hostname to this machine's fully qualified name; client host: "
                  "ask the provider to allow this address")

    # ------------------------------------------------------------ recipients
    def settle(self, mail: ClaimedMail, out: Outgoing, result: SendResult) -> Outcome | None:
        """The server took the mail for some, all or none of the recipients: judge
        each refusal for its recipient and acknowledge the mail accordingly.
        Returns a Wait when a refusal blocks the account (the rest of the batch
        is given back the same way)."""
        judged = _Judged.of(result, self.provider)
        w = self.w
        if judged.sender is not None and result.accepted:
            # a sender refusal among accepted recipients: those recipients are tried again
            judged.deferred.update(judged.sender_refused)
            judged.sender = None
        if result.accepted:
            w.escalation.success(self.account.name)
            w.metrics.set_blocked(self.account.name, False)
            w.decide(self.account.name)
            event(log, logging.INFO, "sent", account=mail.account_name, mail_id=mail.id,
                  message_id=mail.message_id, queue_id=result.queue_id, smtp_code=result.code,
                  smtp_text=result.text, recipients=len(result.accepted), transactions=result.transactions,
                  refused=sorted(judged.refused) or None, deferred=sorted(judged.deferred) or None,
                  dry_run=(w.dry_run or mail.dry_run) or None)
        if judged.sender is not None and not result.accepted:
            if judged.sender.disposition == RETRY:
                self.pause_sender(mail, judged.sender)
            w.fail([mail], judged.sender)
            return judged.wait
        outcomes = judged.outcomes(result) if judged.refused or judged.deferred else None
        verdict = judged.verdict(result)
        if verdict is None:
            w.ack(mail, result.code or None, judged.text(result), recipients=outcomes, queue_id=result.queue_id)
        elif verdict.disposition == WAIT:
            self._client_rejected(verdict)
            self._wait_all(mail, verdict, recipients=outcomes)  # the rest of the batch waits with it
            return None
        elif judged.server is not None and not result.accepted:
            # Nobody accepted and a deferral was the server's (scope mail or connection, e.g.
            # "451 4.3.0 Temporary server error" to every RCPT): the account's temporary
            # failure, counted by the escalation like the same reply after the dot.
            self._temporary(mail, replace(verdict, scope=judged.server.scope), recipients=outcomes)
        else:
            w.fail([mail], verdict, recipients=outcomes)
        return judged.wait


_SEND, _AGAIN, _DONE = "send", "again", "done"


class _Judged:
    """The refusals of one send, judged recipient by recipient."""

    def __init__(self) -> None:
        self.refused: dict[str, tuple[int, str]] = {}
        self.deferred: dict[str, tuple[int, str]] = {}
        self.wait: Outcome | None = None
        self.sender: Outcome | None = None  # a refusal of the sender address (it names no recipient)
        self.sender_refused: dict[str, tuple[int, str]] = {}
        #: the first temporary refusal that is the server's, not its recipient's (scope mail or connection)
        self.server: Outcome | None = None
        self.reasons: dict[str, str] = {}  # recipient -> the classification's reason

    @classmethod
    def of(cls, result: SendResult, provider: str | None) -> "_Judged":
        j = cls()
        for rcpt, (code, text) in result.refused.items():
            verdict = classify_reply(code, text, result.stages.get(rcpt, "rcpt"), provider)
            j.reasons[rcpt] = verdict.reason
            if verdict.scope == SENDER:
                j.sender_refused[rcpt] = (code, text)
                j.sender = j.sender if j.sender is not None and j.sender.disposition == STOP else verdict
            elif verdict.disposition == STOP:
                j.refused[rcpt] = (code, text)
            else:
                j.deferred[rcpt] = (code, text)
                if verdict.disposition == WAIT and j.wait is None:
                    j.wait = verdict
                if verdict.disposition == RETRY and verdict.scope in (MAIL, CONNECTION) and j.server is None:
                    j.server = verdict
        return j

    def text(self, result: SendResult) -> str:
        """MarkSent's SmtpText: the last final reply, every queue ID when the mail took
        several transactions (452 too many recipients), then each refusal."""
        text = f"{result.code} {result.text}" if result.code else result.text
        if len(result.queue_ids) > 1:
            text += f" (queue IDs of its {len(result.queue_ids)} transactions: {', '.join(result.queue_ids)})"
        if self.refused or self.deferred:
            text += "; " + "; ".join(
                f"{'deferred' if r in self.deferred else 'refused'} {r}: {c} {t}"
                for r, (c, t) in [*self.refused.items(), *self.deferred.items()])
        return text

    def why(self) -> str:
        """Each refusal with its classification (the reply, the stage, the rule)."""
        return "; ".join(f"{'deferred' if r in self.deferred else 'refused'} {r}: {self.reasons.get(r, '')}"
                         for r in [*self.refused, *self.deferred])

    def outcomes(self, result: SendResult) -> list[dict[str, object]]:
        """RecordRecipientOutcomes' rows: Delivered, Refused (final) and Deferred (retried)."""
        rows: list[dict[str, object]] = [
            {"address": r, "outcome": "Delivered", "code": result.code or None, "text": result.text[:1000]}
            for r in result.accepted]
        rows += [{"address": r, "outcome": "Refused", "code": c, "text": t[:1000]} for r, (c, t) in self.refused.items()]
        rows += [{"address": r, "outcome": "Deferred", "code": c, "text": t[:1000]}
                 for r, (c, t) in self.deferred.items()]
        return rows

    def verdict(self, result: SendResult) -> Outcome | None:
        """None: acknowledge as sent; else the mail's own outcome."""
        if self.deferred:
            if not result.accepted and self.wait is not None:
                return self.wait  # a throttled account is never charged
            return Outcome(RETRY, f"delivered to {len(result.accepted)} recipient(s); deferred, retried later "
                           f"for those only: {self.why()}", "recipients deferred (4xx)",
                           min(c for c, _ in self.deferred.values()), None, "recipient")
        if result.accepted:
            return None
        return Outcome(STOP, f"every recipient refused: {self.why()}", "recipients refused",
                       min((c for c, _ in self.refused.values()), default=None), None, "recipient")


__all__ = ["AccountSender", "SenderPauses"]
