"""The fourth queue reading's fixes: SQL Server 2022 (docs/finalization.md,
docs/guarantees.md, docs/claim.md, docs/enqueue.md).

* FinalizeMail and PurgeMail called from a session in implicit transaction
  mode (``SET IMPLICIT_TRANSACTIONS ON``, as pyodbc and JDBC run with
  autocommit off) commit every batch: the session's @@TRANCOUNT is 0 after
  the call and another session sees the result at once; a session whose
  implicit transaction is already open is refused (50152, 50141).
* PurgeMail's candidate read is an Index Seek on IX_MailQueue_Final (actual
  plan).
* GetQueueStats' per-hour statement is compiled for its window: with 200,000
  finished mails kept 30 days back and a handful in the window, the seek's
  estimate is the window's, not 30 % of the history.
* ClaimMail reads the rows it returns by Clustered Index Seeks.
* GetEnqueuePolicy lists a Windows group user that holds MailqEnqueuer (only
  where the server knows a Windows group; skipped otherwise).
"""

from __future__ import annotations

import uuid

import pytest

from mailq_helpers import (
    age_finished,
    bulk_fill,
    claim,
    connection,
    enqueue,
    execute,
    expect_error,
    new_account,
    new_app,
    scalar,
    showplans,
    statement_plans,
    table_scans,
)
from mailq_db import procedures

pytestmark = pytest.mark.integration

SHOWPLAN = "{http://schemas.microsoft.com/sqlserver/2004/07/showplan}"


def dead_mails(conn, n: int) -> str:
    """n mails of a new account that are out of attempts with their lease passed."""
    account = new_account(conn, "implicit")
    bulk_fill(conn, account, n)
    execute(conn, "UPDATE mailq.MailQueue SET AttemptsRemaining = 0 WHERE AccountName = ?;", account)
    return account


def committed_count(conn, sql: str, *params) -> int:
    """A count read with a lock timeout: an uncommitted change of another session is 1222, not a wait."""
    execute(conn, "SET LOCK_TIMEOUT 5000;")
    try:
        return scalar(conn, sql, *params)
    finally:
        execute(conn, "SET LOCK_TIMEOUT -1;")


# -- the caller's transaction: implicit transaction mode ----------------------------


def test_finalize_commits_every_batch_for_a_session_in_implicit_transaction_mode(mssql_url, conn):
    account = dead_mails(conn, 500)
    with connection(mssql_url) as implicit:
        execute(implicit, "SET IMPLICIT_TRANSACTIONS ON;")
        try:
            result = procedures.finalize_mail(implicit, batch_size=100, max_batches=10)
            assert result.failed == 500 and not result.busy
            assert scalar(implicit, "SELECT @@TRANCOUNT;") == 0, "the batches nested in an implicit transaction"
            assert scalar(implicit, "SELECT CAST(2 & @@OPTIONS AS INT);") == 2, "the caller's mode must come back"
        finally:
            execute(implicit, "IF @@TRANCOUNT > 0 ROLLBACK TRANSACTION;")
    assert committed_count(conn, "SELECT COUNT(*) FROM mailq.MailQueue WITH (READCOMMITTEDLOCK) "
                                 "WHERE AccountName = ? AND Status = N'Failed';", account) == 500


def test_purge_commits_every_batch_for_a_session_in_implicit_transaction_mode(mssql_url, conn):
    app, account = new_app(conn, "implicitpurge"), new_account(conn, "implicitpurge")
    ids = [r.mail_id for r in enqueue(conn, account, app, 30)]
    token, mails = claim(conn, app, batch_size=30)
    procedures.mark_sent(conn, ids=[m.id for m in mails], lock_token=token, smtp_code=250)
    age_finished(conn, ids, 40)
    with connection(mssql_url) as implicit:
        execute(implicit, "SET IMPLICIT_TRANSACTIONS ON;")
        try:
            assert procedures.purge_mail(implicit, older_than_days=30, batch_size=10) >= 30
            assert scalar(implicit, "SELECT @@TRANCOUNT;") == 0, "the purge nested in an implicit transaction"
        finally:
            execute(implicit, "IF @@TRANCOUNT > 0 ROLLBACK TRANSACTION;")
    assert committed_count(conn, "SELECT COUNT(*) FROM mailq.MailQueue WITH (READCOMMITTEDLOCK) "
                                 "WHERE AccountName = ?;", account) == 0


@pytest.mark.parametrize("call,number", [
    (lambda c: procedures.finalize_mail(c, batch_size=10, max_batches=1), 50152),
    (lambda c: procedures.purge_mail(c, older_than_days=30, batch_size=10), 50141),
])
def test_an_open_implicit_transaction_is_still_refused(mssql_url, call, number):
    with connection(mssql_url) as implicit:
        execute(implicit, "SET IMPLICIT_TRANSACTIONS ON;")
        try:
            scalar(implicit, "SELECT COUNT(*) FROM mailq.SendingAccount;")  # opens the implicit transaction
            assert scalar(implicit, "SELECT @@TRANCOUNT;") == 1
            expect_error(number, call, implicit)
        finally:
            execute(implicit, "IF @@TRANCOUNT > 0 ROLLBACK TRANSACTION;")


