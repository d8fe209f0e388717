"""The monitoring procedures against SQL Server 2022 (docs/monitoring/README.md):

* mailq.GetQueueMetrics: depth by account, run mode and status; the oldest
  SENDABLE mail leaves out scheduled, backed-off (Retry) and blocked (Wait)
  mail, and counts an expired lease; attempts of the window's complete
  minutes by outcome and reply class; blocked accounts and why; 50580.
* Its plan reads the queued mail and the window, never the sent history:
  no scan of mailq.MailQueue or mailq.MailAttempt with 20,000 Sent mails.
* mailq.FindMail lists one status of one account; 50581, 50582.
* mailq.GetMailHistory: the mail, its attempts and recipients; 50583; an
  unknown ID is three empty sets.
* delay.GetTaskMetrics: pending, overdue, held, failed; the queue enabled.
* Roles: MailqMonitor reads all of it and may cancel, requeue or unblock
  nothing (229); CallerIsMailqAdmin says who may.
"""

from __future__ import annotations

import uuid

import pytest
from mailq_helpers import (
    claim,
    enqueue,
    execute,
    expect_error,
    new_account,
    new_app,
    query,
    scalar,
    showplans,
    statement_plans,
    table_scans,
    unique,
)

from mailq_db import procedures

pytestmark = pytest.mark.integration

AS_USER = """
EXECUTE AS USER = N'{user}';
BEGIN TRY
    {statement}
    SELECT CAST(0 AS INT) AS Number;
END TRY
BEGIN CATCH
    SELECT ERROR_NUMBER() AS Number;
END CATCH;
REVERT;
"""


def last_number(conn, user: str, statement: str) -> int:
    cur = conn.cursor()
    cur.execute(AS_USER.format(user=user, statement=statement))
    last = None
    while True:
        if cur.description:
            rows = cur.fetchall()
            if rows and cur.description[0][0] == "Number":
                last = rows[0][0]
        if not cur.nextset():
            break
    cur.close()
    return last


def pair(rows, account, run_mode="prod"):
    return [r for r in rows if r["AccountName"] == account and r["RunMode"] == run_mode]


def test_sendable_leaves_out_scheduled_backed_off_and_blocked_mail(conn):
    account = new_account(conn, "metrics")
    app = new_app(conn, "metrics")
    due = enqueue(conn, account, app, 3)
    enqueue(conn, account, app, 2, date_to_process=scalar(conn, "SELECT DATEADD(HOUR, 1, SYSUTCDATETIME())"))
    # the oldest due mail became due 10 minutes ago
    execute(conn, "UPDATE mailq.MailQueue SET VisibleAtUtc = DATEADD(MINUTE, -10, SYSUTCDATETIME()), "
                  "DateToProcess = DATEADD(MINUTE, -10, SYSUTCDATETIME()) WHERE ID = ?;", due[0].mail_id)
    token, mails = claim(conn, app, batch_size=1)
    assert [m.id for m in mails] == [due[0].mail_id]
    # a Retry backs the claimed mail off: no longer sendable
    procedures.mark_failed(conn, ids=[due[0].mail_id], lock_token=token, disposition="Retry",
                           error="451 4.3.0 later", retry_after_seconds=3600, smtp_code=451)
    m = procedures.get_queue_metrics(conn)
    depth = {r["Status"]: r["MailCount"] for r in pair(m.depth, account)}
    assert depth == {"UnSent": 5, "Sending": 0}
    [s] = pair(m.sendable, account)
    assert s["DueCount"] == 2 and s["SendableCount"] == 2 and not s["IsBlocked"]
    assert 0 <= s["OldestSendableAgeSeconds"] < 120  # the 10-minute-old mail is backed off, not counted
    # a Wait blocks the account: nothing sendable, the block and its reason shown
    token, mails = claim(conn, app, batch_size=1)
    procedures.mark_failed(conn, ids=[mails[0].id], lock_token=token, disposition="Wait",
                           error="421 4.7.0 too many connections", retry_after_seconds=600, smtp_code=421)
    m = procedures.get_queue_metrics(conn)
    [s] = pair(m.sendable, account)
    assert s["IsBlocked"] and s["SendableCount"] == 0 and s["OldestSendableAgeSeconds"] == 0
    [a] = [r for r in m.accounts if r["AccountName"] == account]
    assert a["IsBlocked"] and 500 < a["BlockedSecondsLeft"] <= 600 and "421" in a["BlockReason"]
    procedures.unblock_sending_account(conn, account_name=account)


