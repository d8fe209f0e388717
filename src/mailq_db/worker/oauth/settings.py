"""The ``[accounts.NAME.oauth]`` table of the worker's TOML: which token provider, and its settings.

Secrets never live in the file: a secret is named by an environment variable
(``*_env``, read when the configuration is loaded) or a file (``*_file``,
read each time a token is fetched, so a rotated file is picked up without a
restart).  Every problem is reported with what to do, like the rest of the
configuration (``mailq_db.worker.config``).

Providers (docs/oauth2.md):

* ``microsoft``: Microsoft identity platform, client credentials (an
  application with SMTP.SendAsApp), MSAL; ``tenant``, ``client_id`` and a
  secret (``client_secret_env`` / ``client_secret_file``) or a certificate
  (``certificate_file``, PEM with key and certificate, or PFX); scope
  ``https://outlook.office365.com/.default``.
* ``google``: a Google service account with domain-wide delegation,
  google-auth; its JSON key in ``service_account_file`` or
  ``service_account_env``; ``subject`` (the mailbox, default: the account's
  ``user``); scope ``https://mail.google.com/``.
* ``refresh_token``: a delegated mailbox; ``issuer`` = ``microsoft`` (MSAL),
  ``google`` or ``generic`` (an RFC 6749 token endpoint ``token_uri``, both
  through google-auth's refresh grant); ``client_id``, an optional client
  secret and the refresh token (``refresh_token_file`` / ``refresh_token_env``).
* ``command``: a program prints the token (like msmtp's ``passwordeval``):
  ``command`` is an argv list run without a shell, with ``timeout_seconds``.
"""

from __future__ import annotations

import difflib
import importlib.util
import os
from dataclasses import dataclass, field
from typing import Any, Mapping, Protocol

PROVIDERS = ("microsoft", "google", "refresh_token", "command")
ISSUERS = ("microsoft", "google", "generic")
MICROSOFT_SCOPE = "https://outlook.office365.com/.default"
MICROSOFT_DELEGATED_SCOPE = "https://outlook.office.com/SMTP.Send"
GOOGLE_SCOPE = "https://mail.google.com/"
GOOGLE_TOKEN_URI = "https://oauth2.googleapis.com/token"
MICROSOFT_AUTHORITY_HOST = "https://login.microsoftonline.com"

#: provider (or refresh-token issuer) -> (import name, extra that installs it)
EXTRAS = {
    "microsoft": ("msal", "oauth-microsoft"),
    "google": ("google.auth", "oauth-google"),
    "generic": ("google.auth", "oauth-google"),
}

_COMMON = ("provider", "scope", "timeout_seconds", "refresh_margin_seconds")
KEYS = {
    "microsoft": (*_COMMON, "tenant", "client_id", "client_secret_env", "client_secret_file", "certificate_file",
                  "certificate_password_env", "authority_host"),
    "google": (*_COMMON, "service_account_file", "service_account_env", "subject", "token_uri"),
    "refresh_token": (*_COMMON, "issuer", "tenant", "client_id", "client_secret_env", "client_secret_file",
                      "refresh_token_file", "refresh_token_env", "token_uri", "authority_host"),
    "command": (*_COMMON, "command", "token_lifetime_seconds"),
}


class Problems(Protocol):
    def add(self, where: str, text: str) -> None: ...


@dataclass(frozen=True)
class Secret:
    """Where a secret comes from: an environment variable (read at load) or a file (read at use)."""

    env: str | None = None
    file: str | None = None
    value: str | None = field(default=None, repr=False, compare=False)

    def read(self) -> str:
        """The secret; a file that cannot be read is a TokenError naming it (never its content)."""
        if self.env is not None:
            return self.value or ""
        assert self.file is not None
        return read_secret_file(self.file, "utf-8").strip()

    def describe(self) -> str:
        return f"${self.env}" if self.env else f"the file {self.file}"


