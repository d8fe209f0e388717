"""One SMTP connection per account batch: connect, STARTTLS, log in once, send many.

Errors are raised as they come (smtplib exceptions, ``OSError``, or
:class:`SetupError` for a server that lacks what the account requires) with
the ``stage`` attribute set, so :mod:`mailq_db.worker.classify` can decide.

What this layer guarantees (checked against Postfix in tests/realmta):

* **One connection sequence**: connect (and TLS for implicit TLS), greeting,
  EHLO, STARTTLS with the certificate checked, EHLO again, one AUTH.  The
  probe (``check-config --probe``) runs the same steps through ``on_step``.
* **One AUTH attempt** with one mechanism (PLAIN, else LOGIN, built here in
  UTF-8 as RFC 4616 says): a wrong password is tried once, never once per
  mechanism.  :meth:`SmtpSession._authenticate` is the only place that logs in;
  each mechanism is one method ``_auth_<name>``.  Accounts with
  ``auth = "xoauth2"`` / ``"oauthbearer"`` send one AUTH with a token
  (``_auth_xoauth2`` / ``_auth_oauthbearer``, the exchange in
  :mod:`mailq_db.worker.sasl`); a refused token is dropped and ``open``
  connects once more with a new one (again one AUTH on that connection).
* **DKIM**: an account with ``dkim`` signs each message just before it is sent
  (:mod:`mailq_db.worker.dkim`).
* **SIZE** (RFC 1870): when the server advertises a limit, MAIL FROM declares
  the message size, and a message above the limit is refused before MAIL
  (:class:`MessageTooBig`, a Stop).
* **PIPELINING** (RFC 2920): when offered, MAIL FROM, every RCPT TO and DATA
  are written at once and the replies read in order; DATA is the last command
  of the group, and the message is sent only after its 354.
* **Partial recipients**: each refused RCPT is returned with its reply; a
  "452 4.5.3 too many recipients" (RFC 5321 4.5.3.1.10) is not a refusal:
  the rest is sent in a follow-up transaction on the same connection, so every
  recipient receives the mail once.  When a follow-up transaction fails, the
  recipients of the earlier ones are still returned as accepted and the
  follow-up's recipients as refused with that failure (never raised away).
* **Timeouts** (RFC 5321 4.5.3.2): ``command_timeout_seconds`` for commands;
  the message content is written in chunks, each within
  ``data_timeout_seconds`` (Postfix's smtp_data_xfer_timeout: a limit on
  progress, so the time allowed grows with the message's size);
  ``final_reply_timeout_seconds`` (default 600 s, 4.5.3.2.6) for the reply
  after the final dot.  A timeout or a lost connection after the final dot is
  :class:`OutcomeUnknown`: the server may have accepted the mail.
* **A dead idle connection** (closed by the server between two mails, or a
  421 to the next MAIL FROM) is :class:`ConnectionGone`: nothing of the mail
  was sent, the worker reconnects once without charging the mail.
"""

from __future__ import annotations

import base64
import re
import smtplib
import socket
import ssl
from dataclasses import dataclass, field
from typing import Callable, Iterator

from . import dkim, oauth, sasl
from .classify import NeedsSmtpUtf8, SetupError, reply_text
from .config import AccountConfig
from .message import Outgoing

#: "250 2.0.0 Ok: queued as 4Ab1C2" (Postfix), "250 OK id=1abcde-000123-AB" (Exim), "... queued as <id>"
QUEUE_ID = re.compile(r"queued as\s+<?([A-Za-z0-9._-]+)>?|\bid=([A-Za-z0-9._-]+)", re.IGNORECASE)
#: The message content is written in chunks of this size, each within data_timeout_seconds.
DATA_CHUNK = 64 * 1024
#: AUTH mechanisms in order of preference (one attempt with the first the server offers).
AUTH_MECHANISMS = ("PLAIN", "LOGIN")
#: The code given to recipients of a follow-up transaction that broke without a reply:
#: a transient failure (the worker defers them), never a reply the server sent.
NO_REPLY = 451


@dataclass
class SendResult:
    code: int
    text: str
    refused: dict[str, tuple[int, str]] = field(default_factory=dict)  # recipients refused (any code)
    accepted: list[str] = field(default_factory=list)
    transactions: int = 1
    queue_ids: list[str] = field(default_factory=list)
    #: the stage of each refusal that did not come at RCPT (a failed follow-up transaction)
    stages: dict[str, str] = field(default_factory=dict)
    #: a follow-up transaction got no reply after its final dot: its recipients may have the mail
    outcome_unknown: bool = False

    @property
    def queue_id(self) -> str | None:
        return ",".join(self.queue_ids) or None


