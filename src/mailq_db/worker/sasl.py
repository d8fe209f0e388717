"""SASL XOAUTH2 and OAUTHBEARER (RFC 7628) for the worker's SMTP AUTH step.

Exactly one AUTH command per connection, as with passwords:

* **XOAUTH2** (Google's and Microsoft's format):
  ``base64("user=" user "^Aauth=Bearer " token "^A^A")`` as the initial
  response (https://developers.google.com/workspace/gmail/imap/xoauth2-protocol;
  https://learn.microsoft.com/en-us/exchange/client-developer/legacy-protocols/how-to-authenticate-an-imap-pop-smtp-application-by-using-oauth).
* **OAUTHBEARER** (RFC 7628 3.1): ``base64("n,a=" authzid ",^Ahost=" host
  "^Aport=" port "^Aauth=Bearer " token "^A^A")``, the authzid escaped as
  RFC 5801 saslname (``,`` -> ``=2C``, ``=`` -> ``=3D``).
* The initial response goes on the AUTH line when that line fits in 2048
  octets; a longer one (a large JWT) is sent after the server's empty 334
  (RFC 4954 4 allows both; Microsoft's documentation shows the second form).
* A 4xx reply (RFC 4954 ``454 4.7.0 Temporary authentication failure``:
  the server could not check the token) is not a refusal: the token is kept
  and the account waits briefly.
* A refused token is answered by the server with a ``334`` challenge holding
  a base64 JSON error (``{"status":"401","schemes":"bearer","scope":...}``);
  the client must end the exchange: an empty line for XOAUTH2 (Google's
  documentation above), a single ``%x01`` for OAUTHBEARER (RFC 7628 3.2.3).
  The server then sends its final failure (535); the decoded JSON is added to
  the reply text for the log line.

Nothing here logs or raises anything that contains the token.

The exchange plugs into the session's AUTH dispatch
(``SmtpSession._auth_xoauth2`` / ``_auth_oauthbearer``).  The token comes from
the account's provider through the per-process cache
(:mod:`mailq_db.worker.oauth`); a refused token is dropped from the cache, so
the next connection gets a new one (``SmtpSession.open`` connects once more
with it; a second refusal pauses the account).
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
import smtplib
from typing import Any

from . import oauth
from .classify import TABLE, Outcome, SetupError
from .logs import event

log = logging.getLogger("mailq_db.worker")

#: account ``auth`` -> SASL mechanism
TOKEN_MECHANISMS = {"xoauth2": "XOAUTH2", "oauthbearer": "OAUTHBEARER"}
AUTH_MODES = ("password", *TOKEN_MECHANISMS)
#: The longest AUTH command line sent with the initial response (RFC 4954 4 allows
#: 12288 octets, but Postfix's smtpd cuts command lines at line_length_limit,
#: 2048 by default; the lab's test with a 2.5 KB token showed it).  A longer
#: response is sent after the server's empty 334 challenge instead.
MAX_INITIAL_RESPONSE_LINE = 2048
#: Rules of smtp_rules.toml whose ``why`` is the fix for a password refused
#: because the provider no longer accepts passwords.
BASIC_AUTH_RULES = ("basic-auth-disabled", "smtp-auth-disabled", "gmail-password-refused",
                    "gmail-app-password-required")


class TokenRejected(smtplib.SMTPAuthenticationError):
    """The server refused the token (one AUTH command).  ``server_error`` is the
    decoded JSON of the 334 challenge, when the server sent one."""

    def __init__(self, code: int, reply: bytes | str, server_error: Any = None):
        text = reply.decode("utf-8", "replace") if isinstance(reply, bytes) else str(reply)
        if server_error:
            text += f" (server's OAuth error: {describe_server_error(server_error)})"
        super().__init__(code, text.encode("utf-8"))
        self.server_error = server_error


def _text(reply: bytes | str) -> str:
    return reply.decode("utf-8", "replace") if isinstance(reply, bytes) else reply


def saslname(value: str) -> str:
    """RFC 5801 saslname: ``=`` as ``=3D`` and ``,`` as ``=2C``."""
    return value.replace("=", "=3D").replace(",", "=2C")


def initial_response(mechanism: str, user: str, token: str, host: str, port: int) -> bytes:
    """The client's initial response (before base64).  A control character in ``user`` or a
    ``token`` that is not a bearer token would end a field early: :class:`SetupError`."""
    if any(c < " " or c == "\x7f" for c in user):
        raise SetupError(f"user {user!r} has a control character: it cannot be sent in a {mechanism} message")
    if not oauth.cache.BEARER_TOKEN.fullmatch(token):
        raise SetupError("the access token has characters a bearer token cannot have (RFC 6750 2.1)")
    if mechanism == "XOAUTH2":
        text = f"user={user}\x01auth=Bearer {token}\x01\x01"
    elif mechanism == "OAUTHBEARER":
        text = f"n,a={saslname(user)},\x01host={host}\x01port={port}\x01auth=Bearer {token}\x01\x01"
    else:
        raise ValueError(f"not a token mechanism: {mechanism}")
    return text.encode("utf-8")


def decode_server_error(challenge: bytes | str) -> Any:
    """The 334 challenge's base64 JSON (a dict), its text when it is not JSON, or None."""
    raw = challenge.encode("ascii", "replace") if isinstance(challenge, str) else challenge
    try:
        decoded = base64.b64decode(raw.strip(), validate=True)
    except (binascii.Error, ValueError):
        return raw.decode("ascii", "replace").strip() or None
    text = decoded.decode("utf-8", "replace")
    try:
        return json.loads(text)
    except ValueError:
        return text.strip() or None


