"""procedures.get_mail_events repeats a read chosen as deadlock victim (1205)
on an autocommit connection, and never inside a caller's transaction.

This tests the wrapper's own Python logic with a stand-in connection; it
claims nothing about mailq.GetMailEvents (tests/integration does).
"""

from __future__ import annotations

import pyodbc
import pytest

from mailq_db import procedures
from mailq_db.errors import DatabaseError

DEADLOCK = pyodbc.Error(
    "40001",
    "[40001] [Microsoft][ODBC Driver 18 for SQL Server][SQL Server]Transaction (Process ID 57) was "
    "deadlocked on lock resources with another process and has been chosen as the deadlock victim. "
    "Rerun the transaction. (1205) (SQLExecDirectW)",
)


class Cursor:
    description = None

    def __init__(self, conn):
        self.conn = conn

    def execute(self, sql, *params):
        self.conn.calls.append((sql, params))
        if self.conn.failures:
            self.conn.failures -= 1
            raise DEADLOCK
        return self

    def fetchall(self):
        return []

    def close(self):
        pass


class Conn:
    def __init__(self, failures: int, autocommit: bool):
        self.failures = failures
        self.autocommit = autocommit
        self.calls: list = []

    def cursor(self):
        return Cursor(self)


@pytest.fixture(autouse=True)
def no_sleep(monkeypatch):
    monkeypatch.setattr(procedures.time, "sleep", lambda s: None)


def test_a_deadlocked_read_is_repeated_with_the_same_cursor():
    conn = Conn(failures=2, autocommit=True)
    assert procedures.get_mail_events(conn, app_name="billing", after_event_id=41) == []
    assert len(conn.calls) == 3
    assert {c[1] for c in conn.calls} == {("billing", None, 41, None)}


def test_a_read_deadlocked_every_time_raises_1205():
    conn = Conn(failures=10, autocommit=True)
    with pytest.raises(DatabaseError) as info:
        procedures.get_mail_events(conn, app_name="billing")
    assert info.value.number == 1205
    assert len(conn.calls) == procedures.READ_DEADLOCK_ATTEMPTS


def test_inside_a_callers_transaction_the_deadlock_is_the_callers_to_handle():
    conn = Conn(failures=1, autocommit=False)
    with pytest.raises(DatabaseError) as info:
        procedures.get_mail_events(conn, mail_id=7)
    assert info.value.number == 1205 and len(conn.calls) == 1