@dataclass
class _Transaction:
    """What one MAIL/RCPT/DATA transaction left: the final reply and the recipients."""

    code: int = 0
    text: str = ""
    accepted: list[str] = field(default_factory=list)
    refused: dict[str, tuple[int, str]] = field(default_factory=dict)
    later: list[str] = field(default_factory=list)  # "too many recipients": the next transaction's


class MessageTooBig(smtplib.SMTPException):
    """The message is larger than the server's advertised SIZE (RFC 1870)."""


class OutcomeUnknown(smtplib.SMTPException):
    """The message was sent but the final reply never came: it may have been accepted."""


class ConnectionGone(smtplib.SMTPException):
    """A reused connection was found dead at the next MAIL FROM: nothing was sent."""


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


def _b64(text: str) -> str:
    return base64.b64encode(text.encode("utf-8")).decode("ascii")


#: Reports one completed step of the connection sequence: (step, detail).
StepObserver = Callable[[str, str], None]


class SmtpSession:
    """An open, authenticated connection to one account's server."""

    def __init__(self, account: AccountConfig, *, on_step: StepObserver | None = None,
                 tokens: oauth.TokenCache | None = None, token_retry: bool = True):
        self.account = account
        self.smtp: smtplib.SMTP | None = None
        self.stage = "connect"
        self.transactions = 0  # transactions completed on this connection
        self.last_reply: tuple[int, str] | None = None
        #: the server's greeting and the domain its EHLO reply names (provider hints)
        self.greeting = ""
        self.ehlo_domain = ""
        self.on_step = on_step
        #: where a token account's tokens come from (None: the process cache, oauth.TOKENS),
        #: and whether a refused token is replaced once on a new connection
        self.tokens = tokens
        self.token_retry = token_retry

    # ------------------------------------------------------------ connect
    def open(self) -> "SmtpSession":
        """Connect, EHLO, STARTTLS, EHLO, AUTH; raises with ``stage`` set to the failing step.

        A token the server refuses (:class:`sasl.TokenRejected`) has been dropped from
        the cache: one more connection with a new token (unless ``token_retry`` is off);
        a second refusal is raised."""
        try:
            return self._open_once()
        except sasl.TokenRejected as exc:
            if not self.token_retry:
                raise
            sasl.refused_once(self, exc)
            return self._open_once()

    def _open_once(self) -> "SmtpSession":
        a = self.account
        try:
            self._connect()
            self.stage = "ehlo"
            self._ehlo("EHLO")
            if a.tls == "starttls":
                self.stage = "starttls"
                self._starttls()
                self.stage = "ehlo"
                self._ehlo("EHLO after STARTTLS")
            if a.user:
                self.stage = "auth"
                self._authenticate()
        except BaseException:
            self.close()
            raise
        return self

    def _step(self, name: str, detail: str) -> None:
        if self.on_step is not None:
            self.on_step(name, detail)

    def _connect(self) -> None:
        a = self.account
        self.stage = "connect"
        smtp: smtplib.SMTP
        if a.tls == "implicit":
            smtp = smtplib.SMTP_SSL(local_hostname=a.local_hostname, timeout=a.connect_timeout_seconds,
                                    context=tls_context(a))
        else:
            smtp = smtplib.SMTP(local_hostname=a.local_hostname, timeout=a.connect_timeout_seconds)
        # smtplib keeps the server name for TLS (SNI, certificate check) only when the
        # host is given to the constructor, which would also swallow the greeting.
        smtp._host = a.host  # type: ignore[attr-defined]
        self.smtp = smtp
        code, greeting = smtp.connect(a.host, a.port)
        self.greeting = reply_text(greeting)
        if code != 220:
            raise smtplib.SMTPConnectError(code, greeting)
        self._sock().settimeout(a.command_timeout_seconds)
        self._step(f"TCP {a.host}:{a.port}", f"{code} {' '.join(self.greeting.split())}")

    def _sock(self) -> socket.socket:
        assert self.smtp is not None and self.smtp.sock is not None, "not connected"
        return self.smtp.sock

    def _ehlo(self, step: str) -> None:
        assert self.smtp is not None
        code, reply = self.smtp.ehlo()
        if code != 250:
            # no HELO fallback: a server that refuses EHLO cannot do STARTTLS, AUTH or SIZE anyway
            raise smtplib.SMTPHeloError(code, reply)
        self.ehlo_domain = (reply_text(reply).split() or [""])[0]
        self._step(step, f"{code}; offers {', '.join(sorted(self.smtp.esmtp_features)) or 'nothing'}")

    def _starttls(self) -> None:
        a = self.account
        assert self.smtp is not None
        if not self.smtp.has_extn("starttls"):
            raise SetupError(f"STARTTLS required but not offered by {a.host}:{a.port} "
                             f"(account {a.name}; set tls in the worker config)")
        self.smtp.starttls(context=tls_context(a))
        sock = self._sock()
        sock.settimeout(a.command_timeout_seconds)
        version, subject = "TLS", ""
        if isinstance(sock, ssl.SSLSocket):
            version = sock.version() or version
            cert = sock.getpeercert() or {}
            names = dict(pair[0] for pair in cert.get("subject", ()) if pair)  # type: ignore[misc]
            subject = f" for {names['commonName']}" if names.get("commonName") else ""
        self._step("STARTTLS", f"{version}, certificate "
                   f"{'verified' if a.verify_tls else 'NOT verified (verify_tls = false)'}{subject}")

    def _authenticate(self) -> None:
        """AUTH exactly once, with the first mechanism of AUTH_MECHANISMS the server
        offers (smtplib's login() would try every mechanism in turn).  Raises
        SMTPAuthenticationError on a refusal (535), SetupError when no usable
        mechanism is offered."""
        a, smtp = self.account, self.smtp
        assert smtp is not None
        if not smtp.has_extn("auth"):
            raise SetupError(f"{a.host}:{a.port} does not offer AUTH "
                             f"(account {a.name} has a user; is the port a submission port?)")
        offered = smtp.esmtp_features["auth"].upper().split()
        mechanism = self._mechanism(offered)
        # one method per mechanism: _auth_plain, _auth_login, _auth_xoauth2, _auth_oauthbearer
        code, reply = getattr(self, f"_auth_{mechanism.lower()}")()
        if code not in (235, 503):  # 503: already authenticated
            raise smtplib.SMTPAuthenticationError(code, reply)
        self._step("AUTH", f"logged in as {a.user} (one attempt) with {mechanism}")

    def _mechanism(self, offered: list[str]) -> str:
        """The mechanism of this login: the token account's, else the first of AUTH_MECHANISMS offered."""
        a = self.account
        if a.auth != "password":
            mechanism = sasl.TOKEN_MECHANISMS[a.auth]
            sasl.check_offered(mechanism, offered, a.host)
            return mechanism
        password_mechanism = next((m for m in AUTH_MECHANISMS if m in offered), None)
        if password_mechanism is None:
            raise SetupError(f"{a.host} offers AUTH {' '.join(offered)}, not {' or '.join(AUTH_MECHANISMS)}")
        return password_mechanism

    def _auth_plain(self) -> tuple[int, bytes]:
        """RFC 4616: authzid NUL authcid NUL passwd, UTF-8, as the initial response."""
        assert self.smtp is not None
        return self.smtp.docmd("AUTH", "PLAIN " + _b64(f"\0{self.account.user}\0{self.account.password or ''}"))

    def _auth_login(self) -> tuple[int, bytes]:
        """The LOGIN mechanism: the user name as the initial response, then the password."""
        assert self.smtp is not None
        code, reply = self.smtp.docmd("AUTH", "LOGIN " + _b64(self.account.user or ""))
        if code != 334:
            return code, reply
        return self.smtp.docmd(_b64(self.account.password or ""))

    def _auth_xoauth2(self) -> tuple[int, bytes]:
        """XOAUTH2 with the account's token (:func:`sasl.authenticate`)."""
        return self._auth_token("XOAUTH2")

    def _auth_oauthbearer(self) -> tuple[int, bytes]:
        """OAUTHBEARER (RFC 7628) with the account's token (:func:`sasl.authenticate`)."""
        return self._auth_token("OAUTHBEARER")

    def _auth_token(self, mechanism: str) -> tuple[int, bytes]:
        """Fetch the token (from the cache, or anew; reported as the step "token"), then
        one AUTH.  A refused token is dropped from the cache and :class:`sasl.TokenRejected`
        raised; a 4xx (the server could not check it) keeps it."""
        a = self.account
        assert self.smtp is not None and a.oauth is not None and a.user
        cache = self.tokens if self.tokens is not None else oauth.TOKENS
        token = oauth.get_token(a.name, a.oauth, cache)
        if self.on_step is not None:
            self._step("token", sasl.describe_token(a, token, cache))
        try:
            return sasl.authenticate(self.smtp, mechanism, a.user, token.access_token, a.host, a.port)
        except sasl.TokenRejected:
            cache.invalidate(a.name, token)
            raise

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
        options = self._mail_options(out)
        todo = list(out.recipients)
        result = SendResult(0, "", transactions=0)
        while todo:
            if result.transactions and result.accepted:
                tx = self._follow_up(out, todo, options, result)
            else:
                tx = self._transaction(out, todo, options, first=True)
            result.transactions += 1
            if tx.accepted:
                result.code, result.text = tx.code, tx.text
                qid = queue_id(tx.text)
                if qid:
                    result.queue_ids.append(qid)
            result.accepted += tx.accepted
            result.refused.update(tx.refused)
            if not tx.accepted:
                # nothing accepted in this transaction: the rest cannot go either
                result.refused.update({r: (tx.code, tx.text) for r in tx.later})
                break
            todo = tx.later
        if not result.accepted:
            raise smtplib.SMTPRecipientsRefused(
                {r: (c, t.encode()) for r, (c, t) in result.refused.items()})
        return result

    def _mail_options(self, out: Outgoing) -> list[str]:
        options: list[str] = []
        if out.smtputf8:
            if not self.supports_smtputf8:
                raise NeedsSmtpUtf8(
                    f"an address is not ASCII and {self.account.host} does not offer SMTPUTF8")
            options = ["SMTPUTF8", "BODY=8BITMIME"]
        limit = self.size_limit
        if limit is not None:
            if len(out.data) > limit:
                raise MessageTooBig(
                    f"the message is {len(out.data)} bytes; {self.account.host} accepts at most "
                    f"{limit} (SIZE, RFC 1870): not sent")
            options.append(f"SIZE={len(out.data)}")
        return options

    def _follow_up(self, out: Outgoing, todo: list[str], options: list[str], result: SendResult) -> _Transaction:
        """A follow-up transaction whose failure refuses its own recipients only: the
        recipients of the earlier transactions have the mail and stay accepted."""
        try:
            return self._transaction(out, todo, options, first=False)
        except smtplib.SMTPRecipientsRefused as exc:
            refused = {r: (c, reply_text(t)) for r, (c, t) in exc.recipients.items()}
        except smtplib.SMTPResponseException as exc:
            refused = {r: (exc.smtp_code, reply_text(exc.smtp_error)) for r in todo}
        except (OutcomeUnknown, smtplib.SMTPException, OSError) as exc:
            self.abort()
            refused = {r: (NO_REPLY, f"{type(exc).__name__}: {exc}") for r in todo}
            result.outcome_unknown = result.outcome_unknown or isinstance(exc, OutcomeUnknown)
        result.stages.update({r: self.stage for r in refused})
        return _Transaction(code=0, text="", refused=refused)

    def _transaction(self, out: Outgoing, recipients: list[str], options: list[str], *,
                     first: bool) -> _Transaction:
        """MAIL, RCPT..., DATA, message."""
        pipelined = self.pipelining
        rcpt_cmds = [_line("RCPT TO:" + smtplib.quoteaddr(r), []) for r in recipients]
        self._mail(out.envelope_from, options, rcpt_cmds, pipelined, reused=self.transactions > 0 and first)
        tx = self._recipients(recipients, rcpt_cmds, pipelined)
        if self._data(tx, pipelined):
            self._message(out.data, tx)
        return tx

    def _mail(self, sender: str, options: list[str], rcpt_cmds: list[bytes], pipelined: bool,
              *, reused: bool) -> None:
        smtp = self.smtp
        assert smtp is not None
        mail_cmd = _line("MAIL FROM:" + smtplib.quoteaddr(sender), options)
        self.stage = "mail"
        try:
            smtp.send(b"".join([mail_cmd, *rcpt_cmds, b"DATA\r\n"]) if pipelined else mail_cmd)
            code, text = self._reply()
        except (smtplib.SMTPServerDisconnected, ConnectionError, OSError) as exc:
            if reused and not isinstance(exc, (socket.timeout, TimeoutError)):
                self.abort()
                raise ConnectionGone(f"the connection was closed while idle: {exc}") from exc
            raise
        if code == 421 and reused:
            self.abort()
            raise ConnectionGone(f"421 at MAIL FROM on a reused connection: {text}")
        if code != 250:
            if pipelined:
                self._drain(len(rcpt_cmds) + 1)  # the RCPTs' and DATA's replies (503s)
            self._reset(code)
            raise smtplib.SMTPSenderRefused(code, text.encode(), sender)

    def _recipients(self, recipients: list[str], rcpt_cmds: list[bytes], pipelined: bool) -> _Transaction:
        assert self.smtp is not None
        tx = _Transaction()
        self.stage = "rcpt"
        for rcpt, cmd in zip(recipients, rcpt_cmds, strict=True):
            if not pipelined:
                self.smtp.send(cmd)
            code, text = self._reply()
            if code in (250, 251):
                tx.accepted.append(rcpt)
            elif too_many_recipients(code, text) and tx.accepted:
                tx.later.append(rcpt)
            else:
                tx.refused[rcpt] = (code, text)
            if code == 421:
                self.abort()
                tx.refused.update({r: (code, text) for r in recipients
                                   if r not in tx.accepted and r not in tx.refused})
                raise smtplib.SMTPRecipientsRefused({r: (c, t.encode()) for r, (c, t) in tx.refused.items()})
        return tx

    def _data(self, tx: _Transaction, pipelined: bool) -> bool:
        """DATA's reply; True when the message is to be sent (354 with a recipient)."""
        assert self.smtp is not None
        self.stage = "data"
        code, text = 0, ""
        if pipelined:
            code, text = self._reply()
        elif tx.accepted:
            self.smtp.send(b"DATA\r\n")
            code, text = self._reply()
        if not tx.accepted:
            # RFC 2920 3.1: a pipelined DATA after no accepted RCPT is refused by the
            # server (Postfix: 554 5.5.1 no valid recipients); never send the message.
            if code == 354:  # a broken server: end the empty data phase
                self.smtp.send(b".\r\n")
                self._reply()
            self._reset(code)
            return False
        if code != 354:
            self._reset(code)
            raise smtplib.SMTPDataError(code, text.encode())
        return True

    def _message(self, data: bytes, tx: _Transaction) -> None:
        """The content in chunks (each within data_timeout_seconds), then the final reply."""
        self.stage = "dot"
        sock = self._sock()
        try:
            sock.settimeout(self.account.data_timeout_seconds)
            for chunk in dot_stuffed_chunks(data):
                sock.sendall(chunk)
        except OSError:
            self.abort()  # the server has part of the message: this connection is done
            raise
        try:
            sock.settimeout(self.account.final_reply_timeout_seconds)
            code, text = self._reply()
        except (smtplib.SMTPServerDisconnected, OSError) as exc:
            self.abort()
            raise OutcomeUnknown(
                f"no reply after the final dot ({type(exc).__name__}: {exc}): the server may have "
                "accepted the mail") from exc
        finally:
            if self.connected:
                self._sock().settimeout(self.account.command_timeout_seconds)
        if code != 250:
            self._reset(code)
            raise smtplib.SMTPDataError(code, text.encode())
        self.transactions += 1
        tx.code, tx.text = code, text

    def _reply(self) -> tuple[int, str]:
        assert self.smtp is not None
        code, text = self.smtp.getreply()
        self.last_reply = (code, reply_text(text))
        return self.last_reply

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
                code, text = self.smtp.quit()
                self._step("QUIT", f"{code} {' '.join(reply_text(text).split())}")
            except (smtplib.SMTPException, OSError):
                pass
        self.abort()


