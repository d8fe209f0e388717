"""Connections to SQL Server through pyodbc, from a URL or an ODBC connection string.

Accepted forms (from ``MAILQ_DB_URL``, ``--db``/``--url`` or the worker's config):

* a SQLAlchemy-style URL: ``mssql+pyodbc://user:pass@host:1433/db?driver=...&TrustServerCertificate=yes``
  (``mssql://`` is accepted too);
* a raw ODBC connection string: ``DRIVER={ODBC Driver 18 for SQL Server};SERVER=host,1433;...``.

When the string names no driver, :func:`find_driver` picks one.  Connections
are opened with autocommit on: every procedure owns its transaction.
:data:`TRANSIENT_ERRORS` is the one list of transient errors (each with the
Microsoft page it comes from); :class:`ReconnectingConnection` retries them,
reopening a dropped connection, and every caller (worker, client, the
events and hooks commands) goes through it or through :func:`is_transient`.
"""

from __future__ import annotations

import logging
import os
import random
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterator
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
# Transient errors: the one list every caller uses
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class Transient:
    """A SQL Server error after which the same call may succeed a little later."""

    number: int
    what: str
    #: True: the server ran none of the call's work (refused, or rolled it back),
    #: so any call may be sent again.  False: the connection broke mid-call, so
    #: the call may have committed: only a call that is safe to repeat is resent.
    rolled_back: bool
    source: str


_ERRORS = "https://learn.microsoft.com/en-us/sql/relational-databases/errors-events/"
_AZURE_TRANSIENT = ("https://learn.microsoft.com/en-us/azure/azure-sql/database/"
                    "troubleshoot-common-errors-issues#list-of-transient-fault-error-codes")
_AZURE_LIMITS = "https://learn.microsoft.com/en-us/azure/azure-sql/database/resource-limits-logical-server"
_AG_CLIENTS = ("https://learn.microsoft.com/en-us/sql/database-engine/availability-groups/windows/"
               "about-client-connection-access-to-availability-replicas-sql-server")

#: Native error numbers that are transient, each with the Microsoft page that says so.
#: Microsoft.Data.SqlClient keeps a similar list (SqlConfigurableRetryFactory.
#: BaselineTransientErrors); this one adds the availability-group errors.
TRANSIENT_ERRORS: dict[int, Transient] = {t.number: t for t in (
    Transient(1205, "chosen as deadlock victim; the transaction was rolled back", True,
              _ERRORS + "mssqlserver-1205-database-engine-error"),
    Transient(1222, "lock request time out (XACT_ABORT ON: the transaction was rolled back)", True,
              _ERRORS + "mssqlserver-1222-database-engine-error"),
    Transient(4060, "cannot open the database requested by the login (it is moving or starting)", True,
              _AZURE_TRANSIENT),
    Transient(40613, "database not currently available (Azure SQL reconfiguration)", True, _AZURE_TRANSIENT),
    Transient(40501, "the service is busy (Azure SQL throttling); the request was refused", True,
              _AZURE_TRANSIENT),
    Transient(49918, "not enough resources to process the request", True, _AZURE_TRANSIENT),
    Transient(49919, "too many create or update operations in progress", True, _AZURE_TRANSIENT),
    Transient(49920, "too many operations in progress", True, _AZURE_TRANSIENT),
    Transient(10928, "resource limit (sessions or workers) reached; the request was refused", True,
              _AZURE_LIMITS),
    Transient(10929, "the resource's minimum guarantee cannot be given now; the request was refused",
              True, _AZURE_LIMITS),
    Transient(40197, "the service had an error processing the request (failover or reconfiguration)",
              False, _AZURE_TRANSIENT),
    Transient(976, "the availability database is not accessible (failover in progress)", True,
              _AG_CLIENTS),
    Transient(983, "the availability replica is not PRIMARY or SECONDARY (failover in progress)", True,
              _AG_CLIENTS),
)}

