"""``mailq-db stats``: mail queued now, oldest due age, mail finished per hour, recent failures."""

from __future__ import annotations

import argparse
import json
from datetime import datetime
from typing import Any

from .. import procedures
from ..connection import connect

HELP = """\
Show the queue's health (mailq.GetQueueStats): mail queued now by status and
account, the oldest due mail's age per account (how far behind the workers
are), mail finished per hour and account over the last --hours hours (Sent,
Failed, Expired, Cancelled, Stopped), and the most recent failed attempts.
Every figure comes from an index seek bounded by the mail still queued or by
the time window: the cost does not grow with the finished mail kept.

examples:
  mailq-db stats
  mailq-db stats --failures 50 --hours 72
  mailq-db stats --json | jq '.queued'
"""

SECTIONS = (
    ("queued", "Mail queued now, by status and account", ("Status", "AccountName", "MailCount")),
    ("oldest_due", "Oldest due mail per account",
     ("AccountName", "OldestDueUtc", "OldestDueAgeSeconds", "DueCount")),
    ("finished_per_hour", "Mail finished per hour (UTC)",
     ("HourUtc", "AccountName", "Sent", "Failed", "Expired", "Cancelled", "Stopped")),
    ("failures", "Recent failed attempts", ("ID", "AccountName", "Status", "DateProcessed", "LastError")),
)


def register(subparsers) -> None:
    p = subparsers.add_parser("stats", help="queue counts, oldest due age, throughput, failures",
                              description=HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--failures", type=_count, default=10, metavar="N", help="recent failures to list (default 10)")
    p.add_argument("--hours", type=_hours, default=24, metavar="N",
                   help="hours of finished mail to count, 1-168 (default 24)")
    p.add_argument("--json", action="store_true", help="print JSON instead of tables")
    p.add_argument("--db", help="database URL (default: $MAILQ_DB_URL)")
    p.set_defaults(func=run)


def _count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not 0 <= value <= 1000:
        raise argparse.ArgumentTypeError(f"must be 0-1000, got {value}")
    return value


def _hours(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not 1 <= value <= 168:
        raise argparse.ArgumentTypeError(f"must be 1-168, got {value}")
    return value


def _cell(value: Any, width: int | None = None) -> str:
    if value is None:
        text = "-"
    elif isinstance(value, datetime):
        text = value.strftime("%Y-%m-%d %H:%M:%S")
    else:
        text = " ".join(str(value).split())
    if width and len(text) > width:
        text = text[: width - 1] + "…"
    return text


def table(rows: list[dict[str, Any]], columns: tuple[str, ...]) -> str:
    if not rows:
        return "  (none)"
    cells = [[_cell(r.get(c), 80) for c in columns] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(columns)]
    lines = ["  " + "  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True))]
    lines += ["  " + "  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)) for row in cells]
    return "\n".join(line.rstrip() for line in lines)


def render(stats: procedures.QueueStats, hours: int = 24) -> str:
    parts = []
    for attr, title, columns in SECTIONS:
        if attr == "finished_per_hour":
            title = f"{title}, last {hours} h"
        parts.append(f"{title}:\n{table(getattr(stats, attr), columns)}")
    return "\n\n".join(parts)


#: Bounces and suppressions: mailq.GetSuppressionStats, last 7 days.
BOUNCE_SECTIONS = (
    ("suppressions", "Active suppressions", ("AccountName", "Reason", "Suppressed")),
    ("bounce_reports", "Bounce, complaint and unsubscribe reports (last 7 days)",
     ("AccountName", "Kind", "Reports", "Mails", "LastAtUtc")),
)


def bounce_sections(conn: Any) -> dict[str, list[dict[str, Any]]]:
    from ..bounces import health
    from ..errors import DatabaseError

    get = getattr(procedures, "get_suppression_stats", None)  # a stand-in without it: no section
    if get is None:
        return {}
    try:
        return health.rows(get(conn, days=7))
    except DatabaseError as exc:
        if exc.number == 2812:  # not deployed yet: no section
            return {}
        raise


def run(args) -> int:
    conn = connect(args.db)
    try:
        stats = procedures.get_queue_stats(conn, recent_failures=args.failures, finished_hours=args.hours)
        bounces = bounce_sections(conn)
    finally:
        conn.close()
    if args.json:
        print(json.dumps({**{attr: getattr(stats, attr) for attr, _, _ in SECTIONS}, **bounces},
                         default=str, ensure_ascii=False, indent=2))
    else:
        print(render(stats, args.hours))
        for attr, title, columns in BOUNCE_SECTIONS:
            if attr in bounces:
                print(f"\n{title}:\n{table(bounces[attr], columns)}")
    return 0
