"""Driver discovery, URL translation, dropped-connection detection and reconnect with backoff."""

from __future__ import annotations

import pytest

from mailq_db import connection
from mailq_db.connection import Backoff, ReconnectingConnection, find_driver, is_connection_lost, to_odbc
from mailq_db.errors import ConfigurationError, DatabaseError, DriverNotFoundError, LeaseLostError


@pytest.mark.parametrize("available,expected", [
    (["FreeTDS", "ODBC Driver 17 for SQL Server", "ODBC Driver 18 for SQL Server"], "ODBC Driver 18 for SQL Server"),
    (["FreeTDS", "ODBC Driver 17 for SQL Server"], "ODBC Driver 17 for SQL Server"),
    (["PostgreSQL", "FreeTDS"], "FreeTDS"),
])
def test_driver_preference(available, expected):
    assert find_driver(available) == expected


def test_no_driver_lists_what_was_tried_and_how_to_install_each():
    with pytest.raises(DriverNotFoundError) as info:
        find_driver(["PostgreSQL Unicode"])
    text = str(info.value)
    assert "PostgreSQL Unicode" in text
    for hint in ("ODBC Driver 18 for SQL Server", "msodbcsql18", "msodbcsql17", "apt-get install unixodbc tdsodbc"):
        assert hint in text


def test_freetds_gets_tds_7_4():
    odbc = to_odbc("mssql+pyodbc://sa:p%3Bw@db.example:1433/mail", driver="FreeTDS")
    assert odbc.startswith("DRIVER={FreeTDS};SERVER=db.example,1433;DATABASE=mail;UID=sa;PWD={p;w}")
    assert odbc.endswith("TDS_Version=7.4")


def test_url_driver_wins_and_bad_schemes_are_refused():
    assert "DRIVER=ODBC Driver 18 for SQL Server" in to_odbc(
        "mssql+pyodbc://u:p@h/db?driver=ODBC+Driver+18+for+SQL+Server")
    with pytest.raises(ConfigurationError, match="unsupported URL scheme"):
        to_odbc("postgresql://h/db")


def test_connect_without_a_url_says_where_to_put_one(monkeypatch):
    monkeypatch.delenv("MAILQ_DB_URL", raising=False)
    monkeypatch.setattr(connection, "pyodbc_problem", lambda: None)
    with pytest.raises(ConfigurationError, match="MAILQ_DB_URL"):
        connection.connect(None)


class FakePyodbcError(Exception):
    pass


FakePyodbcError.__module__ = "pyodbc"


@pytest.mark.parametrize("exc,lost", [
    (FakePyodbcError("08S01", "[08S01] Communication link failure"), True),
    (FakePyodbcError("HYT00", "[HYT00] Query timeout expired"), True),
    (FakePyodbcError("42000", "[42000] Syntax error"), False),
    (DatabaseError(10054, "connection reset"), True),
    (LeaseLostError(50202, "lost"), False),
    (ConnectionResetError(), True),
    (ValueError("x"), False),
])
def test_is_connection_lost(exc, lost):
    assert is_connection_lost(exc) is lost


def test_is_connection_lost_looks_at_the_cause():
    wrapped = DatabaseError(None, "Communication link failure")
    wrapped.__cause__ = FakePyodbcError("08S01", "link failure")
    assert is_connection_lost(wrapped)


def test_backoff_doubles_up_to_the_maximum():
    b = Backoff(0.5, 3, jitter=False)
    assert [b.next() for _ in range(5)] == [0.5, 1, 2, 3, 3]
    b.reset()
    assert b.next() == 0.5


def test_reconnecting_connection_reopens_and_sends_the_same_call_again():
    opened, sleeps, seen = [], [], []

    class Conn:
        def close(self):
            pass

    def open_connection():
        opened.append(Conn())
        return opened[-1]

    def proc(conn, *, ids):
        seen.append((conn, ids))
        if len(seen) < 3:
            raise ConnectionResetError("dropped")
        return "ok"

    db = ReconnectingConnection(open_connection, backoff=Backoff(1, 8, jitter=False), sleep=sleeps.append)
    assert db.call(proc, ids=[1, 2]) == "ok"
    assert len(opened) == 3 and [s for s in sleeps] == [1, 2] and db.reconnects == 2
    assert [ids for _, ids in seen] == [[1, 2]] * 3 and seen[2][0] is opened[2]


def test_reconnecting_connection_gives_up_and_raises_other_errors_at_once():
    db = ReconnectingConnection(object, retries=2, sleep=lambda s: None)
    calls = []

    def dropped(conn):
        calls.append(1)
        raise ConnectionResetError("down")

    with pytest.raises(ConnectionResetError):
        db.call(dropped)
    assert len(calls) == 3

    def refused(conn):
        raise LeaseLostError(50202, "lost")

    with pytest.raises(LeaseLostError):
        db.call(refused)
