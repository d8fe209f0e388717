"""The one table that turns SMTP outcomes into Retry, Wait or Stop.

Documented, rule by rule, in ``docs/smtp-classification.md``; change both
together.  The first matching rule wins.

* **Retry** - transient trouble with this mail: the attempt is consumed and
  the database schedules the next one with backoff.
* **Wait** - the account is throttled, locked or unreachable: the account is
  blocked until ``retry_after_seconds`` from now and the attempt is refunded.
  A Wait always applies to the whole rest of the account's batch.
* **Stop** - permanent: the mail is ``Failed`` at once.

Stages are where the reply came: ``connect`` (greeting), ``ehlo``,
``starttls``, ``auth``, ``mail`` (MAIL FROM), ``rcpt`` (RCPT TO), ``data``
(the reply to DATA), ``dot`` (the final reply after the message; ``data`` is
accepted as its alias), ``rset``, ``quit``.

Every outcome has a ``scope``: ``recipient`` (one RCPT refused), ``mail``,
``account`` (a Wait: the account or client is throttled or refused) or
``connection`` (the connection is unusable; nothing is the mail's fault).
"""

from __future__ import annotations

import re
import smtplib
import socket
import ssl
from dataclasses import dataclass

RETRY, WAIT, STOP = "Retry", "Wait", "Stop"
STAGES = ("connect", "ehlo", "starttls", "auth", "mail", "rcpt", "data", "dot", "rset", "quit")
MAIL_STAGES = ("mail", "rcpt", "data", "dot")
CONNECT_STAGES = ("connect", "ehlo", "starttls")
SCOPES = ("recipient", "mail", "account", "connection")

#: Reply texts that mean "you are sending too much / the account is locked".
THROTTLE_TEXT = re.compile(
    r"throttl|rate[ -]?limit|too many|exceed|slow down|try again in|locked|quota|frequency|"
    r"sending limit|limit reached|temporarily blocked|temporarily rate|"
    r"too much mail|too many connections",  # Postfix anvil: smtpd_client_*_rate_limit
    re.IGNORECASE,
)
#: 5xx texts that mean an account-wide quota, not a bad mail (e.g. a daily sending cap).
QUOTA_TEXT = re.compile(
    r"sending (?:limit|quota|rate)|(?:daily|hourly) (?:user )?(?:sending )?(?:limit|quota)|"
    r"quota exceeded|rate limit",
    re.IGNORECASE,
)
#: Postfix rejections of the client (its HELO name, its address, the sender
#: address), not of this mail; with smtpd_delay_reject = yes (the default)
#: they arrive at RCPT TO.  The operator must fix the configuration.
CLIENT_REJECTED_TEXT = re.compile(
    r"Helo command rejected|Client host rejected|Sender address rejected", re.IGNORECASE)


class SetupError(smtplib.SMTPException):
    """The server cannot serve the account as configured (e.g. STARTTLS not offered)."""


class NeedsSmtpUtf8(smtplib.SMTPException):
    """A non-ASCII address, and the server does not offer SMTPUTF8."""


@dataclass(frozen=True)
class Rule:
    name: str
    disposition: str
    codes: range | tuple[int, ...] = ()
    stages: tuple[str, ...] = STAGES
    text: re.Pattern[str] | None = None
    retry_after_seconds: int | None = None  # None: the database's default backoff / block time


#: code ranges
ANY_4XX = range(400, 500)
ANY_5XX = range(500, 600)

RULES: tuple[Rule, ...] = (
    Rule("421 service closing", WAIT, (421,), retry_after_seconds=120),
    Rule("client or sender rejected by policy", WAIT, range(400, 600), ("mail", "rcpt"),
         text=CLIENT_REJECTED_TEXT, retry_after_seconds=900),
    Rule("4xx throttle or lock text", WAIT, ANY_4XX, text=THROTTLE_TEXT, retry_after_seconds=300),
    Rule("452 insufficient storage / too many recipients", WAIT, (452,), retry_after_seconds=300),
    Rule("454 temporary TLS or auth failure", WAIT, (454,), (*CONNECT_STAGES, "auth"), retry_after_seconds=300),
    Rule("5xx quota or sending limit", WAIT, ANY_5XX, text=QUOTA_TEXT, retry_after_seconds=3600),
    Rule("auth temporary failure", WAIT, ANY_4XX, ("auth",), retry_after_seconds=300),
    Rule("auth refused (credentials or policy)", WAIT, ANY_5XX, ("auth",), retry_after_seconds=900),
    Rule("connect-stage error", WAIT, range(400, 600), CONNECT_STAGES, retry_after_seconds=300),
    Rule("552 at RCPT is transient (RFC 5321 4.5.3.1.10)", RETRY, (552,), ("rcpt",)),
    Rule("4xx on this mail", RETRY, ANY_4XX, MAIL_STAGES),
    Rule("5xx permanent for this mail", STOP, ANY_5XX, MAIL_STAGES),
)

