"""The client API for applications: post / emit / send / stop, and events.

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
``@OwnTran = IIF(@@TRANCOUNT = 0, 1, 0)``).  No function here ever commits or
rolls back a caller's connection:

* :func:`post` joins the caller's transaction.  The mail is queued if and
  when the caller commits, and gone if the caller rolls back.  With pyodbc's
  default (autocommit off) the connection is always in a transaction; the
  driver runs it with IMPLICIT_TRANSACTIONS ON, under which EnqueueMail's own
  BEGIN TRANSACTION nests inside the caller's ("When IMPLICIT_TRANSACTIONS =
  ON an explicit BEGIN TRANSACTION will start two nested transactions", SET
  IMPLICIT_TRANSACTIONS reference), so its COMMIT commits nothing durable.  On
  an autocommit connection the caller must have run BEGIN TRANSACTION,
  otherwise the procedure commits the mail itself.
* :func:`emit`, :func:`send` and :func:`stop` run in their own transaction and
  leave the caller's work alone: given a URL they open (and close) their own
  autocommit connection; given a caller's connection they accept it only with
  autocommit on (the procedure owns its transaction) and refuse one with
  autocommit off (:class:`CallerTransactionError`): on it they could neither
  commit their own work nor roll back their own error without committing or
  rolling back the caller's.  (TinyMail's ``emit``/``send`` never touch the
  caller's transaction either; its ``post``, which records the error and does
  not affect the transaction, differs from this :func:`post`, the outbox.)
* :func:`events` and :func:`wait` only read; they never commit either.

Transient errors (the list of :mod:`mailq_db.connection`: deadlocks, lock
timeouts, Azure SQL and availability-group failovers, dropped connections) are
retried: on a connection these functions opened, with a new connection when
the old one broke; on a caller's connection, in place when the session
survived the error.  An enqueue is sent again after an error that may have
committed it only when it carries an ``idempotency_key`` (EnqueueMail then
returns the mail the first call queued).

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
from .connection import Backoff, ReconnectingConnection, connect, keeps_session
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


def as_event(row: Any) -> MailEvent:
    """A :class:`MailEvent` from what the GetMailEvents wrapper returns: a dict
    keyed by column names (or field names), an object with the field names or
    the column names as attributes (a pyodbc Row), a dataclass whose fields
    follow the result set's columns, or a row in the result set's column order."""
    if isinstance(row, MailEvent):
        return row
    if isinstance(row, Mapping):
        values = [row[c] if c in row else row.get(f) for c, f in zip(_COLUMNS, _FIELDS, strict=True)]
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
    if event_id is None or mail_id is None:
        raise ValueError(f"an event row without EventID or MailID: {row!r}")
    return MailEvent(int(event_id), int(mail_id), app, str(kind), status, procedures._int_or_none(attempts),
                     procedures._int_or_none(code), detail, at)


# --------------------------------------------------------------------------
# Exceptions
# --------------------------------------------------------------------------


class CallerTransactionError(MailqError, TypeError):
    """emit, send or stop was given a connection with autocommit off: it would
    have to commit or roll back the caller's transaction.  Pass a URL, an
    autocommit connection, or enqueue inside the transaction with post()."""


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

#: In-place attempts of a call on a caller's connection after a transient error
#: that kept the session (the call was rolled back: connection.keeps_session).
IN_PLACE_ATTEMPTS = 3


def _is_connection(conn_or_url: Any) -> bool:
    return conn_or_url is not None and not isinstance(conn_or_url, str)


class _CallersConnection:
    """A caller's connection behind the interface of ReconnectingConnection: a
    call that was rolled back by a transient error is sent again on the same
    session; a broken connection is the caller's to reopen."""

    def __init__(self, conn: Any, sleep: Callable[[float], None] = time.sleep):
        self.raw = conn
        self._sleep = sleep

    def call(self, fn: Callable[..., Any], **kwargs: Any) -> Any:
        backoff = Backoff(0.05, 1.0)
        for attempt in range(1, IN_PLACE_ATTEMPTS + 1):
            try:
                return fn(self.raw, **kwargs)
            except Exception as exc:
                if attempt == IN_PLACE_ATTEMPTS or not keeps_session(exc):
                    raise
                self._sleep(backoff.next())
        raise AssertionError("unreachable")  # pragma: no cover

    call_at_most_once = call  # only errors that rolled the call back are retried


