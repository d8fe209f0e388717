"""The worker's TOML configuration: database, worker settings, SMTP accounts.

Secrets never live in the file: an account names the environment variable
that holds its password (``password_env``), and the database URL comes from
``MAILQ_DB_URL``, ``--db``, or ``[database] url`` without a password (use
``url_env`` to name another variable).  :func:`load_config` collects every
problem it finds and raises one :class:`ConfigurationError` that lists them all,
each with what to do about it.

Example: ``examples/worker.toml``.
"""

from __future__ import annotations

import difflib
import os
import re
import socket
import ssl
from dataclasses import dataclass, field
from typing import Any, Mapping
from urllib.parse import urlsplit

from ..bounces.verp import BounceSettings, parse_settings as parse_bounce_settings
from ..errors import ConfigurationError
from .classify import EscalationPolicy, resolve_provider, tomllib  # one TOML import for Python 3.10 and 3.11+
from .dkim import DkimSettings, key_file_warning, parse_dkim, permission_warning
from .oauth.settings import OAuthSettings, parse_oauth
from .sasl import AUTH_MODES

TLS_MODES = ("starttls", "implicit", "none")
#: The generators every application may call when the configuration names none
#: (the built-in CSV generator renders only its own arguments).
DEFAULT_GENERATORS: dict[str, tuple[str, ...]] = {"*": ("csv",)}


@dataclass(frozen=True)
class AccountConfig:
    name: str
    host: str
    port: int = 587
    tls: str = "starttls"  # starttls (required) | implicit | none
    allow_plaintext: bool = False
    user: str | None = None
    password_env: str | None = None
    password: str | None = field(default=None, repr=False)
    connect_timeout_seconds: float = 10.0
    command_timeout_seconds: float = 30.0
    verify_tls: bool = True
    ca_file: str | None = None
    local_hostname: str | None = None
    #: RFC 5321 4.5.3.2.6: wait this long for the reply after the final dot
    final_reply_timeout_seconds: float = 600.0
    #: the message content is written in chunks, each within this many seconds
    #: (Postfix's smtp_data_xfer_timeout: a limit on progress, so a large message
    #: on a slow link gets as long as it keeps moving)
    data_timeout_seconds: float = 180.0
    #: the provider whose replies the server sends (a provider id or alias of
    #: smtp_rules.toml, e.g. "qq"); None: recognised from the host name, the
    #: greeting or the EHLO reply
    provider: str | None = None
    #: use RFC 2920 PIPELINING when the server offers it
    pipelining: bool = True
    #: a Wait (throttled account) blocks the account for this long at first,
    #: doubling on each further Wait up to wait_max_seconds; None: the
    #: classification rule's time
    wait_min_seconds: float | None = None
    wait_max_seconds: float = 3600.0
    #: the account's minimum interval between two logins lives in the database
    #: (mailq.SendingAccount.MinLoginIntervalMs, every worker obeys it); when
    #: the next login is at most this far away the worker sleeps, otherwise it
    #: defers the account's batch (a Wait: no attempt spent).  0: never sleep.
    login_sleep_max_seconds: float = 10.0
    #: [accounts.NAME.bounces]: VERP return path and unsubscribe links (docs/bounces.md)
    bounces: BounceSettings | None = None
    #: how the account signs in: "password" (PLAIN/LOGIN), "xoauth2" or
    #: "oauthbearer" with a token from ``oauth`` (docs/oauth2.md)
    auth: str = "password"
    oauth: OAuthSettings | None = None
    #: DKIM signing of every mail of the account (docs/dkim.md); None: unsigned
    dkim: DkimSettings | None = None


@dataclass(frozen=True)
class WorkerConfig:
    batch_size: int = 50
    lease_seconds: int = 120
    lease_safety_margin_seconds: int = 30
    app_name: str | None = None  # None: compete for every application's mail
    worker_name: str = field(default_factory=lambda: f"{socket.gethostname()}:{os.getpid()}")
    concurrency: int = 1
    idle_backoff_min_seconds: float = 1.0
    idle_backoff_max_seconds: float = 30.0
    ack_interval_seconds: float = 5.0
    dry_run: bool = False
    #: The run modes this worker serves (docs/run-modes.md): it claims mail of
    #: these run modes only.  Default: ("prod",).
    run_modes: tuple[str, ...] = ("prod",)
    #: a lazy attachment generator taking longer is abandoned and its mail retried
    generator_timeout_seconds: float = 60.0
    #: on shutdown, how long unwritten acknowledgements are retried before the
    #: worker leaves their mails to lease expiry (flagged PossibleDuplicate)
    ack_shutdown_wait_seconds: float = 30.0
    #: the bytes of mail (bodies and attachments) one claimed batch may hold;
    #: mails beyond it are given back at once and the next claims are smaller
    batch_memory_budget_bytes: int = 256 * 1024 * 1024


