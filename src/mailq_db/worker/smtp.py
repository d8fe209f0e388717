"""One SMTP connection per account batch: connect, STARTTLS, log in once, send many.

Errors are raised as they come (smtplib exceptions, ``OSError``, or
:class:`SetupError` for a server that lacks what the account requires) with
the ``stage`` attribute set, so :mod:`mailq_db.worker.classify` can decide.

What this layer does on purpose (issue 14, checked against Postfix in
tests/realmta):

* **One AUTH attempt** with one mechanism (PLAIN, else LOGIN): a wrong
  password is tried once, never once per mechanism.  Accounts with
  ``auth = "xoauth2"`` / ``"oauthbearer"`` send one AUTH with a token
  (:mod:`mailq_db.worker.sasl`); a refused token is dropped and ``open``
  connects once more with a new one (again one AUTH on that connection).
* **SIZE** (RFC 1870): when the server advertises a limit, MAIL FROM declares
  the message size, and a message above the limit is refused before MAIL
  (:class:`MessageTooBig`, a Stop).
* **PIPELINING** (RFC 2920): when offered, MAIL FROM, every RCPT TO and DATA
  are written at once and the replies read in order; DATA is the last command
  of the group, and the message is sent only after its 354.
* **Partial recipients**: each refused RCPT is returned with its reply; a
  "452 4.5.3 too many recipients" (RFC 5321 4.5.3.1.10) is not a refusal:
  the rest is sent in a follow-up transaction on the same connection, so every
  recipient receives the mail once.
* **Timeouts** (RFC 5321 4.5.3.2): ``command_timeout_seconds`` for commands,
  ``final_reply_timeout_seconds`` (default 600 s, 4.5.3.2.6) for the reply
  after the final dot.  A timeout or a lost connection after the final dot is
  :class:`OutcomeUnknown`: the server may have accepted the mail.
* **A dead idle connection** (closed by the server between two mails, or a
  421 to the next MAIL FROM) is :class:`ConnectionGone`: nothing of the mail
  was sent, the worker reconnects once without charging the mail.
"""

from __future__ import annotations

import re
import smtplib
import socket
import ssl
from dataclasses import dataclass, field

from . import dkim, sasl
from .classify import NeedsSmtpUtf8, SetupError
from .config import AccountConfig
from .message import Outgoing

#: "250 2.0.0 Ok: queued as 4Ab1C2" (Postfix), "250 OK id=1abcde-000123-AB" (Exim), "... queued as <id>"
QUEUE_ID = re.compile(r"queued as\s+<?([A-Za-z0-9._-]+)>?|\bid=([A-Za-z0-9._-]+)", re.IGNORECASE)


@dataclass
class SendResult:
    code: int
    text: str
    refused: dict[str, tuple[int, str]] = field(default_factory=dict)  # recipients refused (any code)
    accepted: list[str] = field(default_factory=list)
    transactions: int = 1
    queue_ids: list[str] = field(default_factory=list)

    @property
    def queue_id(self) -> str | None:
        return ",".join(self.queue_ids) or None


class MessageTooBig(smtplib.SMTPException):
    """The message is larger than the server's advertised SIZE (RFC 1870)."""


class OutcomeUnknown(smtplib.SMTPException):
    """The message was sent but the final reply never came: it may have been accepted."""


class ConnectionGone(smtplib.SMTPException):
    """A reused connection was found dead at the next MAIL FROM: nothing was sent."""


def _text(reply: bytes | str) -> str:
    return reply.decode("utf-8", "replace") if isinstance(reply, bytes) else str(reply)


def queue_id(text: str) -> str | None:
    m = QUEUE_ID.search(text or "")
    return (m.group(1) or m.group(2)) if m else None


