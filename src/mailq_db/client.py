"""The client API for applications: TinyMail's post / emit / send, and events.

Four calls, each a thin layer over the wrappers of :mod:`mailq_db.procedures`
(this module sends no SQL of its own)::

    from mailq_db import client

    client.post(conn, to_address=..., subject=..., body=...)   # in YOUR transaction (outbox)
    mail_id = client.emit(url_or_conn, to_address=..., ...)     # own transaction, committed
    event = client.send(url_or_conn, timeout=60, ...)           # emit, then wait for the outcome
    for event in client.events(url_or_conn, "billing", after=cursor, follow=True): ...

``conn_or_url`` is an open pyodbc connection (used as is, never closed here),
a URL or ODBC connection string (a connection is opened, with autocommit on,
and closed), or ``None``: the URL in ``MAILQ_DB_URL``.

Transactions (the procedures own a transaction only when the caller has none:
``@OwnTran = IIF(@@TRANCOUNT = 0, 1, 0)``):

* :func:`post` never commits nor rolls back.  The mail is part of the caller's
  transaction: it is queued if and when the caller commits, and gone if the
  caller rolls back.  With pyodbc's default (autocommit off) the connection is
  always in a transaction; the driver runs it with IMPLICIT_TRANSACTIONS ON,
  under which EnqueueMail's own BEGIN TRANSACTION nests inside the caller's
  ("When IMPLICIT_TRANSACTIONS = ON an explicit BEGIN TRANSACTION will start
  two nested transactions", SET IMPLICIT_TRANSACTIONS reference), so its
  COMMIT commits nothing durable.  On an autocommit connection the caller must
  have run BEGIN TRANSACTION, otherwise the procedure commits the mail itself.
* :func:`emit` owns the transaction: on a connection it opened, the procedure
  commits its own; on a caller's connection with autocommit off it commits
  after the enqueue (and rolls back on an error), so pending work on that
  connection goes with it -- enqueue inside your own work with :func:`post`.
* :func:`send` is :func:`emit` plus reads; on a caller's connection with
  autocommit off each read's transaction is committed (reads only), so the
  connection holds no transaction between two polls.

Outcomes of :func:`send`: the terminal event (Sent or DryRun) is returned;
Failed, Expired and Cancelled raise :class:`MailFailed` (subclasses
:class:`MailExpired`, :class:`MailCancelled`), Stopped raises
:class:`MailStopped`; each carries the mail ID, the event, the SMTP code and
the detail.  No terminal event within ``timeout`` raises :class:`MailTimeout`:
the mail stays queued and will still be sent (or stop it: :func:`stop`).

Errors of the procedures themselves (bad input, unknown mail...) are the
:mod:`mailq_db.errors` classes the wrappers raise, unchanged.
"""

from __future__ import annotations

import dataclasses
import time
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Callable, Iterator, Mapping

from . import procedures
from .connection import Backoff, connect
from .errors import MailqError

#: Event types after which nothing more happens to a mail (coordination brief).
TERMINAL = frozenset({"Sent", "DryRun", "Failed", "Cancelled", "Expired", "Stopped"})
#: Terminal types that mean the mail went out (DryRun: recorded, reached no server).
DELIVERED = frozenset({"Sent", "DryRun"})

#: mailq.GetMailEvents's @MaxEvents bounds.
MAX_EVENTS_LIMIT = 5000

DEFAULT_TIMEOUT = 60.0
#: Polling of :func:`send` and :func:`events` (follow): the first wait, doubled
#: after every empty read up to the maximum; reset when an event arrives.
POLL_INITIAL = 0.2
POLL_MAXIMUM = 5.0


# --------------------------------------------------------------------------
# Events
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class MailEvent:
    """One row of mailq.GetMailEvents.  ``event_id`` is the cursor to pass as
    ``after`` to read what follows."""

    event_id: int
    mail_id: int
    app_name: str | None
    event_type: str
    status: str | None
    attempt_count: int | None
    smtp_code: int | None
    detail: str | None
    occurred_at_utc: datetime | None

    @property
    def terminal(self) -> bool:
        return self.event_type in TERMINAL