def test_an_expired_lease_is_sendable_and_counted_as_sending(conn):
    account = new_account(conn, "lease")
    app = new_app(conn, "lease")
    enqueue(conn, account, app, 1)
    token, mails = claim(conn, app, batch_size=1, lease_seconds=1)
    execute(conn, "UPDATE mailq.MailQueue SET VisibleAtUtc = DATEADD(SECOND, -30, SYSUTCDATETIME()) WHERE ID = ?;",
            mails[0].id)
    m = procedures.get_queue_metrics(conn)
    assert {r["Status"]: r["MailCount"] for r in pair(m.depth, account)} == {"UnSent": 0, "Sending": 1}
    [s] = pair(m.sendable, account)
    assert s["SendableCount"] == 1 and s["OldestSendableAgeSeconds"] >= 30


def test_attempts_of_the_windows_complete_minutes_by_outcome_and_reply_class(conn):
    account = new_account(conn, "window")
    app = new_app(conn, "window")
    ids = [r.mail_id for r in enqueue(conn, account, app, 3)]
    token, mails = claim(conn, app, batch_size=3)
    procedures.mark_sent(conn, ids=ids[:2], lock_token=token, smtp_code=250, smtp_text="250 2.0.0 Ok: queued as X")
    procedures.mark_failed(conn, ids=[ids[2]], lock_token=token, disposition="Stop", error="550 5.1.1 no user",
                           smtp_code=550)
    # moved into the previous complete minute (the window never holds the current one)
    execute(conn, "UPDATE mailq.MailAttempt SET EndedAtUtc = DATEADD(SECOND, -70, EndedAtUtc) "
                  "WHERE MailID IN (?, ?, ?);", *ids)
    m = procedures.get_queue_metrics(conn, window_minutes=5)
    rows = {(r["Outcome"], r["ReplyClass"]): r["Attempts"] for r in m.attempts if r["AccountName"] == account}
    assert rows == {("Sent", "2xx"): 2, ("Stop", "5xx"): 1}
    assert (m.window_end_utc - m.window_start_utc).total_seconds() == 300
    expect_error(50580, procedures.get_queue_metrics, conn, window_minutes=61)


def test_the_plan_never_reads_the_sent_history(conn):
    account = new_account(conn, "history")
    execute(conn, f"""
        WITH n AS (SELECT TOP (20000) ROW_NUMBER() OVER (ORDER BY (SELECT NULL)) AS i
                   FROM sys.all_columns AS a CROSS JOIN sys.all_columns AS b)
        INSERT INTO mailq.MailQueue (DateToProcess, DateProcessed, VisibleAtUtc, FromAddress, ToAddress, Subject,
            Body, Status, AttemptsRemaining, AccountName, ContentHash, MessageID, SentAtUtc)
        SELECT SYSUTCDATETIME(), SYSUTCDATETIME(), SYSUTCDATETIME(), N'a@example.org', N'b@example.org', N's',
            N'b', N'Sent', 0, N'{account}', HASHBYTES('SHA2_256', CONCAT(N'h', n.i)),
            CONCAT(N'<h', n.i, N'-{uuid.uuid4().hex[:6]}@example.org>'), SYSUTCDATETIME()
        FROM n;""")
    execute(conn, "UPDATE STATISTICS mailq.MailQueue;")
    cur = conn.cursor()
    cur.execute("SET STATISTICS XML ON; EXEC mailq.GetQueueMetrics @WindowMinutes = 5; SET STATISTICS XML OFF;")
    plans, _ = showplans(cur)
    cur.close()
    assert plans
    for index in ("IX_MailQueue_ClaimByAccount", "IX_MailQueue_Status", "IX_MailAttempt_EndedAtUtc"):
        table = "MailAttempt" if "Attempt" in index else "MailQueue"
        for stmt in statement_plans(plans, index, table):
            assert table_scans(stmt, table) in ([], ["Index Scan [IX_MailQueue_ClaimByAccount]"]), stmt.text
            for read in stmt.reads:
                assert (read.actual_rows_read or 0) < 20000, (index, stmt.text)