#: A run-mode name: the rule of CK_MailQueue_RunMode / EnqueueMail's 50240.
RUN_MODE_RE = re.compile(r"[a-z][a-z0-9_-]{0,31}")


def check_run_modes(modes: Any) -> list[str]:
    """The problems of a run-mode list (empty when it is valid): 1-16 names,
    each a-z first, then a-z 0-9 '-' '_', at most 32 characters."""
    if not isinstance(modes, (list, tuple)) or not modes:
        return ["must be a non-empty list of run-mode names, e.g. [\"prod\"]"]
    problems = []
    if len(modes) > 16:
        problems.append(f"at most 16 run modes (got {len(modes)})")
    for m in modes:
        if not isinstance(m, str) or not RUN_MODE_RE.fullmatch(m):
            problems.append(f"{m!r} is not a run-mode name (a-z first, then a-z 0-9 - _, at most 32 characters)")
    return problems


@dataclass(frozen=True)
class DatabaseConfig:
    url: str | None = None
    connect_timeout_seconds: int = 15
    query_timeout_seconds: int = 30


@dataclass(frozen=True)
class Config:
    worker: WorkerConfig = field(default_factory=WorkerConfig)
    database: DatabaseConfig = field(default_factory=DatabaseConfig)
    accounts: dict[str, AccountConfig] = field(default_factory=dict)
    #: repeated temporary failures of an account become an account pause ([escalation])
    escalation: EscalationPolicy = field(default_factory=EscalationPolicy)
    #: application name -> the lazy attachment generators its mail may call
    #: ([generators]); "*" applies to every application (and to mail without one)
    generators: dict[str, tuple[str, ...]] = field(default_factory=lambda: dict(DEFAULT_GENERATORS))

    def generators_for(self, app_name: str | None) -> frozenset[str]:
        """The generators a mail of ``app_name`` may call."""
        allowed = set(self.generators.get("*", ()))
        if app_name is not None:
            allowed.update(self.generators.get(app_name, ()))
            allowed.update(v for k, vs in self.generators.items() if k.casefold() == app_name.casefold()
                           for v in vs)
        return frozenset(allowed)


class _Problems:
    def __init__(self, source: str):
        self.source = source
        self.items: list[str] = []

    def add(self, where: str, text: str) -> None:
        self.items.append(f"{where}: {text}")

    def raise_if_any(self) -> None:
        if self.items:
            lines = "\n".join(f"  - {p}" for p in self.items)
            raise ConfigurationError(f"{len(self.items)} problem(s) in {self.source}:\n{lines}")


def _take(table: dict[str, Any], key: str, kind: type | tuple[type, ...], where: str,
          problems: _Problems, default: Any = None) -> Any:
    if key not in table:
        return default
    value = table.pop(key)
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if isinstance(value, bool) and bool not in kinds:
        ok = False
    else:
        ok = isinstance(value, kinds)
    if not ok:
        names = " or ".join(k.__name__ for k in kinds)
        problems.add(f"{where}.{key}", f"must be {names}, got {value!r}")
        return default
    return value


def _positive(value: Any, where: str, problems: _Problems, minimum: float = 1) -> None:
    if value is not None and value < minimum:
        problems.add(where, f"must be at least {minimum}, got {value}")