#: ODBC SQLSTATEs after which the connection is unusable (class 08: connection
#: exception) or in an unknown state (HYT00/HYT01: timeout; the statement was
#: cancelled, so the connection is closed and opened again to roll back
#: whatever it left open).  An availability-group failover ends every
#: connection of the old primary this way.  (ODBC Appendix A, error codes:
#: https://learn.microsoft.com/en-us/sql/odbc/reference/appendixes/appendix-a-odbc-error-codes)
LOST_SQLSTATES = ("08", "HYT00", "HYT01")
#: Native numbers of a session that is gone (233: no process on the other end
#: of the pipe; 10053/10054/10060/10061/11001/64/121: TCP errors; -1 and 233
#: are how the ODBC driver reports a broken link).
LOST_NATIVE = {233, 10053, 10054, 10060, 10061, 11001, 64, 121, -1}
#: The transient errors that keep the session usable (nothing to reconnect for).
SAME_SESSION = frozenset({1205, 1222, 40501, 49918, 49919, 49920, 10928, 10929})


def _chain(exc: BaseException | None) -> Iterator[BaseException]:
    seen = 0
    while exc is not None and seen < 5:
        yield exc
        exc = exc.__cause__
        seen += 1


def is_connection_lost(exc: BaseException | None) -> bool:
    """True when ``exc`` (or an exception it was raised from) means the connection dropped.

    Recognises pyodbc errors by SQLSTATE and native number, and plain
    :class:`ConnectionError`/``TimeoutError`` (which test doubles raise).
    """
    for e in _chain(exc):
        if isinstance(e, (ConnectionError, TimeoutError)):
            return True
        args = getattr(e, "args", ())
        if type(e).__module__ == "pyodbc" and args and isinstance(args[0], str):
            if args[0].startswith(LOST_SQLSTATES):
                return True
        if isinstance(e, DatabaseError) and e.number in LOST_NATIVE:
            return True
    return False


def transient_error(exc: BaseException | None) -> Transient | None:
    """The :data:`TRANSIENT_ERRORS` entry of ``exc`` (or of an exception it was raised from)."""
    for e in _chain(exc):
        number = getattr(e, "number", None)
        if isinstance(e, DatabaseError) and number in TRANSIENT_ERRORS:
            return TRANSIENT_ERRORS[number]
    return None


def is_transient(exc: BaseException | None) -> bool:
    """A lost connection or a :data:`TRANSIENT_ERRORS` error: the same call may succeed later."""
    return transient_error(exc) is not None or is_connection_lost(exc)


def may_have_run(exc: BaseException | None) -> bool:
    """True when the failed call may have committed (the connection broke mid-call)."""
    known = transient_error(exc)
    return (known is not None and not known.rolled_back) or is_connection_lost(exc)


def keeps_session(exc: BaseException | None) -> bool:
    """True for a transient error after which the same connection can be used again."""
    known = transient_error(exc)
    return known is not None and known.number in SAME_SESSION and not is_connection_lost(exc)


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
    """A connection that retries transient errors and is opened again, with backoff, when it drops.

    ``call(fn, **kwargs)`` runs ``fn(conn, **kwargs)`` (a wrapper of
    :mod:`mailq_db.procedures`).  When it fails with a transient error
    (:func:`is_transient`: a lost connection, a deadlock, a lock timeout, an
    Azure SQL or availability-group failover error), the connection is
    discarded unless the error keeps the session (:func:`keeps_session`), and
    the same call is sent again after a backoff, at most ``retries`` times.

    ``call`` is for calls that are safe to repeat: the sender's procedures are
    fenced by the lock token (an acknowledgement that committed before the
    connection dropped is accepted again or refused with LeaseLostError, and
    nothing is written twice), reads, and the at-least-once dispatchers.
    ``call_at_most_once`` resends only when the server surely ran nothing
    (``Transient.rolled_back``): for a call that must not run twice.
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
        return self._call(fn, kwargs, repeatable=True)

    def call_at_most_once(self, fn: Callable[..., Any], **kwargs: Any) -> Any:
        return self._call(fn, kwargs, repeatable=False)

    def _call(self, fn: Callable[..., Any], kwargs: dict[str, Any], *, repeatable: bool) -> Any:
        attempt = 0
        while True:
            try:
                result = fn(self.raw, **kwargs)
            except Exception as exc:
                retry = is_transient(exc) and (repeatable or not may_have_run(exc))
                if not retry or attempt >= self.retries:
                    raise
                attempt += 1
                delay = self.backoff.next()
                self._log.warning(
                    "transient database error during %s (%s); retrying in %.1f s (%d/%d)",
                    getattr(fn, "__name__", "call"), exc, delay, attempt, self.retries,
                )
                if not keeps_session(exc):
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
