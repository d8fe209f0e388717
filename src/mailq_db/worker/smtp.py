"""One SMTP connection per account batch: connect, STARTTLS, log in once, send many.

Errors are raised as they come (smtplib exceptions, ``OSError``, or
:class:`SetupError` for a server that lacks what the account requires) with
the ``stage`` attribute set, so :mod:`mailq_db.worker.classify` can decide.
"""

from __future__ import annotations

import smtplib
import ssl
from dataclasses import dataclass, field

from .classify import NeedsSmtpUtf8, SetupError
from .config import AccountConfig
from .message import Outgoing


@dataclass
class SendResult:
    code: int
    text: str
    refused: dict[str, tuple[int, str]] = field(default_factory=dict)  # partially refused recipients


def _text(reply: bytes | str) -> str:
    return reply.decode("utf-8", "replace") if isinstance(reply, bytes) else str(reply)


def tls_context(account: AccountConfig) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=account.ca_file)
    if not account.verify_tls:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    return context


class SmtpSession:
    """An open, authenticated connection to one account's server."""

    def __init__(self, account: AccountConfig):
        self.account = account
        self.smtp: smtplib.SMTP | None = None
        self.stage = "connect"

    def open(self) -> "SmtpSession":
        a = self.account
        self.stage = "connect"
        try:
            if a.tls == "implicit":
                smtp: smtplib.SMTP = smtplib.SMTP_SSL(
                    a.host, a.port, local_hostname=a.local_hostname,
                    timeout=a.connect_timeout_seconds, context=tls_context(a))
            else:
                smtp = smtplib.SMTP(a.host, a.port, local_hostname=a.local_hostname,
                                    timeout=a.connect_timeout_seconds)
            self.smtp = smtp
            smtp.sock.settimeout(a.command_timeout_seconds)
            smtp.ehlo()
            if a.tls == "starttls":
                if not smtp.has_extn("starttls"):
                    raise SetupError(f"STARTTLS required but not offered by {a.host}:{a.port} "
                                     f"(account {a.name}; set tls in the worker config)")
                code, reply = smtp.starttls(context=tls_context(a))
                smtp.sock.settimeout(a.command_timeout_seconds)
                smtp.ehlo()
            if a.user:
                self.stage = "auth"
                smtp.login(a.user, a.password or "")
        except BaseException:
            self.abort()
            raise
        return self

    @property
    def supports_smtputf8(self) -> bool:
        return bool(self.smtp and self.smtp.has_extn("smtputf8"))

    @property
    def connected(self) -> bool:
        return self.smtp is not None and self.smtp.sock is not None

    def send(self, out: Outgoing) -> SendResult:
        """One SMTP transaction: MAIL, RCPT for each recipient, DATA.

        Returns the final reply; raises the smtplib exception of the step that
        failed (``self.stage`` says which).  Recipients refused while others
        were accepted are reported in ``SendResult.refused``.
        """
        smtp = self.smtp
        assert smtp is not None, "open() first"
        mail_options: list[str] = []
        if out.smtputf8:
            if not self.supports_smtputf8:
                raise NeedsSmtpUtf8(
                    f"an address is not ASCII and {self.account.host} does not offer SMTPUTF8")
            mail_options = ["SMTPUTF8", "BODY=8BITMIME"]
        self.stage = "mail"
        code, reply = smtp.mail(out.envelope_from, mail_options)
        if code != 250:
            self._reset(code)
            raise smtplib.SMTPSenderRefused(code, reply, out.envelope_from)
        self.stage = "rcpt"
        refused: dict[str, tuple[int, str]] = {}
        for rcpt in out.recipients:
            code, reply = smtp.rcpt(rcpt)
            if code not in (250, 251):
                refused[rcpt] = (code, _text(reply))
                if code == 421:
                    self.abort()
                    raise smtplib.SMTPRecipientsRefused(refused)
        if len(refused) == len(out.recipients):
            self._reset(0)
            raise smtplib.SMTPRecipientsRefused(refused)
        self.stage = "data"
        code, reply = smtp.data(out.data)
        if code != 250:
            self._reset(code)
            raise smtplib.SMTPDataError(code, reply)
        return SendResult(code, _text(reply), refused)

    def _reset(self, code: int) -> None:
        if code == 421:
            self.abort()
            return
        try:
            assert self.smtp is not None
            self.smtp.rset()
        except (smtplib.SMTPException, OSError):
            self.abort()

    def abort(self) -> None:
        """Drop the connection without a goodbye."""
        if self.smtp is not None:
            try:
                self.smtp.close()
            except OSError:
                pass
        self.smtp = None

    def close(self) -> None:
        """QUIT politely; ignore a server that is already gone."""
        if self.smtp is not None and self.smtp.sock is not None:
            try:
                self.smtp.quit()
            except (smtplib.SMTPException, OSError):
                pass
        self.abort()
