"""``mailq-db dbmail-runner``: runs the @query of mail sent with mailq.SendDbMail."""

from __future__ import annotations

import argparse
import os

from ..connection import connect

HELP = """\
Run the @query of mail sent with mailq.SendDbMail, as the database user who
sent it, and add the result to the mail (body or attachment, sqlcmd's layout);
the mail waits for this until then.  Connects twice with the same URL: once to
claim and hand back (role MailqDbMailRunner), once per query to run it (the
login needs IMPERSONATE on each sending user: docs/database-mail.md).

examples:
  mailq-db dbmail-runner                 # until stopped, idle 5 s between polls
  mailq-db dbmail-runner --once          # the waiting queries, then exit
"""


def register(subparsers) -> None:
    p = subparsers.add_parser("dbmail-runner", help="run SendDbMail's @query as its sender",
                              description=HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--db", help="database URL (default: $MAILQ_DB_URL)")
    p.add_argument("--once", action="store_true", help="run what waits now, then exit")
    p.add_argument("--idle-seconds", type=float, default=5.0, help="pause when nothing waits (default 5)")
    p.add_argument("--lease-seconds", type=int, default=300,
                   help="a query's lease (10-3600, default 300); the query may run for the lease less "
                        "a tenth (at least 5 s), then it is cancelled as a query error")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..dbmail.runner import query_seconds, run_forever
    from ..procedures import _DRIVER_ERRORS

    url = args.db or os.environ.get("MAILQ_DB_URL")
    control = connect(url)
    # Each statement of a query gets at most the query's time (the runner
    # also stops reading when that time is up between statements).
    seconds = query_seconds(args.lease_seconds)
    try:
        done = run_forever(control, lambda: connect(url, query_timeout=seconds), idle_seconds=args.idle_seconds,
                           lease_seconds=args.lease_seconds, driver_errors=_DRIVER_ERRORS, once=args.once)
    finally:
        control.close()
    print(f"{done} queries run")
    return 0