_NUM = (int, float)
#: key -> (type, default) of an [accounts.NAME] table
ACCOUNT_SPEC: dict[str, tuple[Any, Any]] = {
    "host": (str, None), "port": (int, None), "tls": (str, "starttls"), "allow_plaintext": (bool, False),
    "user": (str, None), "password_env": (str, None), "connect_timeout_seconds": (_NUM, 10.0),
    "command_timeout_seconds": (_NUM, 30.0), "final_reply_timeout_seconds": (_NUM, 600.0),
    "data_timeout_seconds": (_NUM, 180.0), "verify_tls": (bool, True), "ca_file": (str, None),
    "local_hostname": (str, None), "pipelining": (bool, True), "wait_min_seconds": (_NUM, None),
    "wait_max_seconds": (_NUM, 3600.0), "login_sleep_max_seconds": (_NUM, 10.0), "provider": (str, None),
}
#: the identity keys, read by _identity: auth, and the [accounts.NAME.oauth] and [accounts.NAME.dkim] tables
IDENTITY_KEYS = ("auth", "oauth", "dkim")
#: ... and the [accounts.NAME.bounces] table (mailq_db.bounces.verp.parse_settings)
ACCOUNT_KEYS = (*ACCOUNT_SPEC, *IDENTITY_KEYS, "bounces")
WORKER_KEYS = tuple(WorkerConfig.__dataclass_fields__)
DATABASE_KEYS = ("url", "url_env", "connect_timeout_seconds", "query_timeout_seconds")


def _unknown(table: dict[str, Any], where: str, problems: _Problems, known: tuple[str, ...] = ()) -> None:
    for key in table:
        close = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
        hint = f"did you mean {close[0]!r}?" if close else "check the spelling against examples/worker.toml"
        problems.add(f"{where}.{key}", f"unknown setting ({hint})")


