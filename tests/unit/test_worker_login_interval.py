"""The minimum interval between two logins per account (issue 16 point 4,
TinyMail 8C.5): the worker asks mailq.AcquireLoginSlot before every SMTP
connection; it sleeps when the next login is near, and otherwise defers the
account's batch as a Wait (no attempt spent).

LoginSlots below is a test double of the DATABASE LAYER (the procedure's
documented contract over a fake clock shared by several workers, standing
for workers on several machines); the procedure itself is tested by
tests/integration/test_mailq_login_interval.py against SQL Server.  The
fake clock makes every assertion exact: nothing here is timed."""

from __future__ import annotations

import logging

import pytest
from worker_helpers import FakeQueue, account_for, make_mail, make_worker

from mailq_db.errors import ConfigurationError, DatabaseError
from mailq_db.procedures import LoginSlot
from mailq_db.worker.config import parse_config


class LoginSlots:
    """mailq.AcquireLoginSlot's contract for one account, on a fake clock in ms."""

    def __init__(self, interval_ms: int | None):
        self.interval_ms = interval_ms
        self.now_ms = 0
        self.last_ms: int | None = None
        self.asked: list[tuple[int, bool]] = []  # (fake time, granted) per call
        self.sleeps: list[float] = []

    def acquire(self, conn, *, account_name: str) -> LoginSlot:
        i, last = self.interval_ms, self.last_ms
        if i is None or last is None or last <= self.now_ms - i:
            self.last_ms = self.now_ms
            self.asked.append((self.now_ms, True))
            return LoginSlot(True, 0, i, None)
        self.asked.append((self.now_ms, False))
        return LoginSlot(False, min(i, last + i - self.now_ms), i, None)

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now_ms += round(seconds * 1000)

    def granted_at(self) -> list[int]:
        return [t for t, granted in self.asked if granted]


class SlotQueue(FakeQueue):
    def __init__(self, mails, slots: LoginSlots, **kw):
        super().__init__(mails, **kw)
        self.slots = slots

    def acquire_login_slot(self, conn, *, account_name: str) -> LoginSlot:
        return self._apply("acquire_login_slot", dict(account_name=account_name),
                           lambda: self.slots.acquire(conn, account_name=account_name))


def worker_for(queue: SlotQueue, sink, **account):
    worker = make_worker(queue, {"default": account_for(sink, **account)})
    worker.sleep = queue.slots.sleep
    return worker


def test_without_an_interval_every_connection_is_granted_and_nobody_sleeps(sink):
    slots = LoginSlots(None)
    queue = SlotQueue([make_mail(1), make_mail(2)], slots)
    worker = worker_for(queue, sink)
    worker.run(once=True)
    assert queue.statuses() == {1: "Sent", 2: "Sent"}
    assert slots.asked == [(0, True)]  # one connection for the batch, one question
    assert slots.sleeps == [] and worker.metrics.snapshot()["login_sleeps"] == 0


def test_a_second_worker_sleeps_the_exact_wait_then_logs_in(sink):
    slots = LoginSlots(3000)  # 3 s between logins, across workers
    queue = SlotQueue([make_mail(1)], slots)
    first = worker_for(queue, sink)
    first.run(once=True)  # logs in at t = 0
    slots.now_ms = 1000
    queue.rows[2] = type(queue.rows[1])(make_mail(2))  # a new mail, claimed by another worker
    second = worker_for(queue, sink)
    second.run(once=True)
    assert slots.sleeps == [2.0]  # 3 s after the first login, not a fixed back-off
    assert slots.granted_at() == [0, 3000]
    assert queue.statuses() == {1: "Sent", 2: "Sent"}
    assert queue.calls_to("mark_failed") == []  # slept, not deferred
    assert second.metrics.snapshot()["login_sleeps"] == 1
    assert second.metrics.snapshot()["smtp_connections"] == 1
    assert len(sink.messages) == 2


def test_a_long_wait_defers_the_batch_as_a_wait_without_spending_attempts(sink, caplog):
    slots = LoginSlots(600_000)  # 10 minutes between logins
    slots.last_ms = 0
    slots.now_ms = 60_000  # the last login was a minute ago: 9 minutes to go
    queue = SlotQueue([make_mail(1, attempts_remaining=3), make_mail(2, attempts_remaining=3)], slots)
    worker = worker_for(queue, sink, login_sleep_max_seconds=10)
    with caplog.at_level(logging.WARNING, logger="mailq_db.worker"):
        worker.run(once=True)
    [call] = queue.calls_to("mark_failed")
    assert call["ids"] == [1, 2] and call["disposition"] == "Wait"
    assert call["retry_after_seconds"] == 540  # exactly the time left, no growing back-off
    assert "minimum interval between logins" in call["error"]
    assert [queue.rows[i].attempts_remaining for i in (1, 2)] == [3, 3]  # refunded
    assert queue.statuses() == {1: "UnSent", 2: "UnSent"}
    assert "default" in queue.blocked_until  # no worker claims the account before then
    assert slots.sleeps == [] and sink.messages == []
    snap = worker.metrics.snapshot()
    assert snap["smtp_connections"] == 0 and snap["login_deferrals"] == 1 and snap["waited"] == 2
    assert worker.escalation.level("default") is None  # the provider-throttling back-off is not touched