def describe_server_error(value: Any) -> str:
    if isinstance(value, dict):
        return ", ".join(f"{k}={v}" for k, v in value.items())
    return str(value)[:300]


def check_offered(mechanism: str, offered: list[str], host: str) -> None:
    """:class:`SetupError` when the server does not offer the token ``mechanism`` (naming
    the other token mechanism when the server offers that one)."""
    if mechanism not in offered:
        other = next((a for a in TOKEN_MECHANISMS.values() if a in offered and a != mechanism), None)
        hint = f': set auth = "{other.lower()}"' if other else ""
        raise SetupError(f"{host} offers AUTH {' '.join(offered)}, not {mechanism}{hint}")


def authenticate(smtp: smtplib.SMTP, mechanism: str, user: str, token: str, host: str,
                 port: int) -> tuple[int, bytes]:
    """One AUTH command with ``mechanism``; returns the 235 reply, raises :class:`TokenRejected`
    for a refused token, ``SMTPAuthenticationError`` for a 4xx (the token is not refused), or
    :class:`SetupError` when the server does not offer the mechanism."""
    if not smtp.has_extn("auth"):
        raise SetupError(f"{host}:{port} does not offer AUTH (is the port a submission port?)")
    check_offered(mechanism, smtp.esmtp_features["auth"].upper().split(), host)
    response = base64.b64encode(initial_response(mechanism, user, token, host, port)).decode("ascii")
    if len("AUTH ") + len(mechanism) + 1 + len(response) + 2 <= MAX_INITIAL_RESPONSE_LINE:
        code, reply = smtp.docmd("AUTH", f"{mechanism} {response}")
    else:
        # A long token (Entra ID's JWTs are 1.5-2.5 KB): the response goes after the
        # server's empty 334, where Postfix allows smtpd_sasl_response_limit (12288)
        # instead of cutting the command line at line_length_limit (2048).
        code, reply = smtp.docmd("AUTH", mechanism)
        if code != 334:
            raise smtplib.SMTPAuthenticationError(code, reply)
        code, reply = smtp.docmd(response)
    server_error = None
    if code == 334:
        server_error = decode_server_error(reply)
        # end the failed exchange: XOAUTH2 an empty line, OAUTHBEARER a single %x01 (RFC 7628 3.2.3)
        code, reply = smtp.docmd("" if mechanism == "XOAUTH2" else base64.b64encode(b"\x01").decode("ascii"))
    if code == 235:
        return code, reply
    if 400 <= code < 500:
        # the server could not check the token just now (RFC 4954 454 4.7.0): not a refusal
        text = reply.decode("utf-8", "replace") if isinstance(reply, bytes) else str(reply)
        raise smtplib.SMTPAuthenticationError(code, text.encode("utf-8"))
    raise TokenRejected(code, reply, server_error)


