"""docs/monitoring/README.md, "Logs": the jq command it gives finds one mail's
state lines in a real worker log (JSON lines from the worker's own formatter,
with a non-JSON line among them), and the LogQL line filter it gives matches
that mail's lines and not a neighbour's.  jq comes from Debian's jq package
(.ci/run installs it); in CI the test fails rather than skips without it."""

from __future__ import annotations

import io
import json
import logging
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from mailq_db.worker import logs

README = Path(__file__).resolve().parents[2] / "docs/monitoring/README.md"


def worker_log() -> str:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logs.JsonFormatter())
    log = logging.getLogger("mailq_db.test_log_queries")
    log.handlers[:], log.propagate, log.level = [handler], False, logging.INFO
    logs.mail_state(log, mail_id=4711, account="default", message_id="<4711@x>", status="Sending", outcome="Claimed",
                    attempt=1)
    logs.mail_state(log, mail_id=47110, account="default", message_id="<47110@x>", status="Sent", outcome="Sent")
    logs.mail_state(log, mail_id=4711, account="default", message_id="<4711@x>", status="Sent", outcome="Sent",
                    queue_id="4XyZ12AbC", smtp_code=250)
    # what a crashed thread or a warning leaves in the same output: not JSON
    return "Traceback (most recent call last):\n  File \"x.py\", line 1\n" + stream.getvalue()


def readme_command(prefix: str) -> str:
    lines = [line for line in README.read_text(encoding="utf-8").splitlines() if line.startswith(prefix)]
    assert lines, prefix
    return lines[0]


def test_the_readmes_jq_command_reads_past_lines_that_are_not_json(tmp_path):
    jq = shutil.which("jq")
    if jq is None:
        if os.environ.get("CI"):
            pytest.fail("jq is missing: .ci/run installs Debian's jq package")
        pytest.skip("jq is not installed (Debian package jq)")
    command = readme_command("jq ")
    program = re.fullmatch(r"jq -cR '([^']+)' worker\.log", command).group(1)
    (tmp_path / "worker.log").write_text(worker_log())
    result = subprocess.run([jq, "-cR", program, "worker.log"], cwd=tmp_path, capture_output=True, text=True,
                            timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    rows = [json.loads(line) for line in result.stdout.splitlines()]
    assert [(r["outcome"], r["status"], r["queue_id"]) for r in rows] == [("Claimed", "Sending", None),
                                                                          ("Sent", "Sent", "4XyZ12AbC")]
    # plain jq (what the README said before) stops at the traceback and finds nothing
    plain = subprocess.run([jq, "-c", program.removeprefix("fromjson? | "), "worker.log"], cwd=tmp_path,
                           capture_output=True, text=True, timeout=60, check=False)
    assert plain.returncode != 0 and plain.stdout == ""


def test_the_readmes_logql_line_filter_matches_that_mail_only():
    query = readme_command("{job=\"mailq-worker\"}")
    needle = re.search(r"\|= `([^`]+)`", query).group(1)
    lines = [line for line in worker_log().splitlines() if needle in line]
    assert [json.loads(line)["mail_id"] for line in lines] == [4711, 4711]
