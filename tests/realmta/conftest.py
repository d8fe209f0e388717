"""The Postfix + Dovecot lab (tests/realmta/lab.py) as a session fixture.

Every test in this folder is marked ``realmta``: ``pytest -m realmta -rs``
runs and lists them.  They are never skipped silently: where Postfix,
Dovecot or root are missing, the folder is skipped with ONE reason, and in
CI (``CI=true``) it fails instead, because CI must run them.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "unit"))  # fake_queue, smtp_sink

from lab import Lab, running_lab  # noqa: E402


def pytest_collection_modifyitems(config, items):
    for item in items:
        if Path(str(item.fspath)).parent == Path(HERE):
            item.add_marker(pytest.mark.realmta)


@pytest.fixture(scope="session")
def lab():
    yield from running_lab(Lab, "mailq-realmta-")
