"""The client API's own Python logic: connection handling, that the caller's
transaction is never committed or rolled back, transient-error retries,
polling with backoff, timeout, exception mapping.

The wrappers of mailq_db.procedures are replaced by a recording fake and the
connection by a fake DB-API object: these tests prove what the client does
around the procedures (calls, commits, waits), never what a procedure does.
The procedures' behaviour is tested against SQL Server in tests/integration.
"""

from __future__ import annotations

import dataclasses
from datetime import datetime

import pytest

from mailq_db import client, procedures
from mailq_db.errors import InvalidInputError


class FakeConnection:
    def __init__(self, autocommit: bool = False):
        self.autocommit = autocommit
        self.log: list[str] = []
        self.closed = False

    def commit(self) -> None:
        self.log.append("commit")

    def rollback(self) -> None:
        self.log.append("rollback")

    def close(self) -> None:
        self.closed = True


def event(event_id: int, kind: str, mail_id: int = 7, code: int | None = None, detail: str | None = None):
    """A row as the GetMailEvents wrapper returns it (columns of the result set)."""
    return {"EventID": event_id, "MailID": mail_id, "AppName": "billing", "EventType": kind,
            "Status": None, "AttemptCount": 1, "SmtpCode": code, "Detail": detail,
            "OccurredAtUtc": datetime(2026, 11, 23, 12, 0, 0)}


class FakeProcedures:
    """Records the wrapper calls; GetMailEvents answers from a script of batches."""

    def __init__(self, monkeypatch, batches=(), enqueue_error: Exception | None = None):
        self.calls: list[tuple[str, dict]] = []
        self.batches = list(batches)
        self.enqueue_error = enqueue_error
        monkeypatch.setattr(procedures, "enqueue_mail", self.enqueue_mail)
        monkeypatch.setattr(procedures, "get_mail_events", self.get_mail_events, raising=False)
        monkeypatch.setattr(procedures, "stop_mail", self.stop_mail, raising=False)

    def enqueue_mail(self, conn, **kw):
        conn.log.append("enqueue")
        self.calls.append(("enqueue_mail", kw))
        if self.enqueue_error:
            raise self.enqueue_error
        return procedures.EnqueueResult(7, "<7@x>", True)

    def get_mail_events(self, conn, **kw):
        conn.log.append("events")
        self.calls.append(("get_mail_events", kw))
        return self.batches.pop(0) if self.batches else []

    def stop_mail(self, conn, **kw):
        conn.log.append("stop")
        self.calls.append(("stop_mail", kw))
        return [{"MailID": kw["mail_id"], "Status": "Stopped"}]


class FakeClock:
    def __init__(self):
        self.now = 0.0
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


MAIL = {"to_address": "a@example.org", "subject": "s", "body": "b"}


# -- post -----------------------------------------------------------------------


@pytest.mark.parametrize("autocommit", [False, True])
def test_post_never_commits_nor_rolls_back(monkeypatch, autocommit):
    fake = FakeProcedures(monkeypatch)
    conn = FakeConnection(autocommit=autocommit)
    assert client.post(conn, **MAIL, idempotency_key="order-42") == 7
    assert conn.log == ["enqueue"]
    assert fake.calls == [("enqueue_mail", {**MAIL, "idempotency_key": "order-42"})]


def test_post_leaves_the_callers_transaction_alone_on_an_error(monkeypatch):
    FakeProcedures(monkeypatch, enqueue_error=InvalidInputError(50101, "@ToAddress is required"))
    conn = FakeConnection()
    with pytest.raises(InvalidInputError):
        client.post(conn, **MAIL)
    assert conn.log == ["enqueue"]


@pytest.mark.parametrize("target", [None, "mssql+pyodbc://u@h/db"])
def test_post_refuses_a_url(monkeypatch, target):
    FakeProcedures(monkeypatch)
    with pytest.raises(TypeError, match="caller's transaction"):
        client.post(target, **MAIL)


# -- emit -----------------------------------------------------------------------


@pytest.mark.parametrize("call", ["emit", "send", "stop"])
def test_a_callers_manual_commit_connection_is_refused_and_its_transaction_left_alone(monkeypatch, call):
    fake = FakeProcedures(monkeypatch)
    conn = FakeConnection(autocommit=False)
    with pytest.raises(client.CallerTransactionError, match="autocommit off"):
        if call == "emit":
            client.emit(conn, **MAIL, idempotency_key="k1")
        elif call == "send":
            client.send(conn, timeout=5, **MAIL)
        else:
            client.stop(conn, 7, "why")
    assert conn.log == [] and fake.calls == [] and not conn.closed  # no commit, no rollback, no call


