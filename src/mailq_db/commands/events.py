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
When newer events are held back by a transaction left open in the database
(any open transaction that wrote a rowversion value holds every reader back),
a note on stderr names it: session, open since, program, host, login
(mailq.GetEventStreamStall; seeing other sessions needs VIEW SERVER STATE).

examples:
  mailq-db events --app billing
  mailq-db events --app billing --after 41230 --follow
  mailq-db events --mail 101
  mailq-db events --app billing --follow --json | jq -c 'select(.event_type == "Failed")'
"""

#: Seconds between two reads once the stream is caught up (--follow).
DEFAULT_INTERVAL = 1.0
#: A writing transaction open this long that holds the stream back is named on stderr.
STALL_SECONDS = 10
#: While caught up (--follow): seconds between two looks at what holds the stream back.
STALL_CHECK_SECONDS = 30.0


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
           sleep: Callable[[float], None] = time.sleep,
           caught_up: Callable[[], None] | None = None) -> Iterator[procedures.MailEvent]:
    """Yield events after ``after`` in order, page by page.  A page shorter than
    ``batch`` means caught up: call ``caught_up``, then stop, or (``follow``)
    pause ``interval`` and read again from the last EventID seen, forever."""
    cursor = after
    while True:
        page = fetch(cursor, batch)
        for event in page:
            yield event
            cursor = event.event_id
        if len(page) < batch:
            if caught_up is not None:
                caught_up()
            if not follow:
                return
            sleep(interval)


class StallWatch:
    """Says on stderr, once per transaction, what holds the stream back while
    the reader is caught up: at most every ``every`` seconds.  Quiet when the
    stream flows; gives up quietly when the procedure cannot be called (not
    deployed, not granted, any error): the events are what this command is for."""

    def __init__(self, check: Callable[[], procedures.EventStreamStall], *, every: float,
                 out: Any = None, clock: Callable[[], float] = time.monotonic) -> None:
        self.check = check
        self.every = every
        self.out = out if out is not None else sys.stderr
        self.clock = clock
        self.last_look: float | None = None
        self.told: set[int] = set()
        self.held_min: int | None = None  # MinActiveRowversion held back at the last look (invisible holder)
        self.off = False

    def __call__(self) -> None:
        now = self.clock()
        if self.off or (self.last_look is not None and now - self.last_look < self.every):
            return
        self.last_look = now
        try:
            stall = self.check()
        except Exception:  # noqa: BLE001 - the note is a courtesy: it never stops the stream
            self.off = True
            return
        if not stall.held_back:
            self.held_min = None
            return
        for holder in stall.holders:
            if holder.transaction_id not in self.told:
                self.told.add(holder.transaction_id)
                print(f"mailq-db events: newer events are held back until this transaction ends: "
                      f"{holder.describe()}", file=self.out, flush=True)
        if not stall.can_see_transactions:
            if self.held_min == stall.min_active_rowversion:
                print(f"mailq-db events: newer events have been held back for {self.every:g} s or more by one "
                      f"open transaction; to see which, the login needs {stall.permission}",
                      file=self.out, flush=True)
            self.held_min = stall.min_active_rowversion


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

    watch = StallWatch(lambda: procedures.get_event_stream_stall(conn, min_open_seconds=STALL_SECONDS),
                       every=STALL_CHECK_SECONDS)
    last = args.after
    try:
        for event in stream(fetch, after=args.after, batch=args.batch, follow=args.follow,
                            interval=args.interval, caught_up=watch):
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