#: Unknown codes (outside 4xx/5xx, e.g. a bogus reply) are retried.
DEFAULT_RULE = Rule("unexpected reply", RETRY)


@dataclass(frozen=True)
class Outcome:
    """What to do with a mail: the disposition, why, and how long to block the account."""

    disposition: str
    reason: str
    rule: str
    smtp_code: int | None = None
    retry_after_seconds: int | None = None
    #: recipient | mail | account | connection (see the module docstring)
    scope: str = "mail"

    @property
    def account_wide(self) -> bool:
        """A Wait blocks the account: the rest of its batch is given back the same way."""
        return self.disposition == WAIT


def _text(reply: bytes | str | None) -> str:
    if isinstance(reply, bytes):
        return reply.decode("utf-8", "replace")
    return reply or ""


def classify_reply(code: int, text: bytes | str | None, stage: str, provider: str | None = None) -> Outcome:
    """Classify one SMTP reply ``code``/``text`` received at ``stage``."""
    if stage not in STAGES:
        raise ValueError(f"unknown stage {stage!r}")
    message = _text(text)
    for rule in RULES:
        if rule.codes and code not in rule.codes:
            continue
        if stage not in rule.stages and not (stage == "data" and "dot" in rule.stages):
            continue
        if rule.text is not None and not rule.text.search(message):
            continue
        break
    else:
        rule = DEFAULT_RULE
    reason = f"{code} {message}".strip() + f" (at {stage.upper()}; rule: {rule.name})"
    if rule.disposition == WAIT:
        scope = "account"
    elif stage == "rcpt":
        scope = "recipient"
    else:
        scope = "mail"
    return Outcome(rule.disposition, reason, rule.name, code, rule.retry_after_seconds, scope)


def permanent(reason: str) -> Outcome:
    """A mail that can never be sent as stored (malformed, unsendable address)."""
    return Outcome(STOP, reason, "malformed mail")


def classify_exception(exc: BaseException, stage: str, provider: str | None = None) -> Outcome:
    """Classify an exception raised while talking to the server at ``stage``.

    Replies carried by smtplib exceptions go through :func:`classify_reply`.
    Dropped connections and timeouts: Retry for the mail in flight; before any
    mail (``connect``/``auth``) they mean the account is unreachable: Wait.
    """
    if isinstance(exc, smtplib.SMTPRecipientsRefused):
        # Every recipient refused: classify by the most severe reply (a Wait
        # beats a Stop beats a Retry, so a throttled account is never charged).
        outcomes = [classify_reply(code, text, "rcpt") for code, text in exc.recipients.values()]
        order = {WAIT: 0, STOP: 1, RETRY: 2}
        return min(outcomes, key=lambda o: order[o.disposition])
    if isinstance(exc, smtplib.SMTPSenderRefused):
        return classify_reply(exc.smtp_code, exc.smtp_error, "mail")
    if isinstance(exc, smtplib.SMTPAuthenticationError):
        return classify_reply(exc.smtp_code, exc.smtp_error, "auth")
    if isinstance(exc, smtplib.SMTPResponseException):
        return classify_reply(exc.smtp_code, exc.smtp_error, stage)
    account_stage = stage in (*CONNECT_STAGES, "auth")
    if isinstance(exc, NeedsSmtpUtf8):
        return Outcome(STOP, f"{exc} (RFC 6531); the address cannot be delivered through this account",
                       "SMTPUTF8 needed")
    if isinstance(exc, SetupError):
        return Outcome(WAIT, str(exc), "account setup failed", None, 600, "account")
    if isinstance(exc, smtplib.SMTPNotSupportedError) or isinstance(exc, ssl.SSLError):
        kind = "TLS failure" if isinstance(exc, ssl.SSLError) else "not supported by the server"
        if account_stage:
            return Outcome(WAIT, f"{kind}: {exc} (at {stage.upper()})", "account setup failed", None, 600,
                           "account")
        return Outcome(RETRY, f"{kind}: {exc} (at {stage.upper()})", "transport error")
    if isinstance(exc, (smtplib.SMTPServerDisconnected, socket.timeout, TimeoutError, OSError)):
        kind = "timeout" if isinstance(exc, (socket.timeout, TimeoutError)) else "connection lost"
        if account_stage:
            return Outcome(WAIT, f"{kind}: {exc or type(exc).__name__} (at {stage.upper()})",
                           "server unreachable", None, 60, "account")
        return Outcome(RETRY, f"{kind}: {exc or type(exc).__name__} (at {stage.upper()})",
                       "dropped connection or timeout")
    return Outcome(RETRY, f"{type(exc).__name__}: {exc} (at {stage.upper()})", "unexpected error")
