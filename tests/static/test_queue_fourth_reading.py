"""What can be seen without a server of the fourth queue reading's fixes
(/work/readings-new/r24.md; docs/finalization.md, docs/claim.md, docs/guarantees.md):

* FinalizeMail and PurgeMail turn IMPLICIT_TRANSACTIONS off before any
  statement that could open a transaction, so their batches commit one by
  one also for a session in implicit transaction mode (pyodbc and JDBC with
  autocommit off), where the ``@@TRANCOUNT > 0`` check alone passes;
* PurgeMail finds its candidates by a forced seek on IX_MailQueue_Final, whose
  filter the predicate repeats;
* GetQueueStats compiles the per-hour statement for the window (its memory
  grant), and only that one;
* ClaimMail reads the rows it returns by forced seeks;
* GetEnqueuePolicy lists Windows group users as ways in;
* the docs no longer cite revisions that the one baseline replaced, and say
  where the per-index lock order can end a claim with 1205.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from mailq_db.deployment import strip_comments

ROOT = Path(__file__).resolve().parents[2]
PROC = ROOT / "sql" / "procedures"
DOCS = ROOT / "docs"


def squash(text: str) -> str:
    return re.sub(r"\s+", " ", strip_comments(text)).upper()


def proc(name: str) -> str:
    return squash((PROC / f"mailq.{name}.sql").read_text(encoding="utf-8"))


def body(sql: str) -> str:
    """The procedure's statements after ``AS BEGIN``."""
    return sql[sql.index(" AS BEGIN ") + len(" AS BEGIN "):]


# -- the caller's transaction: implicit transaction mode ----------------------------

FIRST_OPENERS = ("BEGIN TRANSACTION", "FROM ", "INSERT ", "UPDATE ", "DELETE ", "DECLARE @CANDIDATE TABLE",
                 "DECLARE @DONE TABLE")


@pytest.mark.parametrize("name", ["FinalizeMail", "PurgeMail"])
def test_batch_committing_procedures_turn_implicit_transactions_off_first(name):
    code = body(proc(name))
    assert "SET IMPLICIT_TRANSACTIONS OFF;" in code, \
        f"{name}: under IMPLICIT_TRANSACTIONS ON its batches would nest in one implicit transaction"
    at = code.index("SET IMPLICIT_TRANSACTIONS OFF;")
    for opener in FIRST_OPENERS:
        if opener in code:
            assert at < code.index(opener), f"{name}: {opener!r} comes before SET IMPLICIT_TRANSACTIONS OFF"
    assert at < code.index("IF @@TRANCOUNT > 0 THROW"), f"{name}: the mode must be off before the check"
    assert "SET IMPLICIT_TRANSACTIONS ON" not in code
    text = (PROC / f"mailq.{name}.sql").read_text(encoding="utf-8")
    transaction = " ".join(text.split("Transaction:")[1].split("Isolation:")[0].split())
    assert "implicit transaction mode" in transaction, f"{name}: the header does not say it"


# -- PurgeMail's candidates -------------------------------------------------------------


def test_purge_candidates_are_a_forced_seek_on_the_final_index():
    sql = proc("PurgeMail")
    candidates = sql[sql.index("INSERT INTO @CANDIDATE (ID)"):]
    candidates = candidates[:candidates.index(";")]
    assert "WITH ( INDEX (IX_MAILQUEUE_FINAL), FORCESEEK, READCOMMITTEDLOCK, READPAST, ROWLOCK )" in candidates
    # the filter's literals, so the filtered index matches (else error 8622 with the hint)
    index = squash((ROOT / "sql" / "indexes" / "mailq.MailQueue.IX_MailQueue_Final.sql").read_text(encoding="utf-8"))
    (literal,) = re.findall(r"WHERE STATUS (IN \([^)]*\))", index)
    assert f"Q.STATUS {literal} AND Q.DATEPROCESSED < @CUTOFF" in candidates


# -- GetQueueStats: memory grant of the window ------------------------------------------


def test_stats_compile_only_the_hourly_statement_for_its_window():
    sql = proc("GetQueueStats")
    statements = [s.strip() for s in body(sql).split(";")]
    recompiled = [s for s in statements if "OPTION (RECOMPILE)" in s]
    assert len(recompiled) == 1, recompiled
    assert "FROM MAILQ.MAILQUEUE AS Q WITH (INDEX (IX_MAILQUEUE_FINAL), FORCESEEK)" in recompiled[0]
    assert "Q.DATEPROCESSED >= @FINISHEDSINCE" in recompiled[0]


# -- ClaimMail's result sets ------------------------------------------------------------


def test_claim_reads_the_rows_it_returns_by_forced_seeks():
    sql = proc("ClaimMail")
    returned = sql[sql.index("DECLARE @RETURNEDAT"):]
    assert "FROM MAILQ.MAILQUEUE AS Q WITH (FORCESEEK (PK_MAILQUEUE (ID))) INNER JOIN @CLAIMED AS C" in returned
    assert "FROM MAILQ.MAILATTACHMENT AS A WITH (FORCESEEK (PK_MAILATTACHMENT (MAILID))) INNER JOIN @CLAIMED AS C" \
        in returned
    assert "MAILQ.MAILTEMPLATEVERSION AS V WITH (FORCESEEK)" in returned


# -- GetEnqueuePolicy: Windows groups -------------------------------------------------------


def test_enqueue_policy_lists_windows_group_users():
    sql = proc("GetEnqueuePolicy")
    (types,) = re.findall(r"U\.TYPE IN \(([^)]*)\)", sql)
    listed = {t.strip().strip("'") for t in types.split(",")}
    assert {"S", "U", "G", "E", "X", "C", "K"} <= listed, listed
    assert "R" not in listed and "A" not in listed, "roles and application roles are not users"
    header = (PROC / "mailq.GetEnqueuePolicy.sql").read_text(encoding="utf-8").split("*/")[0]
    assert "Windows" in header


# -- docs -----------------------------------------------------------------------------------


@pytest.mark.parametrize("doc", ["guarantees.md", "finalization.md"])
def test_docs_cite_no_revision_the_baseline_replaced(doc):
    text = (DOCS / doc).read_text(encoding="utf-8")
    cited = set(re.findall(r"\b[Rr]evisions? (00\d\d)", text)) | set(re.findall(r"\b(00\d\d)[–-]00\d\d\b", text))
    assert cited <= {"0001"}, f"{doc} cites revisions {sorted(cited)}; the history is one baseline, 0001"
    assert "Upgrade default" not in text


def test_docs_say_where_the_per_index_order_can_end_a_claim_with_1205():
    claim = " ".join((DOCS / "claim.md").read_text(encoding="utf-8").split())
    assert "Competing and isolated workers on the same mail" in claim and "1205" in claim
    finalization = " ".join((DOCS / "finalization.md").read_text(encoding="utf-8").split())
    assert "IMPLICIT_TRANSACTIONS" in finalization and "1205" in finalization
    guarantees = " ".join((DOCS / "guarantees.md").read_text(encoding="utf-8").split())
    assert "Within `mailq.MailQueue` the order is per index" in guarantees
    run_modes = guarantees[guarantees.index("## Run modes"):]
    assert "IX_MailQueue_ClaimByApp" in run_modes