#: The result set's columns, in order, and MailEvent's fields.
_COLUMNS = ("EventID", "MailID", "AppName", "EventType", "Status", "AttemptCount", "SmtpCode",
            "Detail", "OccurredAtUtc")
_FIELDS = ("event_id", "mail_id", "app_name", "event_type", "status", "attempt_count", "smtp_code",
           "detail", "occurred_at_utc")


def _int(value: Any) -> int | None:
    return None if value is None else int(value)


def as_event(row: Any) -> MailEvent:
    """A :class:`MailEvent` from what the GetMailEvents wrapper returns: a dict
    keyed by column names (or field names), an object with the field names or
    the column names as attributes (a pyodbc Row), a dataclass whose fields
    follow the result set's columns, or a row in the result set's column order."""
    if isinstance(row, MailEvent):
        return row
    if isinstance(row, Mapping):
        values = [row[c] if c in row else row.get(f) for c, f in zip(_COLUMNS, _FIELDS)]
    elif hasattr(row, "event_id"):
        values = [getattr(row, f, None) for f in _FIELDS]
    elif hasattr(row, "EventID"):  # a pyodbc Row: columns by name
        values = [getattr(row, c, None) for c in _COLUMNS]
    elif dataclasses.is_dataclass(row):  # another wrapper's dataclass, fields in column order
        values = [getattr(row, f.name) for f in dataclasses.fields(row)][: len(_COLUMNS)]
    else:
        values = list(row)[: len(_COLUMNS)]
        values += [None] * (len(_COLUMNS) - len(values))
    event_id, mail_id, app, kind, status, attempts, code, detail, at = values
    return MailEvent(int(event_id), int(mail_id), app, str(kind), status, _int(attempts), _int(code),
                     detail, at)


# --------------------------------------------------------------------------
# Exceptions
# --------------------------------------------------------------------------


class MailError(MailqError):
    """A mail did not reach a recipient's server (base of the outcomes of send)."""

    def __init__(self, mail_id: int, event: MailEvent | None, message: str):
        super().__init__(message)
        self.mail_id = mail_id
        self.event = event
        self.smtp_code = event.smtp_code if event else None
        self.detail = event.detail if event else None


def _outcome_text(mail_id: int, event: MailEvent) -> str:
    code = f" (SMTP {event.smtp_code})" if event.smtp_code is not None else ""
    detail = f": {event.detail}" if event.detail else ""
    return f"mail {mail_id} {event.event_type.lower()}{code}{detail}"


class MailFailed(MailError):
    """The mail ended without being sent: Failed (a permanent SMTP error or the
    last attempt), or Expired / Cancelled (subclasses)."""


class MailExpired(MailFailed):
    """The mail's ExpiresAtUtc passed before it could be sent."""


class MailCancelled(MailFailed):
    """The mail was cancelled (mailq.CancelMail) before it was sent."""


class MailStopped(MailError):
    """The mail was stopped (mailq.StopMail, TinyMail's stop()): no more retries."""


class MailTimeout(MailError):
    """No terminal event within the timeout.  The mail stays queued and will
    still be sent; ``event`` is the last event seen (or None)."""

    def __init__(self, mail_id: int, event: MailEvent | None, timeout: float):
        last = f"; last event {event.event_type}" if event else ""
        super().__init__(mail_id, event, f"mail {mail_id}: no outcome within {timeout:g} s{last} "
                                         "(the mail stays queued)")
        self.timeout = timeout


_RAISES: dict[str, type[MailError]] = {
    "Failed": MailFailed,
    "Expired": MailExpired,
    "Cancelled": MailCancelled,
    "Stopped": MailStopped,
}