def test_emit_leaves_the_callers_connection_alone_on_an_error(monkeypatch):
    FakeProcedures(monkeypatch, enqueue_error=InvalidInputError(50101, "@ToAddress is required"))
    conn = FakeConnection(autocommit=True)
    with pytest.raises(InvalidInputError) as info:
        client.emit(conn, **MAIL)
    assert info.value.number == 50101
    assert conn.log == ["enqueue"] and not conn.closed


def test_emit_retries_a_deadlock_in_place_on_a_callers_connection(monkeypatch):
    from mailq_db.errors import DatabaseError

    fake = FakeProcedures(monkeypatch)
    calls = []

    def deadlocked_once(conn, **kw):
        calls.append(kw)
        if len(calls) == 1:
            raise DatabaseError(1205, "chosen as the deadlock victim")
        return fake.enqueue_mail(conn, **kw)

    monkeypatch.setattr(procedures, "enqueue_mail", deadlocked_once)
    conn = FakeConnection(autocommit=True)
    assert client.emit(conn, **MAIL) == 7 and len(calls) == 2


def test_emit_from_a_url_resends_after_a_dropped_connection_only_with_an_idempotency_key(monkeypatch):
    attempts = []

    def dropped_once(conn, **kw):
        attempts.append(kw.get("idempotency_key"))
        if len(attempts) in (1, 3):
            raise ConnectionResetError("dropped after the server may have committed")
        return procedures.EnqueueResult(7, "<7@x>", True)

    monkeypatch.setattr(procedures, "enqueue_mail", dropped_once)
    monkeypatch.setattr(client, "connect", lambda url: FakeConnection(True))
    monkeypatch.setattr(client.ReconnectingConnection, "__init__", _fast_reconnects(
        client.ReconnectingConnection.__init__))
    assert client.emit("x", **MAIL, idempotency_key="k1") == 7  # sent again: the key makes it safe
    with pytest.raises(ConnectionResetError):
        client.emit("x", **MAIL)  # without a key a second send could queue the mail twice
    assert attempts == ["k1", "k1", None]


def _fast_reconnects(init):
    def fast(self, open_connection, **kw):
        init(self, open_connection, sleep=lambda s: None)
    return fast


def test_emit_on_an_autocommit_connection_leaves_the_commit_to_the_procedure(monkeypatch):
    FakeProcedures(monkeypatch)
    conn = FakeConnection(autocommit=True)
    client.emit(conn, **MAIL)
    assert conn.log == ["enqueue"]


def test_emit_from_a_url_opens_and_closes_its_connection(monkeypatch):
    FakeProcedures(monkeypatch)
    opened: list[tuple[str | None, FakeConnection]] = []

    def fake_connect(url):
        conn = FakeConnection(autocommit=True)  # connection.connect opens with autocommit on
        opened.append((url, conn))
        return conn

    monkeypatch.setattr(client, "connect", fake_connect)
    assert client.emit("mssql+pyodbc://u@h/db", **MAIL) == 7
    assert client.emit(None, **MAIL) == 7  # None: connect() reads MAILQ_DB_URL
    assert [url for url, _ in opened] == ["mssql+pyodbc://u@h/db", None]
    assert all(conn.closed for _, conn in opened)


def test_a_url_connection_is_closed_when_the_enqueue_fails(monkeypatch):
    FakeProcedures(monkeypatch, enqueue_error=InvalidInputError(50101, "bad"))
    conns: list[FakeConnection] = []
    monkeypatch.setattr(client, "connect", lambda url: conns.append(FakeConnection(True)) or conns[-1])
    with pytest.raises(InvalidInputError):
        client.emit("x", **MAIL)
    assert conns[0].closed


# -- send -----------------------------------------------------------------------


def run_send(monkeypatch, batches, timeout=30.0, conn=None):
    fake = FakeProcedures(monkeypatch, batches)
    clock = FakeClock()
    conn = conn or FakeConnection(autocommit=True)
    outcome = None
    try:
        outcome = client.send(conn, timeout=timeout, clock=clock, sleep=clock.sleep, **MAIL)
    except client.MailError as exc:
        outcome = exc
    return outcome, fake, clock, conn


def test_send_returns_the_sent_event_and_follows_the_cursor(monkeypatch):
    batches = [[event(1, "Enqueued")], [], [event(2, "Claimed")], [event(3, "Sent", code=250, detail="2.0.0 OK")]]
    outcome, fake, clock, _ = run_send(monkeypatch, batches)
    assert isinstance(outcome, client.MailEvent) and outcome.event_type == "Sent"
    assert outcome.smtp_code == 250 and outcome.event_id == 3
    reads = [kw for name, kw in fake.calls if name == "get_mail_events"]
    assert [r["after_event_id"] for r in reads] == [0, 1, 1, 2]
    assert all(r["mail_id"] == 7 and "app_name" not in r for r in reads)


