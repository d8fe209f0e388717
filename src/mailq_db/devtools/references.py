"""Reference check, in the spirit of SSDT's build: every table and column that a
procedure, view, function or trigger names must exist in the tables, views and
functions that sql/ defines.  A typo in a column name fails here, not at the
DBA's deployment.

What is resolved, statement by statement:

* every two-part table name in the project's schemas (mailq, delay) and every
  dbo name that is not a known external object;
* ``alias.Column`` wherever the alias stands for one of our tables, views,
  inline functions, a CTE, a table variable or a ``VALUES`` derived table with
  a column list (aliases of system views, OPENJSON and STRING_SPLIT are not
  resolved: their columns are Microsoft's);
* the column list of ``INSERT``, the targets of ``SET``, the
  ``OUTPUT inserted.X / deleted.X`` columns (against the DML target) and
  ``OUTPUT ... INTO @t (cols)``;
* unqualified columns of a statement that reads exactly one source;
* ``EXEC schema.Procedure @P = ...`` inside modules: the procedure exists, names
  only its parameters, and passes every parameter that has no default.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .sqlmodel import (
    OWN_SCHEMAS,
    Catalog,
    code_children,
    first,
    identifier_text,
    norm,
    parse_file,
    select_output_names,
)

DML = ("select_statement", "update_statement", "delete_statement", "insert_statement", "merge_statement")
UNRESOLVED = object()  # a source whose columns we do not know (system views, OPENJSON, ...)


@dataclass
class Problem:
    path: str
    line: int
    message: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.message}"


def _line(seg) -> int:
    return seg.pos_marker.line_no if seg.pos_marker else 0


def _is_ours(name: str, catalog: Catalog) -> bool:
    parts = norm(name).split(".")
    if len(parts) != 2:
        return False
    return parts[0] in OWN_SCHEMAS or (parts[0] == "dbo" and not parts[1].startswith("sp_"))


class ModuleChecker:
    def __init__(self, path: Path, catalog: Catalog):
        self.path = path
        self.catalog = catalog
        self.problems: list[Problem] = []
        self.tree = parse_file(path).tree
        self.table_vars: dict[str, set[str]] = {}
        self.ctes: dict[str, set[str]] = {}
        self.trigger_table: str | None = None
        # ids of column references that are checked by a special rule, not as plain references
        self._insert_list_ids: set[int] = set()
        self._set_target_ids: set[int] = set()
        self._output_ids: set[int] = set()

    def report(self, seg, message: str) -> None:
        self.problems.append(Problem(str(self.path), _line(seg), message))

    # -- module-wide names -------------------------------------------------

    def collect_locals(self) -> None:
        for decl in self.tree.recursive_crawl("declare_segment"):
            codes = code_children(decl)
            for i, seg in enumerate(codes):
                if seg.raw.startswith("@") and i + 1 < len(codes) and codes[i + 1].raw.upper() == "TABLE":
                    cols = {
                        identifier_text(c.segments[0]).lower()
                        for c in decl.recursive_crawl("column_definition")
                    }
                    self.table_vars[seg.raw.lower()] = cols
        for cte in self.tree.recursive_crawl("common_table_expression"):
            ident = next((c for c in cte.segments if c.type in ("identifier", "quoted_identifier")), None)
            if ident is None:
                continue
            explicit = next((c for c in cte.segments if c.type == "cte_column_list"), None)
            if explicit is not None:
                names = [identifier_text(i).lower() for i in explicit.recursive_crawl("identifier")]
            else:
                select = first(cte, "select_statement")
                names = select_output_names(select) if select is not None else []
            self.ctes[identifier_text(ident).lower()] = set(names)
        trigger = first(self.tree, "create_trigger_statement")
        if trigger is not None:
            self.trigger_table = self.catalog.triggers.get(self._trigger_name(trigger))

    def _trigger_name(self, trigger) -> str:
        ref = next(iter(trigger.recursive_crawl("trigger_reference", "object_reference", "table_reference")), None)
        return norm(ref.raw) if ref is not None else ""

    # -- sources -----------------------------------------------------------

    def columns_of(self, name: str):
        """Columns of a source name, UNRESOLVED when unknown, None when it does not exist."""
        key = norm(name)
        if key.startswith("@"):
            return self.table_vars.get(key, UNRESOLVED)
        if key in ("inserted", "deleted") and self.trigger_table:
            return self.catalog.tables.get(self.trigger_table, UNRESOLVED)
        if key in self.ctes:
            return self.ctes[key]
        if key in self.catalog.tables:
            return self.catalog.tables[key]
        if _is_ours(name, self.catalog):
            if key in self.catalog.objects:
                return UNRESOLVED  # e.g. a queue: its columns are the broker's
            return None
        return UNRESOLVED

    def sources(self, scope) -> dict[str, object]:
        """alias (and bare name) -> column set or UNRESOLVED, for every FROM/JOIN element in scope."""
        found: dict[str, object] = {}
        for element in scope.recursive_crawl("from_expression_element"):
            alias_seg = next((c for c in element.segments if c.type == "alias_expression"), None)
            alias = None
            alias_cols = None
            if alias_seg is not None:
                idents = [c for c in alias_seg.segments if c.type in ("identifier", "quoted_identifier")]
                if idents:
                    alias = identifier_text(idents[0]).lower()
                col_list = next((c for c in alias_seg.segments if c.type == "alias_column_list"), None)
                if col_list is not None:
                    alias_cols = {identifier_text(i).lower() for i in col_list.recursive_crawl("identifier")}
            table_expr = next((c for c in element.segments if c.type == "table_expression"), None)
            bracket = next((c for c in element.segments if c.type == "bracketed"), None)
            cols: object = UNRESOLVED
            if alias_cols is not None:
                cols = alias_cols
            elif table_expr is not None:
                ref = next((c for c in table_expr.segments if c.type == "table_reference"), None)
                func = next((c for c in table_expr.segments if c.type == "function"), None)
                if ref is not None:
                    cols = self.columns_of(ref.raw)
                    if cols is None:
                        self.report(ref, f"{ref.raw} is not a table, view or function defined in sql/")
                        cols = UNRESOLVED
                    alias = alias or norm(ref.raw).split(".")[-1]
                    found.setdefault(norm(ref.raw), cols)
                elif func is not None:
                    fname = next((c for c in func.segments if c.type == "function_name"), None)
                    if fname is not None and "." in fname.raw:
                        cols = self.columns_of(fname.raw)
                        if cols is None:
                            self.report(fname, f"{fname.raw} is not a function defined in sql/")
                            cols = UNRESOLVED
            elif bracket is not None:
                select = first(bracket, "select_statement")
                if select is not None and first(bracket, "values_clause") is None:
                    cols = set(select_output_names(select))
            if alias:
                found[alias] = cols
        return found

    # -- checks ------------------------------------------------------------

    def check_column(self, ref, sources: dict[str, object], select_aliases: set[str]) -> None:
        parts = [identifier_text(p).lower() for p in ref.segments if p.type in ("identifier", "quoted_identifier")]
        if not parts:
            return
        if len(parts) == 1:
            column = parts[0]
            if column.startswith("@") or column in select_aliases:
                return
            resolved = [cols for cols in {id(v): v for v in sources.values()}.values()]
            if len(resolved) == 1 and resolved[0] is not UNRESOLVED and column not in resolved[0]:
                self.report(ref, f"column {ref.raw} does not exist in the only source of this statement")
            return
        qualifier, column = ".".join(parts[:-1]), parts[-1]
        if qualifier not in sources:
            if qualifier in ("inserted", "deleted") and self.trigger_table:
                cols = self.catalog.tables.get(self.trigger_table, UNRESOLVED)
            else:
                self.report(ref, f"{ref.raw}: '{qualifier}' is not a table or alias of this statement")
                return
        else:
            cols = sources[qualifier]
        if cols is not UNRESOLVED and column not in cols:
            self.report(ref, f"column {ref.raw} does not exist in {qualifier}")

    def target_columns(self, stmt, sources):
        """Columns of an INSERT/UPDATE/DELETE target (UNRESOLVED when unknown)."""
        ref = next((c for c in stmt.segments if c.type == "table_reference"), None)
        if ref is None:
            # DELETE FROM t / DELETE TOP (n) a FROM ...: the target is inside the from clause
            ref = next(iter(stmt.recursive_crawl("table_reference")), None)
        if ref is None:
            return UNRESOLVED, None
        key = norm(ref.raw)
        if key in sources:
            return sources[key], ref
        cols = self.columns_of(ref.raw)
        if cols is None:
            self.report(ref, f"{ref.raw} is not a table defined in sql/")
            return UNRESOLVED, ref
        return cols, ref

    def check_statement(self, stmt) -> None:
        sources = self.sources(stmt)
        select_aliases = set()
        for select in [stmt, *stmt.recursive_crawl("select_statement")]:
            if select.type == "select_statement":
                select_aliases.update(select_output_names(select))
        # table references that are not in a FROM element (e.g. UPDATE/INSERT targets)
        for ref in stmt.recursive_crawl("table_reference"):
            if _is_ours(ref.raw, self.catalog) and self.columns_of(ref.raw) is None:
                self.report(ref, f"{ref.raw} is not a table, view or function defined in sql/")
        main = stmt if stmt.type in DML else next((c for c in stmt.segments if c.type in DML), stmt)
        kind = main.type
        if kind in ("update_statement", "insert_statement", "delete_statement", "merge_statement"):
            target_cols, _ = self.target_columns(main, sources)
            if kind == "insert_statement":
                bracket = next((c for c in main.segments if c.type == "bracketed"), None)
                if bracket is not None and target_cols is not UNRESOLVED:
                    for ref in bracket.recursive_crawl("column_reference"):
                        name = identifier_text(ref.segments[-1]).lower()
                        if name not in target_cols:
                            self.report(ref, f"INSERT column {ref.raw} does not exist in the target table")
            for clause in main.recursive_crawl("set_clause"):
                ref = next((c for c in clause.segments if c.type == "column_reference"), None)
                if ref is None:
                    continue
                parts = [p for p in ref.segments if p.type in ("identifier", "quoted_identifier")]
                if len(parts) == 1 and target_cols is not UNRESOLVED:
                    if identifier_text(parts[0]).lower() not in target_cols:
                        self.report(ref, f"SET target {ref.raw} does not exist in the updated table")
            for output in main.recursive_crawl("output_clause"):
                self.check_output(output, target_cols)
        for ref in stmt.recursive_crawl("column_reference"):
            if id(ref) in self._output_ids or id(ref) in self._insert_list_ids:
                continue
            if id(ref) in self._set_target_ids:
                parts = [p for p in ref.segments if p.type in ("identifier", "quoted_identifier")]
                if len(parts) == 1:
                    continue
            self.check_column(ref, sources, select_aliases)

    def check_output(self, output, target_cols) -> None:
        codes = code_children(output)
        for i, seg in enumerate(codes):
            if seg.raw.lower() in ("inserted", "deleted") and i + 2 < len(codes) and codes[i + 1].raw == ".":
                column = identifier_text(codes[i + 2]).lower()
                if column != "*" and target_cols is not UNRESOLVED and column not in target_cols:
                    self.report(seg, f"OUTPUT {seg.raw}.{codes[i + 2].raw} does not exist in the DML target")
            if seg.raw.upper() == "INTO" and i + 1 < len(codes):
                var = codes[i + 1].raw.lower()
                cols = self.table_vars.get(var) if var.startswith("@") else self.columns_of(codes[i + 1].raw)
                bracket = codes[i + 2] if i + 2 < len(codes) and codes[i + 2].type == "bracketed" else None
                if bracket is not None and cols not in (None, UNRESOLVED):
                    for ref in bracket.recursive_crawl("column_reference"):
                        if identifier_text(ref.segments[-1]).lower() not in cols:
                            self.report(ref, f"OUTPUT INTO column {ref.raw} does not exist in {codes[i + 1].raw}")

    def check_exec(self, stmt) -> None:
        ref = next((c for c in stmt.segments if c.type == "object_reference"), None)
        if ref is None or not _is_ours(ref.raw, self.catalog):
            return
        name = norm(ref.raw)
        if name.split(".")[1].startswith("sp_"):
            return
        proc = self.catalog.procedures.get(name)
        if proc is None:
            self.report(ref, f"EXEC {ref.raw}: no such procedure in sql/")
            return
        codes = code_children(stmt)
        given = {
            codes[i].raw.lower()
            for i in range(len(codes) - 1)
            if codes[i].raw.startswith("@") and codes[i + 1].raw == "="
        }
        for param in sorted(given - set(proc.parameters)):
            self.report(ref, f"EXEC {ref.raw}: {param} is not a parameter of the procedure")
        for param, has_default in proc.parameters.items():
            if not has_default and param not in given:
                self.report(ref, f"EXEC {ref.raw}: required parameter {param} is missing")

    def run(self) -> list[Problem]:
        if self.tree is None:
            return self.problems
        self.collect_locals()
        for stmt in self.tree.recursive_crawl("insert_statement"):
            bracket = next((c for c in stmt.segments if c.type == "bracketed"), None)
            if bracket is not None:
                self._insert_list_ids.update(id(r) for r in bracket.recursive_crawl("column_reference"))
        for clause in self.tree.recursive_crawl("set_clause"):
            ref = next((c for c in clause.segments if c.type == "column_reference"), None)
            if ref is not None:
                self._set_target_ids.add(id(ref))
        for output in self.tree.recursive_crawl("output_clause"):
            self._output_ids.update(id(r) for r in output.recursive_crawl("column_reference"))
        for stmt in self._outermost(self.tree):
            self.check_statement(stmt)
        for stmt in self.tree.recursive_crawl("execute_script_statement"):
            self.check_exec(stmt)
        return self.problems

    def _outermost(self, seg):
        """Outermost DML statements (a WITH statement counts as one, with its CTEs)."""
        for child in seg.segments:
            if child.type == "with_compound_statement":
                yield child
            elif child.type in DML:
                yield child
            else:
                yield from self._outermost(child)


def check_module(path: Path, catalog: Catalog) -> list[Problem]:
    """Every unresolved reference of one module file (each reported once)."""
    seen, unique = set(), []
    for problem in ModuleChecker(path, catalog).run():
        key = (problem.line, problem.message)
        if key not in seen:
            seen.add(key)
            unique.append(problem)
    return unique
