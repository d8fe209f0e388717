"""What holds the event stream back, on SQL Server 2022 (docs/events.md,
"When the stream stalls").

* While another session keeps a transaction open that enqueued a mail (it
  wrote a MailEvent row, hence a rowversion value), GetMailEvents returns
  nothing after it, and mailq.GetEventStreamStall says HeldBack = 1 and lists
  that session (its @@SPID), open for at least the time waited, its program
  and login as sys.dm_exec_sessions shows them; once it rolls back, nothing
  is held back.
* A database user without VIEW SERVER STATE (EXECUTE AS USER) gets the
  summary row with CanSeeTransactions = 0 and no error (no 297/300).
* @MinOpenSeconds filters younger transactions out; out of range is 50521.
"""

from __future__ import annotations

import time

import pytest

from mailq_helpers import (
    connection,
    execute,
    exec_proc,
    expect_error,
    new_account,
    new_app,
    query,
    result_sets,
    scalar,
)
from mailq_db import procedures

pytestmark = pytest.mark.integration


def test_an_open_enqueue_holds_the_stream_back_and_is_named(mssql_url, conn):
    app, account = new_app(conn, "stall"), new_account(conn, "stall")
    procedures.enqueue_mail(conn, to_address="a@example.com", subject="s", body="b", account_name=account,
                            app_name=app)
    assert procedures.get_event_stream_stall(conn).held_back is False
    with connection(mssql_url) as writer:
        spid = scalar(writer, "SELECT @@SPID;")
        program, login = query(conn, "SELECT program_name, login_name FROM sys.dm_exec_sessions "
                                     "WHERE session_id = ?;", spid)[0]
        cursor = writer.cursor()
        cursor.execute("BEGIN TRANSACTION;")
        try:
            procedures.enqueue_mail(writer, to_address="b@example.com", subject="s", body="b",
                                    account_name=account, app_name=app)
            time.sleep(2.5)
            seen = procedures.get_mail_events(conn, app_name=app)
            assert [e.event_type for e in seen] == ["Enqueued"], "an event after the open one was returned"
            stall = procedures.get_event_stream_stall(conn, min_open_seconds=2)
            assert stall.held_back and stall.can_see_transactions
            assert stall.min_active_rowversion < stall.next_rowversion
            mine = [h for h in stall.holders if h.session_id == spid]
            assert mine, f"session {spid} not listed: {stall.holders}"
            (holder,) = mine
            assert holder.open_seconds >= 2 and holder.state == "active"
            assert holder.program_name == program and holder.login_name == login
            assert stall.oldest_open_seconds >= holder.open_seconds
            assert f"session {spid}" in holder.describe()
            assert not [h for h in procedures.get_event_stream_stall(conn, min_open_seconds=3600).holders
                        if h.session_id == spid], "@MinOpenSeconds did not filter"
        finally:
            cursor.execute("IF @@TRANCOUNT > 0 ROLLBACK TRANSACTION;")
            cursor.close()
    after = procedures.get_event_stream_stall(conn)
    assert after.held_back is False and after.holders == []


def test_a_caller_without_view_server_state_gets_the_summary_only(conn):
    execute(conn, "IF USER_ID(N'stall_reader') IS NULL CREATE USER stall_reader WITHOUT LOGIN;")
    execute(conn, "ALTER ROLE MailqEnqueuer ADD MEMBER stall_reader;")
    cursor = conn.cursor()
    try:
        cursor.execute("EXECUTE AS USER = N'stall_reader'; EXEC mailq.GetEventStreamStall; REVERT;")
        head, holders = result_sets(cursor)[:2]
    finally:
        cursor.close()
    assert head[0][3] in (False, 0), "CanSeeTransactions without the permission"
    assert "VIEW SERVER STATE" in head[0][4]
    assert holders == []


def test_min_open_seconds_out_of_range_is_50521(conn):
    expect_error(50521, exec_proc, conn, "mailq.GetEventStreamStall", MinOpenSeconds=-1)
    expect_error(50521, exec_proc, conn, "mailq.GetEventStreamStall", MinOpenSeconds=86401)
