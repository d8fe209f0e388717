"""Mail templates in sql/ (issue 16, point 2), checked without a server.

These read the procedures' text; tests/integration/test_mailq_templates.py
tests their behaviour on SQL Server 2022.

* versions are immutable: no file but the trigger writes an UPDATE, DELETE or
  MERGE of mailq.MailTemplateVersion, and the trigger refuses both (50218);
* every THROW number of a template procedure is named in its header's Errors
  line, and lies in 50210-50219 (this piece's numbers);
* every template procedure validates @TemplateName (50210) before any
  transaction, and AddMailTemplateVersion compares texts as bytes;
* grants: administrators get every template procedure, sender workers only
  GetMailTemplate, the enqueue role nothing;
* the baseline deploys the template files in build order.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from mailq_db.deployment import code_only, strip_comments

ROOT = Path(__file__).resolve().parents[2]
SQL = ROOT / "sql"
PROCS = ["AddMailTemplateVersion", "GetMailTemplate", "ListMailTemplates", "ListMailTemplateVersions",
         "RetireMailTemplate"]
FILES = [
    "tables/mailq.MailTemplate.sql",
    "tables/mailq.MailTemplateVersion.sql",
    "tables/mailq.MailTemplateVersion.trg_MailTemplateVersion_Immutable.sql",
    *(f"procedures/mailq.{p}.sql" for p in PROCS),
    "security/MailqAdmin.templates.grants.sql",
]
TRIGGER = SQL / "tables/mailq.MailTemplateVersion.trg_MailTemplateVersion_Immutable.sql"


def text(rel: str) -> str:
    return (SQL / rel).read_text(encoding="utf-8")


def header(rel: str) -> str:
    match = re.match(r"\s*/\*(.*?)\*/", text(rel), re.S)
    return match.group(1) if match else ""


def test_no_file_but_the_trigger_changes_a_version_row():
    write = re.compile(r"\b(UPDATE|DELETE\s+FROM|DELETE|MERGE(\s+INTO)?)\s+mailq\.MailTemplateVersion\b", re.I)
    alias_write = re.compile(r"\bFROM\s+mailq\.MailTemplateVersion\s+AS\s+(\w+)", re.I)
    offenders = []
    for path in sorted(SQL.rglob("*.sql")):
        if path == TRIGGER:
            continue
        code = code_only(path.read_text(encoding="utf-8"))
        if write.search(code):
            offenders.append(path.name)
        for alias in alias_write.findall(code):
            if re.search(rf"\b(UPDATE|DELETE)\s+{alias}\b", code, re.I):
                offenders.append(path.name)
    assert offenders == []


def test_the_trigger_refuses_update_and_delete():
    code = strip_comments(TRIGGER.read_text(encoding="utf-8"))
    assert re.search(r"CREATE OR ALTER TRIGGER mailq\.trg_MailTemplateVersion_Immutable\s+ON mailq\.MailTemplateVersion"
                     r"\s+INSTEAD OF UPDATE, DELETE", code)
    assert "THROW 50218" in code


@pytest.mark.parametrize("proc", PROCS)
def test_header_names_every_number_thrown(proc):
    rel = f"procedures/mailq.{proc}.sql"
    thrown = {int(n) for n in re.findall(r"\bTHROW\s+(\d+)", code_only(text(rel)))}
    assert all(50210 <= n <= 50219 for n in thrown), thrown
    errors_line = header(rel).split("Errors:", 1)[1].split("Transaction:", 1)[0]
    assert {int(n) for n in re.findall(r"\b5\d{4}\b", errors_line)} == thrown


@pytest.mark.parametrize("proc", [p for p in PROCS if p != "ListMailTemplates"])
def test_template_name_is_validated_before_any_transaction(proc):
    code = code_only(text(f"procedures/mailq.{proc}.sql"))
    first_throw = code.find("THROW 50210")
    assert first_throw != -1
    begin = code.find("BEGIN TRANSACTION")
    assert begin == -1 or first_throw < begin


def test_add_compares_texts_as_bytes_and_numbers_under_a_lock():
    code = strip_comments(text("procedures/mailq.AddMailTemplateVersion.sql"))
    for column in ("SubjectTemplate", "HtmlTemplate", "TextTemplate"):
        assert f"CAST(v.{column} AS VARBINARY(MAX)) = CAST(@{column} AS VARBINARY(MAX))" in code
    assert re.search(r"FROM mailq\.MailTemplate AS t WITH \(UPDLOCK, HOLDLOCK\)", code)
    assert "COLLATE Latin1_General_BIN2 LIKE N'%[^A-Za-z0-9._-]%'" in code


def test_grants():
    grants = re.findall(r"GRANT EXECUTE ON OBJECT::mailq\.(\w+) TO (\w+);",
                        code_only(text("security/MailqAdmin.templates.grants.sql")).replace("''", ""))
    assert {p for p, role in grants if role == "MailqAdmin"} == set(PROCS)
    assert {p for p, role in grants if role == "MailqSender"} == {"GetMailTemplate"}
    everything = "\n".join(p.read_text(encoding="utf-8") for p in (SQL / "security").glob("*.grants.sql"))
    assert not re.search(r"MailTemplate\w* TO MailqEnqueuer", everything)


def test_build_order_and_revision():
    order = [line.strip() for line in text("BuildOrder.txt").splitlines() if line.strip() and not line.startswith("#")]
    positions = [order.index(f) for f in FILES]
    assert positions == sorted(positions)
    frozen = (ROOT / "alembic/frozen/0001/FILES").read_text(encoding="utf-8").split()
    assert [f for f in frozen if f in FILES] == FILES
