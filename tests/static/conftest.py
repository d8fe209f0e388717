"""Shared fixtures of the static checks: paths, and a writable copy of sql/."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SQL = ROOT / "sql"


@pytest.fixture
def sql_copy(tmp_path):
    """A writable copy of sql/ for negative samples."""
    target = tmp_path / "sql"
    shutil.copytree(SQL, target)
    return target
