"""The dashboard's data: every read and action goes through :mod:`mailq_db.procedures`.

:class:`DatabaseData` is the real layer; tests of the page pass any object
with the same methods (see tests/unit/fake_dashboard.py).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

from .. import procedures
from ..connection import Backoff, ReconnectingConnection
from ..errors import DatabaseError, MailStateError, SuppressedRecipientError

#: SQL Server's "The EXECUTE permission was denied on the object ..."
PERMISSION_DENIED = 229
#: SQL Server's "Could not find stored procedure ...": delayed execution not deployed
NO_SUCH_PROCEDURE = 2812
#: once delay.GetTaskMetrics was found absent, the overview asks again only after this long
DELAY_PROBE_SECONDS = 600.0
#: statuses a bulk action applies to: cancel takes UnSent mail, requeue the final ones
CANCELLABLE = ("UnSent",)
REQUEUEABLE = ("Failed", "Cancelled", "Expired", "Stopped")


class ActionRefused(Exception):
    """The database refused the action: the dashboard's login lacks the grant (MailqAdmin)."""


@dataclass
class Overview:
    metrics: procedures.QueueMetrics
    delay: dict[str, Any] | None  # None: delayed execution not deployed (or not readable)


@dataclass
class MailStory:
    history: procedures.MailHistory
    events: list[procedures.MailEvent]


@dataclass
class ActionOutcome:
    """What a bulk action did, mail by mail."""

    done: list[int] = field(default_factory=list)
    #: mail ID -> why it was left alone (its state changed since it was listed)
    skipped: dict[int, str] = field(default_factory=dict)


class DashboardData(Protocol):
    def overview(self) -> Overview: ...
    def mail_story(self, mail_id: int) -> MailStory: ...
    def find_mail(self, *, status: str, account_name: str | None, run_mode: str | None,
                  max_rows: int) -> list[dict[str, Any]]: ...
    def caller_is_admin(self) -> bool: ...
    def cancel(self, ids: list[int]) -> ActionOutcome: ...
    def requeue(self, ids: list[int]) -> ActionOutcome: ...
    def unblock(self, account_name: str) -> int: ...


class DatabaseData:
    """The dashboard's reads and actions over one connection (reopened when it drops)."""

    def __init__(self, open_connection: Callable[[], Any], *, window_minutes: int = 15,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.db = ReconnectingConnection(open_connection, retries=1, backoff=Backoff(0.5, 2.0))
        self.window_minutes = window_minutes
        self.clock = clock
        self._lock = threading.Lock()  # one connection, one call at a time
        self._delay_absent_until: float | None = None

    def _call(self, fn: Callable[..., Any], **kwargs: Any) -> Any:
        with self._lock:
            try:
                return self.db.call(fn, **kwargs)
            except DatabaseError as exc:
                if exc.number == PERMISSION_DENIED:
                    raise ActionRefused(exc.message) from exc
                raise

    def overview(self) -> Overview:
        """Two calls per page view (one where delayed execution is not deployed:
        after a 2812 the second call is skipped for DELAY_PROBE_SECONDS)."""
        metrics = self._call(procedures.get_queue_metrics, window_minutes=self.window_minutes)
        now = self.clock()
        if self._delay_absent_until is not None and now < self._delay_absent_until:
            return Overview(metrics, None)
        try:
            delay: dict[str, Any] | None = self._call(procedures.get_delay_task_metrics)
        except ActionRefused:
            delay = None  # not granted: the page says so
        except DatabaseError as exc:
            delay = None  # not deployed (2812) or failed: the page says so
            if exc.number == NO_SUCH_PROCEDURE:
                self._delay_absent_until = now + DELAY_PROBE_SECONDS
        return Overview(metrics, delay)

    def mail_story(self, mail_id: int) -> MailStory:
        history = self._call(procedures.get_mail_history, mail_id=mail_id)
        events = self._call(procedures.get_mail_events, mail_id=mail_id, max_events=5000) if history.mail else []
        return MailStory(history, events)

    def find_mail(self, *, status: str, account_name: str | None, run_mode: str | None,
                  max_rows: int) -> list[dict[str, Any]]:
        return self._call(procedures.find_mail, status=status, account_name=account_name, run_mode=run_mode,
                          max_rows=max_rows)

    def caller_is_admin(self) -> bool:
        return bool(self._call(procedures.get_queue_metrics, window_minutes=1).caller_is_admin)

    def _each(self, ids: list[int], fn: Callable[..., Any]) -> ActionOutcome:
        outcome = ActionOutcome()
        for mail_id in ids:
            try:
                self._call(fn, mail_id=mail_id)
            # Changed since it was listed, or (requeue, 50600) every recipient is
            # suppressed now: that mail is left alone, the others are still done.
            except (MailStateError, SuppressedRecipientError) as exc:
                outcome.skipped[mail_id] = exc.message
                continue
            outcome.done.append(mail_id)
        return outcome

    def cancel(self, ids: list[int]) -> ActionOutcome:
        return self._each(ids, procedures.cancel_mail)

    def requeue(self, ids: list[int]) -> ActionOutcome:
        return self._each(ids, procedures.requeue_mail)

    def unblock(self, account_name: str) -> int:
        return int(self._call(procedures.unblock_sending_account, account_name=account_name))
