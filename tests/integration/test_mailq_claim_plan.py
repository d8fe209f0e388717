"""The claim's actual execution plan at depth, read from SQL Server 2022's showplan XML.

Setup: 100,000 due UnSent mails (priorities 0-9, due times spread over the
last hour) are inserted set-based as sa (``mailq_helpers.bulk_fill``), plus
20,000 Sent mails that the filtered index must not carry.  Then, on one
session, ``SET STATISTICS XML ON`` and ``EXEC mailq.ClaimMail @BatchSize = 100``;
every showplan document the call returns is parsed with xml.etree (namespace
http://schemas.microsoft.com/sqlserver/2004/07/showplan).

What is asserted about the claim's pick (the INSERT into @Pick whose plan
reads IX_MailQueue_ClaimByAccount), as the index's header comment and
docs/claim.md promise:

1. IX_MailQueue_ClaimByAccount is read by an **Index Seek** (not an Index Scan), and
   the seek is ordered (``IndexScan/@Ordered``).
2. Between that seek and the nearest **Top** above it there is **no Sort**
   (neither a Sort nor a TopN Sort): the seek delivers rows already in
   ``Priority DESC, VisibleAtUtc, ID`` order and the Top stops it early.
   Sorts above the Top (the ROW_NUMBER per account, index maintenance of the
   update) handle at most @BatchSize rows and are allowed.
3. The seek's actual row count is small (at most 10 x the batch), far from the
   100,000 due rows: the Top really stopped it.
4. No scan of mailq.MailQueue anywhere in the statement (Table Scan,
   Clustered Index Scan or Index Scan); the Key Lookup to the clustered index
   is a seek.
5. The call claimed exactly 100 mails, the first of them of priority 9.

The same for an isolated worker's pick on IX_MailQueue_ClaimByApp, beside
the 100,000 due mails of no application on the same account.  And the
lease's UPDATE reaches its rows by a Clustered Index Seek on PK_MailQueue
even when its plan was compiled for one (account, run mode) pair and then
runs for 200 (FORCESEEK (PK_MailQueue (ID))).

Then the logical reads of ClaimMail per execution
(sys.dm_exec_procedure_stats) at 100 k are compared with those at 5 k rows of
a second database: they must not grow with depth (at most 3 x, a loose bound
for a property that should hold within a few pages).
"""

from __future__ import annotations

import json
import uuid

import pytest

from mailq_helpers import (
    bulk_fill,
    connection,
    enqueue,
    execute,
    new_account,
    new_app,
    scalar,
    showplans,
    statement_plans,
    table_scans,
)
from mailq_db import procedures

pytestmark = pytest.mark.integration

DEPTH = 100_000
SHALLOW = 5_000
BATCH = 100
INDEX = "IX_MailQueue_ClaimByAccount"


@pytest.fixture(scope="module")
def deep(mssql_url):
    """(url, account) of the module's database holding 100 k due and 20 k sent mails."""
    with connection(mssql_url) as conn:
        account = new_account(conn, "deep")
        bulk_fill(conn, account, DEPTH)
        bulk_fill(conn, account, 20_000)
        execute(conn, "UPDATE TOP (20000) q SET q.Status = N'Sent', q.SentAtUtc = SYSUTCDATETIME(), "
                      "q.DateProcessed = SYSUTCDATETIME() FROM mailq.MailQueue AS q WHERE q.ID > ?;", DEPTH)
        execute(conn, "UPDATE STATISTICS mailq.MailQueue WITH FULLSCAN;")
        assert scalar(conn, "SELECT COUNT_BIG(*) FROM mailq.MailQueue WHERE Status = N'UnSent';") == DEPTH
    return mssql_url, account


def claim_with_plan(conn):
    cursor = conn.cursor()
    cursor.execute("SET STATISTICS XML ON;")
    cursor.execute("EXEC mailq.ClaimMail @BatchSize = ?, @LockToken = ?, @LeaseSeconds = 300;",
                   BATCH, str(uuid.uuid4()))
    plans, others = showplans(cursor)
    cursor.execute("SET STATISTICS XML OFF;")
    cursor.close()
    return plans, others


def test_claim_plan_is_an_ordered_seek_with_top_and_no_sort_at_100k(deep):
    url, _ = deep
    with connection(url) as conn:
        plans, others = claim_with_plan(conn)
    assert plans, "SET STATISTICS XML ON returned no showplan"

    claimed = others[0]
    assert len(claimed) == BATCH
    assert claimed[0][15] == 9, "the first claimed mail is not of the highest priority"  # column Priority

    statements = [s for s in statement_plans(plans, INDEX) if s.statement_type.upper() == "INSERT"]  # the pick
    assert len(statements) == 1, f"expected one pick reading {INDEX}, found {len(statements)}"
    (claim_stmt,) = statements
    reads = claim_stmt.reads
    assert reads, f"the claim does not read {INDEX}"
    for read in reads:
        assert read.physical_op == "Index Seek", f"{INDEX} is read by {read.physical_op}, not a seek"
        assert read.ordered, "the seek is not ordered: its output order cannot serve ORDER BY"
        below_top = read.ops_below_top()
        assert below_top is not None, f"no Top above the seek (operators above: {read.ancestors})"
        sorts = [op for op in below_top if op[0] == "Sort"]
        assert not sorts, f"a Sort sits between the seek and the Top: {below_top}"
        assert read.actual_rows is not None, "no actual row counts: not an actual plan"
        assert read.actual_rows <= 10 * BATCH, \
            f"the seek returned {read.actual_rows} rows of {DEPTH}: the Top did not stop it"
    assert table_scans(claim_stmt) == [], "the claim scans mailq.MailQueue"