@contextmanager
def _database(conn_or_url: Any, *, own_transaction: bool) -> Iterator[Any]:
    """A ReconnectingConnection on a connection of our own (a URL, or None:
    MAILQ_DB_URL), opened with autocommit on and closed afterwards; or the
    caller's connection, used as is and left open.  ``own_transaction``: the
    call runs in its own transaction, so a caller's connection must be in
    autocommit mode (CallerTransactionError otherwise)."""
    if _is_connection(conn_or_url):
        if own_transaction and not getattr(conn_or_url, "autocommit", False):
            raise CallerTransactionError(
                "this connection has autocommit off: the call would commit or roll back your open "
                "transaction; pass a URL or an autocommit connection, or use post() to enqueue inside "
                "your transaction")
        yield _CallersConnection(conn_or_url)
        return
    db = ReconnectingConnection(lambda: connect(conn_or_url))
    try:
        yield db
    finally:
        db.close()


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
    """Enqueue one mail in its own transaction and return its mail ID.

    With an idempotency_key that an earlier mail used, nothing new is queued and
    that mail's ID is returned (mailq.EnqueueMail's rule)."""
    with _database(conn_or_url, own_transaction=True) as db:
        return _emit(db, mail)


def _emit(db: Any, mail: dict[str, Any]) -> int:
    # With an idempotency key a repeated enqueue returns the first mail: safe to
    # send again after a dropped connection.  Without, only when nothing ran.
    call = db.call if mail.get("idempotency_key") else db.call_at_most_once
    return int(call(procedures.enqueue_mail, **mail).mail_id)


def _read_events(db: Any, **kwargs: Any) -> list[MailEvent]:
    return [as_event(r) for r in db.call(procedures.get_mail_events, **kwargs)]


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
    with _database(conn_or_url, own_transaction=True) as db:
        mail_id = _emit(db, mail)
        deadline = clock() + timeout
        return _wait(db, mail_id, deadline=deadline, timeout=timeout, poll_initial=poll_initial,
                     poll_maximum=poll_maximum, clock=clock, sleep=sleep)


def wait(
    conn: Any, mail_id: int, *, deadline: float, timeout: float, poll_initial: float = POLL_INITIAL,
    poll_maximum: float = POLL_MAXIMUM, clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> MailEvent:
    """Follow one mail's events until a terminal one or ``deadline`` (a ``clock()``
    value); see :func:`send`.  Reads only: the connection's transaction is left alone."""
    return _wait(_CallersConnection(conn), mail_id, deadline=deadline, timeout=timeout,
                 poll_initial=poll_initial, poll_maximum=poll_maximum, clock=clock, sleep=sleep)


def _wait(
    db: Any, mail_id: int, *, deadline: float, timeout: float, poll_initial: float, poll_maximum: float,
    clock: Callable[[], float], sleep: Callable[[float], None],
) -> MailEvent:
    backoff = Backoff(poll_initial, poll_maximum, jitter=False)
    after, last = 0, None
    while True:
        batch = _read_events(db, mail_id=mail_id, after_event_id=after, max_events=MAX_EVENTS_LIMIT)
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
    with _database(conn_or_url, own_transaction=False) as db:
        backoff = Backoff(poll_initial, poll_maximum, jitter=False)
        while True:
            batch = _read_events(db, app_name=app, after_event_id=after, max_events=batch_size)
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


def stop(conn_or_url: Any, mail_id: int, reason: str) -> list[Any]:
    """TinyMail's stop(): end a mail that is not yet terminal (mailq.StopMail),
    so it is retried no more; returns the procedure's result rows.  Its own
    transaction, like :func:`emit`."""
    with _database(conn_or_url, own_transaction=True) as db:
        result: list[Any] = db.call_at_most_once(procedures.stop_mail, mail_id=mail_id, reason=reason)
        return result
