"""The ``mailq-db`` command line: one entry point, one module per command.

Each module in :mod:`mailq_db.commands` exposes ``register(subparsers)`` that
adds its parser and sets ``func`` to a callable taking the parsed arguments and
returning the exit code.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from . import __version__
from .errors import MailqError

#: Command modules, in the order ``--help`` lists them.
COMMANDS: tuple[str, ...] = (
    "deploy", "enqueue", "worker", "stats", "doctor", "dev", "import_dbmail", "classify", "events",
    "template", "hooks", "exporter", "dashboard", "dbmail_runner",
    "bounces", "unsubscribe",
)

EPILOG = """\
examples:
  mailq-db deploy --sql > deploy.sql          print the deployment script for review
  mailq-db deploy                             apply it (URL from $MAILQ_DB_URL, never argv)
  mailq-db enqueue --to a@example.com --subject Hi --text-file body.txt
  mailq-db worker --config worker.toml        run a sender worker
  mailq-db stats                              queue counts, oldest due age, throughput
  mailq-db doctor                             check driver, server, schema, broker, roles
  mailq-db exporter                           the queue's metrics for Prometheus
  mailq-db dashboard                          a read-only web page of the queue
  mailq-db dbmail-runner                      run SendDbMail's @query as its sender
"""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="mailq-db",
        description="A durable mail queue and delayed execution for Microsoft SQL Server.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"mailq-db {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        importlib.import_module(f"mailq_db.commands.{name}").register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except MailqError as exc:
        print(f"mailq-db {args.command}: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
