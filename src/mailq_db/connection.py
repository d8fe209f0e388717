"""Connections to SQL Server through pyodbc, from a URL or an ODBC connection string.

Accepted forms (from ``MAILQ_DB_URL``, ``--db``/``--url`` or the worker's config):

* a SQLAlchemy-style URL: ``mssql+pyodbc://user:pass@host:1433/db?driver=...&TrustServerCertificate=yes``
  (``mssql://`` is accepted too);
* a raw ODBC connection string: ``DRIVER={ODBC Driver 18 for SQL Server};SERVER=host,1433;...``.

When the string names no driver, :func:`find_driver` picks one.  Connections
are opened with autocommit on: every procedure owns its transaction.
:class:`ReconnectingConnection` reopens a dropped connection with backoff and
sends the interrupted call again (safe for the token-fenced procedures).
"""

from __future__ import annotations

import logging
import os
import random
import time
from typing import Any, Callable
from urllib.parse import parse_qsl, unquote, urlsplit

from .errors import ConfigurationError, DatabaseError, DriverNotFoundError, from_driver_error

ENV_URL = "MAILQ_DB_URL"

#: Drivers tried in order.  FreeTDS needs TDS 7.4 for DATETIME2 and NVARCHAR(MAX).
PREFERRED_DRIVERS = ("ODBC Driver 18 for SQL Server", "ODBC Driver 17 for SQL Server", "FreeTDS")

INSTALL_HINTS = {
    "ODBC Driver 18 for SQL Server": "Microsoft's msodbcsql18 package (see Microsoft's "
    "'Install the Microsoft ODBC driver for SQL Server (Linux)' page)",
    "ODBC Driver 17 for SQL Server": "Microsoft's msodbcsql17 package",
    "FreeTDS": "Debian/Ubuntu: apt-get install unixodbc tdsodbc",
}


def installed_drivers() -> list[str]:
    """The ODBC drivers unixODBC knows about (empty when pyodbc cannot load)."""
    try:
        import pyodbc
    except ImportError:
        return []
    return list(pyodbc.drivers())


def pyodbc_problem() -> str | None:
    """Why pyodbc cannot be imported (e.g. libodbc.so.2 missing), or None when it loads."""
    try:
        import pyodbc  # noqa: F401
    except ImportError as exc:
        return str(exc)
    return None


def find_driver(available: list[str] | None = None) -> str:
    """The best installed driver, or DriverNotFoundError listing what was tried."""
    available = installed_drivers() if available is None else available
    for name in PREFERRED_DRIVERS:
        if name in available:
            return name
    tried = "\n".join(f"  - {name}: install with {INSTALL_HINTS[name]}" for name in PREFERRED_DRIVERS)
    found = ", ".join(available) or "none"
    problem = pyodbc_problem()
    loader = f"pyodbc cannot load: {problem}\n" if problem else ""
    raise DriverNotFoundError(
        f"No usable ODBC driver for SQL Server (drivers registered with unixODBC: {found}).\n"
        f"{loader}Tried, in order:\n{tried}\n"
        "pyodbc itself needs libodbc.so.2 (Debian/Ubuntu: apt-get install unixodbc)."
    )


def _odbc_quote(value: str) -> str:
    if any(c in value for c in ";{}") or value != value.strip():
        return "{" + value.replace("}", "}}") + "}"
    return value


def to_odbc(url: str, *, driver: str | None = None) -> str:
    """An ODBC connection string for ``url`` (URL or ODBC string); adds a driver when missing."""
    url = url.strip()
    if not url:
        raise ConfigurationError(f"empty database URL: set {ENV_URL} or pass --db")
    if "://" not in url:
        odbc = url
    else:
        parts = urlsplit(url)
        if parts.scheme not in ("mssql", "mssql+pyodbc"):
            raise ConfigurationError(
                f"unsupported URL scheme {parts.scheme!r}: use mssql+pyodbc://user:password@host:port/database"
            )
        query = dict(parse_qsl(parts.query, keep_blank_values=True))
        if "odbc_connect" in query:
            odbc = query.pop("odbc_connect")
        else:
            if not parts.hostname:
                raise ConfigurationError("database URL has no host: mssql+pyodbc://user:password@host:port/database")
            items = {"SERVER": parts.hostname + (f",{parts.port}" if parts.port else "")}
            database = unquote(parts.path.lstrip("/"))
            if database:
                items["DATABASE"] = database
            keys = {k.lower() for k in query}
            if parts.username:
                items["UID"] = unquote(parts.username)
                # An empty password is no password: "PWD=" would send one.
                if parts.password:
                    items["PWD"] = unquote(parts.password)
            elif "authentication" not in keys and "trusted_connection" not in keys:
                # Windows/Kerberos integrated login.  Never with Authentication=
                # (Azure AD: ActiveDirectoryMsi, ActiveDirectoryDefault, ...):
                # ODBC refuses the pair with FA001.
                items["Trusted_Connection"] = "yes"
            if "driver" in query:
                items["DRIVER"] = query.pop("driver")
            for key, value in query.items():
                items[key] = value
            odbc = ";".join(f"{k}={_odbc_quote(v)}" for k, v in items.items())
    if "driver=" not in odbc.lower():
        chosen = driver or find_driver()
        odbc = f"DRIVER={{{chosen}}};" + odbc
        if chosen == "FreeTDS" and "tds_version" not in odbc.lower():
            odbc += ";TDS_Version=7.4"
    return odbc


