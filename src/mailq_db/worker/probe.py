"""``check-config --probe``: talk to each account's server the way the worker will, step by step.

TCP (and TLS for implicit TLS), the greeting, EHLO, STARTTLS with the
certificate checked, EHLO again, one AUTH (for a token account: fetching the
token first, as its own step), QUIT.  Each step is reported with
what the server said and, when it fails, what to fix.  QUIT is sent after an
error too, so the server sees a clean end.  Nothing is sent: no MAIL FROM.
"""

from __future__ import annotations

import smtplib
import socket
import ssl
from dataclasses import dataclass

from . import sasl
from .config import AccountConfig, is_fqdn
from .smtp import SmtpSession, tls_context


@dataclass
class Step:
    account: str
    name: str
    ok: bool
    detail: str
    fix: str | None = None
    warning: bool = False

    def line(self) -> str:
        status = "OK" if self.ok and not self.warning else "WARN" if self.ok else "FAIL"
        text = f"[{status}] account {self.account} / {self.name}: {self.detail}"
        if self.fix:
            text += f"\n       fix: {self.fix}"
        return text


def _reply(value: bytes | str | None) -> str:
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    return " ".join((value or "").split())


def _tls_fix(a: AccountConfig, exc: BaseException) -> str:
    if isinstance(exc, ssl.SSLCertVerificationError):
        return (f"the server's certificate is not trusted ({exc.verify_message}): set ca_file to the CA "
                f"that signed it, or check that host = {a.host!r} is a name in the certificate")
    if "WRONG_VERSION_NUMBER" in str(exc) or "wrong version number" in str(exc):
        return (f"port {a.port} does not start with TLS: use tls = \"starttls\" (port 587 or 25), "
                "or the provider's implicit-TLS port (465)")
    return "check the server's TLS configuration and ca_file"


def probe_account(a: AccountConfig) -> list[Step]:
    steps: list[Step] = []
    add = steps.append
    name = a.name
    helo = a.local_hostname or socket.getfqdn()
    if not is_fqdn(helo):
        add(Step(name, "EHLO name", True, f"{helo!r} (from {'local_hostname' if a.local_hostname else 'this host'}) "
                 "is not a fully qualified domain name", "set local_hostname to this machine's public name "
                 "(Postfix's reject_non_fqdn_helo_hostname refuses it)", warning=True))
    session = SmtpSession(a)
    smtp: smtplib.SMTP | None = None
    try:
        try:
            if a.tls == "implicit":
                smtp = smtplib.SMTP_SSL(timeout=a.connect_timeout_seconds, context=tls_context(a),
                                        local_hostname=a.local_hostname)
            else:
                smtp = smtplib.SMTP(timeout=a.connect_timeout_seconds, local_hostname=a.local_hostname)
            smtp._host = a.host  # smtplib sets it only when the host is given to the constructor (TLS SNI)
            code, greeting = smtp.connect(a.host, a.port)
        except ssl.SSLError as exc:
            add(Step(name, f"TLS {a.host}:{a.port}", False, str(exc), _tls_fix(a, exc)))
            return steps
        except (OSError, smtplib.SMTPException) as exc:
            hint = ("is the host right and the port open from here? submission is usually 587 "
                    "(STARTTLS) or 465 (implicit TLS)")
            if isinstance(exc, smtplib.SMTPServerDisconnected) and a.tls != "implicit" and a.port == 465:
                hint = 'port 465 expects TLS from the first byte: set tls = "implicit"'
            elif isinstance(exc, (socket.timeout, TimeoutError)) and a.tls != "implicit":
                hint += '; a server that says nothing may expect implicit TLS (tls = "implicit")'
            add(Step(name, f"TCP {a.host}:{a.port}", False, f"{type(exc).__name__}: {exc}", hint))
            return steps
        add(Step(name, f"TCP {a.host}:{a.port}", code == 220, f"{code} {_reply(greeting)}",
                 None if code == 220 else "the server refuses connections from here (greeting not 220)"))
        if code != 220:
            return steps
        session.smtp = smtp
        smtp.sock.settimeout(a.command_timeout_seconds)
        code, text = smtp.ehlo()
        add(Step(name, "EHLO", code == 250, f"{code}; offers {', '.join(sorted(smtp.esmtp_features)) or 'nothing'}",
                 None if code == 250 else "the server refuses EHLO: check local_hostname"))
        if code != 250:
            return steps
        if a.tls == "starttls":
            if not smtp.has_extn("starttls"):
                add(Step(name, "STARTTLS", False, "not offered",
                         'use the provider\'s submission port (587), or tls = "implicit" on 465'))
                return steps
            try:
                code, text = smtp.starttls(context=tls_context(a))
            except ssl.SSLError as exc:
                add(Step(name, "STARTTLS", False, str(exc), _tls_fix(a, exc)))
                session.smtp = None  # the TLS handshake failed half-way: no QUIT on that socket
                smtp.close()
                return steps
            except smtplib.SMTPResponseException as exc:
                add(Step(name, "STARTTLS", False, f"{exc.smtp_code} {_reply(exc.smtp_error)}",
                         "the server refused STARTTLS"))
                return steps
            cert = smtp.sock.getpeercert() if isinstance(smtp.sock, ssl.SSLSocket) else None
            subject = dict(x[0] for x in cert.get("subject", ())) if cert else {}
            add(Step(name, "STARTTLS", True, f"{smtp.sock.version()}, certificate "
                     f"{'verified' if a.verify_tls else 'NOT verified (verify_tls = false)'}"
                     + (f" for {subject.get('commonName')}" if subject.get("commonName") else ""),
                     None if a.verify_tls else "set verify_tls = true (and ca_file) outside of tests",
                     warning=not a.verify_tls))
            smtp.sock.settimeout(a.command_timeout_seconds)
            code, text = smtp.ehlo()
            add(Step(name, "EHLO after STARTTLS", code == 250,
                     f"{code}; offers {', '.join(sorted(smtp.esmtp_features))}"))
        elif a.tls == "none":
            add(Step(name, "TLS", True, "none: mail and password go in clear text (allow_plaintext)",
                     "only for local sinks", warning=True))
        if a.user and a.auth != "password":  # the token is fetched as its own step, then one AUTH
            sasl.probe_login(session, lambda *step: add(Step(name, *step)))
        elif a.user:
            try:
                session._login(a.user, a.password or "")
                add(Step(name, "AUTH", True, f"logged in as {a.user} (one attempt)"))
            except smtplib.SMTPAuthenticationError as exc:
                add(Step(name, "AUTH", False, f"{exc.smtp_code} {_reply(exc.smtp_error)}",
                         sasl.password_fix(a, exc) or
                         f"authentication failed for account {name}: check the user name and the password "
                         f"in ${a.password_env} (one attempt was made, to avoid a lockout)"))
            except smtplib.SMTPException as exc:
                add(Step(name, "AUTH", False, str(exc), "use a port that offers AUTH (submission, 587)"))
        return steps
    finally:
        # QUIT after errors too
        if session.smtp is not None:
            try:
                code, text = session.smtp.quit()
                add(Step(name, "QUIT", True, f"{code} {_reply(text)}"))
            except (smtplib.SMTPException, OSError):
                pass
            session.abort()
        elif smtp is not None:
            smtp.close()


def probe(accounts: dict[str, AccountConfig]) -> tuple[list[Step], bool]:
    """Probe every account; returns the steps and whether all passed."""
    steps = [s for a in accounts.values() for s in probe_account(a)]
    return steps, all(s.ok for s in steps)