def test_a_wait_the_lease_cannot_cover_is_deferred_not_slept(sink):
    slots = LoginSlots(8000)
    slots.last_ms = 0
    slots.now_ms = 1000  # 7 s to go, under login_sleep_max_seconds (10)
    # lease 15 s, safety margin 10 s: sleeping 7 s would leave 8 s < 10 s
    queue = SlotQueue([make_mail(1)], slots)
    worker = make_worker(queue, {"default": account_for(sink)}, lease_seconds=15)
    worker.sleep = slots.sleep
    worker.run(once=True)
    assert slots.sleeps == []
    [call] = queue.calls_to("mark_failed")
    assert call["disposition"] == "Wait" and call["retry_after_seconds"] == 7


def test_login_sleep_max_zero_never_sleeps(sink):
    slots = LoginSlots(1000)
    slots.last_ms = 0
    slots.now_ms = 500
    queue = SlotQueue([make_mail(1)], slots)
    worker = worker_for(queue, sink, login_sleep_max_seconds=0)
    worker.run(once=True)
    assert slots.sleeps == []
    [call] = queue.calls_to("mark_failed")
    assert call["disposition"] == "Wait" and call["retry_after_seconds"] == 1  # 0.5 s rounds up


def test_a_reconnection_asks_for_the_slot_again(sink):
    """The server closes the idle connection: the reconnection is a login too."""
    slots = LoginSlots(2000)
    sink.replies[("mail", "second@example.com")] = "drop-once"  # closed while idle
    queue = SlotQueue([make_mail(1), make_mail(2, from_address="second@example.com")], slots)
    worker = worker_for(queue, sink)
    worker.run(once=True)
    assert queue.statuses() == {1: "Sent", 2: "Sent"}
    assert slots.granted_at() == [0, 2000] and slots.sleeps == [2.0]
    assert worker.metrics.snapshot()["smtp_connections"] == 2


def test_dry_run_never_asks_for_a_login(sink):
    slots = LoginSlots(1000)
    queue = SlotQueue([make_mail(1)], slots)
    worker = worker_for(queue, sink)
    worker.dry_run = True
    worker.run(once=True)
    assert slots.asked == [] and queue.status(1) == "Sent"


def test_stop_during_the_sleep_releases_the_batch(sink):
    slots = LoginSlots(5000)
    slots.last_ms = 0
    slots.now_ms = 1000
    queue = SlotQueue([make_mail(1)], slots)
    worker = worker_for(queue, sink)

    def stopped_while_sleeping(seconds: float) -> None:
        slots.sleep(seconds)
        worker.stop.set()

    worker.sleep = stopped_while_sleeping
    worker.run(once=True)
    assert queue.status(1) == "UnSent" and queue.calls_to("release_mail")
    assert sink.messages == []


def test_config_login_sleep_max_seconds():
    base = '[accounts.default]\nhost = "smtp.example.com"\n'
    assert parse_config(base, env={}).accounts["default"].login_sleep_max_seconds == 10.0
    assert parse_config(base + "login_sleep_max_seconds = 0\n", env={}).accounts["default"].login_sleep_max_seconds == 0
    with pytest.raises(ConfigurationError, match="login_sleep_max_seconds"):
        parse_config(base + "login_sleep_max_seconds = -1\n", env={})


def test_a_database_below_0012_has_no_interval_and_the_worker_sends_as_before(sink, caplog):
    class OldDatabase(FakeQueue):
        def acquire_login_slot(self, conn, *, account_name):
            self.calls.append(("acquire_login_slot", {"account_name": account_name}))
            raise DatabaseError(2812, "Could not find stored procedure 'mailq.AcquireLoginSlot'.")

    queue = OldDatabase([make_mail(1)])
    worker = make_worker(queue, {"default": account_for(sink)})
    with caplog.at_level(logging.WARNING, logger="mailq_db.worker"):
        worker.run(once=True)
        queue.rows[2] = type(queue.rows[1])(make_mail(2))
        worker.run(once=True)
    assert queue.statuses() == {1: "Sent", 2: "Sent"}
    assert len(queue.calls_to("acquire_login_slot")) == 1  # asked once, then not again
    assert caplog.text.count("the database is older than this worker") == 1


def test_another_database_error_abandons_the_batch_without_spending_attempts(sink):
    class Broken(FakeQueue):
        def acquire_login_slot(self, conn, *, account_name):
            raise DatabaseError(50270, "@AccountName 'default' is not a sending account")

    queue = Broken([make_mail(1, attempts_remaining=3)])
    worker = make_worker(queue, {"default": account_for(sink)})
    with pytest.raises(DatabaseError):
        worker.run(once=True)
    assert queue.status(1) == "UnSent" and queue.rows[1].attempts_remaining == 3  # released, refunded
    assert sink.messages == []


def test_a_worker_beaten_to_the_slot_again_and_again_defers_after_login_sleep_max(sink):
    """Another worker takes the slot just before this one wakes, every time:
    the sleeps for one connection add up to login_sleep_max_seconds at most,
    then the batch is deferred; before, the worker slept on without end (its
    leases extended), holding the whole batch."""
    queue = SlotQueue([make_mail(1), make_mail(2)], LoginSlots(None))
    queue.acquire_login_slot = lambda conn, *, account_name: LoginSlot(False, 4000, 4000, None)
    sleeps: list[float] = []

    def sleep(seconds: float) -> None:
        sleeps.append(seconds)
        if len(sleeps) > 20:
            raise AssertionError("still sleeping after 20 sleeps")

    worker = worker_for(queue, sink, login_sleep_max_seconds=10)
    worker.sleep = sleep
    worker.run(once=True)
    assert sleeps == [4.0, 4.0]
    [call] = queue.calls_to("mark_failed")
    assert call["ids"] == [1, 2] and call["disposition"] == "Wait" and call["retry_after_seconds"] == 4
    assert sink.messages == []
