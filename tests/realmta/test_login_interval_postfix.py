"""The minimum interval between logins against the lab's Postfix anvil
(``smtpd_client_connection_rate_limit`` = CONNECTION_RATE_LIMIT connections
per RATE_UNIT_SECONDS on the ``connrate`` port, tests/realmta/lab.py).

Three workers, one after the other, each open their own connection for one
mail.  Without an interval the third connection inside one time unit gets
anvil's 421 (test_worker_postfix.py::test_anvil_connection_rate_421_waits_
without_charging shows it).  With the account's interval set to a little
more than RATE_UNIT_SECONDS / CONNECTION_RATE_LIMIT, the workers sleep
before connecting (mailq.AcquireLoginSlot's contract, here a double on the
real clock: the database layer is not what this tests) and Postfix never
refuses a connection: every mail is sent on its first attempt.  The
assertions are about outcomes, never about durations.
"""

from __future__ import annotations

import threading
import time

from lab import CONNECTION_RATE_LIMIT, RATE_UNIT_SECONDS
from realmta_helpers import FakeQueue, account, make_mail, worker

from mailq_db.procedures import LoginSlot


class RealClockSlots:
    """mailq.AcquireLoginSlot's contract for every account, on time.monotonic()."""

    def __init__(self, interval_ms: int):
        self.interval_ms = interval_ms
        self.last: float | None = None
        self.lock = threading.Lock()
        self.granted = 0

    def acquire(self, conn, *, account_name: str) -> LoginSlot:
        with self.lock:
            now = time.monotonic()
            if self.last is None or (now - self.last) * 1000 >= self.interval_ms:
                self.last = now
                self.granted += 1
                return LoginSlot(True, 0, self.interval_ms, None)
            left = self.interval_ms - (now - self.last) * 1000
            return LoginSlot(False, max(1, min(self.interval_ms, int(left) + 1)), self.interval_ms, None)


class SlotQueue(FakeQueue):
    def __init__(self, mails, slots: RealClockSlots):
        super().__init__(mails)
        self.slots = slots

    def acquire_login_slot(self, conn, *, account_name: str) -> LoginSlot:
        return self.slots.acquire(conn, account_name=account_name)


def test_login_interval_keeps_the_workers_under_anvils_connection_rate(lab):
    # Let any earlier test's connections on this port age out of anvil's time unit.
    time.sleep(RATE_UNIT_SECONDS + 1)
    interval_ms = int(RATE_UNIT_SECONDS / CONNECTION_RATE_LIMIT * 1000) + 500
    slots = RealClockSlots(interval_ms)
    connections = sleeps = 0
    for i in range(1, CONNECTION_RATE_LIMIT + 2):  # one connection more than anvil allows per unit
        queue = SlotQueue([make_mail(i, from_address="mailer@lab.test", to_address=f"interval-{i}@lab.test")],
                          slots)
        w = worker(queue, {"default": account(lab, "connrate", login_sleep_max_seconds=interval_ms / 1000 + 1)})
        w.run(once=True)
        assert queue.calls_to("mark_failed") == [], queue.calls_to("mark_failed")
        assert queue.status(i) == "Sent" and queue.rows[i].attempts == 1
        snap = w.metrics.snapshot()
        connections += snap["smtp_connections"]
        sleeps += snap["login_sleeps"]
    assert connections == slots.granted == CONNECTION_RATE_LIMIT + 1
    assert sleeps == CONNECTION_RATE_LIMIT  # every worker after the first waited for its slot
    for i in range(1, CONNECTION_RATE_LIMIT + 2):
        lab.wait_delivered(f"interval-{i}@", 1)