def test_isolated_claim_plan_is_an_ordered_seek_on_its_applications_keys(deep):
    url, account = deep
    with connection(url) as conn:
        app = new_app(conn, "planiso")
        bulk_fill(conn, account, 1_000, app=app)
        execute(conn, "UPDATE STATISTICS mailq.MailQueue WITH FULLSCAN;")
        cursor = conn.cursor()
        cursor.execute("SET STATISTICS XML ON;")
        cursor.execute("EXEC mailq.ClaimMail @BatchSize = ?, @LockToken = ?, @LeaseSeconds = 300, @AppName = ?;",
                       BATCH, str(uuid.uuid4()), app)
        plans, others = showplans(cursor)
        cursor.execute("SET STATISTICS XML OFF;")
        cursor.close()
    assert len(others[0]) == BATCH and {r[3] for r in others[0]} == {app}
    assert not statement_plans(plans, INDEX), f"the isolated claim read {INDEX}"
    (pick,) = [s for s in statement_plans(plans, "IX_MailQueue_ClaimByApp") if s.statement_type.upper() == "INSERT"]
    for read in pick.reads:
        assert read.physical_op == "Index Seek" and read.ordered
        below_top = read.ops_below_top()
        assert below_top is not None and not [op for op in below_top if op[0] == "Sort"], below_top
        assert read.actual_rows is not None and read.actual_rows <= 10 * BATCH
    assert table_scans(pick) == []


def test_lease_update_is_a_clustered_seek_after_a_plan_compiled_for_one_pair(fresh_database):
    url = fresh_database()
    with connection(url) as conn:
        app = new_app(conn, "l1")
        first = new_account(conn, "l1first")
        enqueue(conn, first, app, 1)
        # Compiled (and cached) with one (account, run mode) pair.
        procedures.claim_mail(conn, batch_size=1, lock_token=uuid.uuid4(), lease_seconds=300,
                              account_names=[first])
        many = [new_account(conn, f"l1many{i}") for i in range(200)]
        for acct in many:
            bulk_fill(conn, acct, 2)
        cursor = conn.cursor()
        cursor.execute("SET STATISTICS XML ON;")
        cursor.execute("EXEC mailq.ClaimMail @BatchSize = 200, @LockToken = ?, @LeaseSeconds = 300, "
                       "@AccountNames = ?;", str(uuid.uuid4()), json.dumps(many))
        plans, others = showplans(cursor)
        cursor.execute("SET STATISTICS XML OFF;")
        cursor.close()
    assert len(others[0]) == 200
    updates = [s for s in statement_plans(plans, "PK_MailQueue") if s.statement_type.upper() == "UPDATE"
               and "@Pick" in s.text]
    assert updates, "no UPDATE of the picked rows reads PK_MailQueue"
    for stmt in updates:
        assert [r.physical_op for r in stmt.reads] and all(r.physical_op == "Clustered Index Seek"
                                                            for r in stmt.reads), stmt.reads
        assert table_scans(stmt) == [], "the lease's UPDATE scans mailq.MailQueue"


def test_claim_reads_do_not_grow_with_depth(deep, fresh_database):
    deep_url, deep_account = deep
    shallow_url = fresh_database()
    with connection(shallow_url) as conn:
        account = new_account(conn, "shallow")
        bulk_fill(conn, account, SHALLOW)
        execute(conn, "UPDATE STATISTICS mailq.MailQueue WITH FULLSCAN;")

    def reads_per_claim(url: str) -> float:
        query_stats = ("SELECT total_logical_reads, execution_count FROM sys.dm_exec_procedure_stats "
                       "WHERE database_id = DB_ID() AND object_id = OBJECT_ID(N'mailq.ClaimMail');")
        with connection(url) as conn:
            # Warm up (compile), then measure three claims of 100 from the statistics' delta.
            procedures.claim_mail(conn, batch_size=BATCH, lock_token=uuid.uuid4(), lease_seconds=300)
            cursor = conn.cursor()
            reads0, count0 = cursor.execute(query_stats).fetchone()
            for _ in range(3):
                procedures.claim_mail(conn, batch_size=BATCH, lock_token=uuid.uuid4(), lease_seconds=300)
            reads1, count1 = cursor.execute(query_stats).fetchone()
            cursor.close()
            if count1 - count0 == 3:
                return (reads1 - reads0) / 3
            return reads1 / count1  # the plan was recompiled meanwhile: average since then
    shallow = reads_per_claim(shallow_url)
    deep_reads = reads_per_claim(deep_url)
    print(f"logical reads per claim of {BATCH}: {shallow:.0f} at {SHALLOW} rows, {deep_reads:.0f} at {DEPTH} rows")
    assert deep_reads <= 3 * shallow + 200, \
        f"logical reads per claim grow with depth: {shallow:.0f} at {SHALLOW}, {deep_reads:.0f} at {DEPTH}"
