"""The systemd unit in docs/operator-guide.md loads (issue 21 point 7; the
2026-11-26 reading found an inline comment that became part of the
EnvironmentFile path, so the documented unit never started).

``systemd-analyze verify`` (Debian's systemd package) checks the unit as
written, on a copy whose ExecStart and ExecStartPre point at a stand-in
executable (verify refuses a command that does not exist, and mailq-db is not
installed at /usr/local/bin here).  With debug logging it also prints the
unit as parsed, so the test compares what systemd read for EnvironmentFile=,
User= and the commands with what the guide means.  The options the commands
pass must be options of `mailq-db worker`."""

from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
GUIDE = ROOT / "docs" / "operator-guide.md"
DOCUMENTED_BINARY = "/usr/local/bin/mailq-db"


def documented_unit() -> str:
    text = GUIDE.read_text(encoding="utf-8")
    match = re.search(r"```ini\n(# /etc/systemd/system/mailq-worker\.service\n.*?)```", text, re.S)
    assert match, "no mailq-worker.service unit in docs/operator-guide.md"
    return match.group(1)


def directives(unit: str, key: str) -> list[str]:
    return [ln.split("=", 1)[1] for ln in unit.splitlines() if ln.startswith(f"{key}=")]


def test_the_unit_passes_systemd_analyze_verify(tmp_path):
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed (Debian: apt-get install systemd; .ci/run installs it)")
    unit = documented_unit()
    stand_in = tmp_path / "mailq-db"
    stand_in.write_text("#!/bin/sh\nexit 0\n", encoding="utf-8")
    stand_in.chmod(stand_in.stat().st_mode | stat.S_IXUSR)
    path = tmp_path / "mailq-worker.service"
    path.write_text(unit.replace(DOCUMENTED_BINARY, str(stand_in)), encoding="utf-8")
    env = dict(os.environ, SYSTEMD_LOG_LEVEL="debug", SYSTEMD_LOG_COLOR="0")
    result = subprocess.run([analyze, "verify", "--man=no", str(path)], capture_output=True, text=True,
                            timeout=120, env=env)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-3000:]
    assert "mailq-worker.service:" not in "\n".join(
        ln for ln in output.splitlines() if "warning" in ln.lower() or "unknown" in ln.lower())
    parsed = {m.group(1): m.group(2).strip() for m in re.finditer(r"^\s*(EnvironmentFile|User): (.*)$", output, re.M)}
    assert parsed.get("EnvironmentFile") == "/etc/mailq-db/worker.env", parsed
    assert parsed.get("User") == "mailq", parsed


def test_the_unit_without_its_fix_is_caught(tmp_path):
    """The check bites: the documented unit of the reading (an inline comment
    after EnvironmentFile=) is read with the comment in the path."""
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed (Debian: apt-get install systemd; .ci/run installs it)")
    unit = documented_unit().replace("EnvironmentFile=/etc/mailq-db/worker.env",
                                     "EnvironmentFile=/etc/mailq-db/worker.env   # MAILQ_DB_URL=... (mode 0600)")
    path = tmp_path / "broken.service"
    path.write_text(unit.replace(DOCUMENTED_BINARY, "/bin/true"), encoding="utf-8")
    result = subprocess.run([analyze, "verify", "--man=no", str(path)], capture_output=True, text=True,
                            timeout=120, env=dict(os.environ, SYSTEMD_LOG_LEVEL="debug"))
    assert re.search(r"EnvironmentFile: /etc/mailq-db/worker.env +# MAILQ_DB_URL", result.stdout + result.stderr)


def test_the_unit_runs_mailq_db_worker_with_options_it_has():
    unit = documented_unit()
    help_text = subprocess.run([sys.executable, "-m", "mailq_db.cli", "worker", "--help"], capture_output=True,
                               text=True, timeout=120).stdout
    commands = directives(unit, "ExecStartPre") + directives(unit, "ExecStart")
    assert len(commands) == 2
    for command in commands:
        assert command.startswith(f"{DOCUMENTED_BINARY} worker ")
        for option in re.findall(r"(--[a-z-]+)", command):
            assert option in help_text, option
    assert "--check-config" in commands[0]
    assert not re.search(r"://[^\s]*:[^\s@]*@", unit), "no secret in the unit: it comes from EnvironmentFile"
