"""Seams between parts developed apart (delayed execution, hooks, the enqueue
policy, suppression, monitoring): facts one part's text states about another's."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _read(rel: str) -> str:
    return (ROOT / rel).read_text(encoding="utf-8")


def test_docs_say_hooks_and_delayed_targets_enqueue_as_mailqrunner():
    """The policy's user is USER_NAME(); hooks and delayed targets run inside
    EXECUTE AS USER = N'MailqRunner'.  So an enqueue from either is MailqRunner's,
    refused with 50500 until MailqRunner is mapped: each of the three pages says so."""
    rows = _read("sql/procedures/mailq.EnqueueMailRows.sql")
    assert "USER_NAME()" in rows and "mailq.ApplicationPrincipal" in rows
    for rel in ("sql/procedures/mailq.RunApplicationHooks.sql", "sql/broker/delay.RunTask.sql"):
        assert "EXECUTE AS USER = N'MailqRunner'" in _read(rel), rel
    enqueue = _read("docs/enqueue.md")
    assert "Hooks and delayed targets enqueue as `MailqRunner`" in enqueue
    assert re.search(r"BindApplication\s+@AppName = N'\w+',\s+@PrincipalName = N'MailqRunner'", enqueue)
    for rel in ("docs/hooks.md", "docs/delayed-execution.md"):
        text = " ".join(_read(rel).split())
        assert re.search(r"enqueues? (?:mail )?(?:\(.*?\) )?(?:does so )?as (?:the user )?`MailqRunner`.{0,120}50500",
                         text), rel


#: "revision 0002" ... "revision 0018": the unreleased revisions the baseline 0001
#: replaced (no database ran them); "--revision 0002:0001" is the command-line form.
COLLAPSED = re.compile(r"(?<!--)\b[Rr]evisions? 00(?:0[2-9]|1\d)\b")


def test_docs_name_no_revision_the_baseline_replaced():
    found = []
    for path in sorted([*ROOT.glob("docs/**/*.md"), ROOT / "README.md"]):
        for no, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if COLLAPSED.search(line):
                found.append(f"{path.relative_to(ROOT)}:{no}: {line.strip()}")
    assert found == []


def test_the_event_table_names_every_procedure_that_writes_enqueued_or_stopped():
    """EnqueueMailBatch writes Enqueued (through EnqueueMailRows) and a failed
    Database Mail query stops its mail through StopMail: the table says both."""
    assert "EXEC mailq.EnqueueMailRows" in _read("sql/procedures/mailq.EnqueueMailBatch.sql")
    assert "EXEC mailq.StopMail" in _read("sql/procedures/mailq.CompleteDbMailQuery.sql")
    rows = {line.split("|")[1].strip(): line for line in _read("docs/events.md").splitlines()
            if line.startswith("| `")}
    assert "`EnqueueMailBatch`" in rows["`Enqueued`"]
    assert "`CompleteDbMailQuery`" in rows["`Stopped`"]


def test_doctor_role_membership_names_every_role():
    """mailq-db doctor's RoleMembership row (mailq.GetInstallationHealth) lists the
    roles the caller is in: a monitor's, a bounce reader's or a Database Mail
    caller's login must not read "member of: none"."""
    roles = sorted(p.name.split(".")[0] for p in (ROOT / "sql/security").glob("*.role.sql"))
    assert len(roles) >= 7
    text = _read("sql/procedures/mailq.GetInstallationHealth.sql")
    block = text[text.index("N'RoleMembership'"):text.index("INSERT INTO @Check", text.index("N'RoleMembership'"))]
    missing = [role for role in roles if f"N'{role}'" not in block]
    assert missing == []


def test_senddbmail_says_an_unmapped_caller_aborts_the_callers_transaction():
    """SendDbMail returns msdb's codes for what it checks itself, but the enqueue
    policy (50500) is EnqueueMail's rule, THROWn under XACT_ABORT: the header and
    the page's "What still aborts" list name it, as they name 50600."""
    header = _read("sql/procedures/mailq.SendDbMail.sql").split("*/", 1)[0]
    assert re.search(r"errors not checked here \([^)]*50500", header)
    page = _read("docs/database-mail.md")
    aborts = page[page.index("**What still aborts, and why.**"):page.index("## 3. What differs")]
    assert "50500" in aborts and "50600" in aborts
