"""Structured logs: ``event(log, level, message, **fields)`` and a JSON or key=value formatter."""

from __future__ import annotations

import json
import logging
import sys
from datetime import datetime, timezone
from typing import Any

FIELDS = "mailq_fields"


def event(log: logging.Logger, level: int, message: str, **fields: Any) -> None:
    """Log ``message`` with machine-readable ``fields`` (mail_id, account, ...)."""
    log.log(level, message, extra={FIELDS: fields})


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ts, level, logger, thread, msg and the event's fields."""

    def format(self, record: logging.LogRecord) -> str:
        data: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, timezone.utc).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "thread": record.threadName,
            "msg": record.getMessage(),
        }
        data.update(getattr(record, FIELDS, {}) or {})
        if record.exc_info:
            data["exc"] = self.formatException(record.exc_info)
        return json.dumps(data, ensure_ascii=False, default=str)


class TextFormatter(logging.Formatter):
    """``time level thread message key=value ...`` for people."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(threadName)s %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        fields = getattr(record, FIELDS, None)
        if fields:
            text += " " + " ".join(f"{k}={v!r}" if isinstance(v, str) and " " in v else f"{k}={v}"
                                   for k, v in fields.items())
        return text


def setup(log_format: str = "text", level: str = "INFO", stream: Any = None) -> None:
    """Configure the ``mailq_db`` loggers (stderr by default)."""
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter() if log_format == "json" else TextFormatter())
    root = logging.getLogger("mailq_db")
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    root.propagate = False


#: the ``event`` field of a mail's state-change line (docs/monitoring/README.md, "Logs")
MAIL_STATE = "mail_state"


def mail_state(log: logging.Logger, *, mail_id: int, account: str | None, message_id: str | None,
               status: str | None, outcome: str, queue_id: str | None = None, smtp_code: int | None = None,
               attempt: int | None = None, reason: str | None = None, level: int = logging.INFO,
               **more: Any) -> None:
    """One line per state change of one mail, acknowledged by the database:
    ``event="mail_state"``, the mail's ID, account and Message-ID, its status
    after the change, the outcome (Claimed, Sent, DryRun, Retry, Wait, Stop,
    Released), and, once a relay took it, the relay's queue ID.  With
    ``--log-format json`` each is one JSON object per line, so "what happened
    to mail N" is a filter on ``mail_id`` (LogQL and jq: the README)."""
    fields: dict[str, Any] = {"event": MAIL_STATE, "mail_id": mail_id, "account": account,
                              "message_id": message_id, "status": status, "outcome": outcome}
    optional = {"queue_id": queue_id, "smtp_code": smtp_code, "attempt": attempt, "reason": reason, **more}
    fields.update({k: v for k, v in optional.items() if v is not None})
    log.log(level, f"mail {mail_id} {outcome}", extra={FIELDS: fields})
