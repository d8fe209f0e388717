"""SQL Server 2022-only built-in functions: the target is SQL Server 2019 and later.

Microsoft's tools refuse most 2022-only T-SQL on their own (docs/static-proof.md):
TSql150Parser refuses the new grammar (IS [NOT] DISTINCT FROM, the WINDOW
clause, JSON_OBJECT's ``key:value``, TRIM(LEADING ...)), and the Sql150 DacFx
model reports GENERATE_SERIES, DATE_BUCKET, DATETRUNC and STRING_SPLIT's
``ordinal`` as unresolved names.  The functions below look like any other
function call to both tools (the parser and DacFx do not check built-in names),
so this check, and only this check, answers for them.  A 2019 server refuses
them at CREATE time with error 195 ("is not a recognized built-in function
name"); e.g. GREATEST: "Applies to: SQL Server 2022 (16.x) and later versions"
(learn.microsoft.com/sql/t-sql/functions/logical-functions-greatest-transact-sql).
"""

from __future__ import annotations

import re
from pathlib import Path

from ..deployment import code_only

#: Built-ins added in SQL Server 2022 that TSql150Parser and the Sql150 model accept.
SQL2022_FUNCTIONS = (
    "GREATEST", "LEAST",                                   # logical functions
    "BIT_COUNT", "GET_BIT", "SET_BIT", "LEFT_SHIFT", "RIGHT_SHIFT",  # bit manipulation
    "JSON_ARRAY", "JSON_PATH_EXISTS",                      # JSON
    "APPROX_PERCENTILE_CONT", "APPROX_PERCENTILE_DISC",    # approximate percentiles
)
_CALL = re.compile(r"\b(?P<name>" + "|".join(SQL2022_FUNCTIONS) + r")\s*\(", re.I)
_TRIM = re.compile(r"\b(?P<name>LTRIM|RTRIM)\s*\(", re.I)


def _top_level_args(code: str, open_paren: int) -> int:
    """How many arguments the call whose ``(`` is at ``open_paren`` has."""
    depth, args = 0, 1
    for ch in code[open_paren:]:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
            if depth == 0:
                return args
        elif ch == "," and depth == 1:
            args += 1
    return args


def sql2022_functions(sql: str) -> list[str]:
    """``line N: NAME`` for every 2022-only built-in call in ``sql`` (code only)."""
    code = code_only(sql)
    found = []
    for match in _CALL.finditer(code):
        found.append(f"line {code.count(chr(10), 0, match.start()) + 1}: {match.group('name').upper()}")
    for match in _TRIM.finditer(code):
        if _top_level_args(code, match.end() - 1) > 1:  # LTRIM(s, chars): 2022 only
            found.append(f"line {code.count(chr(10), 0, match.start()) + 1}: "
                         f"{match.group('name').upper()} with a second argument")
    return found


def check_tree(sql_root: Path) -> dict[str, list[str]]:
    """file -> 2022-only calls, for every .sql file under ``sql_root``."""
    found = {}
    for path in sorted(Path(sql_root).rglob("*.sql")):
        calls = sql2022_functions(path.read_text(encoding="utf-8"))
        if calls:
            found[str(path)] = calls
    return found
