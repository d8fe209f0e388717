"""Static facts of the suppression SQL (docs/bounces.md) that a reading of it
found broken; the procedures themselves run in tests/integration."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SQL = ROOT / "sql"


def _text(rel: str) -> str:
    return (SQL / rel).read_text(encoding="utf-8")


def _code(rel: str) -> str:
    """The module without its header comment and line comments."""
    text = re.sub(r"/\*.*?\*/", "", _text(rel), flags=re.S)
    return re.sub(r"--[^\n]*", "", text)


def _granted(proc: str) -> set[str]:
    roles = set()
    for f in (SQL / "security").glob("*.grants.sql"):
        roles |= set(re.findall(rf"GRANT EXECUTE ON OBJECT::{re.escape(proc)} TO (\w+);", f.read_text("utf-8")))
    return roles


def test_every_role_that_runs_mailq_db_stats_may_read_the_suppression_section():
    # `mailq-db stats` calls GetQueueStats, then GetSuppressionStats; a 229 on the
    # second ended the command for MailqMonitor, the read-only role it is run as.
    assert _granted("mailq.GetQueueStats") <= _granted("mailq.GetSuppressionStats")


def test_no_output_into_a_table_with_a_check_foreign_key_or_trigger():
    # SQL Server refuses OUTPUT ... INTO a table with an enabled CHECK constraint
    # (Msg 333), on either side of a FOREIGN KEY (Msg 332) or with a trigger
    # (Msg 331): learn.microsoft.com/sql/t-sql/queries/output-clause-transact-sql.
    # mailq.RemoveSuppression wrote its history row that way into
    # mailq.SuppressionHistory (CK_SuppressionHistory_Action) and always failed.
    tables = {f.stem: f.read_text("utf-8") for d in ("tables", "broker") for f in (SQL / d).glob("*.sql")}
    everything = "\n".join(f.read_text("utf-8") for f in SQL.rglob("*.sql"))
    targets = set()
    for f in SQL.rglob("*.sql"):
        code = re.sub(r"/\*.*?\*/|--[^\n]*", "", f.read_text("utf-8"), flags=re.S)
        for m in re.finditer(r"\bOUTPUT\s+(?:inserted|deleted)\.[^;]*?\bINTO\s+([\w.]+)", code, re.I | re.S):
            if not m.group(1).startswith("@"):
                targets.add((f.name, m.group(1)))
    assert targets, "the pattern finds the OUTPUT INTO statements"
    for module, table in sorted(targets):
        definition = re.sub(r"/\*.*?\*/", "", tables[table], flags=re.S)
        assert not re.search(r"\bCHECK\s*\(|\bFOREIGN\s+KEY\b", definition, re.I), (module, table)
        assert not re.search(rf"\bREFERENCES\s+{re.escape(table)}\b", everything, re.I), (module, table)
        assert not re.search(rf"\bTRIGGER\s+[\w.]+\s+ON\s+{re.escape(table)}\b", everything, re.I), (module, table)


def test_record_bounce_counts_bounced_mails_not_reports():
    # What the contract in tests/unit/fake_bounces.py does, in the procedure:
    # both counts are one per mail (a report without mail counts alone).
    code = _code("procedures/mailq.RecordBounce.sql")
    counts = re.findall(r"SELECT (COUNT\([^\n]*\))\s+FROM mailq\.BounceReport AS b", code)
    assert counts == ["COUNT(DISTINCT COALESCE(CAST(b.MailID AS VARBINARY(8)), b.ReportKey))"] * 2
    assert "INCLUDE (MailID)" in _code("indexes/mailq.BounceReport.IX_BounceReport_Address.sql")


def test_requeue_leaves_out_addresses_suppressed_since_the_mail_was_queued():
    # The sweep changes only UnSent and Sending mail; RequeueMail is the one way
    # a finished (Failed, Stopped, ...) mail goes back to UnSent, so it applies
    # the enqueue rule itself: 50600 when nobody is left, else the lists without them.
    code = _code("procedures/mailq.RequeueMail.sql")
    flt = code.index("mailq.FilterSuppressedRecipients(")
    assert flt < code.index("WITH (UPDLOCK, ROWLOCK)") < code.index("THROW 50600") < code.index("UPDATE q")
    assert "N'RecipientSuppressed'" in code
