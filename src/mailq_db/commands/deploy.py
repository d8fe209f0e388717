"""``mailq-db deploy``: apply or print the migrations carried in the package."""

from __future__ import annotations

import argparse
import sys

from .. import deployment as d
from ..connection import resolve_url

HELP = """\
Apply the mailq-db migrations (alembic upgrade) or print the script for review.

The migrations and SQL ship inside the package, so no checkout is needed.

examples:
  mailq-db deploy --sql > mailq-db.sql                print the full script (GO batches)
  mailq-db deploy --sql -x broker=off                 mail queue only (Azure SQL Database)
  mailq-db deploy --url "mssql+pyodbc://user:pw@host/db?driver=ODBC+Driver+18+for+SQL+Server"
  mailq-db deploy --revision 0001 --sql               up to one revision
  mailq-db deploy --downgrade base --sql              print the removal script
"""


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "deploy", help="apply or print the deployment script", description=HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--sql", action="store_true", help="print the script instead of applying it")
    parser.add_argument("--url", "--db", dest="url", help="database URL (default: $MAILQ_DB_URL)")
    parser.add_argument("--revision", default="head", help="target revision (default: head)")
    parser.add_argument("--downgrade", metavar="REVISION",
                        help="downgrade to REVISION (e.g. base) instead of upgrading")
    parser.add_argument("-x", dest="x", action="append", default=[], metavar="KEY=VALUE",
                        help="option passed to the migrations, e.g. broker=off, readers=5")
    parser.set_defaults(func=run)


def run(args) -> int:
    from alembic import command

    x_args = list(args.x)
    for item in x_args:
        if "=" not in item:
            raise SystemExit(f"mailq-db deploy: -x takes KEY=VALUE, got {item!r}")
    if not args.sql:
        x_args.append(f"url={resolve_url(args.url)}")
    cfg = d.alembic_config(x_args=x_args, stdout=sys.stdout)
    if args.downgrade:
        target = args.downgrade
        if args.sql and ":" not in target:
            target = f"head:{target}"  # offline downgrade needs an explicit start
        command.downgrade(cfg, target, sql=args.sql)
    else:
        command.upgrade(cfg, args.revision, sql=args.sql)
    return 0
