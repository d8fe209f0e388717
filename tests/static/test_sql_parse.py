"""(a) Every .sql file parses with sqlfluff's tsql dialect (with the project's
Service Broker plugin) and has no unparsable section."""

from __future__ import annotations

from pathlib import Path

import pytest

from mailq_db.devtools.sqlmodel import unparsable

ROOT = Path(__file__).resolve().parents[2]
SQL_FILES = sorted((ROOT / "sql").rglob("*.sql"))


def test_there_are_sql_files():
    assert len(SQL_FILES) > 40


@pytest.mark.parametrize("path", SQL_FILES, ids=lambda p: p.relative_to(ROOT / "sql").as_posix())
def test_file_parses_without_unparsable_section(path):
    assert unparsable(path.read_text(encoding="utf-8")) == []


def test_checker_reports_an_unparsable_statement():
    broken = "CREATE OR ALTER PROCEDURE mailq.Broken\nAS\nBEGIN\n    SELEKT 1 FROM;\nEND;\n"
    problems = unparsable(broken)
    assert problems, "a misspelt statement must be reported"
    assert any("line" in p for p in problems)


def test_checker_reports_an_unknown_broker_option():
    broken = "CREATE QUEUE dbo.Q WITH STATUS = MAYBE;\n"
    assert unparsable(broken)
