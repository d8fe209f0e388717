"""``mailq-db hooks``: argument parsing, output formats and the --loop pacing
(no server: ``loop`` takes the run function; the procedures are tested in
tests/integration/test_mailq_hooks.py)."""

from __future__ import annotations

import pytest

from mailq_db import cli
from mailq_db.commands import hooks
from mailq_db.procedures import HookRun


def run(app: str | None, state: str, calls: int = 0) -> HookRun:
    return HookRun(app, None if app is None else f"[dbo].[{app}Hook]", calls, calls, 0, 0, 7, state)


def test_parser_knows_the_subcommands():
    parser = cli.build_parser()
    args = parser.parse_args(["hooks", "set", "--app", "billing", "--procedure", "billing.OnMailEvent"])
    assert (args.app, args.procedure, args.remove, args.max_attempts) == ("billing", "billing.OnMailEvent", False, 3)
    args = parser.parse_args(["hooks", "set", "--app", "billing", "--remove"])
    assert args.remove and args.procedure is None
    args = parser.parse_args(["hooks", "run", "--max-events", "50", "--loop", "--interval", "5"])
    assert (args.max_events, args.loop, args.interval) == (50, True, 5)
    args = parser.parse_args(["hooks", "dispatcher", "--stop"])
    assert args.stop and args.interval == 30
    for bad in (["hooks", "set", "--app", "a"],                       # neither --procedure nor --remove
                ["hooks", "set", "--app", "a", "--procedure", "x.y", "--remove"],
                ["hooks", "run", "--max-events", "0"],
                ["hooks", "run", "--max-events", "5001"],
                ["hooks", "set", "--app", "a", "--remove", "--max-attempts", "101"],
                ["hooks"]):
        with pytest.raises(SystemExit):
            parser.parse_args(bad)


def test_run_output_says_busy_and_each_application_state():
    assert hooks.format_run([]) == ["no application has a hook"]
    assert hooks.format_run([run(None, "Busy")])[0].startswith("busy")
    line = hooks.format_run([run("billing", "UpToDate", 3)])[0]
    assert "billing" in line and "UpToDate" in line and "calls=3" in line and "cursor=7" in line


def test_list_output_flags_a_suspended_hook():
    row = {"AppName": "billing", "HookProcedure": "[dbo].[H]", "Pinned": False, "CursorEventID": 5,
           "MaxAttempts": 3, "Failures": 1, "FailingEventID": 9, "FailCount": 2, "LastError": "Suspended:\n x"}
    text = hooks.format_hook(row)
    assert "SUSPENDED" in text and "failing_event=9 x2" in text and "Suspended: x" in text
    assert "pinned" in hooks.format_hook({**row, "Pinned": True, "FailingEventID": None, "LastError": None})


def test_loop_runs_again_at_once_while_there_is_more_else_sleeps():
    results = [[run("a", "More", 500)], [run("a", "UpToDate", 10)], [run(None, "Busy")]]
    sleeps: list[float] = []
    lines: list[str] = []
    hooks.loop(lambda: results.pop(0), interval=10, emit=lines.append, sleep=sleeps.append, runs=3)
    assert sleeps == [10, 10]  # no sleep after the run that left more
    assert len(lines) == 3
