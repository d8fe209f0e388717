"""Where Mono cannot be had, the ScriptDom/DacFx tests skip with ONE reason (as
the integration tests do), and fail instead when MAILQ_REQUIRE_TSQLCHECK=1."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from mailq_db.devtools import tsqlcheck as t

ROOT = Path(__file__).resolve().parents[2]


def run_without_mono(extra_env: dict[str, str]) -> subprocess.CompletedProcess:
    # PATH holds only the interpreter's folder: no mono, no mcs.
    env = {**os.environ, "PATH": str(Path(sys.executable).parent), **extra_env}
    env.pop(t.REQUIRE_ENV, None) if t.REQUIRE_ENV not in extra_env else None
    return subprocess.run(
        [sys.executable, "-m", "pytest", "tests/static/test_tsqlcheck.py", "-q", "-rs", "-p", "no:cacheprovider"],
        cwd=ROOT, capture_output=True, text=True, timeout=600, env=env,
    )


def test_without_mono_the_tool_tests_skip_with_one_reason():
    result = run_without_mono({})
    assert result.returncode == 0, result.stdout[-3000:]
    reasons = set(re.findall(r"^SKIPPED \[\d+\] [^:]+:\d*:? ?(.*)$", result.stdout, re.M))
    assert len(reasons) == 1, reasons
    (reason,) = reasons
    assert reason.startswith(t.SKIP_PREFIX) and "no `mono` on PATH" in reason
    # the tests that need no tool (the message reader) still ran
    assert re.search(r"\d+ passed, \d+ skipped", result.stdout.strip().splitlines()[-1])


def test_without_mono_the_tool_tests_fail_where_they_must_run():
    result = run_without_mono({t.REQUIRE_ENV: "1"})
    assert result.returncode != 0
    assert f"{t.REQUIRE_ENV}=1 but:" in result.stdout


def test_ci_installs_mono_and_prepares_the_tool():
    run = (ROOT / ".ci/run").read_text(encoding="utf-8")
    assert re.search(r"apt_get install -y -qq --no-install-recommends mono-devel", run)
    assert "python -m mailq_db.devtools.tsqlcheck prepare" in run
    workflow = (ROOT / ".github/workflows/ci.yml").read_text(encoding="utf-8")
    assert re.search(r"apt-get install[^\n]*\bmono-devel\b", workflow)
    assert f'{t.REQUIRE_ENV}: "1"' in workflow  # GitHub's static job must run them, not skip


def test_the_cache_is_ignored_and_holds_no_committed_file():
    assert ".cache/" in (ROOT / ".gitignore").read_text(encoding="utf-8").splitlines()
    tracked = subprocess.run(["git", "ls-files", ".cache", "*.dll", "*.whl", "*.exe"], cwd=ROOT,
                             capture_output=True, text=True)
    if tracked.returncode == 0:  # a checkout without git (an sdist) has nothing to check
        assert tracked.stdout.strip() == ""


def test_a_wheel_with_another_hash_is_refused_and_removed(tmp_path):
    wheel = tmp_path / ".cache/tsqlcheck/wheel" / t.WHEEL_NAME
    wheel.parent.mkdir(parents=True)
    wheel.write_bytes(b"not the pinned wheel")
    try:
        t.fetch_wheel(tmp_path)
    except t.Unavailable as exc:
        assert "expected " + t.WHEEL_SHA256 in str(exc)
    else:
        raise AssertionError("a wheel with another SHA-256 must be refused")
    assert not wheel.exists()
