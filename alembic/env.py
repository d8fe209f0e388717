"""Alembic environment of mailq-db.

Online:  ``alembic upgrade head`` with the URL from ``-x url=...`` or
         ``MAILQ_DB_URL`` (a SQLAlchemy URL or an ODBC connection string).
Offline: ``alembic upgrade head --sql`` renders the whole script for sqlcmd or
         SSMS, with ``GO`` between batches, without any server.

``-x`` options understood by the revisions are listed in docs/dba-guide.md.
Each revision runs in its own transaction; the version table is
``dbo.mailq_alembic_version`` so that mailq-db can share a database with
other Alembic projects.
"""

from __future__ import annotations

import os

from alembic import context
from sqlalchemy import create_engine
from sqlalchemy.pool import NullPool

from mailq_db.connection import to_sqlalchemy_url
from mailq_db.deployment import VERSION_TABLE

config = context.config
x_args = context.get_x_argument(as_dictionary=True)

COMMON = {
    "version_table": VERSION_TABLE,
    "transaction_per_migration": True,
}


def run_migrations_offline() -> None:
    """Render the script: no connection, no driver needed."""
    context.configure(dialect_name="mssql", literal_binds=True, **COMMON)
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    url = x_args.get("url") or os.environ.get("MAILQ_DB_URL")
    if not url:
        raise SystemExit(
            "mailq-db: no database URL. Pass `alembic -x url=mssql+pyodbc://...` "
            "or set MAILQ_DB_URL, or render the script with `alembic upgrade head --sql`."
        )
    engine = create_engine(to_sqlalchemy_url(url), poolclass=NullPool)
    with engine.connect() as connection:
        context.configure(connection=connection, **COMMON)
        with context.begin_transaction():
            context.run_migrations()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
