"""(e) Every THROW number in sql/ (and every number mapped to an exception class)
is documented in docs/errors.md, in the block DESIGN.md assigns to it."""

from __future__ import annotations

from pathlib import Path

from mailq_db import errors
from mailq_db.devtools.catalogue import documented_numbers, missing_numbers, throw_numbers

ROOT = Path(__file__).resolve().parents[2]
ERRORS_MD = ROOT / "docs/errors.md"


def test_every_throw_number_is_documented():
    assert missing_numbers(ROOT / "sql", ERRORS_MD) == {}


def test_numbers_stay_in_their_blocks():
    used = set()
    for path in (ROOT / "sql").rglob("*.sql"):
        used |= throw_numbers(path.read_text(encoding="utf-8"))
    assert used, "no THROW found: the catalogue check would pass vacuously"
    # 50100-50499 (DESIGN.md's blocks) and the blocks assigned from 50500 on (docs/CONVENTIONS.md)
    assert all(50100 <= n <= 50699 for n in used), sorted(n for n in used if not 50100 <= n <= 50699)


def test_python_mapping_numbers_are_documented():
    documented = documented_numbers(ERRORS_MD.read_text(encoding="utf-8"))
    assert set(errors.SPECIFIC) <= documented


def test_each_number_is_documented_once():
    text = ERRORS_MD.read_text(encoding="utf-8")
    rows = [line.split("|")[1].strip() for line in text.splitlines() if line.startswith("| 5")]
    assert len(rows) == len(set(rows))


def test_checker_reports_an_undocumented_number(tmp_path):
    (tmp_path / "sql").mkdir()
    (tmp_path / "sql/p.sql").write_text("THROW 50198, N'@X is wrong.', 1;\n-- THROW 50197 in a comment\n")
    (tmp_path / "errors.md").write_text("| number | meaning |\n| --- | --- |\n| 50101 | something |\n")
    assert missing_numbers(tmp_path / "sql", tmp_path / "errors.md") == {50198: [str(tmp_path / "sql/p.sql")]}


def test_error_mapping_classes():
    assert errors.class_for(50102) is errors.InvalidInputError
    assert errors.class_for(50202) is errors.LeaseLostError
    assert errors.class_for(50201) is errors.UnknownMailError
    assert errors.class_for(50250) is errors.MailStateError
    assert errors.class_for(50310) is errors.DelayExecutionError
    assert errors.class_for(50401) is errors.DeploymentCheckError
    assert errors.class_for(50520) is errors.InvalidInputError
    assert errors.class_for(2812) is errors.DatabaseError


def test_driver_message_is_parsed():
    text = ("[42000] [Microsoft][ODBC Driver 18 for SQL Server][SQL Server]"
            "@BatchSize must be 1-1000; got 0. (50130) (SQLExecDirectW)")
    number, message = errors.parse_driver_message(text)
    assert number == 50130
    assert message == "@BatchSize must be 1-1000; got 0."
    exc = errors.from_driver_error(Exception("42000", text))
    assert isinstance(exc, errors.InvalidInputError) and exc.number == 50130
