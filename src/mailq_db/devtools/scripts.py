"""Checks of the rendered deployment scripts (``alembic upgrade head --sql`` and
``alembic downgrade head:base --sql``), the text a DBA reviews and runs."""

from __future__ import annotations

import re
from pathlib import Path

from ..deployment import build_order, code_only, describe, sql_dir, strip_comments

#: Statements that must never appear in a rendered script (outside strings and
#: comments: messages may tell the DBA how to run them).
FORBIDDEN = {
    "ALTER DATABASE": re.compile(r"\bALTER\s+DATABASE\b", re.I),
    "NOLOCK": re.compile(r"\bNOLOCK\b", re.I),
    "READUNCOMMITTED": re.compile(r"\bREAD\s*UNCOMMITTED\b", re.I),
    "TRUSTWORTHY": re.compile(r"\bTRUSTWORTHY\b", re.I),
    "WAITFOR DELAY": re.compile(r"\bWAITFOR\s+DELAY\b", re.I),
    "GETDATE()": re.compile(r"\bGETDATE\s*\(", re.I),
}


def render(command: str, revision: str, x_args: tuple[str, ...] = (), root: Path | None = None) -> str:
    """The offline script of ``alembic <command> <revision> --sql`` (the same
    renderer ``mailq-db dev golden`` writes the golden copies with)."""
    from ..commands.dev import render_golden

    return render_golden(root, command, revision, tuple(x_args))


def batches(script: str) -> list[str]:
    """The batches of a script, split on lines that hold only GO."""
    return [b.strip() for b in re.split(r"^\s*GO\s*$", script, flags=re.M | re.I) if b.strip()]


def problems_in(script: str) -> list[str]:
    """Forbidden statements, doubled terminators and missing GO separators."""
    problems = []
    code = code_only(script)
    for label, pattern in FORBIDDEN.items():
        if pattern.search(code):
            problems.append(f"the script contains {label}")
    if re.search(r";\s*;", code):
        problems.append("the script contains an empty statement (';;', e.g. END;;)")
    if not re.search(r"^GO$", script, re.M):
        problems.append("the script has no GO batch separator")
    for batch in batches(script):
        creates = re.findall(r"\bCREATE\s+(?:OR\s+ALTER\s+)?(?:PROCEDURE|VIEW|FUNCTION|TRIGGER|SCHEMA)\b",
                             code_only(batch), re.I)
        if len(creates) > 1:
            problems.append(f"one batch holds {len(creates)} CREATE statements that must be alone in a batch")
    return problems


def missing_objects(upgrade: str, downgrade: str, root: Path | None = None,
                    only: tuple[str, ...] = ()) -> list[str]:
    """Objects of sql/BuildOrder.txt the upgrade does not create or the downgrade does not remove.

    ``only`` limits the check to files under these sql/ sub-paths.
    """
    problems = []
    up = re.sub(r"\s+", " ", strip_comments(upgrade).lower())
    down = re.sub(r"\s+", " ", strip_comments(downgrade).lower())
    for rel in build_order(root):
        if only and not rel.startswith(only):
            continue
        obj = describe((sql_dir(root) / rel).read_text(encoding="utf-8"))
        if obj.kind in ("grant", "script"):
            continue
        name = re.escape(obj.name.lower())
        kind = "(?:unique )?(?:nonclustered |clustered )?index" if obj.kind == "index" else obj.kind
        created = rf"\bcreate (?:or alter )?{kind} {name}(?![\w.])"
        dropped = rf"\bdrop {kind} (?:if exists )?{name}(?![\w.])"
        if not re.search(created, up):
            problems.append(f"{rel}: {obj.kind} {obj.name} is not created by the upgrade script")
        if not re.search(dropped, down):
            problems.append(f"{rel}: {obj.kind} {obj.name} is not removed by the downgrade script")
    return problems
