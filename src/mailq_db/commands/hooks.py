"""``mailq-db hooks``: register, list and run per-application hook procedures
(mailq.SetApplicationHook, ListApplicationHooks, RunApplicationHooks,
StartHookDispatcher; docs/hooks.md)."""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any, Callable

from .. import procedures
from ..connection import ReconnectingConnection, connect

HELP = """\
Per-application hooks (docs/hooks.md).  A hook is a T-SQL procedure with the
documented signature, called once per event of its application, in its own
transaction, by the dispatcher mailq.RunApplicationHooks; it may stop the
mail (@StopMail = 1).

  set         register (or re-register after reviewing a change) a hook; db_owner
  set --remove  remove it
  list        the hooks, whether each is still pinned, cursor, failures
  run         one dispatcher run (--loop: again every --interval seconds; the
              way to run hooks on Azure SQL Database without an Agent job)
  dispatcher  start / re-time / stop the delayed-execution dispatcher task
              (only where delayed execution is installed)

examples:
  mailq-db hooks set --app billing --procedure billing.OnMailEvent
  mailq-db hooks list
  mailq-db hooks run --max-events 500
  mailq-db hooks run --loop --interval 10
  mailq-db hooks dispatcher --interval 30
  mailq-db hooks dispatcher --stop
"""


def register(subparsers) -> None:
    p = subparsers.add_parser("hooks", help="register, list and run per-application hook procedures",
                              description=HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="hooks_command", metavar="{set,list,run,dispatcher}")
    sub.required = True

    s = sub.add_parser("set", help="register, re-register or remove an application's hook")
    s.add_argument("--app", required=True, metavar="NAME", help="the application")
    g = s.add_mutually_exclusive_group(required=True)
    g.add_argument("--procedure", metavar="SCHEMA.NAME", help="the hook procedure (two-part name)")
    g.add_argument("--remove", action="store_true", help="remove the application's hook")
    s.add_argument("--max-attempts", type=_ranged(1, 100), default=3, metavar="N",
                   help="calls of a failing event before it is given up (1-100, default 3)")
    s.add_argument("--reset-cursor-to", type=_ranged(0, 2**63 - 1), default=None, metavar="EVENT_ID",
                   help="put the hook's cursor at this EventID (0: replay the stored stream)")
    _db(s)
    s.set_defaults(func=run_set)

    ls = sub.add_parser("list", help="the registered hooks and where each stands")
    ls.add_argument("--app", metavar="NAME", help="one application only")
    _db(ls)
    ls.set_defaults(func=run_list)

    r = sub.add_parser("run", help="run the dispatcher once (or in a loop)")
    r.add_argument("--max-events", type=_ranged(1, 5000), default=500, metavar="N",
                   help="hook calls per run, all applications together (1-5000, default 500)")
    r.add_argument("--loop", action="store_true", help="run again every --interval seconds (Ctrl-C to stop)")
    r.add_argument("--interval", type=_ranged(1, 3600), default=10, metavar="SECONDS",
                   help="with --loop: seconds between runs when no application has more (default 10)")
    _db(r)
    r.set_defaults(func=run_run)

    d = sub.add_parser("dispatcher", help="start, re-time or stop the delayed-execution dispatcher")
    d.add_argument("--interval", type=_ranged(1, 3600), default=30, metavar="SECONDS",
                   help="seconds between runs (1-3600, default 30)")
    d.add_argument("--stop", action="store_true", help="stop it (the pending task runs once, stale, and ends)")
    _db(d)
    d.set_defaults(func=run_dispatcher)


def _db(p) -> None:
    p.add_argument("--db", help="database URL (default: $MAILQ_DB_URL)")


def _ranged(low: int, high: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"must be {low}-{high}, got {value}")
        return value
    return parse


