"""A real SMTP server on loopback for the worker's tests and benchmark (aiosmtpd).

``SmtpSink`` starts aiosmtpd on 127.0.0.1 with an ephemeral port, optionally
requiring STARTTLS and AUTH, and answers with scripted replies:
``replies[(stage, key)] = "550 5.1.1 no such user"`` where stage is ``mail``,
``rcpt`` or ``data`` and key an address (the sender for ``mail``, a recipient
for ``rcpt`` and ``data``) or ``"*"`` for any.  Special replies:
``"drop"`` closes the connection without answering (``"drop-once"``: the
first time only), a reply prefixed ``once:`` is used once, ``"stall"`` answers only
after ``stall_seconds``.  Every accepted message is kept in ``messages``
(unless ``keep_messages=False``; ``message_count`` counts them anyway).
``reply_delay`` waits before the last line of every reply, so each client
command costs one simulated round trip; ``replies_sent`` counts those replies.
"""

from __future__ import annotations

import asyncio
import datetime
import ipaddress
import os
import shutil
import socket
import ssl
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass
from typing import Any

import logging

from aiosmtpd.controller import Controller
from aiosmtpd.smtp import SMTP, AuthResult, LoginPassword

USER, PASSWORD = "mailer", "s3cret-test-password"
# aiosmtpd 1.4 logs a warning about its own internal use of Session.login_data on every AUTH.
logging.getLogger("mail.log").setLevel(logging.ERROR)


@dataclass
class Received:
    mail_from: str
    rcpt_tos: list[str]
    data: bytes


