"""Reading the project's T-SQL with sqlfluff: parse trees, and the catalog of what sql/ defines.

Used by the static checks (tests/static/): parse and lint, the reference
check (every table and column a module names exists), and the EXEC contract
(every EXEC names an existing procedure and its parameters).  Needs the
``test`` extra (sqlfluff); the project's sqlfluff plugin adds Service Broker
statements to the ``tsql`` dialect.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

from ..deployment import strip_comments

#: Schemas whose objects must all be defined in sql/ (dbo objects are checked
#: only when sql/ defines at least one dbo object of that name's kind).
OWN_SCHEMAS = ("mailq", "delay")

#: Objects that exist in a deployed database without being defined in sql/.
EXTERNAL_TABLES: dict[str, set[str]] = {
    # Alembic's version table (alembic/env.py: version_table).
    "dbo.mailq_alembic_version": {"version_num"},
}


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


def parse_file(path: Path):
    return parse_text(Path(path).read_text(encoding="utf-8"))


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
# Tree helpers
# --------------------------------------------------------------------------


def children(seg, *types: str):
    return [c for c in seg.segments if not types or c.type in types]


def first(seg, *types: str):
    for c in seg.recursive_crawl(*types):
        return c
    return None


def code_children(seg):
    return [c for c in seg.segments if c.is_code]


def identifier_text(seg) -> str:
    return seg.raw.strip().strip("[]").strip('"')


def main_select(stmt):
    """The outermost SELECT of a view or function body (not one inside a CTE)."""
    with_stmt = first(stmt, "with_compound_statement")
    if with_stmt is not None:
        return next((c for c in with_stmt.segments if c.type == "select_statement"), None)
    return first(stmt, "select_statement")


def select_output_names(select) -> list[str]:
    """Column names a SELECT produces (aliases, else the referenced column's last part)."""
    names = []
    clause = next((c for c in select.segments if c.type == "select_clause"), None)
    if clause is None:
        return names
    for element in clause.segments:
        if element.type != "select_clause_element":
            continue
        alias = next((c for c in element.segments if c.type == "alias_expression"), None)
        if alias is not None:
            ident = [c for c in alias.segments if c.type in ("identifier", "quoted_identifier")]
            if ident:
                names.append(identifier_text(ident[-1]).lower())
                continue
        # "@x = expr" assignments and "Name = expr" aliases
        codes = code_children(element)
        if len(codes) >= 3 and codes[1].raw == "=" and not codes[0].raw.startswith("@"):
            names.append(identifier_text(codes[0]).lower())
            continue
        ref = next((c for c in element.segments if c.type == "column_reference"), None)
        if ref is not None:
            names.append(identifier_text(ref.segments[-1]).lower())
    return names


# --------------------------------------------------------------------------
# The catalog of sql/
# --------------------------------------------------------------------------


@dataclass
class Procedure:
    name: str
    parameters: dict[str, bool]  # lower-case name (with @) -> has a default
    path: str


@dataclass
class Catalog:
    tables: dict[str, set[str]] = field(default_factory=dict)  # tables, views, TVFs: columns
    procedures: dict[str, Procedure] = field(default_factory=dict)
    objects: set[str] = field(default_factory=set)  # every created object (queues, services, ...)
    triggers: dict[str, str] = field(default_factory=dict)  # trigger -> its table

    def has_table(self, name: str) -> bool:
        return norm(name) in self.tables


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
    depth, current, pieces = 0, [], []
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
        params[name] = "=" in piece
    return norm(match.group("name")), params


def _table_columns(stmt) -> list[str]:
    cols = []
    for bracket in stmt.segments:
        if bracket.type != "bracketed":
            continue
        for coldef in bracket.recursive_crawl("column_definition"):
            ident = next((c for c in coldef.segments if c.type in ("identifier", "quoted_identifier")), None)
            if ident is not None:
                cols.append(identifier_text(ident).lower())
        break
    return cols


def build_catalog(sql_root: Path) -> Catalog:
    from ..deployment import describe

    catalog = Catalog(tables={k: set(v) for k, v in EXTERNAL_TABLES.items()})
    for path in sorted(Path(sql_root).rglob("*.sql")):
        text = path.read_text(encoding="utf-8")
        tree = parse_file(path).tree
        obj = describe(text)
        if obj.name:
            catalog.objects.add(norm(obj.name))
        if tree is None:
            continue
        for stmt in tree.recursive_crawl("create_table_statement"):
            ref = first(stmt, "table_reference")
            if ref is not None and not ref.raw.startswith("#"):
                catalog.tables.setdefault(norm(ref.raw), set()).update(_table_columns(stmt))
        for stmt in tree.recursive_crawl("alter_table_statement"):
            ref = first(stmt, "table_reference")
            if ref is None:
                continue
            cols = catalog.tables.setdefault(norm(ref.raw), set())
            for coldef in stmt.recursive_crawl("column_definition"):
                ident = next((c for c in coldef.segments if c.type in ("identifier", "quoted_identifier")), None)
                if ident is not None:
                    cols.add(identifier_text(ident).lower())
        for stmt in tree.recursive_crawl("create_view_statement"):
            ref = next(iter(stmt.recursive_crawl("table_reference", "object_reference")), None)
            select = main_select(stmt)
            if ref is not None and select is not None:
                catalog.tables[norm(ref.raw)] = set(select_output_names(select))
        for stmt in tree.recursive_crawl("create_function_statement"):
            ref = next(iter(stmt.recursive_crawl("function_name", "object_reference")), None)
            select = main_select(stmt)
            if ref is not None and select is not None:
                catalog.tables[norm(ref.raw)] = set(select_output_names(select))
        for stmt in tree.recursive_crawl("create_trigger_statement"):
            refs = list(stmt.recursive_crawl("trigger_reference", "object_reference", "table_reference"))
            if len(refs) >= 2:
                catalog.triggers[norm(refs[0].raw)] = norm(refs[1].raw)
        signature = procedure_signature(text)
        if signature is not None:
            name, params = signature
            catalog.procedures[name] = Procedure(name, params, str(path))
    return catalog


def module_files(sql_root: Path) -> Iterator[Path]:
    """Files that hold a procedure, view, function or trigger."""
    from ..deployment import describe

    for path in sorted(Path(sql_root).rglob("*.sql")):
        if describe(path.read_text(encoding="utf-8")).kind in ("procedure", "view", "function", "trigger"):
            yield path
