"""Reading the project's T-SQL: sqlfluff parse trees (what the linter needs) and
procedure signatures (what the EXEC contract needs).

Whether a table, column, procedure or parameter that a module names exists is
DacFx's question, not this module's (tests/static/test_tsqlcheck.py,
docs/static-proof.md).  Needs the ``test`` extra (sqlfluff); the project's
sqlfluff plugin adds Service Broker statements to the ``tsql`` dialect.
"""

from __future__ import annotations

import functools
import re

from ..deployment import strip_comments


def norm(name: str) -> str:
    """``[mailq].[MailQueue]`` -> ``mailq.mailqueue``; one-part names stay one part."""
    parts = [p.strip().strip("[]").strip('"') for p in name.split(".")]
    return ".".join(p.lower() for p in parts if p)


@functools.lru_cache(maxsize=None)
def _linter():
    from sqlfluff.core import FluffConfig, Linter

    return Linter(config=FluffConfig(overrides={"dialect": "tsql"}))


@functools.lru_cache(maxsize=None)
def parse_text(sql: str):
    """sqlfluff's ParsedString for ``sql`` (cached: the checks share parse trees)."""
    return _linter().parse_string(sql)


def unparsable(sql: str) -> list[str]:
    """The unparsable sections and parse errors of ``sql`` ("line N: text")."""
    parsed = parse_text(sql)
    problems = [f"line {v.line_no}: {v.desc()}" for v in parsed.violations]
    if parsed.tree is not None:
        for seg in parsed.tree.recursive_crawl("unparsable"):
            line = seg.pos_marker.line_no if seg.pos_marker else "?"
            problems.append(f"line {line}: unparsable section {seg.raw[:60]!r}")
    return sorted(set(problems))


# --------------------------------------------------------------------------
# Procedure signatures (the EXEC contract)
# --------------------------------------------------------------------------


_PROC_HEADER = re.compile(
    r"\bCREATE\s+(?:OR\s+ALTER\s+)?PROC(?:EDURE)?\s+(?P<name>[\w\.\[\]]+)(?P<params>.*?)\bAS\b", re.I | re.S
)
_PARAM = re.compile(r"(@\w+)\s+[^,]*?(=\s*[^,]+?)?(?:\s+(?:OUTPUT|OUT|READONLY))?\s*(?:,|$)", re.I | re.S)


def procedure_signature(sql: str) -> tuple[str, dict[str, bool]] | None:
    """(name, {@param: has_default}) of the procedure a file creates."""
    code = strip_comments(sql)
    match = _PROC_HEADER.search(code)
    if match is None:
        return None
    params: dict[str, bool] = {}
    text = match.group("params").strip()
    if text.startswith("(") and text.endswith(")"):
        text = text[1:-1]
    depth, current, pieces = 0, [], []  # type: tuple[int, list[str], list[str]]
    for ch in text:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            pieces.append("".join(current))
            current = []
        else:
            current.append(ch)
    pieces.append("".join(current))
    for piece in pieces:
        piece = piece.strip()
        if not piece.startswith("@"):
            continue
        name = piece.split()[0].lower()
        # A table-valued parameter (READONLY) is optional: omitted, it is an
        # empty table (no default can be declared for it).
        params[name] = "=" in piece or bool(re.search(r"\bREADONLY\b", piece, re.I))
    return norm(match.group("name")), params
