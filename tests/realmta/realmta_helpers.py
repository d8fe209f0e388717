"""Helpers of the realmta tests: accounts for the lab's ports, a worker on a FakeQueue, runs until done.

The database layer is the unit suite's FakeQueue test double (the worker's
behaviour is tested here, never a procedure); the SMTP server is the lab's
real Postfix with Dovecot SASL.
"""

from __future__ import annotations

import time
from typing import Any

from fake_queue import FakeConnection, FakeQueue, make_mail  # noqa: F401
from lab import PASSWORD, USER, Lab

from mailq_db.connection import Backoff, ReconnectingConnection
from mailq_db.worker.config import AccountConfig, Config, WorkerConfig
from mailq_db.worker.loop import Worker


def account(lab: Lab, port: str = "submission", name: str = "default", **overrides: Any) -> AccountConfig:
    values: dict[str, Any] = dict(host="127.0.0.1", port=lab.ports[port], connect_timeout_seconds=10.0,
                                  command_timeout_seconds=20.0, local_hostname="worker.lab.test")
    if port == "submission":
        values.update(tls="starttls", ca_file=lab.ca_file, user=USER, password=PASSWORD,
                      password_env="LAB_PASSWORD")
    else:
        values.update(tls="starttls", ca_file=lab.ca_file)
    values.update(overrides)
    return AccountConfig(name=name, **values)


def worker(queue: FakeQueue, accounts: dict[str, AccountConfig], **settings: Any) -> Worker:
    values: dict[str, Any] = dict(batch_size=50, lease_seconds=120, lease_safety_margin_seconds=10,
                                  worker_name="realmta", idle_backoff_min_seconds=0.01,
                                  idle_backoff_max_seconds=0.05)
    values.update(settings)
    db = ReconnectingConnection(FakeConnection, backoff=Backoff(0.001, 0.002), sleep=lambda s: None)
    return Worker(Config(worker=WorkerConfig(**values), accounts=accounts), db, procs=queue)


def run_until_final(w: Worker, queue: FakeQueue, deadline_seconds: float = 120.0,
                    make_retries_due: bool = False) -> None:
    """Run the worker (``once`` at a time) until every mail is final or the deadline passes.

    ``make_retries_due``: a Retry's next attempt is made due at once (the
    FakeQueue's backoff is the database's business, not what these tests check).
    """
    deadline = time.monotonic() + deadline_seconds
    while time.monotonic() < deadline:
        w.run(once=True)
        if all(r.status in ("Sent", "Failed") for r in queue.rows.values()):
            return
        if make_retries_due:
            for r in queue.rows.values():
                if r.status == "UnSent":
                    r.due = r.due.min
        time.sleep(0.2)


def mails(prefix: str, n: int, start: int = 1, **fields: Any) -> list:
    """``n`` mails to ``<prefix>-<i>@lab.test`` (a prefix per test: the Maildir is shared)."""
    fields.setdefault("from_address", "mailer@lab.test")
    return [make_mail(i, **{"to_address": f"{prefix}-{i}@lab.test",
                            "message_id": f"<{prefix}.{i}@mailq.lab.test>", **fields})
            for i in range(start, start + n)]
