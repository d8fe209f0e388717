"""The query runner's Python logic (mailq_db.dbmail.runner) with a fake
driver: what it reads from a cursor, how it impersonates and reverts, and what
it hands back.  Whether SQL Server and the ODBC driver behave as faked here is
tests/integration/test_dbmail_send.py's job."""

from __future__ import annotations

import datetime as dt
import struct

import pytest

from mailq_db import procedures
from mailq_db.dbmail import layout as L
from mailq_db.dbmail import runner


class DriverError(Exception):
    pass


class FakeCursor:
    """Plays a script: each step is a result (description, rows, rowcount,
    messages) or an exception; execute() of anything but the query answers
    the runner's own statements.  A row that is an exception is raised when
    it is fetched (an error the server sends among the rows)."""

    def __init__(self, steps, nocount=False, sid=b"\x01", fail_execute_as=False):
        self.steps, self.pos, self.nocount, self.sid = steps, 0, nocount, sid
        self.fail_execute_as = fail_execute_as
        self.executed: list[str] = []
        self.description = None
        self.rowcount = -1
        self.messages = None
        self._one = None
        self._rows: list = []
        self.cancelled = 0

    def _load(self):
        step = self.steps[self.pos]
        if isinstance(step, Exception):
            raise step
        self.description, rows, self.rowcount, self.messages = step
        self._rows = list(rows)

    def execute(self, sql, *params):
        self.executed.append(sql)
        self.description, self.messages = None, None
        if sql.startswith("SELECT @@SERVERNAME"):
            self._one = ("SQL1",)
        elif "EXECUTE AS USER" in sql:
            if self.fail_execute_as:
                raise DriverError("[42000] [Microsoft][SQL Server]Cannot execute as the database principal (15517)")
            self._one = (b"\xc0\x0c", self.sid)
        elif sql.startswith("SELECT @@OPTIONS"):
            # nocount None: the query left PARSEONLY/FMTONLY on, so no row comes back
            self._one = None if self.nocount is None else (512 if self.nocount else 0,)
        elif sql.startswith(("REVERT", "IF @@TRANCOUNT")):
            pass
        else:
            self.pos, self._one = 0, None
            self._load()

    def fetchone(self):
        if self._one is not None:  # the answer to one of the runner's own statements
            one, self._one = self._one, None
            return one
        if not self._rows:
            return None
        row = self._rows.pop(0)
        if isinstance(row, Exception):
            raise row
        return row

    def cancel(self):
        self.cancelled += 1

    def nextset(self):
        self.pos += 1
        if self.pos >= len(self.steps):
            return False
        self._load()
        return True


class FakeConn:
    def __init__(self, cursor):
        self.c = cursor
        self.closed = False

    def cursor(self):
        return self.c

    def close(self):
        self.closed = True


def job(**kw):
    base = dict(mailitem_id=7, mail_id=70, query="q", database="db", request_user="rep'ort",
                request_user_sid=b"\x01", attach_results=False, attachment_filename=None, header=True,
                width=256, separator=" ", exclude_query_output=False, append_query_error=False,
                no_truncate=False, no_padding=False, result_format="TEXT", attempts=1)
    base.update(kw)
    return procedures.DbMailQuery(**base)


INT = ("n", int, None, 10, 10, 0, False)
STR = ("name", str, None, 10, 10, 0, True)


def test_reads_every_result_set_message_and_count_in_order_then_reverts():
    steps = [
        (None, [], 3, [("01000", "[Microsoft][ODBC Driver 18 for SQL Server][SQL Server]Disk report")]),
        ([INT], [(1,)], -1, None),
        ([STR], [("a",), (None,)], -1, None),
    ]
    cur = FakeCursor(steps)
    out = runner.run_as_sender(FakeConn(cur), job(), (DriverError,))
    kinds = [type(i).__name__ for i in out.items]
    assert kinds == ["Message", "RowCount", "ResultSet", "ResultSet"]
    assert out.items[0].text == "Disk report"
    assert [i.count for i in out.items if isinstance(i, L.ResultSet)] == [1, 2]
    assert "EXECUTE AS USER = N'rep''ort' WITH COOKIE INTO @c" in cur.executed[1]
    assert cur.executed[-1] == "REVERT WITH COOKIE = 0xc00c;"


def test_set_nocount_on_at_the_end_drops_the_counts_of_result_sets():
    cur = FakeCursor([([INT], [(1,)], -1, None)], nocount=True)
    out = runner.run_as_sender(FakeConn(cur), job(), (DriverError,))
    assert out.items[0].count is None


