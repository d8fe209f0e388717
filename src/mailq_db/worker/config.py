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
import sys
from dataclasses import dataclass, field
from typing import Any, Mapping
from urllib.parse import urlsplit

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

from ..bounces.verp import BounceSettings, parse_settings as parse_bounce_settings
from ..errors import ConfigurationError

TLS_MODES = ("starttls", "implicit", "none")


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
    #: The run modes this worker serves (revision 0015, docs/run-modes.md):
    #: it claims mail of these run modes only.  Default: ("prod",).
    run_modes: tuple[str, ...] = ("prod",)


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


ACCOUNT_KEYS = ("host", "port", "tls", "allow_plaintext", "user", "password_env", "connect_timeout_seconds",
                "command_timeout_seconds", "final_reply_timeout_seconds", "verify_tls", "ca_file",
                "local_hostname", "pipelining", "wait_min_seconds", "wait_max_seconds",
                "login_sleep_max_seconds", "bounces")
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


def _worker(raw: dict[str, Any], problems: _Problems) -> WorkerConfig:
    w = "worker"
    num = (int, float)
    values = {
        "batch_size": _take(raw, "batch_size", int, w, problems),
        "lease_seconds": _take(raw, "lease_seconds", int, w, problems),
        "lease_safety_margin_seconds": _take(raw, "lease_safety_margin_seconds", int, w, problems),
        "app_name": _take(raw, "app_name", str, w, problems),
        "worker_name": _take(raw, "worker_name", str, w, problems),
        "concurrency": _take(raw, "concurrency", int, w, problems),
        "idle_backoff_min_seconds": _take(raw, "idle_backoff_min_seconds", num, w, problems),
        "idle_backoff_max_seconds": _take(raw, "idle_backoff_max_seconds", num, w, problems),
        "ack_interval_seconds": _take(raw, "ack_interval_seconds", num, w, problems),
        "dry_run": _take(raw, "dry_run", bool, w, problems),
        "run_modes": _take(raw, "run_modes", list, w, problems),
    }
    if values["run_modes"] is not None:
        bad = check_run_modes(values["run_modes"])
        for text in bad:
            problems.add("worker.run_modes", text)
        values["run_modes"] = None if bad else tuple(dict.fromkeys(values["run_modes"]))
    _unknown(raw, w, problems, WORKER_KEYS)
    values = {k: v for k, v in values.items() if v is not None}
    cfg = WorkerConfig(**values)
    _positive(cfg.batch_size, "worker.batch_size", problems)
    _positive(cfg.concurrency, "worker.concurrency", problems)
    _positive(cfg.lease_seconds, "worker.lease_seconds", problems, 10)
    _positive(cfg.lease_safety_margin_seconds, "worker.lease_safety_margin_seconds", problems)
    _positive(cfg.idle_backoff_min_seconds, "worker.idle_backoff_min_seconds", problems, 0.01)
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
    return cfg


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
    num = (int, float)
    host = _take(raw, "host", str, a, problems)
    tls = _take(raw, "tls", str, a, problems, "starttls")
    allow_plaintext = _take(raw, "allow_plaintext", bool, a, problems, False)
    port = _take(raw, "port", int, a, problems)
    user = _take(raw, "user", str, a, problems)
    password_env = _take(raw, "password_env", str, a, problems)
    connect_timeout = _take(raw, "connect_timeout_seconds", num, a, problems, 10.0)
    command_timeout = _take(raw, "command_timeout_seconds", num, a, problems, 30.0)
    verify_tls = _take(raw, "verify_tls", bool, a, problems, True)
    ca_file = _take(raw, "ca_file", str, a, problems)
    local_hostname = _take(raw, "local_hostname", str, a, problems)
    final_timeout = _take(raw, "final_reply_timeout_seconds", num, a, problems, 600.0)
    pipelining = _take(raw, "pipelining", bool, a, problems, True)
    wait_min = _take(raw, "wait_min_seconds", num, a, problems)
    wait_max = _take(raw, "wait_max_seconds", num, a, problems, 3600.0)
    login_sleep_max = _take(raw, "login_sleep_max_seconds", num, a, problems, 10.0)
    bounces = parse_bounce_settings(raw.pop("bounces", None), f"{a}.bounces", env, problems.add)
    _unknown(raw, a, problems, ACCOUNT_KEYS)
    if not host:
        problems.add(f"{a}.host", "is required (the SMTP server's host name)")
    if tls not in TLS_MODES:
        problems.add(f"{a}.tls", f"must be one of {', '.join(TLS_MODES)} (got {tls!r})")
    if tls == "none" and not allow_plaintext:
        problems.add(f"{a}.tls", '"none" sends mail and passwords in clear text: '
                     "add allow_plaintext = true if you really mean it (local sinks only)")
    if port is None:
        port = 465 if tls == "implicit" else 587 if tls == "starttls" else 25
    if not 0 < port < 65536:
        problems.add(f"{a}.port", f"must be 1-65535 (got {port})")
    password = None
    if user and not password_env:
        problems.add(f"{a}.password_env", f"user is set: name the environment variable that holds {user}'s password")
    if password_env and not user:
        problems.add(f"{a}.user", "password_env is set but user is not")
    if password_env:
        if password_env not in env:
            problems.add(f"{a}.password_env", f"environment variable {password_env} is not set")
        else:
            password = env[password_env]
    if ca_file and not os.path.isfile(ca_file):
        problems.add(f"{a}.ca_file", f"{ca_file} does not exist")
    elif ca_file:
        try:
            ssl.create_default_context(cafile=ca_file)
        except (ssl.SSLError, ValueError, OSError) as exc:
            problems.add(f"{a}.ca_file", f"{ca_file} is not a PEM file of CA certificates ({exc})")
    if tls == "starttls" and port == 465:
        problems.add(f"{a}.tls", 'port 465 is implicit TLS (RFC 8314): set tls = "implicit", or use port 587')
    if tls == "implicit" and port in (25, 587):
        problems.add(f"{a}.tls", f'port {port} speaks STARTTLS, not implicit TLS: set tls = "starttls", '
                     "or use port 465")
    if local_hostname is not None and not is_fqdn(local_hostname):
        problems.add(f"{a}.local_hostname", f"{local_hostname!r} is not a fully qualified domain name: "
                     "servers such as Postfix (reject_non_fqdn_helo_hostname) refuse it at RCPT TO; "
                     "give this machine's public name, e.g. mailer.example.com")
    _positive(final_timeout, f"{a}.final_reply_timeout_seconds", problems, 0.01)
    if wait_min is not None:
        _positive(wait_min, f"{a}.wait_min_seconds", problems, 1)
        if wait_max < wait_min:
            problems.add(f"{a}.wait_max_seconds", "must be at least wait_min_seconds")
    _positive(connect_timeout, f"{a}.connect_timeout_seconds", problems, 0.01)
    _positive(login_sleep_max, f"{a}.login_sleep_max_seconds", problems, 0)
    _positive(command_timeout, f"{a}.command_timeout_seconds", problems, 0.01)
    return AccountConfig(
        name=name, host=host or "", port=port, tls=tls, allow_plaintext=allow_plaintext,
        user=user, password_env=password_env, password=password,
        connect_timeout_seconds=float(connect_timeout), command_timeout_seconds=float(command_timeout),
        verify_tls=verify_tls, ca_file=ca_file, local_hostname=local_hostname,
        final_reply_timeout_seconds=float(final_timeout), pipelining=pipelining,
        wait_min_seconds=None if wait_min is None else float(wait_min), wait_max_seconds=float(wait_max),
        login_sleep_max_seconds=float(login_sleep_max), bounces=bounces,
    )


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
    for key in raw:
        close = difflib.get_close_matches(key, ("worker", "database", "accounts"), n=1, cutoff=0.6)
        hint = f"did you mean [{close[0]}]?" if close else "expected [worker], [database], [accounts.NAME]"
        problems.add(key, f"unknown section ({hint})")
    problems.raise_if_any()
    return Config(worker=worker, database=database, accounts=accounts)


def load_config(path: str, *, env: Mapping[str, str] | None = None) -> Config:
    """Read and validate a TOML file (see :func:`parse_config`)."""
    try:
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
    except OSError as exc:
        raise ConfigurationError(f"cannot read config {path}: {exc.strerror}") from exc
    return parse_config(text, env=env, source=path)
