"""Run modes and per-application dry-run (issue 16 point 3, revision 0015;
docs/run-modes.md), against SQL Server 2022.

* A mail carries its run mode (default 'prod'); a bad name is 50240 and
  writes nothing; a key reused under another run mode is 50116.
* ClaimMail @RunModes: a worker claims only the run modes it serves (NULL =
  ["prod"]); 50241 on a bad list.
* Cost: 50,000 due priority-9 'staging' mails on the eligible account do not
  make a 'prod' claim read more: the plan reads at most 2 x batch rows of
  IX_MailQueue_ClaimByAccount and the logical reads per claim stay within
  20 % of the same claim without the staging backlog.
* Dry-run application: the claim says DryRun = 1; a real-send
  acknowledgement is recorded as DryRun (status Sent, DryRun = 1, attempt
  outcome and event 'DryRun', Detail naming the mismatch); other
  applications are recorded as Sent.
"""

from __future__ import annotations

import json
import uuid

import pytest

from mailq_helpers import (
    attempts,
    bulk_fill,
    connection,
    enqueue,
    execute,
    expect_error,
    mail_row,
    new_account,
    new_app,
    query,
    showplans,
    statement_plans,
)
from mailq_db import procedures

pytestmark = pytest.mark.integration

BATCH = 100
SKEW = 50_000
INDEX = "IX_MailQueue_ClaimByAccount"


def run_mode_of(conn, mail_id: int) -> str:
    return query(conn, "SELECT RunMode FROM mailq.MailQueue WHERE ID = ?;", mail_id)[0][0]


def test_run_mode_default_explicit_and_refused(conn):
    acct = new_account(conn, "rm")
    app = new_app(conn, "rm")
    plain = enqueue(conn, acct, app)[0]
    staged = enqueue(conn, acct, app, run_mode="staging")[0]
    assert run_mode_of(conn, plain.mail_id) == "prod" and run_mode_of(conn, staged.mail_id) == "staging"
    before = query(conn, "SELECT COUNT_BIG(*) FROM mailq.MailQueue;")
    for bad in ("", "Prod", "9x", "a" * 33, "qa test"):
        expect_error(50240, enqueue, conn, acct, app, run_mode=bad)
    assert query(conn, "SELECT COUNT_BIG(*) FROM mailq.MailQueue;") == before
    key = f"rm-{uuid.uuid4()}"
    enqueue(conn, acct, app, idempotency_key=key, run_mode="staging")
    expect_error(50116, enqueue, conn, acct, app, idempotency_key=key, run_mode="test")


def test_claim_serves_only_its_run_modes(conn):
    acct = new_account(conn, "rmclaim")
    app = new_app(conn, "rmclaim")
    prod = [r.mail_id for r in enqueue(conn, acct, app, 2)]
    staging = [r.mail_id for r in enqueue(conn, acct, app, 2, run_mode="staging")]
    got = procedures.claim_mail(conn, batch_size=10, lock_token=uuid.uuid4(), lease_seconds=60,
                                account_names=[acct], run_modes=["staging"])
    assert sorted(m.id for m in got) == sorted(staging) and {m.run_mode for m in got} == {"staging"}
    got = procedures.claim_mail(conn, batch_size=10, lock_token=uuid.uuid4(), lease_seconds=60,
                                account_names=[acct])  # NULL: ["prod"]
    assert sorted(m.id for m in got) == sorted(prod)
    for bad in ('"prod"', "[]", '["Prod"]', "[1]", json.dumps([f"m{i}" for i in range(17)])):
        expect_error(50241, lambda: query(conn, "EXEC mailq.ClaimMail @LockToken = ?, @RunModes = ?;",
                                          str(uuid.uuid4()), bad))


def _reads(url, acct, modes):
    stats = ("SELECT total_logical_reads, execution_count FROM sys.dm_exec_procedure_stats "
             "WHERE database_id = DB_ID() AND object_id = OBJECT_ID(N'mailq.ClaimMail');")
    reset = ("UPDATE mailq.MailQueue SET Status = N'UnSent', ThreadLock = NULL, "
             "VisibleAtUtc = DATEADD(SECOND, -1, SYSUTCDATETIME()), AttemptsRemaining = 5 "
             "WHERE AccountName = ? AND RunMode = N'prod' AND Status IN (N'UnSent', N'Sending');")
    total = runs = 0
    with connection(url) as c:
        for i in range(4):
            execute(c, reset, acct)
            before = query(c, stats)
            got = procedures.claim_mail(c, batch_size=BATCH, lock_token=uuid.uuid4(), lease_seconds=300,
                                        account_names=[acct], run_modes=modes)
            after = query(c, stats)
            assert len(got) == BATCH and {m.run_mode for m in got} == {"prod"}
            if i == 0 or not before or after[0][1] != before[0][1] + 1:
                continue
            total += after[0][0] - before[0][0]
            runs += 1
    assert runs
    return total / runs