def to_sqlalchemy_url(url: str) -> str:
    """The SQLAlchemy URL Alembic uses for ``url`` (URL or ODBC connection string)."""
    from urllib.parse import quote_plus

    return "mssql+pyodbc:///?odbc_connect=" + quote_plus(to_odbc(url))


def resolve_url(explicit: str | None = None) -> str:
    """``explicit`` if given, else ``MAILQ_DB_URL``, else a clear error."""
    url = explicit or os.environ.get(ENV_URL)
    if not url:
        raise ConfigurationError(f"no database given: pass --db URL or set {ENV_URL}")
    return url


def connect(url: str | None = None, *, timeout: int = 15, query_timeout: int | None = None) -> Any:
    """Open an autocommit pyodbc connection.

    ``timeout`` is the login timeout and ``query_timeout`` the per-statement
    timeout, both in seconds (0 or None: no statement timeout).
    """
    problem = pyodbc_problem()
    if problem:
        find_driver([])  # raises DriverNotFoundError with the install hints
    import pyodbc

    odbc = to_odbc(resolve_url(url))
    try:
        conn = pyodbc.connect(odbc, autocommit=True, timeout=timeout)
    except pyodbc.Error as exc:
        raise from_driver_error(exc) from exc
    if query_timeout:
        conn.timeout = query_timeout
    return conn


# --------------------------------------------------------------------------
# Dropped connections
# --------------------------------------------------------------------------

#: ODBC SQLSTATEs after which the connection is unusable (class 08: connection
#: exception) or in an unknown state (HYT00/HYT01: timeout; the statement was
#: cancelled, so the connection is closed and opened again to roll back
#: whatever it left open).
LOST_SQLSTATES = ("08", "HYT00", "HYT01")
#: SQL Server native errors that mean the session is gone.
LOST_NATIVE = {233, 10053, 10054, 10060, 10061, 11001, 64, 121, -1}


def is_connection_lost(exc: BaseException | None) -> bool:
    """True when ``exc`` (or an exception it was raised from) means the connection dropped.

    Recognises pyodbc errors by SQLSTATE and native number, and plain
    :class:`ConnectionError`/``TimeoutError`` (which test doubles raise).
    """
    seen = 0
    while exc is not None and seen < 5:
        if isinstance(exc, (ConnectionError, TimeoutError)):
            return True
        args = getattr(exc, "args", ())
        if type(exc).__module__ == "pyodbc" and args and isinstance(args[0], str):
            if args[0].startswith(LOST_SQLSTATES):
                return True
        number = getattr(exc, "number", None)
        if isinstance(exc, DatabaseError) and number in LOST_NATIVE:
            return True
        exc = exc.__cause__
        seen += 1
    return False


class Backoff:
    """Exponential backoff with full jitter: ``initial`` doubling up to ``maximum`` seconds."""

    def __init__(self, initial: float = 0.5, maximum: float = 30.0, *, jitter: bool = True):
        self.initial = initial
        self.maximum = maximum
        self.jitter = jitter
        self.current = initial

    def next(self) -> float:
        delay = self.current
        self.current = min(self.maximum, self.current * 2)
        return random.uniform(delay / 2, delay) if self.jitter else delay

    def reset(self) -> None:
        self.current = self.initial


class ReconnectingConnection:
    """A connection that is opened again, with backoff, when it drops.

    ``call(fn, **kwargs)`` runs ``fn(conn, **kwargs)`` (a wrapper of
    :mod:`mailq_db.procedures`).  When the call fails because the connection
    dropped, the connection is discarded, reopened with backoff, and the same
    call is sent again with the same arguments, at most ``retries`` times.

    Sending a call again is safe for the sender's procedures because they are
    fenced by the lock token: an acknowledgement that did commit before the
    connection dropped is refused the second time with ``LeaseLostError``
    (nothing is written twice), and a claim whose answer was lost only leaves
    mails leased to a token nobody uses, which the lease returns to the queue.
    Other errors are raised unchanged.
    """

    def __init__(
        self,
        open_connection: Callable[[], Any],
        *,
        retries: int = 5,
        backoff: Backoff | None = None,
        sleep: Callable[[float], None] = time.sleep,
        log: logging.Logger | None = None,
    ):
        self._open = open_connection
        self.retries = retries
        self.backoff = backoff or Backoff()
        self._sleep = sleep
        self._log = log or logging.getLogger("mailq_db.connection")
        self._conn: Any = None
        self.reconnects = 0

    @property
    def raw(self) -> Any:
        """The underlying connection, opened on first use."""
        if self._conn is None:
            self._conn = self._open()
        return self._conn

    def call(self, fn: Callable[..., Any], **kwargs: Any) -> Any:
        attempt = 0
        while True:
            try:
                result = fn(self.raw, **kwargs)
            except Exception as exc:
                if not is_connection_lost(exc) or attempt >= self.retries:
                    raise
                attempt += 1
                delay = self.backoff.next()
                self._log.warning(
                    "database connection lost during %s (%s); reconnecting in %.1f s (%d/%d)",
                    getattr(fn, "__name__", "call"), exc, delay, attempt, self.retries,
                )
                self.discard()
                self.reconnects += 1
                self._sleep(delay)
                continue
            self.backoff.reset()
            return result

    def discard(self) -> None:
        """Close and forget the connection (errors while closing are ignored)."""
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                conn.close()
            except Exception:  # noqa: BLE001 - it is already broken
                pass

    close = discard
