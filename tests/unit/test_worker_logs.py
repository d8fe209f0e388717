"""Structured logs: JSON lines carry the event's fields; text lines show them as key=value."""

from __future__ import annotations

import io
import json
import logging

from mailq_db.worker import logs


def emit(fmt: str) -> str:
    stream = io.StringIO()
    logs.setup(fmt, "INFO", stream)
    logs.event(logging.getLogger("mailq_db.worker"), logging.WARNING, "Retry",
               ids=[1, 2], reason="450 mailbox busy", smtp_code=450)
    logs.event(logging.getLogger("mailq_db.worker"), logging.DEBUG, "hidden at INFO")
    return stream.getvalue()


def test_json_lines_have_the_fields():
    [line] = emit("json").splitlines()
    data = json.loads(line)
    assert data["msg"] == "Retry" and data["level"] == "WARNING" and data["ids"] == [1, 2]
    assert data["reason"] == "450 mailbox busy" and data["smtp_code"] == 450 and "ts" in data


def test_text_lines_show_key_values():
    [line] = emit("text").splitlines()
    assert "WARNING" in line and "Retry" in line and "ids=[1, 2]" in line
    assert "reason='450 mailbox busy'" in line and "smtp_code=450" in line
