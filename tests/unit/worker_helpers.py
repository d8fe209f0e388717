"""Helpers shared by the unit tests: an account for a loopback sink, a worker wired to a FakeQueue.

(Kept out of conftest.py so test modules never import a module named ``conftest``.)
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # fake_queue, smtp_sink

from fake_queue import FakeConnection, FakeQueue, make_mail  # noqa: E402,F401
from smtp_sink import PASSWORD, USER, SmtpSink  # noqa: E402,F401

from mailq_db.connection import Backoff, ReconnectingConnection  # noqa: E402
from mailq_db.worker.classify import EscalationPolicy  # noqa: E402
from mailq_db.worker.config import AccountConfig, Config, WorkerConfig  # noqa: E402
from mailq_db.worker.loop import Worker  # noqa: E402


def account_for(sink: SmtpSink, name: str = "default", **overrides) -> AccountConfig:
    if sink.cert:
        values = dict(tls="starttls", ca_file=sink.cert, user=USER, password=PASSWORD,
                      password_env="TEST_SMTP_PASSWORD")
    else:
        values = dict(tls="none", allow_plaintext=True)
    values.update(host="127.0.0.1", port=sink.port, connect_timeout_seconds=2.0,
                  command_timeout_seconds=0.5)
    values.update(overrides)
    return AccountConfig(name=name, **values)


def make_worker(queue: FakeQueue, accounts: dict[str, AccountConfig], *,
                escalation: EscalationPolicy | None = None, **worker_settings) -> Worker:
    settings = dict(batch_size=50, lease_seconds=60, lease_safety_margin_seconds=10,
                    worker_name="test-worker", idle_backoff_min_seconds=0.01,
                    idle_backoff_max_seconds=0.05)
    settings.update(worker_settings)
    config = Config(worker=WorkerConfig(**settings), accounts=accounts,
                    escalation=escalation or EscalationPolicy())
    db = ReconnectingConnection(FakeConnection, backoff=Backoff(0.001, 0.002), sleep=lambda s: None)
    return Worker(config, db, procs=queue)


def allow_generators(worker: Worker, registry: dict) -> None:
    """Install ``registry`` as the worker's generators and allow every application to call them."""
    import dataclasses

    worker.generators = registry
    worker.config = dataclasses.replace(worker.config, generators={"*": tuple(registry)})
