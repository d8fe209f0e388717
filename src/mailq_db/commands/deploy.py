"""``mailq-db deploy``: apply or print the migrations carried in the package."""

from __future__ import annotations

import argparse
import io
import logging
import os
import re
import sys

from .. import deployment as d
from ..connection import ENV_URL

HELP = """\
Apply the mailq-db migrations (alembic upgrade) or print the script for review.

The migrations and SQL ship inside the package, so no checkout is needed.
The database URL is read from MAILQ_DB_URL (keep passwords off the command
line: every user of the machine can read it); --url exists for URLs without
secrets (integrated or Azure AD authentication).

examples (the database URL comes from MAILQ_DB_URL, set from a file readable
by you only, e.g. set -a; . ~/.config/mailq-db/deploy.env; set +a):
  mailq-db deploy --sql > mailq-db.sql                print the full script (GO batches)
  mailq-db deploy --sql -x broker=off                 mail queue only (Azure SQL Database)
  mailq-db deploy --sql --revision 0001:head          upgrade script for a database at 0001
  mailq-db deploy                                     apply what the database lacks
  mailq-db deploy -x broker=add                       add delayed execution later (no downgrade)
  mailq-db deploy --downgrade base --sql              print the removal script (stops while
                                                      a table holds rows; -x drop_data=yes)

options (-x KEY=VALUE, validated; broker and readers are stored in the database):
  broker=on|off|add   delayed execution (default: what the database has, else on)
  readers=N           MAX_QUEUE_READERS of dbo.DelayServiceQueue, 1-32767
  lock_timeout=MS     SET LOCK_TIMEOUT of the deployment (default 30000; -1 waits forever)
  seed=check|disable-triggers|ignore
                      what to do about other triggers on dbo.tabDIYTable12402 and other
                      services or messages on dbo.DelayServiceQueue (default check:
                      stop with 50370-50372; docs/dba-guide.md section 4)
  drop_data=no|yes    a downgrade that would drop a table or column holding rows stops
                      with 50420/50422 unless yes (default no)
"""

log = logging.getLogger("mailq_db.deploy")


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "deploy", help="apply or print the deployment script", description=HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--sql", action="store_true", help="print the script instead of applying it")
    parser.add_argument("--url", "--db", dest="url", help=f"database URL (default: ${ENV_URL})")
    parser.add_argument("--revision", default="head",
                        help="target revision, or FROM:TO with --sql (default: head)")
    parser.add_argument("--downgrade", metavar="REVISION",
                        help="downgrade to REVISION (e.g. base) instead of upgrading")
    parser.add_argument("-x", dest="x", action="append", default=[], metavar="KEY=VALUE",
                        help="option passed to the migrations: broker=on|off|add, readers=N, lock_timeout=MS, "
                        "seed=check|disable-triggers|ignore, drop_data=no|yes")
    parser.add_argument("--traceback", action="store_true", help="show the full traceback of a failure")
    parser.set_defaults(func=run)


#: Where a server message names a place itself: sqlcmd-style
#: "Msg 207, Level 16, State 1, Procedure mailq.X, Line 12" or "..., Line 12".
#: The ODBC drivers put neither in the message text (pyodbc does not read the
#: SQL_DIAG_SS_LINE / SQL_DIAG_SS_PROCNAME diagnostic fields), so usually only
#: the batch's place in its file is known.
_SERVER_PLACE = re.compile(
    r"(?:\bProcedure\s+(?P<proc>[^,\s]+)\s*,\s*)?\bLine\s+(?P<line>\d+)\b", re.I)


def server_message(exc: BaseException) -> str:
    """The server's (or our own) message without the driver's bracketed prefixes."""
    from ..errors import MailqError

    orig = getattr(exc, "orig", None) or exc.__cause__ or exc
    args: tuple[object, ...] = getattr(orig, "args", ())
    if type(orig).__module__ == "pyodbc" and len(args) > 1:
        text = str(args[1])
    elif isinstance(exc, MailqError):
        text = str(exc)
    else:
        text = str(getattr(exc, "orig", None) or exc)
    # "[42000] [Microsoft][ODBC Driver 18 for SQL Server][SQL Server]Message (50410) (SQLExecDirectW)"
    text = re.sub(r"\[[^\]]*\]|\(SQL[A-Za-z]+W?\)", "", text).strip()
    return " ".join(text.split())


