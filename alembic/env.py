"""Alembic environment of mailq-db.

Online:  ``alembic upgrade head`` with the URL from ``MAILQ_DB_URL`` (or
         ``-x url=...``; prefer the environment: a command line is visible to
         every user of the machine).
Offline: ``alembic upgrade head --sql`` renders the whole script for sqlcmd or
         SSMS in SQLCMD mode, with ``GO`` between batches, without any server.

Both paths, in this order:

1. the ``-x`` options are validated (unknown keys refused) before anything is
   written or executed, and the frozen copies are checked against
   ``alembic/frozen/MANIFEST.sha256``;
2. a header: the SQLCMD-mode guard and ``:on error exit`` (offline), the full
   SET line with ``XACT_ABORT`` and ``LOCK_TIMEOUT``, the system-database and
   db_owner checks, the deployers' application lock, the bookkeeping tables;
3. one transaction per revision (``mailq_db.deployment.RevisionPlan``);
4. with ``-x broker=add``: the broker catch-up (docs/dba-guide.md, section 4).

Offline, the script is built in memory and written only when complete: a
failed render never leaves a partial script.  The version table is
``dbo.mailq_alembic_version`` (pinned to dbo) so that mailq-db can share a
database with other Alembic projects.
"""

from __future__ import annotations

import dataclasses
import io
import os
import re
import sys
from pathlib import Path

from alembic import context
from sqlalchemy import create_engine, text
from sqlalchemy.pool import NullPool

from mailq_db import deployment as d
from mailq_db.connection import to_sqlalchemy_url
from mailq_db.errors import ConfigurationError

config = context.config
ROOT = Path(__file__).resolve().parents[1]

# 1. Options and manifest, before anything is written.
options = d.parse_options(context.get_x_argument(as_dictionary=True))
problems = d.manifest_problems(ROOT)
if problems:
    raise ConfigurationError(
        "the frozen SQL of this package does not match alembic/frozen/MANIFEST.sha256 "
        "(frozen copies are never edited; reinstall the package):\n  " + "\n  ".join(problems[:20]))
d.install_version_table_guard()

COMMON = {
    "version_table": d.VERSION_TABLE,
    "version_table_schema": d.VERSION_SCHEMA,
    "transaction_per_migration": True,
}

#: SSDT's guard: in a client without SQLCMD mode, ":setvar" is a syntax error
#: and "$(__IsSqlCmdEnabled)" stays literal, so the IF sets NOEXEC ON and
#: nothing after it executes.  ":on error exit" makes sqlcmd (with or without
#: -b) and SSMS in SQLCMD mode stop at the first error.  sqlcmd then closes
#: the connection (the server rolls the open transaction back); SSMS keeps it,
#: and XACT_ABORT does not roll back a compile error, so the header tells an
#: SSMS user to roll back before closing (SSMS offers to COMMIT on close).
SQLCMD_HEADER = """\
-- mailq-db deployment script: run it with sqlcmd (-b -I recommended) or in
-- SSMS with Query > SQLCMD Mode on.  It stops at the first error.  In SSMS
-- the session stays open after a stop: run IF @@TRANCOUNT > 0 ROLLBACK; and
-- close the window (never COMMIT: a syntax error leaves the failed revision's
-- transaction open; closing also releases the deployment lock).
:on error exit
:setvar __IsSqlCmdEnabled "True"
GO
IF N'$(__IsSqlCmdEnabled)' NOT LIKE N'True'
BEGIN
    RAISERROR(N'mailq-db: SQLCMD mode must be enabled to run this script (sqlcmd, or SSMS: Query > SQLCMD Mode).', 16, 1);
    SET NOEXEC ON;
END
GO
""" + d.HEADER_GUARD + "\nGO\n"


def _execute(sql: str) -> None:
    # text() reads ":name" as a bind parameter; T-SQL never means that.
    context.execute(text(d.statement_text(sql).replace(":", "\\:")))


def _destination() -> str | None:
    arg = context.get_revision_argument()
    if isinstance(arg, (tuple, list)):
        arg = arg[0] if arg else None
    if arg in (None, "base"):
        return None
    return context.script.get_revision(arg).revision


def _empty_range_message() -> str:
    start = context.get_starting_revision_argument()
    dest = context.get_revision_argument()
    return (f"the range {start or 'base'}:{dest or 'base'} renders no revision: an upgrade goes up "
            f"(a downgrade is mailq-db deploy --sql --downgrade {start or 'head'}:{dest or 'base'}); "
            f"this package's revisions: {', '.join(d.revisions(ROOT))}")


