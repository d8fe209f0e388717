"""What can be seen without a server of the third queue reading's points
(docs/claim.md, docs/finalization.md, docs/events.md, docs/guarantees.md):

* an isolated worker's claim seeks IX_MailQueue_ClaimByApp, whose keys put
  AppName right after (AccountName, RunMode), with the application as an
  equality and the index's filter repeated as literals; a competing worker's
  claim never reads AppName at all; no read keeps the old residual
  ``(@AppName IS NULL OR k.AppName = @AppName)``;
* the lease's UPDATE is a forced seek on PK_MailQueue;
* ClaimMail and ExtendLease end their lease rows with LeaseSecondsRemaining,
  whole seconds rounded down from a clock read after the claim's statements;
* FinalizeMail takes its application lock (transaction-owned, timeout 0)
  first in every batch, before any read of the queue, and says Busy;
* every DELETE of PurgeMail is a forced seek, and its header no longer says
  READPAST is refused under REPEATABLE READ;
* every mail-queue procedure that writes or reads with lock hints sets READ
  COMMITTED itself, and docs/guarantees.md names the only exceptions;
* GetEventStreamStall checks the caller's permission before it reads a
  transaction DMV, and states that permission in its header;
* GetQueueStats reads no reporting view and every read of mailq.MailQueue
  or mailq.MailAttempt is a forced seek bounded by the live statuses or a
  time window;
* headers of the procedures changed here are contracts of at most ~40 lines
  with a Lock order line.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from mailq_db.deployment import strip_comments

ROOT = Path(__file__).resolve().parents[2]
SQL = ROOT / "sql"
PROC = SQL / "procedures"
CLAIM_BY_APP = SQL / "indexes" / "mailq.MailQueue.IX_MailQueue_ClaimByApp.sql"


def squash(text: str) -> str:
    return re.sub(r"\s+", " ", strip_comments(text)).upper()


def proc(name: str) -> str:
    return squash((PROC / f"mailq.{name}.sql").read_text(encoding="utf-8"))


def header(name: str) -> str:
    text = (PROC / f"mailq.{name}.sql").read_text(encoding="utf-8")
    match = re.match(r"\s*/\*(.*?)\*/", text, re.S)
    assert match, f"{name} has no header"
    return match.group(1)


def k_reads(sql: str) -> list[tuple[str, str]]:
    """(hints, WHERE) of every read of mailq.MailQueue AS k."""
    return re.findall(r"FROM MAILQ\.MAILQUEUE AS K WITH \(([^;]*?)\) WHERE (.*?)(?:\) AS C|\);)", sql)


# -- M1: an isolated worker's claim is bounded too ----------------------------


def test_claim_by_app_index_keys_and_filter():
    creates = re.findall(r"CREATE NONCLUSTERED INDEX.*?;", squash(CLAIM_BY_APP.read_text(encoding="utf-8")))
    assert len(creates) == 1
    offline = creates[0]
    assert ("ON MAILQ.MAILQUEUE (ACCOUNTNAME ASC, RUNMODE ASC, APPNAME ASC, PRIORITY DESC, VISIBLEATUTC ASC, ID ASC)"
            in offline), "AppName must be the third key: after the pair, before the priority order"
    assert "INCLUDE (ATTEMPTSREMAINING, EXPIRESATUTC)" in offline
    assert "WHERE STATUS IN (N'UNSENT', N'SENDING') AND APPNAME IS NOT NULL" in offline
    order = (SQL / "BuildOrder.txt").read_text(encoding="utf-8").split()
    index = order.index("indexes/mailq.MailQueue.IX_MailQueue_ClaimByApp.sql")
    assert index > order.index("tables/mailq.MailQueue.sql")
    assert index < order.index("procedures/mailq.ClaimMail.sql")


def test_isolated_reads_seek_the_application_and_competing_reads_never_read_it():
    claim = proc("ClaimMail")
    reads = k_reads(claim)
    assert len(reads) == 4, reads  # probe and pick, for each kind of worker
    by_app = [(h, w) for h, w in reads if "IX_MAILQUEUE_CLAIMBYAPP" in h]
    by_account = [(h, w) for h, w in reads if "IX_MAILQUEUE_CLAIMBYACCOUNT" in h]
    assert len(by_app) == 2 and len(by_account) == 2
    for _, where in by_app:
        # the application is an equality right after the pair (a seek key, not a
        # residual), and the index's filter is repeated as literals
        assert where.startswith("K.ACCOUNTNAME = D.ACCOUNTNAME AND K.RUNMODE = D.RUNMODE AND K.APPNAME = @APPNAME "
                                "AND K.APPNAME IS NOT NULL AND K.STATUS IN (N'UNSENT', N'SENDING') AND "), where
    for _, where in by_account:
        assert "APPNAME" not in where, where
    assert "@APPNAME IS NULL OR K.APPNAME" not in claim, "the residual application filter is back"
    # each kind of worker runs its own statements, chosen by an IF (not by a
    # startup filter the optimizer may or may not build)
    assert claim.count("IF @APPNAME IS NULL") == 2


# -- L1: the lease's UPDATE is seek-forced ---------------------------------------


def test_claim_update_reaches_the_picked_rows_by_a_forced_primary_key_seek():
    claim = proc("ClaimMail")
    update = claim[claim.index("UPDATE Q SET Q.STATUS = N'SENDING'"):]
    update = update[:update.index(";")]
    assert "FROM MAILQ.MAILQUEUE AS Q WITH (FORCESEEK (PK_MAILQUEUE (ID)), READPAST, UPDLOCK, ROWLOCK)" in update
    assert "Q.ID IN (SELECT P.ID FROM @PICK AS P)" in update
    # re-checked under the row's lock
    assert "Q.STATUS IN (N'UNSENT', N'SENDING') AND Q.VISIBLEATUTC <= @NOW AND Q.ATTEMPTSREMAINING > 0" in update


# -- M5: lease seconds by the server's clock -------------------------------------

LSR = r"CAST\(FLOOR\(DATEDIFF_BIG\(MILLISECOND, @RETURNEDAT, (\w+)\.(\w+)\) / 1000\.0\) AS INT\) AS LEASESECONDSREMAINING"


@pytest.mark.parametrize("name,column", [("ClaimMail", "Q.VISIBLEATUTC"), ("ExtendLease", "E.LEASEEXPIRESUTC")])
def test_lease_seconds_remaining_is_the_last_column_floored_from_a_clock_read_after_the_claim(name, column):
    sql = proc(name)
    after = sql[sql.index("END CATCH;"):]
    assert "DECLARE @RETURNEDAT DATETIME2(3) = SYSUTCDATETIME();" in after
    match = re.search(LSR + r" FROM ", after)
    assert match and f"{match.group(1)}.{match.group(2)}" == column
    assert "LeaseSecondsRemaining" in header(name)


# -- L2: one finalizer at a time ------------------------------------------------


def test_finalize_takes_a_transaction_owned_applock_without_waiting_before_reading():
    sql = proc("FinalizeMail")
    batch = sql[sql.index("BEGIN TRANSACTION;"):]
    lock = batch.index("EXEC @LOCK = SYS.SP_GETAPPLOCK @RESOURCE = N'MAILQ.FINALIZEMAIL', @LOCKMODE = N'EXCLUSIVE', "
                       "@LOCKOWNER = N'TRANSACTION', @LOCKTIMEOUT = 0;")
    assert lock < batch.index("FROM MAILQ.MAILQUEUE"), "the lock must come before the first read of the queue"
    assert "IF @LOCK < 0 BEGIN ROLLBACK TRANSACTION; SET @BUSY = 1; BREAK; END;" in batch
    assert "@BUSY AS BUSY;" in sql
    assert "sp_getapplock" not in (PROC / "mailq.ClaimMail.sql").read_text(encoding="utf-8"), \
        "the finalizer lock must stay FinalizeMail's own"
    lock_order = header("FinalizeMail").split("Lock order:")[1]
    assert lock_order.index("N'mailq.FinalizeMail'") < lock_order.index("mailq.MailQueue")


# -- L5: PurgeMail's deletes are forced seeks --------------------------------------


def test_every_purge_delete_is_a_forced_seek_and_the_header_is_true():
    sql = proc("PurgeMail")
    deletes = re.findall(r"DELETE (?:TOP \(1000\) )?\w+ FROM MAILQ\.(\w+) AS \w+ WITH \(([^;]*?)\) WHERE", sql)
    assert {table for table, _ in deletes} == {
        "MAILATTEMPT", "MAILATTACHMENT", "MAILRECIPIENTOUTCOME", "MAILEVENT", "MAILQUEUE"}
    for table, hints in deletes:
        assert "FORCESEEK" in hints and "ROWLOCK" in hints, (table, hints)
    for table, key in (("MAILATTEMPT", "PK_MAILATTEMPT (MAILID)"), ("MAILATTACHMENT", "PK_MAILATTACHMENT (MAILID)"),
                       ("MAILRECIPIENTOUTCOME", "PK_MAILRECIPIENTOUTCOME (MAILID)"),
                       ("MAILQUEUE", "PK_MAILQUEUE (ID)")):
        assert any(t == table and f"FORCESEEK ({key})" in h for t, h in deletes), table
    text = " ".join(header("PurgeMail").split())
    assert "refused under SERIALIZABLE, REPEATABLE READ" not in text
    assert "READ COMMITTED or REPEATABLE READ" in text


def test_forceseek_column_lists_name_the_leading_key_of_the_named_index():
    """FORCESEEK (index (columns)) must name leading key columns of that index."""
    keys = {}
    for path in (SQL / "tables").glob("mailq.*.sql"):
        for name, cols in re.findall(r"CONSTRAINT (PK_\w+) PRIMARY KEY CLUSTERED \(([^)]*)\)",
                                     path.read_text(encoding="utf-8")):
            keys[name.upper()] = [c.strip().split()[0].upper() for c in cols.split(",")]
    used = set()
    for path in PROC.glob("mailq.*.sql"):
        for index, cols in re.findall(r"FORCESEEK \((PK_\w+) \(([^)]*)\)\)", squash(path.read_text(encoding="utf-8"))):
            wanted = [c.strip() for c in cols.split(",")]
            assert keys[index][:len(wanted)] == wanted, (path.name, index, wanted, keys[index])
            used.add(index)
    assert {"PK_MAILQUEUE", "PK_MAILATTEMPT", "PK_MAILATTACHMENT", "PK_MAILRECIPIENTOUTCOME"} <= used


# -- L6: READ COMMITTED where it matters, and the text says where it is not set ------

#: Procedures that do not set READ COMMITTED, with the reason docs/guarantees.md gives.
NOT_SETTING_RC = {
    "GetMailTemplate", "ListMailTemplates", "ListMailTemplateVersions", "ListApplicationHooks",  # plain reads
    "SendDbMail",         # its queue writes happen in EnqueueMail, which sets it
    "CheckDbMailRequest",  # SendDbMail's checks: reads under the caller's level, as SendDbMail's own
}
WRITE = re.compile(r"\b(INSERT INTO|UPDATE|DELETE|MERGE)\s+(?:TOP \(\d+\) )?(MAILQ\.\w+|\w+ FROM MAILQ\.\w+)", re.I)


def proc_text(name: str) -> str:
    return (PROC / f"mailq.{name}.sql").read_text(encoding="utf-8")


def test_every_procedure_but_the_documented_ones_sets_read_committed():
    missing = set()
    for path in PROC.glob("mailq.*.sql"):
        code = strip_comments(path.read_text(encoding="utf-8"))
        if not re.search(r"SET\s+TRANSACTION\s+ISOLATION\s+LEVEL\s+READ\s+COMMITTED", code, re.I):
            missing.add(path.stem.split(".", 1)[1])
    # the two public enqueue procedures only hand their rows to the core, which sets it
    for name in ("EnqueueMail", "EnqueueMailBatch"):
        assert re.search(r"EXEC(UTE)?\s+mailq\.EnqueueMailRows\b", strip_comments(proc_text(name)), re.I), name
        missing.discard(name)
    assert "EnqueueMailRows" not in missing
    assert missing == NOT_SETTING_RC
    guarantees = (ROOT / "docs" / "guarantees.md").read_text(encoding="utf-8")
    for name in NOT_SETTING_RC:
        assert f"`{name}`" in guarantees, f"docs/guarantees.md does not name the exception {name}"


# -- L7: the stall report --------------------------------------------------------


def test_stall_procedure_checks_the_permission_before_any_dmv():
    sql = proc("GetEventStreamStall")
    first_dmv = sql.index("SYS.DM_TRAN_")
    for check in ("HAS_PERMS_BY_NAME(NULL, NULL, N'VIEW SERVER STATE') = 1",
                  "COALESCE(HAS_PERMS_BY_NAME(NULL, NULL, N'VIEW SERVER PERFORMANCE STATE'), 0) = 1",
                  "HAS_PERMS_BY_NAME(DB_NAME(), N'DATABASE', N'VIEW DATABASE STATE') = 1"):
        assert sql.index(check) < first_dmv, check
    assert sql.rindex("IF @HELDBACK = 1 AND @CANSEE = 1", 0, first_dmv) >= 0
    assert "MIN_ACTIVE_ROWVERSION()" in sql and "@@DBTS" in sql
    assert "WITH EXECUTE AS" not in sql, "the DMVs must be read with the caller's rights"
    text = " ".join(header("GetEventStreamStall").split())
    for words in ("VIEW SERVER STATE", "VIEW SERVER PERFORMANCE STATE", "VIEW DATABASE STATE", "Lock order:"):
        assert words in text
    grants = squash((SQL / "security" / "MailqEnqueuer.eventstall.grants.sql").read_text(encoding="utf-8"))
    assert [g.strip() for g in grants.split(";")][:2] == [
        "GRANT EXECUTE ON OBJECT::MAILQ.GETEVENTSTREAMSTALL TO MAILQENQUEUER",
        "GRANT EXECUTE ON OBJECT::MAILQ.GETEVENTSTREAMSTALL TO MAILQADMIN"]


# -- L8: bounded statistics --------------------------------------------------------


def test_queue_stats_reads_only_bounded_forced_seeks():
    sql = proc("GetQueueStats")
    for view in ("QUEUECOUNTSBYSTATUS", "OLDESTDUEMAIL", "THROUGHPUTPERHOUR", "RECENTFAILURES"):
        assert f"MAILQ.{view}" not in sql, f"GetQueueStats reads the view {view}"
    reads = re.findall(r"FROM MAILQ\.(\w+) AS (\w+) WITH \(([^;]*?)\)\s*(?:INNER JOIN [^;]*?)?WHERE (.*?)(?:GROUP|ORDER)", sql)
    tables = [r[0] for r in reads]
    assert tables == ["MAILQUEUE", "MAILQUEUE", "MAILQUEUE", "MAILATTEMPT"], reads
    bounds = ["Q.STATUS IN (N'UNSENT', N'SENDING')", "Q.STATUS = N'UNSENT' AND Q.VISIBLEATUTC <= @NOW",
              "Q.STATUS IN (N'SENT', N'FAILED', N'CANCELLED', N'EXPIRED', N'STOPPED') AND Q.DATEPROCESSED >= "
              "@FINISHEDSINCE", "T.ENDEDATUTC IS NOT NULL AND T.ENDEDATUTC >= @FAILURESSINCE"]
    indexes = ["IX_MAILQUEUE_STATUS", "IX_MAILQUEUE_STATUS", "IX_MAILQUEUE_FINAL", "IX_MAILATTEMPT_ENDEDATUTC"]
    for (table, _, hints, where), bound, index in zip(reads, bounds, indexes):
        assert f"INDEX ({index}), FORCESEEK" in hints, (table, hints)
        assert where.strip().startswith(bound), (table, where)
    assert "INNER JOIN MAILQ.MAILQUEUE AS Q WITH (FORCESEEK (PK_MAILQUEUE (ID)))" in sql
    assert "SELECT TOP (@RECENTFAILURES)" in sql
    assert "THROW 50520" in sql and "@FINISHEDHOURS NOT BETWEEN 1 AND 168" in sql


# -- headers: contracts -------------------------------------------------------------

CHANGED = ("ClaimMail", "ExtendLease", "FinalizeMail", "PurgeMail", "GetQueueStats", "GetMailEvents",
           "GetEventStreamStall")


@pytest.mark.parametrize("name", CHANGED)
def test_changed_headers_are_contracts(name):
    text = header(name)
    lines = text.strip().splitlines()
    assert len(lines) <= 40, f"{name}: a header of {len(lines)} lines (a contract is ~10-30; reasoning in docs/)"
    for label in ("Parameters:", "Errors:", "Transaction:", "Isolation:", "Lock order:", "Example:"):
        assert label in text, f"{name}: no {label}"
    assert not re.search(r"\b(revision \d{4}|issue \d+)", text, re.I), f"{name}: history in the header"