def test_claim_cost_does_not_grow_with_mail_of_run_modes_not_served(mssql_url, fresh_database):
    plain_url = fresh_database()
    with connection(plain_url) as c:
        acct = new_account(c, "rmcost")
        bulk_fill(c, acct, BATCH)
        execute(c, "UPDATE mailq.MailQueue SET Priority = 0 WHERE AccountName = ?;", acct)
        execute(c, "UPDATE STATISTICS mailq.MailQueue WITH FULLSCAN;")
    plain = _reads(plain_url, acct, ["prod"])
    skew_url = fresh_database()
    with connection(skew_url) as c:
        acct2 = new_account(c, "rmcost")
        bulk_fill(c, acct2, SKEW)  # due, priority 9, same account: but 'staging'
        execute(c, "UPDATE mailq.MailQueue SET Priority = 9, RunMode = N'staging' WHERE AccountName = ?;", acct2)
        bulk_fill(c, acct2, BATCH)
        execute(c, "UPDATE mailq.MailQueue SET Priority = 0 WHERE AccountName = ? AND RunMode = N'prod';", acct2)
        execute(c, "UPDATE STATISTICS mailq.MailQueue WITH FULLSCAN;")
        cursor = c.cursor()
        cursor.execute("SET STATISTICS XML ON;")
        cursor.execute("EXEC mailq.ClaimMail @BatchSize = ?, @LockToken = ?, @AccountNames = ?, @RunModes = ?;",
                       BATCH, str(uuid.uuid4()), json.dumps([acct2]), '["prod"]')
        plans, others = showplans(cursor)
        cursor.execute("SET STATISTICS XML OFF;")
        cursor.close()
        assert len(others[0]) == BATCH
        updates = [s for s in statement_plans(plans, INDEX) if s.statement_type.upper() == "INSERT"]  # the pick
        rows_read = sum((r.actual_rows_read or r.actual_rows or 0) for s in updates for r in s.reads)
        assert rows_read <= 2 * BATCH, f"the claim read {rows_read} rows of {INDEX}"
    skew = _reads(skew_url, acct2, ["prod"])
    print(f"logical reads per claim of {BATCH}: {plain:.0f} without, {skew:.0f} with {SKEW} due staging mails")
    assert skew <= 1.2 * plain + 20


def test_dry_run_application_is_recorded_as_dry_run_even_on_a_real_send_ack(conn):
    acct = new_account(conn, "rmdry")
    dry, live = new_app(conn, "rmdry"), new_app(conn, "rmlive")
    procedures.upsert_application(conn, app_name=dry, dry_run=True)
    d = enqueue(conn, acct, dry)[0].mail_id
    v = enqueue(conn, acct, live)[0].mail_id
    token = uuid.uuid4()
    got = {m.id: m for m in procedures.claim_mail(conn, batch_size=10, lock_token=token, lease_seconds=60,
                                                  account_names=[acct])}
    assert got[d].dry_run is True and got[v].dry_run is False
    procedures.mark_sent(conn, ids=[d, v], lock_token=token, smtp_code=250, smtp_text="250 ok", dry_run=False)
    assert mail_row(conn, d)["Status"] == "Sent" and mail_row(conn, d)["DryRun"]
    assert mail_row(conn, v)["Status"] == "Sent" and not mail_row(conn, v)["DryRun"]
    assert attempts(conn, d)[-1]["Outcome"] == "DryRun" and attempts(conn, v)[-1]["Outcome"] == "Sent"
    events = procedures.get_mail_events(conn, mail_id=d)
    assert events[-1].event_type == "DryRun" and "worker reported a real send" in events[-1].detail
    procedures.upsert_application(conn, app_name=dry, dry_run=False)
    assert query(conn, "SELECT DryRun FROM mailq.Application WHERE AppName = ?;", dry)[0][0] is False
