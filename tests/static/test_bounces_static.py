"""Static facts of the suppression SQL (docs/bounces.md) that a reading of it
found broken; the procedures themselves run in tests/integration."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SQL = ROOT / "sql"


def _text(rel: str) -> str:
    return (SQL / rel).read_text(encoding="utf-8")


def _code(rel: str) -> str:
    """The module without its header comment and line comments."""
    text = re.sub(r"/\*.*?\*/", "", _text(rel), flags=re.S)
    return re.sub(r"--[^\n]*", "", text)


def _granted(proc: str) -> set[str]:
    roles = set()
    for f in (SQL / "security").glob("*.grants.sql"):
        roles |= set(re.findall(rf"GRANT EXECUTE ON OBJECT::{re.escape(proc)} TO (\w+);", f.read_text("utf-8")))
    return roles


def test_every_role_that_runs_mailq_db_stats_may_read_the_suppression_section():
    # `mailq-db stats` calls GetQueueStats, then GetSuppressionStats; a 229 on the
    # second ended the command for MailqMonitor, the read-only role it is run as.
    assert _granted("mailq.GetQueueStats") <= _granted("mailq.GetSuppressionStats")
