"""Fixtures of the unit suite: loopback SMTP sinks and a worker wired to a FakeQueue."""

from __future__ import annotations

import logging
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))  # fake_queue, smtp_sink

from fake_queue import FakeConnection, FakeQueue, make_mail  # noqa: E402
from smtp_sink import PASSWORD, USER, SmtpSink  # noqa: E402

from mailq_db.connection import Backoff, ReconnectingConnection  # noqa: E402
from mailq_db.worker.config import AccountConfig, Config, WorkerConfig  # noqa: E402
from mailq_db.worker.loop import Worker  # noqa: E402


@pytest.fixture(autouse=True)
def _restore_mailq_logger():
    """``mailq-db worker`` configures the mailq_db logger; undo it after each test."""
    logger = logging.getLogger("mailq_db")
    saved = (list(logger.handlers), logger.propagate, logger.level)
    yield
    logger.handlers[:], logger.propagate, logger.level = saved[0], saved[1], saved[2]


@pytest.fixture(scope="session")
def cert_dir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("certs"))


@pytest.fixture
def sink():
    with SmtpSink() as s:
        yield s


@pytest.fixture
def tls_sink(cert_dir):
    with SmtpSink(starttls=True, auth=True, cert_dir=cert_dir) as s:
        yield s


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


def make_worker(queue: FakeQueue, accounts: dict[str, AccountConfig], **worker_settings) -> Worker:
    settings = dict(batch_size=50, lease_seconds=60, lease_safety_margin_seconds=10,
                    worker_name="test-worker", idle_backoff_min_seconds=0.01,
                    idle_backoff_max_seconds=0.05)
    settings.update(worker_settings)
    config = Config(worker=WorkerConfig(**settings), accounts=accounts)
    db = ReconnectingConnection(FakeConnection, backoff=Backoff(0.001, 0.002), sleep=lambda s: None)
    return Worker(config, db, procs=queue)


__all__ = ["FakeQueue", "make_mail", "SmtpSink", "account_for", "make_worker"]
