"""Issue 10, point 8 against SQL Server 2022: views and counts that read
narrow indexes, and bodies off the hot rows.

Setup (module database): 100,000 mails (bulk_fill, set-based as sa) with
2,000-character bodies: 60,000 UnSent, 40,000 Sent, one closed attempt per
mail 30 days ago and 300 closed attempts of the last hours.  Then each reporting view is read once under
``SET STATISTICS XML ON`` and its actual showplan parsed; the shapes asserted
are the ones written in each view's header comment:

* QueueCountsByStatus reads IX_MailQueue_Status (a scan of that narrow index)
  and never touches PK_MailQueue (no clustered scan, no Key Lookup);
* OldestDueMail seeks IX_MailQueue_Status (or reads the claim index, as
  narrow and covering) and never touches PK_MailQueue;
* RecentFailures and ThroughputPerHour seek IX_MailAttempt_EndedAtUtc, never
  scan mailq.MailAttempt, and never scan MailQueue's clustered rows.

Bodies out of row: the table option 'large value types out of row' is 1
from the deployment on, so the in-row records of the clustered index are small
(avg_record_size_in_bytes of IN_ROW_DATA far below the 4,000 bytes a
2,000-character NVARCHAR body takes in row).
"""

from __future__ import annotations

import xml.etree.ElementTree as ET

import pytest

from mailq_helpers import SHOWPLAN_NS, bulk_fill, connection, execute, new_account, scalar, showplans

pytestmark = pytest.mark.integration

ROWS = 100_000
NS = f"{{{SHOWPLAN_NS}}}"


@pytest.fixture(scope="module")
def filled(mssql_url):
    with connection(mssql_url) as c:
        account = new_account(c, "views")
        bulk_fill(c, account, ROWS)
        execute(c, "UPDATE mailq.MailQueue SET Body = REPLICATE(N'b', 2000) WHERE AccountName = ?;", account)
        execute(c, "UPDATE TOP (40000) q SET q.Status = N'Sent', q.SentAtUtc = SYSUTCDATETIME(), "
                   "q.DateProcessed = SYSUTCDATETIME() FROM mailq.MailQueue AS q WHERE q.AccountName = ?;", account)
        # One old attempt per mail (30 days ago), then 300 recent ones: the
        # views' time ranges are selective, as in a queue that runs for months.
        execute(c, """
            INSERT INTO mailq.MailAttempt (MailID, AttemptNo, LockToken, StartedAtUtc, EndedAtUtc, Outcome, SmtpCode)
            SELECT q.ID, 1, NEWID(), DATEADD(DAY, -30, SYSUTCDATETIME()),
                DATEADD(DAY, -30, SYSUTCDATETIME()), N'Retry', 451
            FROM mailq.MailQueue AS q WHERE q.AccountName = ?;""", account)
        execute(c, """
            INSERT INTO mailq.MailAttempt (MailID, AttemptNo, LockToken, StartedAtUtc, EndedAtUtc, Outcome, SmtpCode)
            SELECT TOP (300) q.ID, 2, NEWID(), DATEADD(HOUR, -2, SYSUTCDATETIME()),
                DATEADD(HOUR, -1, SYSUTCDATETIME()), IIF(q.ID % 3 = 0, N'Retry', N'Sent'), 250
            FROM mailq.MailQueue AS q WHERE q.AccountName = ? ORDER BY q.ID;""", account)
        execute(c, "UPDATE STATISTICS mailq.MailQueue WITH FULLSCAN;")
        execute(c, "UPDATE STATISTICS mailq.MailAttempt WITH FULLSCAN;")
    return mssql_url, account


def accesses(url: str, sql: str) -> list[tuple[str, str, str]]:
    """(PhysicalOp, Table, Index) of every operator of the actual plan of ``sql`` that reads a table."""
    with connection(url) as c:
        cur = c.cursor()
        cur.execute("SET STATISTICS XML ON;")
        cur.execute(sql)
        plans, _ = showplans(cur)
        cur.execute("SET STATISTICS XML OFF;")
    found = []
    for doc in plans:
        for relop in ET.fromstring(doc).iter(f"{NS}RelOp"):
            for child in relop:
                if child.tag in (f"{NS}IndexScan", f"{NS}TableScan"):
                    obj = child.find(f"{NS}Object")
                    if obj is not None:
                        found.append((relop.get("PhysicalOp", ""), obj.get("Table", "").strip("[]"),
                                      obj.get("Index", "").strip("[]")))
    assert found, f"no showplan came back for {sql!r}"
    return found


def test_counts_by_status_read_the_narrow_index_only(filled):
    url, _ = filled
    ops = accesses(url, "SELECT Status, AccountName, MailCount FROM mailq.QueueCountsByStatus;")
    queue = [op for op in ops if op[1] == "MailQueue"]
    assert {op[2] for op in queue} == {"IX_MailQueue_Status"}, ops
    assert all(op[0] in ("Index Scan", "Index Seek") for op in queue), ops


def test_oldest_due_seeks_the_narrow_index_only(filled):
    url, _ = filled
    ops = accesses(url, "SELECT AccountName, OldestDueUtc, DueCount FROM mailq.OldestDueMail;")
    queue = [op for op in ops if op[1] == "MailQueue"]
    # IX_MailQueue_Status, or the claim index, which is as narrow, covers the
    # view and holds only claimable rows: either way never the clustered rows.
    assert queue and all(op[0] in ("Index Seek", "Index Scan") and op[2] != "PK_MailQueue" for op in queue), ops
    assert all(op[0] == "Index Seek" for op in queue if op[2] == "IX_MailQueue_Status"), ops


@pytest.mark.parametrize("view", ["RecentFailures", "ThroughputPerHour"])
def test_attempt_views_seek_the_end_time_index(filled, view):
    url, _ = filled
    ops = accesses(url, f"SELECT AccountName FROM mailq.{view};")
    attempts = [op for op in ops if op[1] == "MailAttempt"]
    assert attempts and all(op[0] == "Index Seek" and op[2] == "IX_MailAttempt_EndedAtUtc" for op in attempts), ops
    # MailQueue by ID: seeks, or a scan of a narrow nonclustered index (its keys
    # carry ID) when a hash join is cheaper; never a scan of the clustered rows.
    assert not [op for op in ops if op[1] == "MailQueue" and op[0] in ("Clustered Index Scan", "Table Scan")], ops


def in_row_record_size(url: str) -> float:
    with connection(url) as c:
        return scalar(c, """
            SELECT MAX(s.avg_record_size_in_bytes)
            FROM sys.dm_db_index_physical_stats(DB_ID(), OBJECT_ID(N'mailq.MailQueue'), 1, NULL, N'DETAILED') AS s
            WHERE s.alloc_unit_type_desc = N'IN_ROW_DATA' AND s.index_level = 0;""")


def test_bodies_are_stored_out_of_row(filled):
    url, _ = filled
    with connection(url) as c:
        assert scalar(c, "SELECT CAST(large_value_types_out_of_row AS INT) FROM sys.tables "
                         "WHERE object_id = OBJECT_ID(N'mailq.MailQueue');") == 1
        execute(c, "ALTER INDEX PK_MailQueue ON mailq.MailQueue REBUILD;")
    assert in_row_record_size(url) < 1000