def is_fqdn(name: str) -> bool:
    """A fully qualified domain name (or an address literal such as [192.0.2.1]), as EHLO wants (RFC 5321 4.1.4)."""
    if name.startswith("[") and name.endswith("]"):
        return True
    labels = name.rstrip(".").split(".")
    return len(labels) >= 2 and all(re.fullmatch(r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?", x)
                                    for x in labels) and not labels[-1].isdigit()


#: key -> type of a [worker] setting (defaults: WorkerConfig's)
WORKER_SPEC: dict[str, Any] = {
    "batch_size": int, "lease_seconds": int, "lease_safety_margin_seconds": int, "app_name": str,
    "worker_name": str, "concurrency": int, "idle_backoff_min_seconds": _NUM, "idle_backoff_max_seconds": _NUM,
    "ack_interval_seconds": _NUM, "dry_run": bool, "run_modes": list, "generator_timeout_seconds": _NUM,
    "ack_shutdown_wait_seconds": _NUM, "batch_memory_budget_bytes": int,
}


def _worker(raw: dict[str, Any], problems: _Problems) -> WorkerConfig:
    w = "worker"
    values = {key: _take(raw, key, kind, w, problems) for key, kind in WORKER_SPEC.items()}
    if values["run_modes"] is not None:
        bad = check_run_modes(values["run_modes"])
        for text in bad:
            problems.add("worker.run_modes", text)
        values["run_modes"] = None if bad else tuple(dict.fromkeys(values["run_modes"]))
    _unknown(raw, w, problems, WORKER_KEYS)
    cfg = WorkerConfig(**{k: v for k, v in values.items() if v is not None})
    for key, minimum in (("batch_size", 1), ("concurrency", 1), ("lease_seconds", 10),
                         ("lease_safety_margin_seconds", 1), ("idle_backoff_min_seconds", 0.01),
                         ("generator_timeout_seconds", 0.01), ("ack_shutdown_wait_seconds", 0),
                         ("batch_memory_budget_bytes", 1024 * 1024)):
        _positive(getattr(cfg, key), f"worker.{key}", problems, minimum)
    _check_worker(cfg, problems)
    return cfg


def _check_worker(cfg: WorkerConfig, problems: _Problems) -> None:
    if cfg.batch_size > 1000:
        problems.add("worker.batch_size", f"at most 1000 (got {cfg.batch_size}); large batches hold leases long")
    if cfg.lease_safety_margin_seconds * 2 > cfg.lease_seconds:
        problems.add(
            "worker.lease_safety_margin_seconds",
            f"{cfg.lease_safety_margin_seconds} s is more than half of lease_seconds "
            f"({cfg.lease_seconds} s): raise lease_seconds or lower the margin",
        )
    if cfg.idle_backoff_max_seconds < cfg.idle_backoff_min_seconds:
        problems.add("worker.idle_backoff_max_seconds", "must be at least idle_backoff_min_seconds")
    if cfg.app_name is not None and not cfg.app_name.strip():
        problems.add("worker.app_name", "is empty: omit it to compete for every application's mail")


def _database(raw: dict[str, Any], env: Mapping[str, str], problems: _Problems) -> DatabaseConfig:
    d = "database"
    url = _take(raw, "url", str, d, problems)
    url_env = _take(raw, "url_env", str, d, problems)
    connect_timeout = _take(raw, "connect_timeout_seconds", int, d, problems, 15)
    query_timeout = _take(raw, "query_timeout_seconds", int, d, problems, 30)
    _unknown(raw, d, problems, DATABASE_KEYS)
    if url and "://" in url and urlsplit(url).password:
        problems.add("database.url", "contains a password: secrets come from the environment; "
                     "put the whole URL in MAILQ_DB_URL (or the variable named by url_env)")
    elif url and "pwd=" in url.lower():
        problems.add("database.url", "contains PWD=: put the connection string in MAILQ_DB_URL instead")
    if url_env:
        if url:
            problems.add("database", "set url or url_env, not both")
        elif url_env not in env:
            problems.add("database.url_env", f"environment variable {url_env} is not set")
        else:
            url = env[url_env]
    _positive(connect_timeout, "database.connect_timeout_seconds", problems)
    _positive(query_timeout, "database.query_timeout_seconds", problems)
    return DatabaseConfig(url=url, connect_timeout_seconds=connect_timeout,
                          query_timeout_seconds=query_timeout)


def _account(name: str, raw: Any, env: Mapping[str, str], problems: _Problems) -> AccountConfig | None:
    a = f"accounts.{name}"
    if not isinstance(raw, dict):
        problems.add(a, "must be a table: [accounts.NAME] with host, port, tls, user, password_env")
        return None
    if "password" in raw:
        raw.pop("password")
        problems.add(f"{a}.password", "passwords never go in the file: set password_env to the "
                     "name of an environment variable that holds it")
    bounces = parse_bounce_settings(raw.pop("bounces", None), f"{a}.bounces", env, problems.add)
    v = {key: _take(raw, key, kind, a, problems, default) for key, (kind, default) in ACCOUNT_SPEC.items()}
    identity = _identity(a, raw, env, problems, v["user"], v["password_env"])
    _unknown(raw, a, problems, ACCOUNT_KEYS)
    if v["port"] is None:
        v["port"] = 465 if v["tls"] == "implicit" else 587 if v["tls"] == "starttls" else 25
    _check_transport(a, v, problems)
    password = _password(a, v, env, problems, identity["auth"])
    _check_account_names(a, v, problems)
    _check_account_times(a, v, problems)
    floats = {k: float(v[k]) for k in ("connect_timeout_seconds", "command_timeout_seconds",
                                       "final_reply_timeout_seconds", "data_timeout_seconds",
                                       "wait_max_seconds", "login_sleep_max_seconds")}
    return AccountConfig(
        name=name, host=v["host"] or "", port=v["port"], tls=v["tls"], allow_plaintext=v["allow_plaintext"],
        user=v["user"], password_env=v["password_env"], password=password, verify_tls=v["verify_tls"],
        ca_file=v["ca_file"], local_hostname=v["local_hostname"], pipelining=v["pipelining"],
        wait_min_seconds=None if v["wait_min_seconds"] is None else float(v["wait_min_seconds"]),
        provider=v["provider"], auth=identity["auth"], oauth=identity["oauth"], dkim=identity["dkim"],
        bounces=bounces, **floats,
    )


def _check_transport(a: str, v: dict[str, Any], problems: _Problems) -> None:
    """Host, port and TLS mode, and whether they fit together."""
    tls, port = v["tls"], v["port"]
    if not v["host"]:
        problems.add(f"{a}.host", "is required (the SMTP server's host name)")
    if tls not in TLS_MODES:
        problems.add(f"{a}.tls", f"must be one of {', '.join(TLS_MODES)} (got {tls!r})")
    if tls == "none" and not v["allow_plaintext"]:
        problems.add(f"{a}.tls", '"none" sends mail and passwords in clear text: '
                     "add allow_plaintext = true if you really mean it (local sinks only)")
    if not 0 < port < 65536:
        problems.add(f"{a}.port", f"must be 1-65535 (got {port})")
    if tls == "starttls" and port == 465:
        problems.add(f"{a}.tls", 'port 465 is implicit TLS (RFC 8314): set tls = "implicit", or use port 587')
    if tls == "implicit" and port in (25, 587):
        problems.add(f"{a}.tls", f'port {port} speaks STARTTLS, not implicit TLS: set tls = "starttls", '
                     "or use port 465")
    ca_file = v["ca_file"]
    if ca_file and not os.path.isfile(ca_file):
        problems.add(f"{a}.ca_file", f"{ca_file} does not exist")
    elif ca_file:
        try:
            ssl.create_default_context(cafile=ca_file)
        except (ssl.SSLError, ValueError, OSError) as exc:
            problems.add(f"{a}.ca_file", f"{ca_file} is not a PEM file of CA certificates ({exc})")


def _password(a: str, v: dict[str, Any], env: Mapping[str, str], problems: _Problems,
              auth: str = "password") -> str | None:
    user, password_env = v["user"], v["password_env"]
    if user and not password_env and auth == "password":
        problems.add(f"{a}.password_env", f"user is set: name the environment variable that holds {user}'s password")
    if password_env and not user:
        problems.add(f"{a}.user", "password_env is set but user is not")
    if not password_env:
        return None
    if password_env not in env:
        problems.add(f"{a}.password_env", f"environment variable {password_env} is not set")
        return None
    return env[password_env]


def _check_account_names(a: str, v: dict[str, Any], problems: _Problems) -> None:
    """The EHLO name and the provider."""
    local_hostname = v["local_hostname"]
    if local_hostname is not None and not is_fqdn(local_hostname):
        problems.add(f"{a}.local_hostname", f"{local_hostname!r} is not a fully qualified domain name: "
                     "servers such as Postfix (reject_non_fqdn_helo_hostname) refuse it at RCPT TO; "
                     "give this machine's public name, e.g. mailer.example.com")
    provider = v["provider"]
    if provider is not None and resolve_provider(provider) is None:
        problems.add(f"{a}.provider", f"{provider!r} is not a provider of the rule table "
                     "(see docs/smtp-classification.md, Providers)")


def _check_account_times(a: str, v: dict[str, Any], problems: _Problems) -> None:
    wait_min = v["wait_min_seconds"]
    if wait_min is not None:
        _positive(wait_min, f"{a}.wait_min_seconds", problems, 1)
        if v["wait_max_seconds"] < wait_min:
            problems.add(f"{a}.wait_max_seconds", "must be at least wait_min_seconds")
    for key in ("final_reply_timeout_seconds", "data_timeout_seconds", "connect_timeout_seconds",
                "command_timeout_seconds"):
        _positive(v[key], f"{a}.{key}", problems, 0.01)
    _positive(v["login_sleep_max_seconds"], f"{a}.login_sleep_max_seconds", problems, 0)


def _escalation(raw: Any, problems: _Problems) -> EscalationPolicy:
    if not isinstance(raw, dict):
        problems.add("escalation", "must be a table of settings")
        return EscalationPolicy()
    try:
        return EscalationPolicy.from_mapping(raw)
    except (TypeError, ValueError) as exc:
        problems.add("escalation", str(exc).removeprefix("escalation: "))
        return EscalationPolicy()


def _generators(raw: Any, problems: _Problems) -> dict[str, tuple[str, ...]]:
    """[generators]: application name = ["generator", ...]; "*" for every application."""
    if not isinstance(raw, dict):
        problems.add("generators", 'must be a table: application = ["generator", ...]')
        return dict(DEFAULT_GENERATORS)
    out: dict[str, tuple[str, ...]] = {}
    for app, names in raw.items():
        if not isinstance(names, list) or not all(isinstance(n, str) and n for n in names):
            problems.add(f"generators.{app}", "must be a list of generator names, e.g. [\"csv\"]")
            continue
        out[app] = tuple(dict.fromkeys(names))
    return out


SECTIONS = ("worker", "database", "accounts", "escalation", "generators")


def _identity(a: str, raw: dict[str, Any], env: Mapping[str, str], problems: _Problems, user: str | None,
              password_env: str | None) -> dict[str, Any]:
    """The account's ``auth``, ``[accounts.NAME.oauth]`` and ``[accounts.NAME.dkim]``
    (docs/oauth2.md, docs/dkim.md)."""
    auth = _take(raw, "auth", str, a, problems, "password")
    oauth_raw, dkim_raw = raw.pop("oauth", None), raw.pop("dkim", None)
    values: dict[str, Any] = {"auth": "password", "oauth": None, "dkim": None}
    if auth not in AUTH_MODES:
        problems.add(f"{a}.auth", f"must be one of {', '.join(AUTH_MODES)} (got {auth!r})")
    elif auth != "password":
        values["auth"] = auth
        if not user:
            problems.add(f"{a}.user", f'is required with auth = "{auth}": the mailbox the token signs in as')
        if password_env:
            problems.add(f"{a}.password_env", f'auth = "{auth}" signs in with a token, not a password: remove it')
        if oauth_raw is None:
            problems.add(a, f'auth = "{auth}" needs a table [{a}.oauth] with provider = "microsoft", "google", '
                         '"refresh_token" or "command" (docs/oauth2.md)')
        else:
            values["oauth"] = parse_oauth(f"{a}.oauth", oauth_raw, env, problems, user)
    if auth == "password" and oauth_raw is not None:
        problems.add(f"{a}.oauth", 'is set but auth is "password": set auth = "xoauth2" (or "oauthbearer")')
    if dkim_raw is not None:
        values["dkim"] = parse_dkim(f"{a}.dkim", dkim_raw, env, problems)
    return values


def secret_file_warnings(config: Config) -> list[str]:
    """One line per secret file of an account (OAuth secrets, refresh tokens, keys, the DKIM key)
    that other users may read or change: check-config prints them, the worker logs them."""
    lines = []
    for a in config.accounts.values():
        found = [key_file_warning(a.dkim)] if a.dkim else []
        s = a.oauth
        if s is not None:
            files = [("the client secret", s.client_secret.file if s.client_secret else None),
                     ("the refresh token", s.refresh_token.file if s.refresh_token else None),
                     ("the service account key", s.service_account.file if s.service_account else None),
                     ("the certificate and its key", s.certificate_file)]
            found += [permission_warning(path, what) for what, path in files if path]
        lines += [f"account {a.name}: {line}" for line in found if line]
    return lines


def parse_config(text: str, *, env: Mapping[str, str] | None = None, source: str = "config") -> Config:
    """Parse and validate TOML text; raises ConfigurationError listing every problem."""
    env = os.environ if env is None else env
    problems = _Problems(source)
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigurationError(f"{source} is not valid TOML: {exc}") from exc
    worker = _worker(dict(raw.pop("worker", {}) or {}), problems)
    database = _database(dict(raw.pop("database", {}) or {}), env, problems)
    accounts_raw = raw.pop("accounts", {})
    accounts: dict[str, AccountConfig] = {}
    if not isinstance(accounts_raw, dict) or not accounts_raw:
        problems.add("accounts", "no account: add at least one [accounts.NAME] table "
                     "(NAME is the sending account's name in the database)")
    else:
        for name, table in accounts_raw.items():
            account = _account(name, dict(table) if isinstance(table, dict) else table, env, problems)
            if account:
                accounts[name] = account
    escalation = _escalation(raw.pop("escalation", {}), problems)
    generators = _generators(raw.pop("generators"), problems) if "generators" in raw else dict(DEFAULT_GENERATORS)
    for key in raw:
        close = difflib.get_close_matches(key, SECTIONS, n=1, cutoff=0.6)
        hint = f"did you mean [{close[0]}]?" if close else \
            "expected [worker], [database], [escalation], [generators], [accounts.NAME]"
        problems.add(key, f"unknown section ({hint})")
    problems.raise_if_any()
    return Config(worker=worker, database=database, accounts=accounts, escalation=escalation,
                  generators=generators)


def load_config(path: str, *, env: Mapping[str, str] | None = None) -> Config:
    """Read and validate a TOML file (see :func:`parse_config`)."""
    try:
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
    except OSError as exc:
        raise ConfigurationError(f"cannot read config {path}: {exc.strerror}") from exc
    return parse_config(text, env=env, source=path)