def test_send_backs_off_while_nothing_happens_and_resets_on_an_event(monkeypatch):
    batches = [[], [], [], [event(1, "Enqueued")], [], [event(2, "DryRun")]]
    outcome, _, clock, _ = run_send(monkeypatch, batches)
    assert outcome.event_type == "DryRun"  # recorded, reached no server: not an error
    assert clock.sleeps == [0.2, 0.4, 0.8, 0.2, 0.4]


def test_backoff_is_capped(monkeypatch):
    batches = [[]] * 12 + [[event(1, "Sent")]]
    outcome, _, clock, _ = run_send(monkeypatch, batches, timeout=1000)
    assert outcome.event_type == "Sent"
    assert max(clock.sleeps) == client.POLL_MAXIMUM
    assert clock.sleeps == sorted(clock.sleeps)


@pytest.mark.parametrize("kind, cls", [
    ("Failed", client.MailFailed), ("Expired", client.MailExpired),
    ("Cancelled", client.MailCancelled), ("Stopped", client.MailStopped),
])
def test_send_raises_the_terminal_outcome_with_code_and_detail(monkeypatch, kind, cls):
    detail = "5.1.1 <a@example.org>: user unknown"
    outcome, _, _, _ = run_send(monkeypatch, [[event(1, "Enqueued"), event(2, kind, code=550, detail=detail)]])
    assert type(outcome) is cls
    assert outcome.mail_id == 7 and outcome.smtp_code == 550 and outcome.detail == detail
    assert outcome.event.event_id == 2
    assert str(outcome) == f"mail 7 {kind.lower()} (SMTP 550): {detail}"


def test_expired_and_cancelled_are_failures_stopped_is_not():
    assert issubclass(client.MailExpired, client.MailFailed)
    assert issubclass(client.MailCancelled, client.MailFailed)
    assert not issubclass(client.MailStopped, client.MailFailed)
    assert issubclass(client.MailStopped, client.MailError)


def test_send_times_out_and_leaves_the_mail_queued(monkeypatch):
    batches = [[event(1, "Enqueued")], [event(2, "RetryScheduled", code=451, detail="try later")]]
    conn = FakeConnection(autocommit=True)
    outcome, fake, clock, _ = run_send(monkeypatch, batches, timeout=3.0, conn=conn)
    assert isinstance(outcome, client.MailTimeout)
    assert outcome.mail_id == 7 and outcome.event.event_type == "RetryScheduled"
    assert outcome.smtp_code == 451 and outcome.timeout == 3.0
    assert clock.now == 3.0  # the last wait is cut to the deadline
    assert "stop" not in conn.log and "rollback" not in conn.log  # nothing undone
    assert "stays queued" in str(outcome)


def test_send_on_an_autocommit_connection_never_commits(monkeypatch):
    conn = FakeConnection(autocommit=True)
    run_send(monkeypatch, [[], [event(1, "Sent")]], conn=conn)
    assert conn.log == ["enqueue", "events", "events"]


def test_events_on_a_callers_manual_commit_connection_only_read(monkeypatch):
    FakeProcedures(monkeypatch, [[event(1, "Enqueued")]])
    conn = FakeConnection(autocommit=False)
    assert [e.event_id for e in client.events(conn, "billing")] == [1]
    assert conn.log == ["events"]


def test_send_passes_the_idempotency_key_and_reports_an_earlier_outcome_at_once(monkeypatch):
    outcome, fake, clock, _ = run_send(monkeypatch, [[event(1, "Enqueued"), event(5, "Sent")]])
    assert outcome.event_id == 5 and clock.sleeps == []


@pytest.mark.parametrize("timeout", [0, -1])
def test_send_needs_a_positive_timeout(monkeypatch, timeout):
    fake = FakeProcedures(monkeypatch)
    with pytest.raises(ValueError):
        client.send(FakeConnection(), timeout=timeout, **MAIL)
    assert fake.calls == []


def test_a_non_terminal_event_is_not_an_outcome():
    with pytest.raises(ValueError):
        client.raise_for_outcome(client.as_event(event(1, "Claimed")))


# -- events ---------------------------------------------------------------------


