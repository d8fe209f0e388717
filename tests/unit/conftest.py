"""Fixtures of the unit suite: loopback SMTP sinks (helpers live in worker_helpers.py)."""

from __future__ import annotations

import logging
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))  # fake_queue, smtp_sink

from smtp_sink import SmtpSink  # noqa: E402


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