def test_an_error_is_kept_and_reading_goes_on():
    steps = [([INT], [(1,)], -1, None), DriverError("22012", "[Microsoft][ODBC Driver 18 for SQL Server][SQL Server]"
                                                    "Divide by zero error encountered. (8134) (SQLMoreResults)"),
             ([INT], [(2,)], -1, None)]
    out = runner.run_as_sender(FakeConn(FakeCursor(steps)), job(), (DriverError,))
    errs = [i for i in out.items if isinstance(i, L.QueryError)]
    assert [(e.number, e.text, e.server) for e in errs] == [(8134, "Divide by zero error encountered.", "SQL1")]
    assert [i.rows for i in out.items if isinstance(i, L.ResultSet)] == [[(1,)], [(2,)]]


def test_no_impersonation_grant_is_an_identity_error_and_nothing_runs():
    cur = FakeCursor([([INT], [(1,)], -1, None)], fail_execute_as=True)
    with pytest.raises(runner.IdentityError, match=r"IMPERSONATE ON USER::\[rep'ort\]"):
        runner.run_as_sender(FakeConn(cur), job(), (DriverError,))
    assert cur.executed[-1].startswith("SET NOCOUNT ON; DECLARE @c")


def test_a_recreated_user_is_refused_and_reverted():
    cur = FakeCursor([([INT], [(1,)], -1, None)], sid=b"\x02")
    with pytest.raises(runner.IdentityError, match="dropped and created again"):
        runner.run_as_sender(FakeConn(cur), job(), (DriverError,))
    assert cur.executed[-1].startswith("REVERT WITH COOKIE") and "q" not in cur.executed


def test_finish_fails_on_error_unless_append_query_error():
    out = L.Output([L.QueryError(208, "Invalid object name 'x'.", server="SQL1")])
    assert runner.finish(job(), out) == {"outcome": "Failed", "error": "Msg 208, Server SQL1 Invalid object name 'x'."}
    done = runner.finish(job(append_query_error=True), out)
    assert done["outcome"] == "Done" and "Invalid object name" in done["text"]


def test_finish_attaches_as_database_mail_names_and_encodes():
    rs = L.ResultSet([L.Column("n", "int", 10, 0, False)], [(1,)], count=1)
    args = runner.finish(job(attach_results=True), L.Output([rs]))
    assert args["file_name"] == "QueryResults7.txt" and args["attachment"][:2] == b"\xff\xfe"
    args = runner.finish(job(attach_results=True, result_format="CSV", attachment_filename="r.csv"), L.Output([rs]))
    assert args["file_name"] == "r.csv" and args["attachment"].startswith(b"\xef\xbb\xbfn\r\n1\r\n")


def test_columns_from_pyodbc_descriptions():
    c = runner.column_from_description
    assert c(("d", dt.datetime, None, 23, 23, 3, True)).kind == "datetime"
    assert c(("d", dt.datetime, None, 16, 16, 0, True)).kind == "smalldatetime"
    assert c(("d", dt.datetime, None, 27, 27, 7, True)).kind == "datetime2"
    assert c(("f", float, None, 24, 24, 0, True)).kind == "real"
    assert c(("f", float, None, 53, 53, 0, True)).kind == "float"


def test_datetimeoffset_struct():
    raw = struct.pack("<6hI2h", 2024, 1, 2, 3, 4, 5, 500, -1, -30)
    v = runner._datetimeoffset(raw)
    assert (v.value, v.nanoseconds, v.offset_minutes) == (dt.datetime(2024, 1, 2, 3, 4, 5), 500, -90)


def test_run_one_hands_back_and_gives_up_after_three_attempts(monkeypatch):
    calls = []
    monkeypatch.setattr(procedures, "claim_db_mail_query", lambda conn, **kw: job(attempts=4))
    monkeypatch.setattr(procedures, "complete_db_mail_query", lambda conn, **kw: calls.append(kw))
    assert runner.run_one(object(), lambda: pytest.fail("no query may run"), driver_errors=(DriverError,))
    assert calls[0]["outcome"] == "Failed" and "3 attempts" in calls[0]["error"]
    monkeypatch.setattr(procedures, "claim_db_mail_query", lambda conn, **kw: None)
    assert runner.run_one(object(), lambda: None) is False


def test_an_error_among_the_rows_keeps_the_rows_before_it_and_reading_goes_on():
    # SELECT x, 10 / x FROM t: the error comes with the rows, from the fetch, not the execute.
    boom = DriverError("22012", "[Microsoft][ODBC Driver 18 for SQL Server][SQL Server]"
                                "Divide by zero error encountered. (8134) (SQLFetch)")
    steps = [([INT], [(1,), (2,), boom], -1, None), ([INT], [(3,)], -1, None)]
    out = runner.run_as_sender(FakeConn(FakeCursor(steps)), job(), (DriverError,))
    assert [type(i).__name__ for i in out.items] == ["ResultSet", "QueryError", "ResultSet"]
    assert out.items[0].rows == [(1,), (2,)] and out.items[0].count is None
    assert out.items[1].number == 8134 and out.items[2].rows == [(3,)]