def test_events_reads_in_batches_until_caught_up(monkeypatch):
    fake = FakeProcedures(monkeypatch, [[event(1, "Enqueued"), event(2, "Claimed")], [event(3, "Sent")]])
    conn = FakeConnection(autocommit=True)
    got = list(client.events(conn, "billing", after=0, batch_size=2, sleep=pytest.fail))
    assert [e.event_id for e in got] == [1, 2, 3]
    reads = [kw for name, kw in fake.calls if name == "get_mail_events"]
    assert reads == [{"app_name": "billing", "after_event_id": 0, "max_events": 2},
                     {"app_name": "billing", "after_event_id": 2, "max_events": 2}]


def test_events_follow_waits_with_backoff_and_keeps_the_cursor(monkeypatch):
    batches = [[event(10, "Enqueued")], [], [], [event(11, "Sent")]]
    fake = FakeProcedures(monkeypatch, batches)
    clock = FakeClock()
    it = client.events(FakeConnection(autocommit=True), "billing", after=9, follow=True, sleep=clock.sleep)
    assert [next(it).event_id, next(it).event_id] == [10, 11]
    it.close()
    reads = [kw["after_event_id"] for name, kw in fake.calls if name == "get_mail_events"]
    assert reads == [9, 10, 10, 10]
    assert clock.sleeps == [0.2, 0.4, 0.8]  # reset after the event, doubled while empty


def test_events_from_a_url_closes_the_connection_when_the_caller_stops(monkeypatch):
    FakeProcedures(monkeypatch, [[event(1, "Enqueued")]])
    conns: list[FakeConnection] = []
    monkeypatch.setattr(client, "connect", lambda url: conns.append(FakeConnection(True)) or conns[-1])
    it = client.events("mssql+pyodbc://u@h/db", "billing", follow=True, sleep=lambda s: None)
    next(it)
    it.close()
    assert conns[0].closed


@pytest.mark.parametrize("kw", [{"batch_size": 0}, {"batch_size": 5001}])
def test_events_batch_size_is_checked_before_any_read(monkeypatch, kw):
    fake = FakeProcedures(monkeypatch)
    with pytest.raises(ValueError):
        next(client.events(FakeConnection(), "billing", **kw))
    assert fake.calls == []


def test_as_event_accepts_rows_dicts_and_objects():
    row = (4, 7, "billing", "Sent", "Sent", 1, 250, "ok", None)
    assert client.as_event(row) == client.as_event(dict(zip(client._COLUMNS, row)))
    assert client.as_event(row) == client.as_event(dict(zip(client._FIELDS, row)))
    assert client.as_event(client.as_event(row)).event_id == 4

    class Row(tuple):  # pyodbc's Row: a sequence with the columns as attributes
        def __getattr__(self, name):
            if name not in client._COLUMNS:
                raise AttributeError(name)
            return self[client._COLUMNS.index(name)]

    assert client.as_event(Row(row)) == client.as_event(row)

    @dataclasses.dataclass
    class OtherWrappersEvent:  # same columns, other field names
        id: int
        mail: int
        app: str
        kind: str
        status: str
        attempts: int
        code: int
        text: str
        at: object

    assert client.as_event(OtherWrappersEvent(*row)) == client.as_event(row)
    assert client.as_event(row).terminal


# -- stop -----------------------------------------------------------------------


def test_stop_calls_the_wrapper_in_its_own_transaction(monkeypatch):
    fake = FakeProcedures(monkeypatch)
    conn = FakeConnection(autocommit=True)
    rows = client.stop(conn, 7, "bounced twice")
    assert fake.calls == [("stop_mail", {"mail_id": 7, "reason": "bounced twice"})]
    assert conn.log == ["stop"] and rows[0]["Status"] == "Stopped"


def test_the_client_sends_no_sql_of_its_own():
    from pathlib import Path

    source = Path(client.__file__).read_text(encoding="utf-8")
    assert "EXEC " not in source.upper()
    assert ".cursor(" not in source and ".execute(" not in source


def test_send_does_not_report_a_terminal_event_the_mail_was_requeued_after(monkeypatch):
    """An earlier mail found by its idempotency key can have failed, been requeued
    (mailq.RequeueMail) and sent: its first terminal event is not its outcome."""
    history = [event(1, "Enqueued"), event(2, "Claimed"), event(3, "Failed", code=550, detail="old"),
               event(4, "Requeued")]
    outcome, fake, clock, _ = run_send(monkeypatch, [history, [event(5, "Claimed")], [event(6, "Sent", code=250)]])
    assert isinstance(outcome, client.MailEvent) and outcome.event_type == "Sent" and outcome.event_id == 6
    outcome, _, _, _ = run_send(monkeypatch, [[*history, event(5, "Claimed"), event(6, "Sent", code=250)]])
    assert isinstance(outcome, client.MailEvent) and outcome.event_id == 6
