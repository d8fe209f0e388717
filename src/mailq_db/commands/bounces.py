"""``mailq-db bounces``: read the bounce mailbox, classify one message, manage suppressions."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from datetime import datetime
from typing import Any

from .. import procedures
from ..connection import Backoff, ReconnectingConnection, connect
from ..errors import ConfigurationError

HELP = """\
Bounces, complaints and unsubscribes (docs/bounces.md).

Without a subcommand: read the bounce mailbox over IMAP once (or --loop),
record each delivery report, complaint and mailto: unsubscribe through
mailq.RecordBounce / mailq.RecordUnsubscribe (once per report and recipient),
and move what was handled to the processed or other folder; a message that
could not be recorded stays and is read again.  Settings: the [bounces]
table of --config (IMAP host, user, password_env, the account the mailbox
serves, bounce limits); the database: --db or $MAILQ_DB_URL (role
MailqBounceReader); the signing key: $MAILQ_BOUNCE_KEY.

examples:
  mailq-db bounces --config bounces.toml
  mailq-db bounces --config bounces.toml --loop --interval 60
  mailq-db bounces parse message.eml --json
  mailq-db bounces list --account news --reason Complaint
  mailq-db bounces suppress --account news --address a@example.com --source dba:alice
  mailq-db bounces unsuppress --account news --address a@example.com --source dba:alice
  mailq-db bounces purge --older-than-days 365