def read_secret_file(path: str, encoding: str) -> str:
    """The text of a secret file, read when a token is fetched; a file removed or made unreadable
    since the configuration was loaded is a TokenError (an account Wait naming the file)."""
    try:
        with open(path, encoding=encoding) as fh:
            return fh.read()
    except (OSError, UnicodeError) as exc:
        from .errors import TokenError

        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else f"not {encoding} text"
        raise TokenError(f"{path} cannot be read ({reason})",
                         "check that the file exists and is readable by the worker's user") from None


@dataclass(frozen=True)
class OAuthSettings:
    provider: str
    scopes: tuple[str, ...]
    timeout_seconds: float = 30.0
    #: a token is refreshed when less than this is left (at most half its lifetime)
    refresh_margin_seconds: float = 300.0
    tenant: str | None = None
    client_id: str | None = None
    client_secret: Secret | None = None
    certificate_file: str | None = None
    certificate_password: Secret | None = None
    authority_host: str = MICROSOFT_AUTHORITY_HOST
    service_account: Secret | None = None
    subject: str | None = None
    issuer: str | None = None
    token_uri: str | None = None
    refresh_token: Secret | None = None
    command: tuple[str, ...] = ()
    token_lifetime_seconds: float = 300.0

    @property
    def library(self) -> str:
        """The provider's library name, for messages."""
        key = self.issuer if self.provider == "refresh_token" else self.provider
        return {"microsoft": "MSAL", "google": "google-auth", "generic": "google-auth"}.get(key or "", "")


def missing_extra(settings: OAuthSettings) -> str | None:
    """The one line to print when the provider's optional dependency is not installed."""
    key = settings.issuer if settings.provider == "refresh_token" else settings.provider
    if key not in EXTRAS:
        return None
    module, extra = EXTRAS[key]
    try:
        found = importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        found = False
    if found:
        return None
    return (f"the {settings.provider} token provider needs the {module.split('.')[0]} package: "
            f"pip install 'mailq-db[{extra}]'")


def _take(raw: dict[str, Any], key: str, kind: type | tuple[type, ...], where: str, problems: Problems) -> Any:
    if key not in raw:
        return None
    value = raw.pop(key)
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if isinstance(value, bool) and bool not in kinds or not isinstance(value, kinds):
        names = " or ".join(k.__name__ for k in kinds)
        problems.add(f"{where}.{key}", f"must be {names}, got {value!r}")
        return None
    return value


def _secret(raw: dict[str, Any], base: str, where: str, env: Mapping[str, str], problems: Problems,
            *, required: bool, what: str) -> Secret | None:
    name_env, name_file = f"{base}_env", f"{base}_file"
    var = _take(raw, name_env, str, where, problems)
    path = _take(raw, name_file, str, where, problems)
    if var and path:
        problems.add(where, f"set {name_env} or {name_file}, not both")
        return None
    if var:
        if var not in env:
            problems.add(f"{where}.{name_env}", f"environment variable {var} is not set ({what})")
            return None
        return Secret(env=var, value=env[var])
    if path:
        if not os.path.isfile(path):
            problems.add(f"{where}.{name_file}", f"{path} does not exist ({what})")
            return None
        if not os.access(path, os.R_OK):
            problems.add(f"{where}.{name_file}", f"{path} is not readable by this user ({what})")
            return None
        return Secret(file=path)
    if required:
        problems.add(where, f"{what}: set {name_env} (an environment variable) or {name_file}")
    return None


def _scopes(raw: dict[str, Any], where: str, problems: Problems, default: tuple[str, ...]) -> tuple[str, ...]:
    value = _take(raw, "scope", (str, list), where, problems)
    if value is None:
        return default
    scopes = value.split() if isinstance(value, str) else value
    if not scopes or not all(isinstance(s, str) and s and " " not in s for s in scopes):
        problems.add(f"{where}.scope", "must be a scope string or a list of them")
        return default
    return tuple(scopes)