def test_find_mail_lists_one_status_of_one_account(conn):
    account = new_account(conn, "find")
    app = new_app(conn, "find")
    ids = [r.mail_id for r in enqueue(conn, account, app, 3)]
    procedures.cancel_mail(conn, mail_id=ids[0])
    rows = procedures.find_mail(conn, status="UnSent", account_name=account)
    assert sorted(r["ID"] for r in rows) == ids[1:]
    assert [r["ID"] for r in procedures.find_mail(conn, status="Cancelled", account_name=account)] == ids[:1]
    assert len(procedures.find_mail(conn, status="UnSent", account_name=account, max_rows=1)) == 1
    expect_error(50581, procedures.find_mail, conn, status="Sent")
    expect_error(50582, procedures.find_mail, conn, status="UnSent", max_rows=1001)


def test_a_mails_history(conn):
    account = new_account(conn, "story")
    app = new_app(conn, "story")
    [mail] = enqueue(conn, account, app, 1)
    token, _ = claim(conn, app, batch_size=1)
    procedures.mark_failed(conn, ids=[mail.mail_id], lock_token=token, disposition="Retry",
                           error="451 later", retry_after_seconds=0, smtp_code=451)
    execute(conn, "UPDATE mailq.MailQueue SET VisibleAtUtc = SYSUTCDATETIME() WHERE ID = ?;", mail.mail_id)
    token, _ = claim(conn, app, batch_size=1)
    procedures.mark_sent(conn, ids=[mail.mail_id], lock_token=token, smtp_code=250,
                         smtp_text="250 2.0.0 Ok: queued as 4XyZ")
    h = procedures.get_mail_history(conn, mail_id=mail.mail_id)
    assert h.mail["Status"] == "Sent" and h.mail["MessageID"] == mail.message_id
    assert [(a["AttemptNo"], a["Outcome"]) for a in h.attempts] == [(1, "Retry"), (2, "Sent")]
    assert "queued as 4XyZ" in h.attempts[1]["ErrorText"]
    empty = procedures.get_mail_history(conn, mail_id=-1)
    assert empty.mail is None and empty.attempts == [] and empty.recipients == []
    expect_error(50583, procedures.get_mail_history, conn, mail_id=None)


def test_delay_task_metrics(conn):
    if scalar(conn, "SELECT OBJECT_ID(N'delay.GetTaskMetrics', N'P')") is None:
        pytest.skip("delayed execution is not deployed in this database")
    before = procedures.get_delay_task_metrics(conn)
    base = int(scalar(conn, "SELECT COALESCE(MAX(TaskID), 0) FROM delay.Task")) + 1_000_000
    execute(conn, """
        INSERT INTO delay.Task (TaskID, TaskState, NextRunAtUtc)
        VALUES (?, N'Scheduled', DATEADD(HOUR, 1, SYSUTCDATETIME())),
               (?, N'Retrying', DATEADD(MINUTE, -5, SYSUTCDATETIME())),
               (?, N'Failed', NULL);""", base, base + 1, base + 2)
    try:
        after = procedures.get_delay_task_metrics(conn)
        assert after["PendingTasks"] - before["PendingTasks"] == 2
        assert after["OverdueTasks"] - before["OverdueTasks"] == 1
        assert after["FailedTasks"] - before["FailedTasks"] == 1
        assert after["HeldTasks"] == 0 and after["QueueReceiveEnabled"] == 1 and after["BrokerEnabled"] == 1
    finally:
        execute(conn, "DELETE FROM delay.Task WHERE TaskID BETWEEN ? AND ?;", base, base + 2)


def test_the_monitor_role_reads_and_changes_nothing(conn):
    user = unique("monitor")
    execute(conn, f"CREATE USER [{user}] WITHOUT LOGIN; ALTER ROLE MailqMonitor ADD MEMBER [{user}];")
    for statement in ("EXEC mailq.GetQueueMetrics;", "EXEC mailq.FindMail @Status = N'Failed';",
                      "EXEC mailq.GetMailHistory @MailID = 1;", "EXEC mailq.GetMailEvents @MailID = 1;"):
        assert last_number(conn, user, statement) == 0, statement
    for statement in ("EXEC mailq.CancelMail @ID = 1;", "EXEC mailq.RequeueMail @ID = 1;",
                      "EXEC mailq.UnblockSendingAccount @AccountName = N'x';"):
        assert last_number(conn, user, statement) == 229, statement
    rows = query(conn, AS_USER.format(user=user, statement="EXEC mailq.GetQueueMetrics;"))
    assert rows[0][3] in (False, 0)  # CallerIsMailqAdmin, the first result set's fourth column
    assert procedures.get_queue_metrics(conn).caller_is_admin  # sa: db_owner
