"""Connections to SQL Server through pyodbc, from a URL or an ODBC connection string.

Accepted forms (from ``MAILQ_DB_URL``, ``--db``/``--url`` or the worker's config):

* a SQLAlchemy-style URL: ``mssql+pyodbc://user:pass@host:1433/db?driver=...&TrustServerCertificate=yes``
  (``mssql://`` is accepted too);
* a raw ODBC connection string: ``DRIVER={ODBC Driver 18 for SQL Server};SERVER=host,1433;...``.

When the string names no driver, :func:`find_driver` picks one.  Connections
are opened with autocommit on: every procedure owns its transaction.
"""

from __future__ import annotations

import os
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

from .errors import ConfigurationError, DriverNotFoundError

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


def find_driver(available: list[str] | None = None) -> str:
    """The best installed driver, or DriverNotFoundError listing what was tried."""
    available = installed_drivers() if available is None else available
    for name in PREFERRED_DRIVERS:
        if name in available:
            return name
    tried = "\n".join(f"  - {name}: install with {INSTALL_HINTS[name]}" for name in PREFERRED_DRIVERS)
    found = ", ".join(available) or "none"
    raise DriverNotFoundError(
        f"No usable ODBC driver for SQL Server (drivers registered with unixODBC: {found}).\n"
        f"Tried, in order:\n{tried}\n"
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
            if parts.username:
                items["UID"] = unquote(parts.username)
                items["PWD"] = unquote(parts.password or "")
            else:
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
    """Open an autocommit pyodbc connection; ``timeout`` is the login timeout in seconds."""
    import pyodbc

    conn = pyodbc.connect(to_odbc(resolve_url(url)), autocommit=True, timeout=timeout)
    if query_timeout:
        conn.timeout = query_timeout
    return conn