def raise_for_outcome(event: MailEvent) -> MailEvent:
    """``event`` when it is Sent or DryRun; the matching exception for the other
    terminal types; ValueError for a non-terminal event."""
    if event.event_type in DELIVERED:
        return event
    cls = _RAISES.get(event.event_type)
    if cls is None:
        raise ValueError(f"event {event.event_id} ({event.event_type}) is not terminal")
    raise cls(event.mail_id, event, _outcome_text(event.mail_id, event))


# --------------------------------------------------------------------------
# Connections
# --------------------------------------------------------------------------


def _is_connection(conn_or_url: Any) -> bool:
    return conn_or_url is not None and not isinstance(conn_or_url, str)


@contextmanager
def _connection(conn_or_url: Any, opener: Callable[[str | None], Any] | None = None) -> Iterator[tuple[Any, bool]]:
    """(connection, whether this call owns it).  A URL (or None: MAILQ_DB_URL)
    is opened with autocommit on and closed afterwards; a connection is used as
    is and left open."""
    if _is_connection(conn_or_url):
        yield conn_or_url, False
        return
    conn = (opener or connect)(conn_or_url)
    try:
        yield conn, True
    finally:
        conn.close()


def _manual_commit(conn: Any) -> bool:
    """True when the connection is in a transaction the client must end itself
    (pyodbc's default, autocommit off)."""
    return not getattr(conn, "autocommit", False)


# --------------------------------------------------------------------------
# post / emit / send / events / stop
# --------------------------------------------------------------------------


def post(conn: Any, **mail: Any) -> int:
    """Enqueue one mail inside the caller's open transaction (outbox); returns
    its mail ID.  Never commits nor rolls back: the mail exists once the caller
    commits, and not at all if the caller rolls back.  ``mail`` are the keyword
    arguments of :func:`mailq_db.procedures.enqueue_mail` (to_address, subject,
    body, ..., idempotency_key, attachments)."""
    if not _is_connection(conn):
        raise TypeError("post() enqueues inside the caller's transaction: pass the open connection "
                        "(use emit() to enqueue and commit from a URL)")
    return procedures.enqueue_mail(conn, **mail).mail_id


def emit(conn_or_url: Any = None, **mail: Any) -> int:
    """Enqueue one mail in its own transaction, commit, and return its mail ID.

    With an idempotency_key that an earlier mail used, nothing new is queued and
    that mail's ID is returned (mailq.EnqueueMail's rule)."""
    with _connection(conn_or_url) as (conn, _owned):
        return _emit(conn, mail)


def _committed(conn: Any, call: Callable[[], Any]) -> Any:
    """Run one procedure call as its own transaction: on a connection with
    autocommit off, commit after it and roll back on any error (with
    autocommit on the procedure owns its transaction already)."""
    manual = _manual_commit(conn)
    try:
        result = call()
    except BaseException:
        if manual:
            conn.rollback()
        raise
    if manual:
        conn.commit()
    return result


def _emit(conn: Any, mail: dict[str, Any]) -> int:
    return _committed(conn, lambda: procedures.enqueue_mail(conn, **mail)).mail_id


def _read_events(conn: Any, **kwargs: Any) -> list[MailEvent]:
    rows = procedures.get_mail_events(conn, **kwargs)
    if _manual_commit(conn):
        conn.commit()  # a read's transaction: nothing is held between two polls
    return [as_event(r) for r in rows]