def make_certificate(directory: str) -> tuple[str, str]:
    """A self-signed certificate for localhost/127.0.0.1: (cert path, key path).

    Uses the ``cryptography`` package when installed, else the ``openssl`` CLI.
    """
    cert, key = os.path.join(directory, "cert.pem"), os.path.join(directory, "key.pem")
    try:
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import NameOID
    except ImportError:
        if not shutil.which("openssl"):
            raise RuntimeError("need the cryptography package or the openssl CLI to make a test certificate")
        subprocess.run(
            ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
             "-nodes", "-keyout", key, "-out", cert, "-days", "2", "-subj", "/CN=localhost",
             "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"],
            check=True, capture_output=True,
        )
        return cert, key
    private = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.timezone.utc)
    certificate = (
        x509.CertificateBuilder().subject_name(name).issuer_name(name)
        .public_key(private.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=2))
        .add_extension(x509.SubjectAlternativeName(
            [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(private, hashes.SHA256())
    )
    with open(key, "wb") as fh:
        fh.write(private.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                       serialization.NoEncryption()))
    with open(cert, "wb") as fh:
        fh.write(certificate.public_bytes(serialization.Encoding.PEM))
    return cert, key


class _Handler:
    def __init__(self, sink: "SmtpSink"):
        self.sink = sink

    async def _scripted(self, server: Any, stage: str, keys: list[str]) -> str | None:
        for key in [*keys, "*"]:
            reply = self.sink.replies.get((stage, key))
            if reply is None:
                continue
            if reply.startswith("once:"):  # a scripted reply used once, then the normal behaviour
                del self.sink.replies[(stage, key)]
                reply = reply[len("once:"):]
            if reply in ("drop", "drop-once"):
                if reply == "drop-once":
                    del self.sink.replies[(stage, key)]
                server.transport.abort()
                return "250 never seen"
            if reply == "stall":
                await asyncio.sleep(self.sink.stall_seconds)
                return "250 too late"
            return reply
        return None

    async def handle_EHLO(self, server, session, envelope, hostname, responses):  # noqa: N802
        session.host_name = hostname
        if self.sink.pipelining:
            responses.insert(1, "250-PIPELINING")  # RFC 2920; aiosmtpd reads pipelined commands in order
        return responses

    async def handle_MAIL(self, server, session, envelope, address, mail_options):  # noqa: N802
        await self.sink.delay()
        reply = await self._scripted(server, "mail", [address])
        if reply:
            return reply
        envelope.mail_from = address
        envelope.mail_options.extend(mail_options)
        self.sink.mail_options.append(list(mail_options))
        return "250 OK"

    async def handle_RCPT(self, server, session, envelope, address, rcpt_options):  # noqa: N802
        await self.sink.delay()
        reply = await self._scripted(server, "rcpt", [address])
        if reply:
            return reply
        envelope.rcpt_tos.append(address)
        return "250 OK"

    async def handle_DATA(self, server, session, envelope):  # noqa: N802
        await self.sink.delay()
        reply = await self._scripted(server, "data", list(envelope.rcpt_tos))
        if reply:
            return reply
        with self.sink.lock:
            self.sink.message_count += 1
            if self.sink.keep_messages:
                self.sink.messages.append(Received(envelope.mail_from, list(envelope.rcpt_tos),
                                                   bytes(envelope.original_content or envelope.content)))
            self.sink.accepted.set()
            return self.sink.final_reply or f"250 2.0.0 Ok: queued as Q{self.sink.message_count}"


class _DelayedSMTP(SMTP):
    """aiosmtpd's SMTP server whose replies reach the client ``reply_delay`` after
    they were written (a one-way network delay), so each client round trip costs
    one delay: commands the client pipelines (RFC 2920) are answered together,
    one delay later, like over a real network.  ``counter`` is called once per
    round trip (per flight of replies), not once per reply."""

    def __init__(self, *args: Any, reply_delay: float = 0.0, counter: Any = None, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._reply_delay = reply_delay
        self._counter = counter
        self._last_due = 0.0  # loop time at which the last scheduled reply is delivered

    async def smtp_RSET(self, arg: str) -> None:  # noqa: N802 - aiosmtpd's name
        """A scripted ``replies[("rset", "*")]`` (e.g. "421 ..." then the connection is closed)."""
        replies = self.event_handler.sink.replies
        reply = replies.get(("rset", "*"))
        if reply:
            if reply.startswith("once:"):
                del replies[("rset", "*")]
                reply = reply[len("once:"):]
            await self.push(reply)
            if reply.startswith("421"):
                self.transport.close()
            return
        await super().smtp_RSET(arg)

    async def push(self, status: str) -> None:
        final = len(status) < 4 or status[3] != "-"  # the last line of a reply
        loop = asyncio.get_running_loop()
        now = loop.time()
        due = now + self._reply_delay
        if final and self._counter is not None and due > self._last_due + self._reply_delay / 2:
            self._counter()  # a new flight: one more round trip
        if not self._reply_delay:
            await super().push(status)
            return
        due = max(due, self._last_due)
        self._last_due = due
        if status.startswith(("220", "221")) or self.transport is None:
            # STARTTLS's 220 and QUIT's 221 are followed by a transport change or a
            # close: deliver them in order, then let the server go on
            await asyncio.sleep(max(0.0, due - loop.time()))
            await super().push(status)
            return
        data = bytes(status, "utf-8" if self.enable_SMTPUTF8 else "ascii") + b"\r\n"
        writer = self._writer
        loop.call_at(due, lambda: None if writer.transport.is_closing() else writer.write(data))


class SmtpSink:
    def __init__(self, *, starttls: bool = False, auth: bool = False, smtputf8: bool = True,
                 stall_seconds: float = 2.0, reply_delay: float = 0.0, cert_dir: str | None = None,
                 keep_messages: bool = True, pipelining: bool = True, size_limit: int | None = None):
        self.pipelining = pipelining
        self.mail_options: list[list[str]] = []  # the options of every accepted MAIL FROM
        self.auth_attempts = 0
        self.password = PASSWORD  # the password AUTH accepts (compared as UTF-8 bytes)
        self.replies: dict[tuple[str, str], str] = {}
        #: the reply after an accepted message; None: "250 2.0.0 Ok: queued as Q<n>" (a queue ID per mail)
        self.final_reply: str | None = None
        self.messages: list[Received] = []
        self.lock = threading.Lock()
        self.accepted = threading.Event()
        self.stall_seconds = stall_seconds
        self.reply_delay = reply_delay
        self.replies_sent = 0
        self.keep_messages = keep_messages
        self.message_count = 0
        self.connections = 0
        self.cert = self.key = None
        tls_context = None
        if starttls:
            self._tmp = cert_dir or tempfile.mkdtemp(prefix="mailq-smtp-")
            self.cert, self.key = make_certificate(self._tmp)
            tls_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            tls_context.load_cert_chain(self.cert, self.key)
        kwargs: dict[str, Any] = dict(
            enable_SMTPUTF8=smtputf8, tls_context=tls_context, require_starttls=starttls,
            decode_data=False,
        )
        if size_limit is not None:
            kwargs["data_size_limit"] = size_limit
        if auth:
            kwargs.update(authenticator=self._authenticate, auth_require_tls=starttls)
        else:
            kwargs.update(auth_require_tls=False)
        self._kwargs = kwargs
        port = _free_port()
        self.port = port
        sink = self

        class _Controller(Controller):
            def factory(self) -> SMTP:
                sink.connections += 1
                return _DelayedSMTP(self.handler, reply_delay=sink.reply_delay,
                                    counter=sink._count, **sink._kwargs)

        self.controller = _Controller(_Handler(self), hostname="127.0.0.1", port=port)

    def _count(self) -> None:
        self.replies_sent += 1

    async def delay(self) -> None:
        return None

    def _authenticate(self, server: Any, session: Any, envelope: Any, mechanism: str, auth_data: Any) -> AuthResult:
        self.auth_attempts += 1
        ok = (isinstance(auth_data, LoginPassword) and auth_data.login == USER.encode()
              and auth_data.password == self.password.encode("utf-8"))
        return AuthResult(success=ok, handled=False)

    def start(self) -> "SmtpSink":
        self.controller.start()
        return self

    def stop(self) -> None:
        self.controller.stop()

    def __enter__(self) -> "SmtpSink":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(predicate: Any, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.01)
    return predicate()
