"""Every shell command in docs/operator-guide.md is either marked "(needs SQL Server)" or run here."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys

import mailq_db

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
GUIDE = os.path.join(ROOT, "docs", "operator-guide.md")
SRC = os.path.dirname(os.path.dirname(os.path.abspath(mailq_db.__file__)))
MARK = "# (needs SQL Server)"


def shell_commands() -> list[str]:
    text = open(GUIDE, encoding="utf-8").read()
    blocks = re.findall(r"```sh\n(.*?)```", text, flags=re.S)
    return [line.strip() for block in blocks for line in block.splitlines() if line.strip()]


def test_guide_has_runnable_and_marked_commands():
    commands = shell_commands()
    assert any(MARK in c for c in commands) and any(MARK not in c for c in commands)


def test_every_unmarked_command_runs():
    env = dict(os.environ, PYTHONPATH=SRC + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("MAILQ_DB_URL", None)
    ran = 0
    for command in shell_commands():
        if MARK in command:
            continue
        words = shlex.split(command)
        if words[0] == "export":
            name, _, value = words[1].partition("=")
            env[name] = value
            continue
        assert words[0] == "mailq-db", f"unmarked command that this test cannot run: {command}"
        result = subprocess.run([sys.executable, "-m", "mailq_db", *words[1:]], cwd=ROOT, env=env,
                                capture_output=True, text=True, timeout=60)
        assert result.returncode == 0, f"{command}\n{result.stdout}\n{result.stderr}"
        ran += 1
    assert ran >= 3