def too_many_recipients(code: int, text: str) -> bool:
    """RFC 5321 4.5.3.1.10: 452 (or, from old servers, 552) 'too many recipients'."""
    return code in (452, 552) and ("4.5.3" in text or "5.5.3" in text or "too many recipients" in text.lower())


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
        self.transactions = 0  # transactions completed on this connection
        self.last_reply: tuple[int, str] | None = None

    # ------------------------------------------------------------ connect
    def open(self) -> "SmtpSession":
        try:
            return self._connect()
        except sasl.TokenRejected as exc:
            # The token was dropped from the cache: one more connection with a new one.
            sasl.refused_once(self, exc)
            return self._connect()

    def _connect(self) -> "SmtpSession":
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
            self.stage = "ehlo"
            self._ehlo()
            if a.tls == "starttls":
                if not smtp.has_extn("starttls"):
                    raise SetupError(f"STARTTLS required but not offered by {a.host}:{a.port} "
                                     f"(account {a.name}; set tls in the worker config)")
                self.stage = "starttls"
                smtp.starttls(context=tls_context(a))
                smtp.sock.settimeout(a.command_timeout_seconds)
                self.stage = "ehlo"
                self._ehlo()
            if a.user:
                self.stage = "auth"
                if a.auth == "password":
                    self._login(a.user, a.password or "")
                else:
                    sasl.token_login(self)
        except BaseException:
            self.close()
            raise
        return self

    def _ehlo(self) -> None:
        assert self.smtp is not None
        code, reply = self.smtp.ehlo()
        if code != 250:
            # no HELO fallback: a server that refuses EHLO cannot do STARTTLS, AUTH or SIZE anyway
            raise smtplib.SMTPHeloError(code, reply)

    def _login(self, user: str, password: str) -> None:
        """AUTH exactly once (smtplib's login() tries every mechanism in turn)."""
        smtp = self.smtp
        assert smtp is not None
        if not smtp.has_extn("auth"):
            raise SetupError(f"{self.account.host}:{self.account.port} does not offer AUTH "
                             f"(account {self.account.name} has a user; is the port a submission port?)")
        offered = smtp.esmtp_features["auth"].upper().split()
        mechanism = next((m for m in ("PLAIN", "LOGIN") if m in offered), None)
        if mechanism is None:
            raise SetupError(f"{self.account.host} offers AUTH {' '.join(offered)}, not PLAIN or LOGIN")
        smtp.user, smtp.password = user, password
        method = smtp.auth_plain if mechanism == "PLAIN" else smtp.auth_login
        smtp.auth(mechanism, method, initial_response_ok=True)  # raises SMTPAuthenticationError on 535

    # ------------------------------------------------------------ state
    @property
    def supports_smtputf8(self) -> bool:
        return bool(self.smtp and self.smtp.has_extn("smtputf8"))

    @property
    def pipelining(self) -> bool:
        return bool(self.smtp and self.smtp.has_extn("pipelining") and self.account.pipelining)

    @property
    def size_limit(self) -> int | None:
        if not (self.smtp and self.smtp.has_extn("size")):
            return None
        try:
            value = int(self.smtp.esmtp_features["size"].split()[0])
        except (ValueError, IndexError):
            return None
        return value or None  # SIZE 0: no fixed limit (RFC 1870 4)

    @property
    def connected(self) -> bool:
        return self.smtp is not None and self.smtp.sock is not None

    # ------------------------------------------------------------ send
    def send(self, out: Outgoing) -> SendResult:
        """Deliver ``out`` to every recipient the server accepts (one or more transactions).

        Returns the last final reply, the accepted recipients and the refused
        ones with their replies (never "too many recipients": those are sent in
        a follow-up transaction).  Raises when no recipient received the mail:
        ``SMTPSenderRefused`` (MAIL), ``SMTPRecipientsRefused`` (every RCPT),
        ``SMTPDataError`` (DATA or the final reply), :class:`MessageTooBig`,
        :class:`OutcomeUnknown`, :class:`ConnectionGone`.
        """
        assert self.smtp is not None, "open() first"
        out = dkim.sign_outgoing(self.account, out)
        options: list[str] = []
        if out.smtputf8:
            if not self.supports_smtputf8:
                raise NeedsSmtpUtf8(
                    f"an address is not ASCII and {self.account.host} does not offer SMTPUTF8")
            options = ["SMTPUTF8", "BODY=8BITMIME"]
        payload = _dot_stuffed(out.data)
        limit = self.size_limit
        if limit is not None:
            if len(out.data) > limit:
                raise MessageTooBig(
                    f"the message is {len(out.data)} bytes; {self.account.host} accepts at most "
                    f"{limit} (SIZE, RFC 1870): not sent")
            options.append(f"SIZE={len(out.data)}")
        todo = list(out.recipients)
        result = SendResult(0, "", transactions=0)
        while todo:
            code, text, accepted, refused, later = self._transaction(out.envelope_from, todo, options, payload,
                                                                     first=result.transactions == 0)
            result.transactions += 1
            if accepted:
                result.code, result.text = code, text
            result.accepted += accepted
            result.refused.update(refused)
            qid = queue_id(text)
            if qid:
                result.queue_ids.append(qid)
            if not accepted:
                # nothing accepted in this transaction: the rest cannot go either
                result.refused.update({r: (code, text) for r in later})
                break
            todo = later
        if not result.accepted:
            raise smtplib.SMTPRecipientsRefused(
                {r: (c, t.encode() if isinstance(t, str) else t) for r, (c, t) in result.refused.items()})
        return result

    def _transaction(self, sender: str, recipients: list[str], options: list[str], payload: bytes,
                     *, first: bool) -> tuple[int, str, list[str], dict[str, tuple[int, str]], list[str]]:
        """MAIL, RCPT..., DATA, message: (final code, text, accepted, refused, too-many-later)."""
        smtp = self.smtp
        assert smtp is not None
        reused = self.transactions > 0 and first
        mail_cmd = _line("MAIL FROM:" + smtplib.quoteaddr(sender), options)
        rcpt_cmds = [_line("RCPT TO:" + smtplib.quoteaddr(r), []) for r in recipients]
        pipelined = self.pipelining
        self.stage = "mail"
        try:
            if pipelined:
                smtp.send(b"".join([mail_cmd, *rcpt_cmds, b"DATA\r\n"]))
            else:
                smtp.send(mail_cmd)
            mail_code, mail_text = self._reply()
        except (smtplib.SMTPServerDisconnected, ConnectionError, OSError) as exc:
            if reused and not isinstance(exc, (socket.timeout, TimeoutError)):
                self.abort()
                raise ConnectionGone(f"the connection was closed while idle: {exc}") from exc
            raise
        if mail_code == 421 and reused:
            self.abort()
            raise ConnectionGone(f"421 at MAIL FROM on a reused connection: {mail_text}")

        accepted: list[str] = []
        refused: dict[str, tuple[int, str]] = {}
        later: list[str] = []
        if mail_code != 250:
            if pipelined:
                self._drain(len(rcpt_cmds) + 1)  # the RCPTs' and DATA's replies (503s)
            self._reset(mail_code)
            raise smtplib.SMTPSenderRefused(mail_code, mail_text.encode(), sender)
        self.stage = "rcpt"
        for rcpt, cmd in zip(recipients, rcpt_cmds):
            if not pipelined:
                smtp.send(cmd)
            code, text = self._reply()
            if code in (250, 251):
                accepted.append(rcpt)
            elif too_many_recipients(code, text) and accepted:
                later.append(rcpt)
            else:
                refused[rcpt] = (code, text)
            if code == 421:
                self.abort()
                refused.update({r: (code, text) for r in recipients if r not in accepted and r not in refused})
                raise smtplib.SMTPRecipientsRefused({r: (c, t.encode()) for r, (c, t) in refused.items()})
        self.stage = "data"
        if pipelined:
            data_code, data_text = self._reply()
        elif accepted:
            smtp.send(b"DATA\r\n")
            data_code, data_text = self._reply()
        else:
            data_code, data_text = 0, ""
        if not accepted:
            # RFC 2920 3.1: a pipelined DATA after no accepted RCPT is refused by the
            # server (Postfix: 554 5.5.1 no valid recipients); never send the message.
            if data_code == 354:  # a broken server: end the empty data phase
                smtp.send(b".\r\n")
                self._reply()
            self._reset(data_code)
            return 0, "", [], refused, later
        if data_code != 354:
            self._reset(data_code)
            raise smtplib.SMTPDataError(data_code, data_text.encode())
        self.stage = "dot"
        smtp.send(payload)
        deadline_timeout = self.account.final_reply_timeout_seconds
        try:
            smtp.sock.settimeout(deadline_timeout)
            code, text = self._reply()
        except (smtplib.SMTPServerDisconnected, OSError) as exc:
            self.abort()
            raise OutcomeUnknown(
                f"no reply after the final dot ({type(exc).__name__}: {exc}): the server may have "
                "accepted the mail") from exc
        finally:
            if self.smtp is not None and self.smtp.sock is not None:
                self.smtp.sock.settimeout(self.account.command_timeout_seconds)
        if code != 250:
            self._reset(code)
            raise smtplib.SMTPDataError(code, text.encode())
        self.transactions += 1
        return code, text, accepted, refused, later

    def _reply(self) -> tuple[int, str]:
        assert self.smtp is not None
        code, text = self.smtp.getreply()
        self.last_reply = (code, _text(text))
        return code, _text(text)

    def _drain(self, n: int) -> None:
        for _ in range(n):
            try:
                self._reply()
            except (smtplib.SMTPException, OSError):
                self.abort()
                return

    def _reset(self, code: int) -> None:
        if code == 421 or not self.connected:
            self.abort()
            return
        try:
            assert self.smtp is not None
            rcode, _ = self.smtp.rset()
            if rcode == 421:
                self.abort()
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
        """QUIT politely (also after errors); ignore a server that is already gone."""
        if self.smtp is not None and self.smtp.sock is not None:
            try:
                self.smtp.sock.settimeout(min(5.0, self.account.command_timeout_seconds))
                self.smtp.quit()
            except (smtplib.SMTPException, OSError):
                pass
        self.abort()


def _line(command: str, options: list[str]) -> bytes:
    text = command + "".join(f" {o}" for o in options)
    return (text + "\r\n").encode("utf-8")


def _dot_stuffed(data: bytes) -> bytes:
    """The DATA payload: CRLF line ends, leading dots doubled, the final CRLF.CRLF (RFC 5321 4.5.2)."""
    q = smtplib.bCRLF.join(re.split(rb"\r\n|\r|\n", data))
    q = re.sub(rb"(?m)^\.", b"..", q)
    if not q.endswith(smtplib.bCRLF):
        q += smtplib.bCRLF
    return q + b"." + smtplib.bCRLF

