"""The integration suite skips with ONE reason where SQL Server cannot run, and
fails instead of skipping where it must run (MAILQ_REQUIRE_INTEGRATION=1)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import importlib.util

import pytest

ROOT = Path(__file__).resolve().parents[2]

_spec = importlib.util.spec_from_file_location("integration_conftest", ROOT / "tests/integration/conftest.py")
_conftest = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_conftest)
skip_reason = _conftest.skip_reason


def run_integration(extra_env: dict[str, str]) -> subprocess.CompletedProcess:
    env = {**os.environ, **extra_env}
    return subprocess.run(
        [sys.executable, "-m", "pytest", "tests/integration", "-q", "-rs", "-p", "no:cacheprovider"],
        cwd=ROOT, capture_output=True, text=True, timeout=600, env=env,
    )


@pytest.mark.skipif(skip_reason() is None, reason="SQL Server can run here: the suite runs for real")
def test_suite_skips_with_one_reason():
    result = run_integration({"MAILQ_REQUIRE_INTEGRATION": "0"})
    assert result.returncode == 0, result.stdout[-3000:]
    reasons = set(re.findall(r"^SKIPPED \[\d+\] [^:]+:\d*:? ?(.*)$", result.stdout, re.M))
    assert reasons == {skip_reason()}, reasons
    summary = result.stdout.strip().splitlines()[-1]
    assert re.search(r"\d+ skipped", summary) and "passed" not in summary and "failed" not in summary


@pytest.mark.skipif(skip_reason() is None, reason="SQL Server can run here: the suite runs for real")
def test_suite_fails_where_it_must_run():
    result = run_integration({"MAILQ_REQUIRE_INTEGRATION": "1"})
    assert result.returncode != 0
    assert "MAILQ_REQUIRE_INTEGRATION=1 but:" in result.stdout + result.stderr