def describe_failure(exc: BaseException, progress: dict | None = None) -> str:
    """One line: where the deployment stopped and the server's own message.

    ``revision R, file F, lines A-B`` (the failing batch's place in the frozen
    copy that was sent; each file is one batch), or ``batch N (label)`` for a
    batch the tool adds ("(revision check)" ...); when the message itself names a line
    (and procedure), that line is added, mapped to the file's line.
    """
    progress = d.PROGRESS if progress is None else progress
    text = server_message(exc)
    where = []
    if progress.get("revision"):
        where.append(f"revision {progress['revision']}")
    label = progress.get("file")
    first, last = progress.get("first_line"), progress.get("last_line")
    if progress.get("path") and first:
        where.append(f"file {progress['path']}")
        where.append(f"lines {first}-{last}" if last and last != first else f"line {first}")
    elif label and str(label).startswith("(") and progress.get("batch"):
        where.append(f"batch {progress['batch']} {label}")  # a batch the tool adds: "batch 4 (stored options)"
    elif label:
        where.append(f"file {label}")
    match = _SERVER_PLACE.search(text)
    if match:
        server_line = int(match.group("line"))
        proc = match.group("proc")
        if proc:
            where.append(f"procedure {proc} line {server_line}")
        elif first:
            where.append(f"line {int(str(first)) + server_line - 1} (server: batch line {server_line})")
        else:
            where.append(f"batch line {server_line}")
    prefix = ", ".join(where)
    return f"mailq-db deploy: failed{' in ' + prefix if prefix else ''}: {text}"


def run(args) -> int:
    from alembic import command

    from ..errors import ConfigurationError

    try:
        x_args = list(args.x)
        d.parse_options(x_args)  # validated before anything is written or sent
        url = args.url or os.environ.get(ENV_URL)
        if not args.sql:
            if not url:
                raise ConfigurationError(
                    f"no database given: set {ENV_URL} (or pass --url), or print the script with --sql")
            if args.url:
                x_args.append(f"url={url}")  # else env.py reads MAILQ_DB_URL itself
            if not logging.getLogger().handlers:
                logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
            log.setLevel(logging.INFO)
        check_range(args)
        d.reset_progress()
        buffer = io.StringIO() if args.sql else None
        cfg = d.alembic_config(x_args=x_args, stdout=buffer or sys.stderr)
        if args.downgrade:
            target = args.downgrade
            if args.sql and ":" not in target:
                target = f"head:{target}"  # offline downgrade needs an explicit start
            command.downgrade(cfg, target, sql=args.sql)
        else:
            command.upgrade(cfg, args.revision, sql=args.sql)
        if buffer is not None:
            sys.stdout.write(buffer.getvalue())
    except KeyboardInterrupt:
        raise
    except Exception as exc:  # noqa: BLE001 - one line for the operator, not a traceback
        if getattr(args, "traceback", False):
            raise
        print(unknown_revision(exc, args) or describe_failure(exc), file=sys.stderr)
        return 1
    return 0


def _known() -> list[str]:
    return d.revisions()


def _position(rev: str, known: list[str]) -> int | None:
    """Where ``rev`` sits among this package's revisions (base -1, head last)."""
    if rev == "base":
        return -1
    if rev == "head":
        return len(known) - 1
    return known.index(rev) if rev in known else None


def check_range(args) -> None:
    """Refuse what would render nothing or the wrong way round, before Alembic
    runs: ``--revision A:B`` with B below A (an empty script that exits 0),
    and ranges without --sql (online, the database says where it starts)."""
    from ..errors import ConfigurationError

    known = _known()
    spec = args.downgrade if args.downgrade else args.revision
    for rev in spec.split(":"):
        if _position(rev, known) is None:
            raise ConfigurationError(
                f"unknown revision {rev!r}: this mailq-db knows {', '.join(known) or 'none'} "
                "(and head, base)")
    if ":" not in spec:
        return
    if not args.sql:
        raise ConfigurationError(f"a range ({spec}) needs --sql: online, mailq-db deploy reads the "
                                 "database's revision and picks the revisions itself")
    start, dest = spec.split(":", 1)
    below = (_position(dest, known) or 0) < (_position(start, known) or 0)  # both known: checked above
    if start == dest:
        raise ConfigurationError(f"the range {spec} starts where it ends: there is nothing to render")
    if args.downgrade is None and below:
        raise ConfigurationError(
            f"--revision {spec} renders no upgrade: {dest} is not above {start} "
            f"(to go down, render mailq-db deploy --sql --downgrade {spec})")
    if args.downgrade is not None and not below:
        raise ConfigurationError(f"--downgrade {spec} goes up: render mailq-db deploy --sql --revision {spec}")


_UNKNOWN = re.compile(r"Can't locate revision identified by '(?P<rev>[^']+)'")


def unknown_revision(exc: BaseException, args) -> str | None:
    """One line for a database at a revision this package does not know (a
    newer mailq-db deployed it), instead of Alembic's "Can't locate revision"."""
    match = _UNKNOWN.search(str(exc))
    if not match:
        return None
    known = _known()
    return (f"mailq-db deploy: the database is at revision {match.group('rev')}, which this mailq-db does not "
            f"know (its revisions: {', '.join(known)}): a newer mailq-db deployed it. Deploy with that "
            "version or a later one (error 50421 in a rendered script).")