"""


def register(subparsers) -> None:
    p = subparsers.add_parser("bounces", help="read the bounce mailbox; classify a report; manage suppressions",
                              description=HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", metavar="FILE", help="TOML file with a [bounces] table")
    p.add_argument("--loop", action="store_true", help="read again every --interval seconds until interrupted")
    p.add_argument("--interval", type=float, default=60.0, metavar="S", help="seconds between passes (default 60)")
    p.add_argument("--db", help="database URL (default: $MAILQ_DB_URL)")
    p.set_defaults(func=run_read, parser=p)
    sub = p.add_subparsers(dest="bounces_command", metavar="SUBCOMMAND")

    parse = sub.add_parser("parse", help="classify one message file as the reader would")
    parse.add_argument("file", help="an RFC 5322 message (.eml); '-' reads standard input")
    parse.add_argument("--json", action="store_true", help="print the JSON object (the default prints a summary)")
    parse.set_defaults(func=run_parse)

    lst = sub.add_parser("list", help="the suppression list (mailq.ListSuppressions)")
    lst.add_argument("--account")
    lst.add_argument("--address")
    lst.add_argument("--reason", choices=("HardBounce", "SoftBounce", "Complaint", "Unsubscribe", "Manual"))
    lst.add_argument("--include-expired", action="store_true")
    lst.add_argument("--max-rows", type=int, default=1000)
    lst.add_argument("--json", action="store_true")
    lst.add_argument("--db")
    lst.set_defaults(func=run_list)

    add = sub.add_parser("suppress", help="suppress an address (mailq.AddSuppression)")
    _address_args(add)
    add.add_argument("--reason", default="Manual",
                     choices=("Manual", "HardBounce", "SoftBounce", "Complaint", "Unsubscribe"))
    add.add_argument("--expires", metavar="UTC", help="ISO 8601 UTC time, e.g. 2030-01-01T00:00:00")
    add.set_defaults(func=run_suppress)

    rm = sub.add_parser("unsuppress", help="remove a suppression (mailq.RemoveSuppression)")
    _address_args(rm)
    rm.set_defaults(func=run_unsuppress)

    purge = sub.add_parser("purge", help="delete old bounce reports (mailq.PurgeBounceReports)")
    purge.add_argument("--older-than-days", type=int, required=True)
    purge.add_argument("--db")
    purge.set_defaults(func=run_purge)


def _address_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--account", required=True)
    p.add_argument("--address", required=True)
    p.add_argument("--source", required=True, help="who does it, e.g. dba:alice")
    p.add_argument("--app", help="one application only (default: every application of the account)")
    p.add_argument("--detail", help="why")
    p.add_argument("--db")


# ------------------------------------------------------------------ parse


def summary(report: Any) -> str:
    lines = [f"kind: {report.kind}  (format: {report.format})"]
    if report.original_message_id:
        lines.append(f"original Message-ID: {report.original_message_id}")
    for r in report.recipients:
        lines.append(f"  {r.address}  action={r.action}  status={r.status or '-'}  ({r.kind})")
    if not report.recipients:
        lines.append("  (no recipient)")
    return "\n".join(lines)


def run_parse(args) -> int:
    from ..bounces.parse import parse

    if args.file == "-":
        raw = sys.stdin.buffer.read()
    else:
        try:
            with open(args.file, "rb") as fh:
                raw = fh.read()
        except OSError as exc:
            raise ConfigurationError(f"cannot read {args.file}: {exc.strerror}") from exc
    report = parse(raw)
    print(report.dumps() if args.json else summary(report))
    return 0


# ------------------------------------------------------------------ read


def run_read(args) -> int:
    from ..bounces import reader

    if args.bounces_command is None and not args.config:
        args.parser.error("--config FILE is required to read the bounce mailbox (or give a subcommand)")
    config = reader.load_reader_config(args.config, env=os.environ)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    db = ReconnectingConnection(lambda: connect(args.db), backoff=Backoff(0.5, 30.0))
    token_provider = (lambda: os.environ.get(config.token_env or "", "")) if config.auth == "xoauth2" else None
    try:
        while True:
            result = reader.run_once(config, db, procedures, token_provider=token_provider)
            print(f"bounces: {result.seen} read, {result.recorded} recorded, {result.unsubscribed} unsubscribes, "
                  f"{result.nothing} with nothing to record, {result.failed} failed (left in {config.folder})"
                  + (f"; suppressed: {', '.join(result.suppressed)}" if result.suppressed else ""))
            if not args.loop:
                return 1 if result.failed else 0
            time.sleep(args.interval)
    except KeyboardInterrupt:
        return 0
    finally:
        db.close()


# ------------------------------------------------------------------ suppressions


def _print_rows(rows: list[dict[str, Any]], as_json: bool) -> None:
    if as_json:
        print(json.dumps(rows, default=str, ensure_ascii=False, indent=2))
        return
    from .stats import table

    print(table(rows, ("AccountName", "AppName", "Address", "Reason", "Source", "UpdatedAtUtc", "ExpiresAtUtc")))


def run_list(args) -> int:
    conn = connect(args.db)
    try:
        rows = procedures.list_suppressions(conn, account_name=args.account, address=args.address,
                                            reason=args.reason, include_expired=args.include_expired,
                                            max_rows=args.max_rows)
    finally:
        conn.close()
    _print_rows(rows, args.json)
    return 0


def run_suppress(args) -> int:
    expires = None
    if args.expires:
        try:
            expires = datetime.fromisoformat(args.expires.rstrip("Z"))
        except ValueError as exc:
            raise ConfigurationError(f"--expires: {exc}") from exc
    conn = connect(args.db)
    try:
        row = procedures.add_suppression(conn, account_name=args.account, address=args.address,
                                         source=args.source, reason=args.reason, app_name=args.app,
                                         detail=args.detail, expires_at_utc=expires)
    finally:
        conn.close()
    print(f"suppressed {row['Address']} for {row['AccountName']}"
          f"{' / ' + row['AppName'] if row.get('AppName') else ''}: {row['SweptMails']} queued mail(s) lost it, "
          f"{row['StoppedMails']} stopped")
    return 0


def run_unsuppress(args) -> int:
    conn = connect(args.db)
    try:
        removed = procedures.remove_suppression(conn, account_name=args.account, address=args.address,
                                                source=args.source, app_name=args.app, detail=args.detail)
    finally:
        conn.close()
    print(f"removed {removed} suppression(s)")
    return 0


def run_purge(args) -> int:
    conn = connect(args.db)
    try:
        n = procedures.purge_bounce_reports(conn, older_than_days=args.older_than_days)
    finally:
        conn.close()
    print(f"purged {n} bounce report(s)")
    return 0