def auth_fix(account: Any, outcome: Outcome | None = None, *, again: bool = True) -> str:
    """What the operator must check after the server refused the account's login
    (``again``: a fresh token was refused after the cached one)."""
    if getattr(account, "auth", "password") == "password":
        rule = TABLE.by_id(outcome.rule) if outcome is not None else None
        if rule is not None and rule.id in BASIC_AUTH_RULES:
            return rule.why
        return f"check the password in ${account.password_env} and the user name"
    s = account.oauth
    who = f"the mailbox {account.user}"
    if outcome is not None and outcome.smtp_code is not None and 400 <= outcome.smtp_code < 500:
        return ("the server could not check the token just now (a temporary failure, not a refusal): the account "
                "waits and tries again; if it persists, check the server's connection to its identity platform")
    if s.provider == "microsoft":
        hint = ("the application has the Office 365 Exchange Online application permission SMTP.SendAsApp with "
                "admin consent, its service principal is registered in Exchange Online (New-ServicePrincipal) "
                f"with Add-MailboxPermission on {account.user}, and SMTP AUTH is enabled for the mailbox "
                "(Set-CASMailbox -SmtpClientAuthenticationDisabled $false)")
    elif s.provider == "google":
        hint = ("domain-wide delegation in the Google Admin console grants the service account's client ID the "
                f"scope https://mail.google.com/, and subject ({s.subject}) is the mailbox")
    elif s.provider == "refresh_token":
        hint = (f"the refresh token was issued to {account.user} for the SMTP scope ({' '.join(s.scopes) or '-'}) "
                "and is still valid")
    else:
        hint = f"the command's token is for {account.user} and has the SMTP scope"
    what = f"a freshly fetched token for {who} as well" if again else f"the token for {who}"
    return (f"the server refused {what}: check that user is the mailbox the token is for, and that {hint} "
            "(docs/oauth2.md)")


def password_fix(account: Any, exc: smtplib.SMTPResponseException) -> str | None:
    """The fix named by a "basic authentication disabled" rule for this refusal, or None."""
    from .classify import classify_reply

    outcome = classify_reply(exc.smtp_code, exc.smtp_error, "auth", account.provider or account.host)
    rule = TABLE.by_id(outcome.rule)
    return rule.why if rule is not None and rule.id in BASIC_AUTH_RULES else None


def describe_provider(account: Any) -> str:
    s = account.oauth
    if s.provider == "microsoft":
        return f"Microsoft identity platform (MSAL), tenant {s.tenant}, client {s.client_id}"
    if s.provider == "google":
        return f"Google service account (google-auth) for {s.subject}"
    if s.provider == "refresh_token":
        return f"refresh token ({s.issuer}, {s.library})"
    return f"command {s.command[0]}"


def describe_token(account: Any, token: oauth.Token, cache: oauth.TokenCache) -> str:
    """The probe's "token" step: where the token came from and how long it lives."""
    left = max(0, int(token.expires_at - cache.clock()))
    return (f"obtained from {describe_provider(account)}; valid for {left} s "
            f"(refreshed {int(min(account.oauth.refresh_margin_seconds, left / 2))} s before it expires)")


def token_failure(exc: BaseException) -> tuple[str, str | None] | None:
    """The probe's failed "token" step for an exception of the token fetch, as (detail, fix);
    None when ``exc`` is not one."""
    if isinstance(exc, oauth.MissingExtra):
        return str(exc), "install the extra named above, then probe again"
    if isinstance(exc, oauth.TokenError):
        return str(exc).split("; fix: ")[0], exc.fix
    if isinstance(exc, oauth.TokenUnavailable):
        return str(exc), ("check that this machine reaches the identity platform (proxy, firewall, DNS) "
                          "and probe again")
    return None


def refused_once(session: Any, exc: TokenRejected) -> None:
    """Log that the server refused the cached token and one new connection follows."""
    account = session.account
    event(log, logging.WARNING, f"the server refused the token of account {account.name}; fetching a new token "
          "and connecting once more", account=account.name, user=account.user, smtp_code=exc.smtp_code,
          reply=_text(exc.smtp_error))
