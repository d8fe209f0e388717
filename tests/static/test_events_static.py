"""Static checks of the event stream (issue 16, point 1; docs/events.md).

No server here: these read sql/ and the revision.  What they prove:
* every procedure that changes a mail's Status (or inserts a mail) writes
  mailq.MailEvent, and the EventType values written are the fixed ones;
* mailq.MailEvent can be an OUTPUT ... INTO target: no CHECK constraint, no
  foreign key on either side, no trigger (OUTPUT clause (Transact-SQL),
  Arguments, output_table);
* GetMailEvents bounds its read by MIN_ACTIVE_ROWVERSION() taken in an
  earlier statement, reads with READCOMMITTEDLOCK, seeks, and is bounded;
* 'Stopped' is a final status everywhere a final status is listed (CHECK,
  IX_MailQueue_Final and PurgeMail, sysmail_allitems, RequeueMail);
* PurgeMail deletes a mail's events before the mail, 1000 rows a statement;
* the downgrade drops the event table after every procedure that writes it.
The behaviour itself is tested against SQL Server 2022 in
tests/integration/test_mailq_events.py.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from mailq_db import deployment as d
from mailq_db import procedures
from mailq_db.deployment import strip_comments

ROOT = Path(__file__).resolve().parents[2]
SQL = ROOT / "sql"
EVENT_TYPES = set(procedures.EVENT_TYPES)
STATUS_SET = re.compile(r"^\s+\w+\.Status\s*=\s*[^,\n]+,\s*$", re.M)


def code(rel: str) -> str:
    return strip_comments((SQL / rel).read_text(encoding="utf-8"))


def procedure_files() -> list[Path]:
    return sorted((SQL / "procedures").glob("mailq.*.sql"))


def changes_status(text: str) -> bool:
    return bool(STATUS_SET.search(text)) or "INSERT INTO mailq.MailQueue" in text


def test_every_state_change_writes_an_event():
    changing = [p.name for p in procedure_files() if changes_status(strip_comments(p.read_text(encoding="utf-8")))]
    assert {"mailq.EnqueueMailRows.sql", "mailq.ClaimMail.sql", "mailq.MarkSent.sql", "mailq.MarkFailed.sql",
            "mailq.ReleaseMail.sql", "mailq.FinalizeMail.sql", "mailq.CancelMail.sql", "mailq.RequeueMail.sql",
            "mailq.StopMail.sql"} <= set(changing), changing
    missing = [n for n in changing if "mailq.MailEvent" not in code(f"procedures/{n}")]
    assert missing == [], f"these change a mail's Status without writing mailq.MailEvent: {missing}"


def _event_literals(text: str) -> set[str]:
    """EventType literals written: the third value of each INSERT/OUTPUT into mailq.MailEvent."""
    found = set()
    for m in re.finditer(r"N'(\w+)'", text):
        if m.group(1) in EVENT_TYPES:
            found.add(m.group(1))
    return found


def test_event_types_written_are_the_fixed_ones_and_all_are_written():
    written: set[str] = set()
    for p in procedure_files():
        text = strip_comments(p.read_text(encoding="utf-8"))
        if "mailq.MailEvent" not in text or "INTO mailq.MailEvent" not in text:
            continue
        for block in re.findall(r"(?:OUTPUT|SELECT)\b(?:(?!;).)*?INTO mailq\.MailEvent|INSERT INTO mailq\.MailEvent"
                                r"(?:(?!;).)*;", text, re.S):
            written |= _event_literals(block)
    # FinalizeMail writes its new status (Failed / Expired) as the event type.
    written |= {"Failed", "Expired"}
    assert written == EVENT_TYPES, sorted(EVENT_TYPES ^ written)
    assert set(procedures.TERMINAL_EVENT_TYPES) == {"Sent", "DryRun", "Failed", "Cancelled", "Expired", "Stopped"}


def test_event_table_can_be_an_output_into_target():
    table = code("tables/mailq.MailEvent.sql")
    assert "CHECK" not in table.upper() and "FOREIGN KEY" not in table.upper()
    assert re.search(r"EventSeq\s+ROWVERSION\s+NOT NULL", table)
    for p in SQL.rglob("*.sql"):
        text = strip_comments(p.read_text(encoding="utf-8"))
        assert not re.search(r"REFERENCES\s+mailq\.MailEvent\b", text), p
        assert not re.search(r"CREATE\s+(OR\s+ALTER\s+)?TRIGGER\b[^;]*?\bON\s+mailq\.MailEvent\b", text, re.S), p


def test_get_mail_events_reads_below_the_active_rowversion():
    text = code("procedures/mailq.GetMailEvents.sql")
    bound = text.index("DECLARE @Upper BINARY(8) = MIN_ACTIVE_ROWVERSION();")
    selects = [m.start() for m in re.finditer(r"SELECT TOP \(@MaxEvents\)", text)]
    assert len(selects) == 2 and all(s > bound for s in selects), "the bound must be read before the rows"
    assert text.count("e.EventSeq < @Upper") == 2 and text.count("e.EventSeq > @After") == 2
    assert text.count("ORDER BY e.EventSeq ASC") == 2
    assert "WITH (INDEX (IX_MailEvent_AppName), FORCESEEK, READCOMMITTEDLOCK)" in text
    assert "WITH (INDEX (IX_MailEvent_MailID), FORCESEEK, READCOMMITTEDLOCK)" in text
    assert "@MaxEvents NOT BETWEEN 1 AND 5000" in text
    for ix, keys in [("AppName", "(AppName ASC, EventSeq ASC)"), ("MailID", "(MailID ASC, EventSeq ASC)")]:
        assert keys in code(f"indexes/mailq.MailEvent.IX_MailEvent_{ix}.sql")


def _statuses(fragment: str) -> set[str]:
    return set(re.findall(r"N'(\w+)'", fragment))


FINAL = {"Sent", "Failed", "Cancelled", "Expired", "Stopped"}


def test_stopped_is_a_final_status_everywhere():
    check = re.search(r"CK_MailQueue_Status CHECK \((.*?)\)\s*,", code("tables/mailq.MailQueue.sql"), re.S)
    assert "Stopped" in _statuses(check.group(1))
    final_ix = re.search(r"WHERE Status IN \(([^)]*)\)", code("indexes/mailq.MailQueue.IX_MailQueue_Final.sql"))
    assert _statuses(final_ix.group(1)) == FINAL
    purge = code("procedures/mailq.PurgeMail.sql")
    lists = re.findall(r"q\.Status IN \(([^)]*)\)", purge)
    assert lists and all(_statuses(x) == FINAL for x in lists), "PurgeMail must match IX_MailQueue_Final's filter"
    sysmail = code("views/mailq.sysmail_allitems.sql")
    assert all(_statuses(x) >= FINAL - {"Sent"} for x in re.findall(r"q\.Status IN \(([^)]*)\)", sysmail))
    assert "N'Stopped'" in code("procedures/mailq.RequeueMail.sql")


def test_stop_mail_fences_the_lease():
    text = code("procedures/mailq.StopMail.sql")
    assert "IF @Status NOT IN (N'UnSent', N'Sending')" in text and "THROW 50260" in text
    update = text[text.index("UPDATE q"):text.index("FROM mailq.MailQueue AS q\n        WHERE q.ID = @MailID;")]
    assert "q.Status = N'Stopped'" in update and "q.ThreadLock = NULL" in update
    assert "INTO mailq.MailEvent" in update, "the Stopped event must be written by the same statement"


def test_purge_deletes_events_before_the_mail():
    text = code("procedures/mailq.PurgeMail.sql")
    events = text.index("FROM mailq.MailEvent AS e WITH (INDEX (IX_MailEvent_MailID), FORCESEEK, ROWLOCK)")
    assert "DELETE TOP (1000) e" in text
    assert events < text.index("DELETE q\n")


def test_downgrade_drops_the_event_table_after_every_procedure_that_writes_it():
    statements = d.RevisionPlan("0001", ROOT).downgrade_statements()
    table = next(i for i, s in enumerate(statements) if "DROP TABLE IF EXISTS mailq.MailEvent" in s)
    dropped = [i for i, s in enumerate(statements) if "DROP PROCEDURE IF EXISTS mailq.MarkSent" in s]
    assert dropped and dropped[0] < table


@pytest.mark.parametrize("name", ["GetMailEvents", "StopMail"])
def test_new_procedures_are_granted(name):
    admin = (SQL / "security/MailqAdmin.grants.sql").read_text(encoding="utf-8")
    assert f"GRANT EXECUTE ON OBJECT::mailq.{name} TO MailqAdmin;" in admin
