"""EXEC contract, the part no Microsoft tool can check:

* every ``EXEC`` the Python layer sends names a procedure defined in sql/, only
  its parameters, and every parameter that has no default (DacFx never sees
  Python);
* every ``EXEC`` inside a sql/ module passes every parameter of the callee that
  has no default.  DacFx's model (tests/static/test_tsqlcheck.py) already
  proves that such an EXEC names an existing procedure and only its
  parameters (SQL71501/SQL71502), but not that a required parameter is
  passed: SQL Server reports that only when the EXEC runs (error 201).
  See docs/static-proof.md ("one authority per question").

The SQL texts are read from the Python sources with :mod:`ast` (string
constants; adjacent literals are already joined by the parser).  An f-string
or ``%``/``.format`` template that contains ``EXEC`` cannot be checked and is
reported as a problem: the wrappers keep literal SQL on purpose.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from ..deployment import code_only, describe
from .sqlmodel import norm, procedure_signature

_EXEC = re.compile(r"\bEXEC(?:UTE)?\s+(?P<name>[\w\[\]]+\.[\w\[\]]+)(?P<args>[^;]*)", re.I)
_ARG = re.compile(r"(@\w+)\s*=")


def procedures(sql_root: Path) -> dict[str, dict[str, bool]]:
    """name -> {@param: has_default} for every procedure file under ``sql_root``."""
    found = {}
    for path in Path(sql_root).rglob("*.sql"):
        signature = procedure_signature(path.read_text(encoding="utf-8"))
        if signature:
            found[signature[0]] = signature[1]
    return found


def exec_texts(source: str, filename: str = "<source>") -> list[tuple[int, str, bool]]:
    """(line, text, checkable) for every string in ``source`` that contains EXEC."""
    found = []
    tree = ast.parse(source, filename)
    docstrings = {
        id(body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        and (body := node.body)
        and isinstance(body[0], ast.Expr)
        and isinstance(body[0].value, ast.Constant)
    }
    for node in ast.walk(tree):
        if id(node) in docstrings:
            continue
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and _EXEC.search(node.value):
            found.append((node.lineno, node.value, True))
        elif isinstance(node, ast.JoinedStr):
            literal = "".join(str(v.value) if isinstance(v, ast.Constant) else "_expr_" for v in node.values)
            names = [norm(m.group("name")) for m in _EXEC.finditer(literal)]
            if any(not n.startswith("sys.") for n in names):
                found.append((node.lineno, literal, False))
    return found


def check_source(source: str, filename: str, procs: dict[str, dict[str, bool]]) -> list[str]:
    problems = []
    for line, text, checkable in exec_texts(source, filename):
        where = f"{filename}:{line}"
        if not checkable:
            problems.append(f"{where}: EXEC built with an f-string cannot be checked; use a literal SQL text")
            continue
        for match in _EXEC.finditer(text):
            name = norm(match.group("name"))
            if name.startswith("sys."):
                continue
            if name not in procs:
                problems.append(f"{where}: EXEC {match.group('name')}: no such procedure in sql/")
                continue
            given = [a.lower() for a in _ARG.findall(match.group("args"))]
            if len(given) != len(set(given)):
                problems.append(f"{where}: EXEC {match.group('name')}: a parameter is given twice")
            for param in given:
                if param not in procs[name]:
                    problems.append(f"{where}: EXEC {match.group('name')}: {param} is not a parameter")
            for param, has_default in procs[name].items():
                if not has_default and param not in given:
                    problems.append(f"{where}: EXEC {match.group('name')}: required {param} is not passed")
    return problems


def check_tree(src_root: Path, sql_root: Path) -> tuple[list[str], int]:
    """Problems of every .py file under ``src_root``, and how many EXEC texts were checked."""
    procs = procedures(sql_root)
    problems, checked = [], 0
    for path in sorted(Path(src_root).rglob("*.py")):
        source = path.read_text(encoding="utf-8")
        checked += sum(len(_EXEC.findall(t)) for _, t, ok in exec_texts(source, str(path)) if ok)
        problems += check_source(source, str(path), procs)
    return problems, checked


#: An EXEC inside T-SQL, optionally with a return-code variable (``EXEC @rc = x.y``).
_SQL_EXEC = re.compile(
    r"\bEXEC(?:UTE)?\s+(?:@\w+\s*=\s*)?(?P<name>[\w\[\]]+\.[\w\[\]]+)(?P<args>[^;]*)", re.I
)


def check_sql(sql: str, filename: str, procs: dict[str, dict[str, bool]]) -> list[str]:
    """Required parameters missing from the EXECs of one module (comments and
    string literals are not code: ``N'EXEC ...'`` is never read)."""
    problems = []
    code = code_only(sql)
    for match in _SQL_EXEC.finditer(code):
        name = norm(match.group("name"))
        if name.startswith("sys.") or name not in procs:
            continue  # system procedures; unknown names are DacFx's (SQL71501/SQL71502)
        line = code.count("\n", 0, match.start()) + 1
        given = {a.lower() for a in _ARG.findall(match.group("args"))}
        for param, has_default in procs[name].items():
            if not has_default and param not in given:
                problems.append(f"{filename}:{line}: EXEC {match.group('name')}: required {param} is not passed")
    return problems


def check_sql_tree(sql_root: Path) -> tuple[list[str], int]:
    """Problems of every procedure, function, trigger and view under ``sql_root``,
    and how many EXECs of sql/ procedures were checked."""
    procs = procedures(sql_root)
    problems, checked = [], 0
    for path in sorted(Path(sql_root).rglob("*.sql")):
        sql = path.read_text(encoding="utf-8")
        if describe(sql).kind not in ("procedure", "function", "trigger", "view"):
            continue
        checked += sum(1 for m in _SQL_EXEC.finditer(code_only(sql)) if norm(m.group("name")) in procs)
        problems += check_sql(sql, str(path), procs)
    return problems, checked
