"""(c) Every table and column that a procedure, view, function or trigger names
resolves against the tables, views and functions defined in sql/."""

from __future__ import annotations

from pathlib import Path

import pytest

from mailq_db.devtools.references import check_module
from mailq_db.devtools.sqlmodel import build_catalog, module_files

ROOT = Path(__file__).resolve().parents[2]
MODULES = list(module_files(ROOT / "sql"))


def test_catalog_knows_the_queue_tables(catalog):
    assert {"id", "visibleatutc", "threadlock", "attemptsremaining"} <= catalog.tables["mailq.mailqueue"]
    assert "mailq.claimmail" in catalog.procedures
    assert catalog.procedures["mailq.claimmail"].parameters["@locktoken"] is False


@pytest.mark.parametrize("path", MODULES, ids=lambda p: p.relative_to(ROOT / "sql").as_posix())
def test_module_references_resolve(path, catalog):
    assert [str(p) for p in check_module(path, catalog)] == []


def _break(path: Path, old: str, new: str) -> None:
    text = path.read_text(encoding="utf-8")
    assert old in text, f"sample text not found in {path.name}: {old!r}"
    path.write_text(text.replace(old, new, 1), encoding="utf-8")


BROKEN_SAMPLES = [
    # (file, original text, broken text, expected words in the problem)
    ("procedures/mailq.ClaimMail.sql", "q.VisibleAtUtc <= @Now", "q.VisibleAtUtx <= @Now", "VisibleAtUtx"),
    ("procedures/mailq.ClaimMail.sql", "INSERT INTO mailq.MailAttempt (MailID, AttemptNo,",
     "INSERT INTO mailq.MailAttempt (MailID, AttemptNumber,", "AttemptNumber"),
    ("procedures/mailq.MarkSent.sql", "OUTPUT inserted.ID, inserted.AttemptCount INTO @Acked",
     "OUTPUT inserted.ID, inserted.Attempts INTO @Acked", "inserted.Attempts"),
    ("procedures/mailq.MarkSent.sql", "q.DryRun = @DryRun", "q.IsDryRun = @DryRun", "IsDryRun"),
    ("procedures/mailq.EnqueueMail.sql", "FROM mailq.SendingAccount AS a\n",
     "FROM mailq.SendingAccounts AS a\n", "mailq.SendingAccounts"),
    ("procedures/mailq.UpsertApplication.sql", "SET p.Description = @Description",
     "SET p.Descr = @Description", "Descr"),
    ("procedures/mailq.ReleaseMail.sql", "@IDList = @IDList, @LockToken = @LockToken;",
     "@IDLst = @IDList;", "@idlst"),
    ("views/mailq.RecentFailures.sql", "t.ErrorText AS LastError", "t.ErrorTxt AS LastError", "ErrorTxt"),
]


@pytest.mark.parametrize("rel,old,new,expected", BROKEN_SAMPLES, ids=[s[3] for s in BROKEN_SAMPLES])
def test_checker_finds_a_broken_reference(sql_copy, rel, old, new, expected):
    _break(sql_copy / rel, old, new)
    catalog = build_catalog(sql_copy)
    problems = [str(p) for p in check_module(sql_copy / rel, catalog)]
    assert any(expected.lower() in p.lower() for p in problems), problems


def test_checker_finds_an_exec_missing_a_required_parameter(sql_copy):
    rel = "procedures/mailq.ReleaseMail.sql"
    _break(sql_copy / rel, "@IDList = @IDList, @LockToken = @LockToken;", "@IDList = @IDList;")
    problems = [str(p) for p in check_module(sql_copy / rel, build_catalog(sql_copy))]
    assert any("required parameter @locktoken" in p for p in problems), problems