def _line(command: str, options: list[str]) -> bytes:
    text = command + "".join(f" {o}" for o in options)
    return (text + "\r\n").encode("utf-8")


_LINE_END = re.compile(rb"\r\n|\r|\n")
_LEADING_DOT = re.compile(rb"(?m)^\.")


def dot_stuffed_chunks(data: bytes, size: int = DATA_CHUNK) -> Iterator[bytes]:
    """The DATA payload in pieces of about ``size`` bytes, cut after a line end:
    CRLF line ends, leading dots doubled, the final CRLF.CRLF (RFC 5321 4.5.2).
    Only one piece is in memory at a time, never a second copy of the message."""
    view = memoryview(data)
    start, end = 0, len(data)
    while start < end:
        cut = data.find(b"\n", min(start + size, end) - 1)
        stop = end if cut < 0 else cut + 1
        piece = bytes(view[start:stop])  # ends with LF (a CRLF is never split) or at the end
        piece = _LEADING_DOT.sub(b"..", _LINE_END.sub(b"\r\n", piece))
        start = stop
        if start >= end and not piece.endswith(b"\r\n"):
            piece += b"\r\n"
        yield piece
    if not data:
        yield b"\r\n"
    yield b".\r\n"


def _dot_stuffed(data: bytes) -> bytes:
    """The whole DATA payload at once (tests and small messages)."""
    return b"".join(dot_stuffed_chunks(data))
