"""`mailq-db stats` reads bounded ranges, never the history kept: SQL Server 2022
(docs/guarantees.md, "Storage and reporting").

Setup: one database with 200,000 Sent mails finished 30 days ago (history a
retention keeps), plus a known live and recent set; a second database with
the same live and recent set only.

* Every statement of mailq.GetQueueStats seeks (no scan of mailq.MailQueue or
  mailq.MailAttempt in the actual plan), and the rows it reads from
  IX_MailQueue_Status / IX_MailQueue_Final are those of the live queue and
  the window, not the 200,000.
* Logical reads per call stay within 20 % of the database without history.
* The figures are right: queued counts per status and account, mail
  finished per hour (Sent, Failed, Expired, Cancelled, Stopped) in the
  window only, failures newest first.
* @FinishedHours out of range is 50520.
"""

from __future__ import annotations

import pytest

from mailq_helpers import (
    bulk_fill,
    claim,
    connection,
    enqueue,
    exec_proc,
    execute,
    expect_error,
    new_account,
    new_app,
    query,
    showplans,
    statement_plans,
    table_scans,
)
from mailq_db import procedures

pytestmark = pytest.mark.integration

HISTORY = 200_000


def live_and_recent(conn) -> str:
    """On a new account: 7 UnSent, 2 Sending, 3 Sent and 1 Cancelled just now, 1 failed attempt."""
    app, account = new_app(conn, "stats"), new_account(conn, "stats")
    enqueue(conn, account, app, 13)
    token, mails = claim(conn, app, batch_size=6)
    procedures.mark_sent(conn, ids=[m.id for m in mails[:3]], lock_token=token, smtp_code=250)
    procedures.mark_failed(conn, ids=[mails[3].id], lock_token=token, disposition="Retry",
                           error="451 try later", smtp_code=451)
    cancel = [r[0] for r in query(conn, "SELECT TOP (1) ID FROM mailq.MailQueue WHERE AccountName = ? "
                                        "AND Status = N'UnSent' ORDER BY ID DESC;", account)]
    procedures.cancel_mail(conn, mail_id=cancel[0])
    return account


@pytest.fixture(scope="module")
def with_history(conn):
    account = live_and_recent(conn)
    old = new_account(conn, "history")
    bulk_fill(conn, old, HISTORY)
    execute(conn, "UPDATE mailq.MailQueue SET Status = N'Sent', SentAtUtc = DATEADD(DAY, -30, SYSUTCDATETIME()), "
                  "DateProcessed = DATEADD(DAY, -30, SYSUTCDATETIME()) WHERE AccountName = ?;", old)
    execute(conn, "UPDATE STATISTICS mailq.MailQueue WITH FULLSCAN;")
    return account


def stats_reads(url: str) -> float:
    stats = ("SELECT total_logical_reads, execution_count FROM sys.dm_exec_procedure_stats "
             "WHERE database_id = DB_ID() AND object_id = OBJECT_ID(N'mailq.GetQueueStats');")
    with connection(url) as c:
        procedures.get_queue_stats(c)  # compile
        (r0, n0), = query(c, stats)
        for _ in range(3):
            procedures.get_queue_stats(c)
        (r1, n1), = query(c, stats)
    return (r1 - r0) / (n1 - n0)


def test_stats_figures_are_right(conn, with_history):
    account = with_history
    stats = procedures.get_queue_stats(conn, recent_failures=5, finished_hours=2)
    queued = {(r["Status"], r["AccountName"]): r["MailCount"] for r in stats.queued}
    assert queued[("UnSent", account)] == 13 - 6 - 1 + 1  # not claimed, minus cancelled, plus the retried one
    assert queued[("Sending", account)] == 2
    assert not [r for r in stats.queued if r["Status"] not in ("UnSent", "Sending")]
    finished = [r for r in stats.finished_per_hour if r["AccountName"] == account]
    assert sum(r["Sent"] for r in finished) == 3 and sum(r["Cancelled"] for r in finished) == 1
    assert not [r for r in stats.finished_per_hour if r["AccountName"].startswith("history")], \
        "mail finished 30 days ago is inside a 2-hour window"
    assert stats.failures and stats.failures[0]["Outcome"] == "Retry"


def test_stats_plans_seek_and_read_only_the_live_queue_and_the_window(conn, with_history):
    cursor = conn.cursor()
    cursor.execute("SET STATISTICS XML ON;")
    cursor.execute("EXEC mailq.GetQueueStats @RecentFailures = 20, @FinishedHours = 24;")
    plans, _ = showplans(cursor)
    cursor.execute("SET STATISTICS XML OFF;")
    cursor.close()
    for index in ("IX_MailQueue_Status", "IX_MailQueue_Final"):
        stmts = statement_plans(plans, index)
        assert stmts, f"GetQueueStats does not read {index}"
        for stmt in stmts:
            assert table_scans(stmt) == [] and table_scans(stmt, "MailAttempt") == []
            for read in stmt.reads:
                assert read.physical_op == "Index Seek", (index, read.physical_op)
                assert (read.actual_rows_read or read.actual_rows or 0) < 1_000, \
                    f"{index}: {read.actual_rows_read} rows read beside {HISTORY} finished mails kept"


def test_stats_reads_do_not_grow_with_history(with_history, mssql_url, fresh_database):
    plain_url = fresh_database()
    with connection(plain_url) as c:
        live_and_recent(c)
        execute(c, "UPDATE STATISTICS mailq.MailQueue WITH FULLSCAN;")
    plain = stats_reads(plain_url)
    deep = stats_reads(mssql_url)
    print(f"logical reads per GetQueueStats: {plain:.0f} without history, {deep:.0f} with {HISTORY} "
          "finished mails kept")
    assert deep <= 1.2 * plain + 20, f"stats reads grow with history: {plain:.0f} -> {deep:.0f}"


def test_finished_hours_out_of_range_is_50520(conn):
    expect_error(50520, exec_proc, conn, "mailq.GetQueueStats", FinishedHours=0)
    expect_error(50520, exec_proc, conn, "mailq.GetQueueStats", FinishedHours=169)