def send(
    conn_or_url: Any = None,
    *,
    timeout: float = DEFAULT_TIMEOUT,
    poll_initial: float = POLL_INITIAL,
    poll_maximum: float = POLL_MAXIMUM,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    **mail: Any,
) -> MailEvent:
    """Enqueue one mail (as :func:`emit`) and wait for its outcome.

    Follows mailq.GetMailEvents @MailID, polling with backoff (``poll_initial``
    doubling to ``poll_maximum`` seconds), until a terminal event: returns it
    when Sent or DryRun, raises MailFailed / MailExpired / MailCancelled /
    MailStopped otherwise, MailTimeout when ``timeout`` seconds pass first (the
    mail stays queued).  With an idempotency_key already used, it waits for
    (or at once reports) the outcome of the earlier mail."""
    if not timeout or timeout <= 0:
        raise ValueError("timeout must be a positive number of seconds")
    with _connection(conn_or_url) as (conn, _owned):
        mail_id = _emit(conn, mail)
        deadline = clock() + timeout
        return wait(conn, mail_id, deadline=deadline, timeout=timeout, poll_initial=poll_initial,
                    poll_maximum=poll_maximum, clock=clock, sleep=sleep)


def wait(
    conn: Any, mail_id: int, *, deadline: float, timeout: float, poll_initial: float = POLL_INITIAL,
    poll_maximum: float = POLL_MAXIMUM, clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> MailEvent:
    """Follow one mail's events until a terminal one or ``deadline`` (a ``clock()``
    value); see :func:`send`."""
    backoff = Backoff(poll_initial, poll_maximum, jitter=False)
    after, last = 0, None
    while True:
        batch = _read_events(conn, mail_id=mail_id, after_event_id=after, max_events=MAX_EVENTS_LIMIT)
        for event in batch:
            after, last = event.event_id, event
        # The outcome is the mail's latest event when it is terminal: a terminal
        # event followed by more (Requeued, then a new attempt) is not the outcome
        # (an earlier mail found by its idempotency key can have such a history).
        if last is not None and last.terminal and len(batch) < MAX_EVENTS_LIMIT:
            return raise_for_outcome(last)
        if len(batch) >= MAX_EVENTS_LIMIT:
            continue  # more are waiting: read on at once
        if batch:
            backoff.reset()
        remaining = deadline - clock()
        if remaining <= 0:
            raise MailTimeout(mail_id, last, timeout)
        sleep(min(backoff.next(), remaining))


def events(
    conn_or_url: Any,
    app: str,
    after: int = 0,
    follow: bool = False,
    *,
    batch_size: int = 500,
    poll_initial: float = POLL_INITIAL,
    poll_maximum: float = POLL_MAXIMUM,
    sleep: Callable[[float], None] = time.sleep,
) -> Iterator[MailEvent]:
    """The events of application ``app`` after the cursor ``after`` (an
    EventID), oldest first, read in batches of ``batch_size`` (1-5000).

    Without ``follow`` the iterator ends when it has caught up; with it, it
    waits for new events (polling with backoff) until the caller stops
    iterating.  Keep ``event.event_id`` of the last event handled as the next
    ``after``: the cursor is commit-safe (no event appears later below it)."""
    if not 1 <= batch_size <= MAX_EVENTS_LIMIT:
        raise ValueError(f"batch_size must be 1-{MAX_EVENTS_LIMIT}")
    if not app:
        raise ValueError("app (the application name) is required")
    with _connection(conn_or_url) as (conn, _owned):
        backoff = Backoff(poll_initial, poll_maximum, jitter=False)
        while True:
            batch = _read_events(conn, app_name=app, after_event_id=after, max_events=batch_size)
            for event in batch:
                after = event.event_id
                yield event
            if len(batch) >= batch_size:
                continue  # more may be waiting: read again at once
            if not follow:
                return
            if batch:
                backoff.reset()
            sleep(backoff.next())


def stop(conn_or_url: Any, mail_id: int, reason: str) -> list[dict[str, Any]]:
    """TinyMail's stop(): end a mail that is not yet terminal (mailq.StopMail),
    so it is retried no more; returns the procedure's result rows.  Commits like
    :func:`emit` on a caller's connection with autocommit off."""
    with _connection(conn_or_url) as (conn, _owned):
        return _committed(conn, lambda: procedures.stop_mail(conn, mail_id=mail_id, reason=reason))
