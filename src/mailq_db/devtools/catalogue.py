"""Error catalogue: every THROW number in sql/ is documented in docs/errors.md,
and every number the Python layer maps to an exception class is documented too."""

from __future__ import annotations

import re
from pathlib import Path

from ..deployment import strip_comments

_THROW = re.compile(r"\bTHROW\s+(\d+)\s*,", re.I)
_DOC_ROW = re.compile(r"^\|\s*(5\d{4})\s*\|", re.M)


def throw_numbers(sql: str) -> set[int]:
    return {int(n) for n in _THROW.findall(strip_comments(sql))}


def documented_numbers(markdown: str) -> set[int]:
    """Numbers that head a row of a Markdown table (``| 50101 | ...``)."""
    return {int(n) for n in _DOC_ROW.findall(markdown)}


def missing_numbers(sql_root: Path, errors_md: Path) -> dict[int, list[str]]:
    """THROW number -> files using it, for numbers absent from the catalogue."""
    documented = documented_numbers(Path(errors_md).read_text(encoding="utf-8"))
    missing: dict[int, list[str]] = {}
    for path in sorted(Path(sql_root).rglob("*.sql")):
        for number in throw_numbers(path.read_text(encoding="utf-8")):
            if number not in documented:
                missing.setdefault(number, []).append(str(path))
    return missing