def format_run(rows: list[procedures.HookRun]) -> list[str]:
    if not rows:
        return ["no application has a hook"]
    out = []
    for r in rows:
        if r.app_name is None:
            out.append(f"busy: another dispatcher run holds the lock ({r.state})")
            continue
        out.append(
            f"{r.app_name}  {r.hook_procedure}  {r.state}  calls={r.calls} ok={r.succeeded} "
            f"failed={r.failed_calls} given_up={r.given_up} cursor={r.cursor_event_id}"
        )
    return out


def format_hook(h: dict[str, Any]) -> str:
    parts = [
        str(h["AppName"]), str(h["HookProcedure"]), "pinned" if h["Pinned"] else "SUSPENDED (changed: re-register)",
        f"cursor={h['CursorEventID']}", f"max_attempts={h['MaxAttempts']}", f"failures={h['Failures']}",
    ]
    if h.get("FailingEventID") is not None:
        parts.append(f"failing_event={h['FailingEventID']} x{h['FailCount']}")
    if h.get("LastError"):
        parts.append(" ".join(str(h["LastError"]).split()))
    return "  ".join(parts)


def more(rows: list[procedures.HookRun]) -> bool:
    """Whether a run left work behind (run again at once rather than sleep)."""
    return any(r.state == "More" for r in rows)


def loop(run_once: Callable[[], list[procedures.HookRun]], *, interval: float,
         emit: Callable[[str], None] = print, sleep: Callable[[float], None] = time.sleep,
         runs: int | None = None) -> None:
    """Run the dispatcher again and again: at once while an application has
    more, else after ``interval`` seconds (``runs`` bounds it, for tests)."""
    done = 0
    while runs is None or done < runs:
        rows = run_once()
        done += 1
        for line in format_run(rows):
            emit(line)
        if not more(rows):
            sleep(interval)


def run_set(args) -> int:
    conn = connect(args.db)
    try:
        reg = procedures.set_application_hook(
            conn, app_name=args.app, hook_procedure=None if args.remove else args.procedure,
            max_attempts=args.max_attempts, reset_cursor_to=args.reset_cursor_to,
        )
    finally:
        conn.close()
    if reg.hook_procedure is None:
        print(f"{reg.app_name}: hook removed" if reg.changed else f"{reg.app_name}: had no hook")
    else:
        print(f"{reg.app_name}: hook {reg.hook_procedure} registered and pinned, "
              f"cursor={reg.cursor_event_id}, max_attempts={reg.max_attempts}")
    return 0


def run_list(args) -> int:
    conn = connect(args.db)
    try:
        hooks = procedures.list_application_hooks(conn, app_name=args.app)
    finally:
        conn.close()
    if not hooks:
        print("no application has a hook")
    for h in hooks:
        print(format_hook(h))
    return 0


def run_run(args) -> int:
    # The dispatcher delivers at least once (docs/hooks.md): a run interrupted by
    # a transient error (connection.TRANSIENT_ERRORS, a dropped connection) is
    # sent again.
    conn = ReconnectingConnection(lambda: connect(args.db))
    try:
        if args.loop:
            try:
                loop(lambda: conn.call(procedures.run_application_hooks, max_events=args.max_events),
                     interval=args.interval)
            except KeyboardInterrupt:
                print("mailq-db hooks run: stopped", file=sys.stderr)
        else:
            for line in format_run(conn.call(procedures.run_application_hooks, max_events=args.max_events)):
                print(line)
    finally:
        conn.close()
    return 0


def run_dispatcher(args) -> int:
    conn = connect(args.db)
    try:
        row = procedures.start_hook_dispatcher(conn, interval_seconds=args.interval, enabled=not args.stop)
    finally:
        conn.close()
    state = "enabled" if row["Enabled"] else "stopped"
    print(f"hook dispatcher {state}: interval={row['IntervalSeconds']}s generation={row['Generation']} "
          f"task={row['TaskID']} ({row['TaskState'] or '-'}){' scheduled now' if row['Scheduled'] else ''}")
    return 0