def test_a_type_pyodbc_cannot_read_is_named_in_the_error():
    # pyodbc's own errors carry (message, SQLSTATE), the other way round.
    bad = DriverError("ODBC SQL type -150 is not yet supported.  column-index=1  type=-150", "HY106")
    out = runner.run_as_sender(FakeConn(FakeCursor([([INT, STR], [bad], -1, None)])), job(), (DriverError,))
    err = [i for i in out.items if isinstance(i, L.QueryError)][0]
    assert err.text.startswith("column 2 of the result is sql_variant, which the query runner cannot read")


def test_nocount_that_cannot_be_read_is_taken_as_off():
    cur = FakeCursor([([INT], [(1,)], -1, None)], nocount=None)
    out = runner.run_as_sender(FakeConn(cur), job(), (DriverError,))
    assert out.items[0].count == 1 and cur.executed[-1].startswith("REVERT WITH COOKIE")


def test_reading_stops_once_the_result_cannot_fit_the_mail():
    big = [("x" * 900_000,)] * 3  # 2,700,000 characters for a body of at most 2,000,000
    cur = FakeCursor([([STR], big, -1, None), ([INT], [(1,)], -1, None)])
    out = runner.run_as_sender(FakeConn(cur), job(), (DriverError,))
    assert out.stopped == runner.TOO_LARGE and cur.cancelled == 1
    assert len(out.items) == 1  # the second result set is never read
    assert runner.finish(job(append_query_error=True), out) == {"outcome": "Failed", "error": runner.TOO_LARGE}
    # The same rows fit an attachment (10 MiB).
    out = runner.run_as_sender(FakeConn(FakeCursor([([STR], big, -1, None)])), job(attach_results=True),
                               (DriverError,))
    assert out.stopped is None


def test_a_query_past_its_time_is_cancelled_as_a_query_error():
    ticks = iter([0.0, 11.0, 12.0, 13.0])  # the deadline is 10: passed after the first result set
    cur = FakeCursor([([INT], [(1,)], -1, None), ([INT], [(2,)], -1, None)])
    out = runner.run_as_sender(FakeConn(cur), job(), (DriverError,), seconds=10, clock=lambda: next(ticks))
    assert cur.cancelled == 1 and [i.rows for i in out.items if isinstance(i, L.ResultSet)] == [[(1,)]]
    assert runner.finish(job(), out)["error"].startswith("the query ran longer than")
    assert cur.executed[-1].startswith("REVERT WITH COOKIE")


def test_query_seconds_leave_a_margin_before_the_lease_passes():
    assert [runner.query_seconds(n) for n in (10, 60, 300, 3600)] == [5, 54, 270, 3240]


def test_a_query_that_breaks_the_reader_fails_its_mail_not_the_runner(monkeypatch):
    calls = []
    monkeypatch.setattr(procedures, "claim_db_mail_query", lambda conn, **kw: job())
    monkeypatch.setattr(procedures, "complete_db_mail_query", lambda conn, **kw: calls.append(kw))
    weird = ("n", int, None, "not a size", 10, 0, False)  # anything the reader does not expect
    conn = FakeConn(FakeCursor([([weird], [(1,)], -1, None)]))
    assert runner.run_one(object(), lambda: conn, driver_errors=(DriverError,))
    assert calls[0]["outcome"] == "Failed" and "could not run or read the query" in calls[0]["error"]
    assert conn.closed


def test_a_claim_lost_before_the_hand_back_does_not_stop_the_runner(monkeypatch):
    from mailq_db.errors import DatabaseError

    def lost(conn, **kw):
        raise DatabaseError(50661, "The query runner's claim on this item is lost")

    monkeypatch.setattr(procedures, "claim_db_mail_query", lambda conn, **kw: job())
    monkeypatch.setattr(procedures, "complete_db_mail_query", lost)
    conn = FakeConn(FakeCursor([([INT], [(1,)], -1, None)]))
    assert runner.run_one(object(), lambda: conn, driver_errors=(DriverError,)) is True

    def down(conn, **kw):
        raise DatabaseError(4060, "cannot open the database")

    monkeypatch.setattr(procedures, "complete_db_mail_query", down)
    with pytest.raises(DatabaseError):
        runner.run_one(object(), lambda: FakeConn(FakeCursor([([INT], [(1,)], -1, None)])),
                       driver_errors=(DriverError,))


def test_the_command_gives_each_query_connection_the_query_time(monkeypatch):
    import argparse

    from mailq_db.commands import dbmail_runner

    opened = []

    class Closing:
        def close(self):
            pass

    monkeypatch.setattr(dbmail_runner, "connect", lambda url, **kw: opened.append(kw) or Closing())

    def once(control, open_query_connection, **kw):
        open_query_connection()
        return 1

    monkeypatch.setattr(runner, "run_forever", once)
    args = argparse.Namespace(db="mssql://u@h/db", idle_seconds=5.0, lease_seconds=300, once=True)
    assert dbmail_runner.run(args) == 0
    assert opened == [{}, {"query_timeout": 270}]
