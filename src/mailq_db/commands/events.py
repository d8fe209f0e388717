"""``mailq-db events``: print the event stream of an application or a mail
(mailq.GetMailEvents), optionally following it as events come."""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any, Callable, Iterator

from .. import procedures
from ..connection import ReconnectingConnection, connect

HELP = """\
Print the events of an application's mail (or of one mail) in order, from
the event stream mailq.GetMailEvents reads (docs/events.md).  Each line
starts with the EventID: keep the last one and pass it to --after to resume
exactly there (the cursor is commit-safe: no event can appear later below it).

examples:
  mailq-db events --app billing
  mailq-db events --app billing --after 41230 --follow
  mailq-db events --mail 101
  mailq-db events --app billing --follow --json | jq -c 'select(.event_type == "Failed")'
"""

#: Seconds between two reads once the stream is caught up (--follow).
DEFAULT_INTERVAL = 1.0


def register(subparsers) -> None:
    p = subparsers.add_parser("events", help="print (and follow) the event stream of an application or a mail",
                              description=HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--app", metavar="NAME", help="the application whose events to print")
    p.add_argument("--mail", type=_non_negative, metavar="ID",
                   help="one mail's events (with --app: only if the mail is that application's)")
    p.add_argument("--after", type=_non_negative, default=0, metavar="N",
                   help="print events after EventID N (default 0: from the start)")
    p.add_argument("--follow", "-f", action="store_true",
                   help="keep waiting for new events (Ctrl-C to stop)")
    p.add_argument("--interval", type=_interval, default=DEFAULT_INTERVAL, metavar="SECONDS",
                   help=f"with --follow: pause between reads once caught up (default {DEFAULT_INTERVAL:g})")
    p.add_argument("--batch", type=_batch, default=500, metavar="N",
                   help="events per read, 1-5000 (default 500)")
    p.add_argument("--json", action="store_true", help="one JSON object per line instead of text")
    p.add_argument("--db", help="database URL (default: $MAILQ_DB_URL)")
    p.set_defaults(func=run)


def _non_negative(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {value}")
    return value


def _batch(text: str) -> int:
    value = _non_negative(text)
    if not 1 <= value <= 5000:
        raise argparse.ArgumentTypeError(f"must be 1-5000, got {value}")
    return value


def _interval(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not 0.05 <= value <= 3600:
        raise argparse.ArgumentTypeError(f"must be 0.05-3600 seconds, got {value:g}")
    return value


Fetch = Callable[[int, int], list[procedures.MailEvent]]


def stream(fetch: Fetch, *, after: int, batch: int, follow: bool, interval: float,
           sleep: Callable[[float], None] = time.sleep) -> Iterator[procedures.MailEvent]:
    """Yield events after ``after`` in order, page by page.  A page shorter than
    ``batch`` means caught up: stop, or (``follow``) pause ``interval`` and read
    again from the last EventID seen, forever."""
    cursor = after
    while True:
        page = fetch(cursor, batch)
        for event in page:
            yield event
            cursor = event.event_id
        if len(page) < batch:
            if not follow:
                return
            sleep(interval)


def format_event(event: procedures.MailEvent) -> str:
    when = event.occurred_at_utc.strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] if event.occurred_at_utc else "-"
    parts = [
        str(event.event_id), when, f"mail={event.mail_id}", f"app={event.app_name or '-'}",
        event.event_type, f"status={event.status}", f"attempts={event.attempt_count}",
    ]
    if event.smtp_code is not None:
        parts.append(f"smtp={event.smtp_code}")
    if event.detail:
        parts.append(" ".join(event.detail.split()))
    return "  ".join(parts)


def event_json(event: procedures.MailEvent) -> str:
    data: dict[str, Any] = {
        "event_id": event.event_id, "mail_id": event.mail_id, "app_name": event.app_name,
        "event_type": event.event_type, "status": event.status, "attempt_count": event.attempt_count,
        "smtp_code": event.smtp_code, "detail": event.detail,
        "occurred_at_utc": event.occurred_at_utc.isoformat() if event.occurred_at_utc else None,
    }
    return json.dumps(data, ensure_ascii=False)


def run(args) -> int:
    if args.app is None and args.mail is None:
        print("mailq-db events: give --app NAME or --mail ID", file=sys.stderr)
        return 2
    # Reads are safe to repeat: a transient error (connection.TRANSIENT_ERRORS,
    # a dropped connection) is retried with the same cursor.
    conn = ReconnectingConnection(lambda: connect(args.db))

    def fetch(after: int, batch: int) -> list[procedures.MailEvent]:
        if args.mail is not None:
            return conn.call(procedures.get_mail_events, mail_id=args.mail, after_event_id=after,
                             max_events=batch)
        return conn.call(procedures.get_mail_events, app_name=args.app, after_event_id=after,
                         max_events=batch)

    last = args.after
    try:
        for event in stream(fetch, after=args.after, batch=args.batch, follow=args.follow,
                            interval=args.interval):
            # --mail with --app: that mail is another application's.  (--app alone is
            # filtered by the procedure, which compares names under the database's
            # collation, case-insensitive by default: 'Billing' finds 'billing'.)
            if not (args.mail is not None and args.app is not None
                    and (event.app_name or "").casefold() != args.app.casefold()):
                print(event_json(event) if args.json else format_event(event), flush=True)
            # The cursor moves only past what was printed (or filtered out): when
            # printing fails (a closed pipe), "resume with --after" repeats that event.
            last = event.event_id
    except KeyboardInterrupt:
        print(f"mailq-db events: stopped; resume with --after {last}", file=sys.stderr)
        return 0
    except Exception:
        print(f"mailq-db events: stopped on an error; resume with --after {last}", file=sys.stderr)
        raise
    finally:
        conn.close()
    return 0