def run_migrations_offline() -> None:
    """Render the script: no connection, no driver needed."""
    config.attributes[d.OPTIONS_ATTRIBUTE] = options
    buffer = io.StringIO()
    context.configure(dialect_name="mssql", literal_binds=True, output_buffer=buffer, **COMMON)
    impl = context.get_context().impl
    impl.static_output(SQLCMD_HEADER)
    for sql in d.script_header(options):
        _execute(sql)
        _execute(d.HEADER_GUARD)
    if options.broker == "add":
        target = _destination()
        if target is None:
            raise ConfigurationError("-x broker=add needs a target revision (head)")
        impl.static_output(f"-- Adding delayed execution at revision {target} (-x broker=add)")
        _execute("BEGIN TRANSACTION")
        for _, sql in d.broker_catch_up_batches(target, options, offline=True, root=ROOT):
            _execute(sql)
        _execute("COMMIT TRANSACTION")
    else:
        d.reset_progress()
        with context.begin_transaction():
            context.run_migrations()
        if d.PROGRESS.get("revision") is None:
            raise ConfigurationError(_empty_range_message())
    for sql in d.script_footer():
        _execute(sql)
    out = config.output_buffer or sys.stdout
    out.write(compact(buffer.getvalue()))


def compact(script: str) -> str:
    """Alembic writes a blank line before and after every GO; one GO line
    between batches reads the same in fewer lines (no batch holds a line that
    is only GO: tests/static/test_deploy_script.py)."""
    return re.sub(r"\n\n+GO\n\n+", "\nGO\n", script)


def stored_options(connection) -> dict[str, str]:
    exists = connection.exec_driver_sql(
        f"SELECT OBJECT_ID(N'{d.OPTION_TABLE}', N'U')").scalar()
    if exists is None:
        return {}
    rows = connection.exec_driver_sql(f"SELECT Name, Value FROM {d.OPTION_TABLE}").fetchall()
    return {str(name): str(value) for name, value in rows}


def run_migrations_online() -> None:
    url = context.get_x_argument(as_dictionary=True).get("url") or os.environ.get("MAILQ_DB_URL")
    if not url:
        raise ConfigurationError(
            "no database URL: set MAILQ_DB_URL (or pass -x url=...), "
            "or render the script with `mailq-db deploy --sql`.")
    engine = create_engine(to_sqlalchemy_url(url), poolclass=NullPool)
    with engine.connect() as connection:
        stored = stored_options(connection)
        opts = options
        if "broker" not in opts.explicit and stored.get("broker") in ("on", "off"):
            # A later upgrade that forgets -x broker=off keeps what the database has.
            opts = dataclasses.replace(opts, broker=stored["broker"])
        config.attributes[d.OPTIONS_ATTRIBUTE] = opts
        d.PROGRESS.update(revision="(header)", file=None)
        for index, sql in enumerate(d.script_header(opts), 1):
            d.note_batch("(script header)", index)
            connection.exec_driver_sql(sql)
        d.reset_progress()
        connection.commit()
        # An explicit value must agree with the stored one.
        stored = stored_options(connection).get("broker")
        connection.commit()  # end the read's autobegun transaction
        if "broker" in opts.explicit and stored in ("on", "off") and opts.broker in ("on", "off") \
                and stored != opts.broker:
            raise ConfigurationError(
                f"the database was deployed with -x broker={stored} (stored in {d.OPTION_TABLE}); "
                + ("add delayed execution with -x broker=add" if stored == "off"
                   else "deploy without -x broker=off") + " (error 50414 in a rendered script)")
        if opts.broker == "add" and stored == "on":
            raise ConfigurationError("delayed execution is already deployed in this database "
                                     "(stored option broker=on): nothing to add (error 50415)")
        context.configure(connection=connection, **COMMON)
        with context.begin_transaction():
            context.run_migrations()
        if opts.broker == "add":
            target = connection.exec_driver_sql(
                f"SELECT MAX(version_num) FROM {d.VERSION_SCHEMA}.{d.VERSION_TABLE}").scalar()
            connection.commit()  # the catch-up opens its own transaction below
            if target is None:
                raise ConfigurationError("-x broker=add: the database has no revision yet; "
                                         "deploy with -x broker=on instead")
            d.PROGRESS["revision"] = f"{target} (broker=add)"
            frozen_in = dict(d.broker_catch_up_files(target, root=ROOT))  # file -> its frozen revision
            with connection.begin():
                for index, (label, sql) in enumerate(
                        d.broker_catch_up_batches(target, opts, offline=False, root=ROOT), 1):
                    d.note_batch(label, index, frozen_in.get(label), ROOT)
                    connection.exec_driver_sql(sql)
            d.reset_progress()
        for sql in d.script_footer(offline=False):
            connection.exec_driver_sql(sql)
        connection.commit()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