def _check_token_uri(token_uri: str | None, where: str, problems: Problems) -> None:
    """A token endpoint receives the client secret, refresh token or signed assertion: https only
    (plain http only on this machine's loopback, for tests)."""
    if token_uri and not token_uri.startswith(("https://", "http://127.0.0.1:", "http://127.0.0.1/",
                                                "http://localhost:", "http://localhost/", "http://[::1]")):
        problems.add(f"{where}.token_uri", f"must be an https:// URL (got {token_uri!r}): the endpoint receives "
                     "the client's credentials")


def _number(raw: dict[str, Any], key: str, where: str, problems: Problems, default: float,
            minimum: float) -> float:
    value = _take(raw, key, (int, float), where, problems)
    if value is None:
        return default
    if value < minimum:
        problems.add(f"{where}.{key}", f"must be at least {minimum:g}, got {value}")
        return default
    return float(value)


def parse_oauth(where: str, raw: Any, env: Mapping[str, str], problems: Problems,
                user: str | None) -> OAuthSettings | None:
    """The settings of ``[accounts.NAME.oauth]`` (``raw``), or None after adding the problems."""
    if not isinstance(raw, dict):
        problems.add(where, f"must be a table [{where}] with provider = one of {', '.join(PROVIDERS)}")
        return None
    raw = dict(raw)
    provider = _take(raw, "provider", str, where, problems)
    if provider not in PROVIDERS:
        close = difflib.get_close_matches(str(provider), PROVIDERS, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        problems.add(f"{where}.provider", f"must be one of {', '.join(PROVIDERS)}, got {provider!r}{hint}")
        return None
    known = KEYS[provider]
    for key in [k for k in raw if k not in known]:
        raw.pop(key)
        close = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
        hint = f"did you mean {close[0]!r}?" if close else f"provider {provider} takes {', '.join(known)}"
        problems.add(f"{where}.{key}", f"unknown setting ({hint})")
    common = dict(timeout_seconds=_number(raw, "timeout_seconds", where, problems, 30.0, 1),
                  refresh_margin_seconds=_number(raw, "refresh_margin_seconds", where, problems, 300.0, 0))
    parse = {"microsoft": _microsoft, "google": _google, "refresh_token": _refresh_token,
             "command": _command}[provider]
    settings = parse(where, raw, env, problems, user, common)
    if settings is not None:
        line = missing_extra(settings)
        if line:
            problems.add(where, line)
    return settings


def _microsoft(where: str, raw: dict[str, Any], env: Mapping[str, str], problems: Problems, user: str | None,
               common: dict[str, Any]) -> OAuthSettings | None:
    tenant = _take(raw, "tenant", str, where, problems)
    client_id = _take(raw, "client_id", str, where, problems)
    authority = _take(raw, "authority_host", str, where, problems) or MICROSOFT_AUTHORITY_HOST
    cert = _take(raw, "certificate_file", str, where, problems)
    cert_password = _secret(raw, "certificate_password", where, env, problems, required=False,
                            what="the certificate file's password") if "certificate_password_env" in raw else None
    secret = _secret(raw, "client_secret", where, env, problems, required=not cert,
                     what="the application's client secret (or set certificate_file)")
    for key, value in (("tenant", tenant), ("client_id", client_id)):
        if not value:
            problems.add(f"{where}.{key}", f"is required for provider microsoft (Entra ID > App registrations > "
                         f"Overview: {'Directory (tenant) ID' if key == 'tenant' else 'Application (client) ID'})")
    if tenant in ("common", "organizations", "consumers"):
        problems.add(f"{where}.tenant", "client credentials need the tenant's ID or domain, not " + repr(tenant))
    if cert and secret:
        problems.add(where, "set a client secret or certificate_file, not both")
    if cert and not os.path.isfile(cert):
        problems.add(f"{where}.certificate_file", f"{cert} does not exist")
    if not authority.startswith("https://"):
        problems.add(f"{where}.authority_host", "must be an https:// URL (e.g. https://login.microsoftonline.us)")
    return OAuthSettings("microsoft", _scopes(raw, where, problems, (MICROSOFT_SCOPE,)), tenant=tenant,
                         client_id=client_id, client_secret=secret, certificate_file=cert,
                         certificate_password=cert_password, authority_host=authority.rstrip("/"), **common)


def _google(where: str, raw: dict[str, Any], env: Mapping[str, str], problems: Problems, user: str | None,
            common: dict[str, Any]) -> OAuthSettings | None:
    key = _secret(raw, "service_account", where, env, problems, required=True,
                  what="the service account's JSON key")
    subject = _take(raw, "subject", str, where, problems) or user
    token_uri = _take(raw, "token_uri", str, where, problems)
    _check_token_uri(token_uri, where, problems)
    if not subject:
        problems.add(f"{where}.subject", "is required: the mailbox the service account acts for (default: user)")
    return OAuthSettings("google", _scopes(raw, where, problems, (GOOGLE_SCOPE,)), service_account=key,
                         subject=subject, token_uri=token_uri, **common)


def _refresh_token(where: str, raw: dict[str, Any], env: Mapping[str, str], problems: Problems,
                   user: str | None, common: dict[str, Any]) -> OAuthSettings | None:
    issuer = _take(raw, "issuer", str, where, problems)
    if issuer not in ISSUERS:
        problems.add(f"{where}.issuer", f"must be one of {', '.join(ISSUERS)} (who issued the refresh token), "
                     f"got {issuer!r}")
        return None
    tenant = _take(raw, "tenant", str, where, problems)
    client_id = _take(raw, "client_id", str, where, problems)
    token_uri = _take(raw, "token_uri", str, where, problems)
    authority = _take(raw, "authority_host", str, where, problems) or MICROSOFT_AUTHORITY_HOST
    # google-auth's refresh grant always sends a client secret; MSAL serves public clients too
    secret = _secret(raw, "client_secret", where, env, problems, required=issuer != "microsoft",
                     what="the client secret of the OAuth client the refresh token was issued to")
    token = _secret(raw, "refresh_token", where, env, problems, required=True, what="the refresh token")
    if not client_id:
        problems.add(f"{where}.client_id", "is required: the client the refresh token was issued to")
    if issuer == "microsoft" and not tenant:
        problems.add(f"{where}.tenant", "is required for issuer microsoft (a tenant ID, a domain, or "
                     "'organizations' / 'consumers')")
    if issuer == "generic" and not token_uri:
        problems.add(f"{where}.token_uri", "is required for issuer generic: the token endpoint's https:// URL")
    _check_token_uri(token_uri, where, problems)
    default = {"microsoft": (MICROSOFT_DELEGATED_SCOPE,), "google": (GOOGLE_SCOPE,), "generic": ()}[issuer]
    return OAuthSettings("refresh_token", _scopes(raw, where, problems, default), issuer=issuer, tenant=tenant,
                         client_id=client_id, client_secret=secret, refresh_token=token,
                         token_uri=token_uri or (GOOGLE_TOKEN_URI if issuer == "google" else None),
                         authority_host=authority.rstrip("/"), **common)


def _command(where: str, raw: dict[str, Any], env: Mapping[str, str], problems: Problems, user: str | None,
             common: dict[str, Any]) -> OAuthSettings | None:
    command = _take(raw, "command", list, where, problems)
    lifetime = _number(raw, "token_lifetime_seconds", where, problems, 300.0, 1)
    if not command or not all(isinstance(a, str) and a for a in command):
        problems.add(f"{where}.command", 'is required: the program and its arguments as a list, e.g. '
                     '["/usr/local/bin/get-token", "--account", "sales"] (no shell)')
        return None
    program = command[0]
    if os.sep in program:
        if not (os.path.isfile(program) and os.access(program, os.X_OK)):
            problems.add(f"{where}.command", f"{program} is not an executable file")
    elif not any(os.access(os.path.join(d, program), os.X_OK) for d in os.environ.get("PATH", "").split(os.pathsep)):
        problems.add(f"{where}.command", f"{program} is not found on PATH: give its full path")
    return OAuthSettings("command", _scopes(raw, where, problems, ()), command=tuple(command),
                         token_lifetime_seconds=lifetime, **common)
