"""``mailq-db events``: the paging/follow logic and the output formats (no server:
``stream`` takes the fetch function; the procedure itself is tested in
tests/integration/test_mailq_events.py)."""

from __future__ import annotations

import json
from datetime import datetime

import pytest

from mailq_db import cli
from mailq_db.commands import events as ev
from mailq_db.procedures import MailEvent


def event(i: int, kind: str = "Enqueued", app: str = "billing") -> MailEvent:
    return MailEvent(i, 100 + i, app, kind, "UnSent", 0, None, None, datetime(2026, 11, 24, 0, 0, i % 60))


class Source:
    """Events 1..n, appearing in the given waves (one wave per sleep)."""

    def __init__(self, waves: list[list[int]]):
        self.waves = waves
        self.visible: list[int] = []
        self.calls: list[tuple[int, int]] = []
        self.sleeps = 0
        self._release()

    def _release(self):
        if self.waves:
            self.visible += self.waves.pop(0)

    def fetch(self, after: int, batch: int):
        self.calls.append((after, batch))
        return [event(i) for i in self.visible if i > after][:batch]

    def sleep(self, _seconds: float):
        self.sleeps += 1
        self._release()
        if self.sleeps > 5:
            raise KeyboardInterrupt


def test_reads_page_by_page_until_caught_up():
    src = Source([list(range(1, 8))])
    got = [e.event_id for e in ev.stream(src.fetch, after=0, batch=3, follow=False, interval=1, sleep=src.sleep)]
    assert got == [1, 2, 3, 4, 5, 6, 7]
    assert src.calls == [(0, 3), (3, 3), (6, 3)] and src.sleeps == 0


def test_resumes_after_the_cursor():
    src = Source([list(range(1, 8))])
    assert [e.event_id for e in ev.stream(src.fetch, after=5, batch=10, follow=False, interval=1)] == [6, 7]


def test_follow_waits_and_continues_from_the_last_event():
    src = Source([[1, 2], [], [3], [4, 5]])
    got = []
    with pytest.raises(KeyboardInterrupt):
        for e in ev.stream(src.fetch, after=0, batch=10, follow=True, interval=0.1, sleep=src.sleep):
            got.append(e.event_id)
    assert got == [1, 2, 3, 4, 5]
    assert [a for a, _ in src.calls[:4]] == [0, 2, 2, 3]


def test_formats():
    e = MailEvent(42, 7, "billing", "Failed", "Failed", 3, 550, "550 5.1.1\nno such user",
                  datetime(2026, 11, 24, 1, 2, 3, 456000))
    line = ev.format_event(e)
    assert line.startswith("42  2026-11-24 01:02:03.456  mail=7  app=billing  Failed")
    assert "smtp=550" in line and "550 5.1.1 no such user" in line and "\n" not in line
    data = json.loads(ev.event_json(e))
    assert data["event_id"] == 42 and data["smtp_code"] == 550 and data["occurred_at_utc"].startswith("2026-11-24")


def test_needs_app_or_mail(capsys):
    assert cli.main(["events"]) == 2
    assert "--app NAME or --mail ID" in capsys.readouterr().err


@pytest.mark.parametrize("argv", [["events", "--app", "a", "--batch", "0"], ["events", "--app", "a", "--after", "-1"],
                                  ["events", "--app", "a", "--interval", "0"]])
def test_bad_options_are_refused(argv, capsys):
    with pytest.raises(SystemExit) as info:
        cli.main(argv)
    assert info.value.code == 2


def test_app_in_another_case_prints_the_events_the_procedure_returned(monkeypatch, capsys):
    """GetMailEvents compares @AppName under the database's (case-insensitive)
    collation; the command dropped every returned event whose stored name was
    spelt differently, printing nothing and exiting 0."""
    class Conn:
        def close(self):
            pass

    pages = [[event(1), event(2)]]
    monkeypatch.setattr(ev, "connect", lambda db: Conn())
    monkeypatch.setattr(ev.procedures, "get_mail_events", lambda conn, **kw: pages.pop(0) if pages else [])
    assert cli.main(["events", "--app", "Billing"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 2
    pages[:] = [[event(1)]]
    assert cli.main(["events", "--mail", "101", "--app", "BILLING"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 1
    pages[:] = [[event(1, app="shop")]]
    assert cli.main(["events", "--mail", "101", "--app", "billing"]) == 0
    assert capsys.readouterr().out == ""


def test_a_failed_print_is_not_passed_by_the_resume_cursor(monkeypatch, capsys):
    """The cursor was moved before the event was printed, so a print that
    failed (a closed pipe) was skipped by "resume with --after N"."""
    class Conn:
        def close(self):
            pass

    pages = [[event(1), event(2)]]
    monkeypatch.setattr(ev, "connect", lambda db: Conn())
    monkeypatch.setattr(ev.procedures, "get_mail_events", lambda conn, **kw: pages.pop(0) if pages else [])
    printed = []

    def fragile_print(text, file=None, **kw):
        if file is not None:  # the command's own messages on stderr
            file.write(text + "\n")
            return
        if printed:
            raise BrokenPipeError("reader went away")
        printed.append(text)

    # events.py's own name `print` shadows the builtin there only
    monkeypatch.setattr(ev, "print", fragile_print, raising=False)
    with pytest.raises(BrokenPipeError):
        cli.main(["events", "--app", "billing"])
    assert len(printed) == 1
    assert "resume with --after 1" in capsys.readouterr().err