# -- PurgeMail's candidate read ---------------------------------------------------------


def test_purge_finds_candidates_by_a_seek_on_the_final_index(conn):
    app, account = new_app(conn, "purgeseek"), new_account(conn, "purgeseek")
    ids = [r.mail_id for r in enqueue(conn, account, app, 5)]
    token, mails = claim(conn, app, batch_size=5)
    procedures.mark_sent(conn, ids=[m.id for m in mails], lock_token=token, smtp_code=250)
    age_finished(conn, ids, 40)
    cursor = conn.cursor()
    cursor.execute("SET STATISTICS XML ON;")
    cursor.execute("EXEC mailq.PurgeMail @OlderThanDays = 30, @BatchSize = 10;")
    plans, _ = showplans(cursor)
    cursor.execute("SET STATISTICS XML OFF;")
    cursor.close()
    stmts = [s for s in statement_plans(plans, "IX_MailQueue_Final") if "@Candidate" in s.text]
    assert stmts, "the candidate read does not read IX_MailQueue_Final"
    for stmt in stmts:
        assert {r.physical_op for r in stmt.reads} == {"Index Seek"}, [r.physical_op for r in stmt.reads]
        assert table_scans(stmt) == []


# -- GetQueueStats: the per-hour statement's estimate -------------------------------------


def test_stats_hourly_statement_is_estimated_for_its_window_not_the_history(conn):
    history = new_account(conn, "grant")
    bulk_fill(conn, history, 200_000)
    execute(conn, "UPDATE mailq.MailQueue SET Status = N'Sent', SentAtUtc = DATEADD(DAY, -30, SYSUTCDATETIME()), "
                  "DateProcessed = DATEADD(DAY, -30, SYSUTCDATETIME()) WHERE AccountName = ?;", history)
    execute(conn, "UPDATE STATISTICS mailq.MailQueue WITH FULLSCAN;")
    cursor = conn.cursor()
    cursor.execute("SET STATISTICS XML ON;")
    cursor.execute("EXEC mailq.GetQueueStats @RecentFailures = 5, @FinishedHours = 24;")
    plans, _ = showplans(cursor)
    cursor.execute("SET STATISTICS XML OFF;")
    cursor.close()
    (stmt,) = [s for s in statement_plans(plans, "IX_MailQueue_Final") if "@FinishedSince" in s.text]
    estimates = [float(op.get("EstimateRows")) for op in stmt.element.iter(f"{SHOWPLAN}RelOp")
                 if op.find(f"{SHOWPLAN}IndexScan") is not None]
    print(f"per-hour statement: estimated rows {estimates} with 200,000 finished mails outside the window")
    # 30 % of the history would be 60,000; the window holds only this module's recent mail.
    assert max(estimates) < 6_000, estimates


# -- ClaimMail's result sets ------------------------------------------------------------


def test_claim_returns_its_rows_by_clustered_seeks(conn):
    app, account = new_app(conn, "returned"), new_account(conn, "returned")
    enqueue(conn, account, app, 3, attachments=[procedures.Attachment("a.txt", b"hello", "text/plain")])
    cursor = conn.cursor()
    cursor.execute("SET STATISTICS XML ON;")
    cursor.execute("EXEC mailq.ClaimMail @BatchSize = 3, @LockToken = ?, @AppName = ?;", str(uuid.uuid4()), app)
    plans, others = showplans(cursor)
    cursor.execute("SET STATISTICS XML OFF;")
    cursor.close()
    assert len(others[0]) == 3
    for index, table in (("PK_MailQueue", "MailQueue"), ("PK_MailAttachment", "MailAttachment")):
        returned = [s for s in statement_plans(plans, index, table) if s.statement_type == "SELECT"]
        assert returned, index
        for stmt in returned:
            assert {r.physical_op for r in stmt.reads} == {"Clustered Index Seek"}, (index, stmt.text)


# -- GetEnqueuePolicy: Windows groups ------------------------------------------------------


def test_enqueue_policy_lists_a_windows_group_user(conn):
    group = scalar(conn, "SELECT TOP (1) name FROM sys.server_principals WHERE type = 'G' ORDER BY name;")
    if group is None:
        pytest.skip("this server knows no Windows group login (Linux container): nothing to map")
    user = f"it_group_{uuid.uuid4().hex[:8]}"
    execute(conn, f"CREATE USER [{user}] FOR LOGIN [{group}]; ALTER ROLE MailqEnqueuer ADD MEMBER [{user}];")
    try:
        policy = procedures.get_enqueue_policy(conn)
        assert (user, "MailqEnqueuer") in policy.unmapped, policy.unmapped
    finally:
        execute(conn, f"ALTER ROLE MailqEnqueuer DROP MEMBER [{user}]; DROP USER [{user}];")
