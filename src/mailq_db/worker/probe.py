"""``check-config --probe``: talk to each account's server the way the worker will, step by step.

The probe runs the worker's own connection sequence (:meth:`SmtpSession.open`:
TCP, and TLS for implicit TLS, the greeting, EHLO, STARTTLS with the
certificate checked, EHLO again, one AUTH) and QUIT, reporting each step with
what the server said; the step that fails is reported with what to fix.  For a
token account (``auth = "xoauth2"``/``"oauthbearer"``) the token is fetched
anew, not from the worker's cache, and reported as its own step before AUTH;
a refused token is not replaced (one AUTH, as for a password).  QUIT
is sent after an error too, so the server sees a clean end.  Nothing is sent:
no MAIL FROM.
"""

from __future__ import annotations

import smtplib
import socket
import ssl
from dataclasses import dataclass

from . import oauth, sasl
from .classify import SetupError, classify_reply, reply_text
from .config import AccountConfig, is_fqdn
from .smtp import SmtpSession


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
    return " ".join(reply_text(value).split())


def _tls_fix(a: AccountConfig, exc: BaseException) -> str:
    if isinstance(exc, ssl.SSLCertVerificationError):
        return (f"the server's certificate is not trusted ({exc.verify_message}): set ca_file to the CA "
                f"that signed it, or check that host = {a.host!r} is a name in the certificate")
    if "WRONG_VERSION_NUMBER" in str(exc) or "wrong version number" in str(exc):
        return (f"port {a.port} does not start with TLS: use tls = \"starttls\" (port 587 or 25), "
                "or the provider's implicit-TLS port (465)")
    return "check the server's TLS configuration and ca_file"


def _connect_failure(a: AccountConfig, exc: BaseException) -> Step:
    if isinstance(exc, ssl.SSLError):
        return Step(a.name, f"TLS {a.host}:{a.port}", False, str(exc), _tls_fix(a, exc))
    if isinstance(exc, smtplib.SMTPConnectError):
        return Step(a.name, f"TCP {a.host}:{a.port}", False, f"{exc.smtp_code} {_reply(exc.smtp_error)}",
                    "the server refuses connections from here (greeting not 220)")
    hint = "is the host right and the port open from here? submission is usually 587 (STARTTLS) or 465 (implicit TLS)"
    if isinstance(exc, smtplib.SMTPServerDisconnected) and a.tls != "implicit" and a.port == 465:
        hint = 'port 465 expects TLS from the first byte: set tls = "implicit"'
    elif isinstance(exc, (socket.timeout, TimeoutError)) and a.tls != "implicit":
        hint += '; a server that says nothing may expect implicit TLS (tls = "implicit")'
    return Step(a.name, f"TCP {a.host}:{a.port}", False, f"{type(exc).__name__}: {exc}", hint)


def _failure(a: AccountConfig, stage: str, exc: BaseException) -> Step:
    """The step that failed, with what to fix."""
    if stage == "connect":
        return _connect_failure(a, exc)
    if stage == "ehlo":
        return Step(a.name, "EHLO", False, str(exc), "the server refuses EHLO: check local_hostname")
    if stage == "starttls":
        if isinstance(exc, ssl.SSLError):
            return Step(a.name, "STARTTLS", False, str(exc), _tls_fix(a, exc))
        if isinstance(exc, SetupError):
            return Step(a.name, "STARTTLS", False, "not offered",
                        'use the provider\'s submission port (587), or tls = "implicit" on 465')
        return Step(a.name, "STARTTLS", False, str(exc), "the server refused STARTTLS")
    if stage == "auth":
        return _auth_failure(a, exc)
    return Step(a.name, stage.upper(), False, f"{type(exc).__name__}: {exc}")


def _auth_failure(a: AccountConfig, exc: BaseException) -> Step:
    """The failed token fetch or AUTH, with what to fix."""
    token = sasl.token_failure(exc)
    if token is not None:
        return Step(a.name, "token", False, *token)
    if isinstance(exc, smtplib.SMTPAuthenticationError):
        if a.auth != "password":
            outcome = classify_reply(exc.smtp_code, exc.smtp_error, "auth", a.provider or a.host)
            fix = sasl.auth_fix(a, outcome, again=False)
        else:
            fix = sasl.password_fix(a, exc) or (
                f"authentication failed for account {a.name}: check the user name and the password "
                f"in ${a.password_env} (one attempt was made, to avoid a lockout)")
        return Step(a.name, "AUTH", False, f"{exc.smtp_code} {_reply(exc.smtp_error)}", fix)
    if a.auth != "password" and isinstance(exc, SetupError):
        return Step(a.name, "AUTH", False, str(exc), "use the provider's submission port (587), or the mechanism "
                    "it offers")
    return Step(a.name, "AUTH", False, str(exc), "use a port that offers AUTH (submission, 587)")


def probe_account(a: AccountConfig) -> list[Step]:
    steps: list[Step] = []
    helo = a.local_hostname or socket.getfqdn()
    if not is_fqdn(helo):
        steps.append(Step(a.name, "EHLO name", True, f"{helo!r} (from "
                          f"{'local_hostname' if a.local_hostname else 'this host'}) is not a fully qualified "
                          "domain name", "set local_hostname to this machine's public name "
                          "(Postfix's reject_non_fqdn_helo_hostname refuses it)", warning=True))

    def on_step(name: str, detail: str) -> None:
        unverified = name == "STARTTLS" and not a.verify_tls
        steps.append(Step(a.name, name, True, detail,
                          "set verify_tls = true (and ca_file) outside of tests" if unverified else None,
                          warning=unverified))
        if name == "EHLO" and a.tls == "none":
            steps.append(Step(a.name, "TLS", True, "none: mail and password go in clear text (allow_plaintext)",
                              "only for local sinks", warning=True))

    # a token is fetched anew (a cache of its own: what the identity platform says now), one AUTH
    session = SmtpSession(a, on_step=on_step, tokens=oauth.TokenCache(), token_retry=False)
    try:
        session.open()
    except Exception as exc:  # noqa: BLE001 - every failure is a reported step
        steps.append(_failure(a, session.stage, exc))
    finally:
        session.close()  # QUIT after errors too (reported by on_step)
    return steps


def probe(accounts: dict[str, AccountConfig]) -> tuple[list[Step], bool]:
    """Probe every account; returns the steps and whether all passed."""
    steps = [s for a in accounts.values() for s in probe_account(a)]
    return steps, all(s.ok for s in steps)
