"""(h) No SQL Server 2022-only built-in function that Microsoft's parser and
DacFx model let through (GREATEST, LEAST, the bit functions, ...): the target
is SQL Server 2019 and later (docs/static-proof.md)."""

from __future__ import annotations

from pathlib import Path

import pytest

from mailq_db.devtools.versions import SQL2022_FUNCTIONS, check_tree, sql2022_functions

ROOT = Path(__file__).resolve().parents[2]


def test_no_sql_file_calls_a_sql_server_2022_function():
    assert check_tree(ROOT / "sql") == {}
    assert check_tree(ROOT / "alembic/frozen") == {}


@pytest.mark.parametrize("name", SQL2022_FUNCTIONS)
def test_each_2022_function_is_found(name):
    sql = f"CREATE OR ALTER PROCEDURE mailq.P\nAS\nSELECT {name.lower()} (1, 2) AS x;\n"
    assert sql2022_functions(sql) == [f"line 3: {name}"]


def test_ltrim_with_characters_is_found_and_plain_trims_are_not():
    sql = "SELECT LTRIM(@a) AS a, RTRIM(CONCAT(@a, N',')) AS b,\n    LTRIM(@a, N' x') AS c;\n"
    assert sql2022_functions(sql) == ["line 2: LTRIM with a second argument"]


def test_comments_strings_and_longer_names_are_not_calls():
    sql = "-- GREATEST(1, 2)\nSELECT N'LEAST(1, 2)' AS a, dbo.GREATEST_OF(1) AS b, GreatestValue AS c;\n"
    assert sql2022_functions(sql) == []
