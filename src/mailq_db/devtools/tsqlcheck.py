"""Microsoft's own T-SQL parser (ScriptDom ``TSql150Parser``) and DacFx model
validation (what SSDT and sqlpackage run at build time), with no SQL Server.

The C# tool ``tools/tsqlcheck/TsqlCheck.cs`` is compiled with Mono's ``mcs``
against the .NET Standard 2.0 assemblies bundled in the PyPI wheel
``mssql-cli==1.0.0`` and run with ``mono``; it prints JSON lines.  This module
fetches the wheel (``pip download``, pinned by SHA-256) into
``.cache/tsqlcheck/`` inside the checkout (ignored by git), unzips only the
assemblies it needs, builds the tool once per source hash, runs it, and
classifies DacFx's unresolved references against the reviewed allow-list
``tools/tsqlcheck/allowlist.txt``.

    python -m mailq_db.devtools.tsqlcheck prepare    # what .ci/run does
    python -m mailq_db.devtools.tsqlcheck parse FILE...
    python -m mailq_db.devtools.tsqlcheck model Sql150|SqlAzure FILE...

Where Mono or the wheel cannot be had, :func:`build` raises
:class:`Unavailable` with one reason, and the static tests skip with it.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path

from ..deployment import project_root

WHEEL_REQUIREMENT = "mssql-cli==1.0.0"
WHEEL_NAME = "mssql_cli-1.0.0-py2.py3-none-manylinux1_x86_64.whl"
WHEEL_SHA256 = "edb3850ab8ffa077c64270f27263f6377fdb5bd5bb5c5b4990c5fb08f49627b6"
WHEEL_BIN = "mssqlcli/mssqltoolsservice/bin/"
#: The assemblies the tool references or DacFx loads on Mono (nothing else is unzipped).
ASSEMBLIES = (
    "Microsoft.SqlServer.TransactSql.ScriptDom.dll",
    "Microsoft.SqlServer.Dac.dll",
    "Microsoft.SqlServer.Dac.Extensions.dll",
    "Microsoft.Data.Tools.Schema.Sql.dll",
    "Microsoft.Data.Tools.Utilities.dll",
    "System.Drawing.Common.dll",
    "System.IO.Packaging.dll",
    "System.Data.SqlClient.dll",
)
#: Mono's facades that let mcs compile against .NET Standard 2.0 assemblies.
FACADES = ("netstandard.dll", "System.Runtime.dll")
COMPILE_REFERENCES = (
    "Microsoft.SqlServer.TransactSql.ScriptDom.dll",
    "Microsoft.SqlServer.Dac.dll",
    "Microsoft.SqlServer.Dac.Extensions.dll",
)
SKIP_PREFIX = "Microsoft ScriptDom/DacFx checks need Mono (mono, mcs) and the PyPI wheel mssql-cli==1.0.0"
REQUIRE_ENV = "MAILQ_REQUIRE_TSQLCHECK"


class Unavailable(RuntimeError):
    """Mono or the wheel cannot be had on this machine (the message says which)."""


def source_dir(root: Path | None = None) -> Path:
    return (root or project_root()) / "tools" / "tsqlcheck"


def cache_dir(root: Path | None = None) -> Path:
    return (root or project_root()) / ".cache" / "tsqlcheck"


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _facade_dir() -> Path | None:
    for candidate in ("/usr/lib/mono/4.5/Facades", "/usr/lib/mono/4.7.2-api/Facades"):
        if all((Path(candidate) / f).is_file() for f in FACADES):
            return Path(candidate)
    return None


def fetch_wheel(root: Path | None = None) -> Path:
    """The wheel in the cache, downloaded with pip if absent; its hash is checked."""
    wheel_dir = cache_dir(root) / "wheel"
    wheel = wheel_dir / WHEEL_NAME
    if not wheel.is_file():
        wheel_dir.mkdir(parents=True, exist_ok=True)
        try:
            result = subprocess.run(
                # bounded: an offline machine learns it in about a minute, then skips
                [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
                 "--timeout", "30", "--retries", "1", "-q", WHEEL_REQUIREMENT, "-d", str(wheel_dir)],
                capture_output=True, text=True, timeout=600,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise Unavailable(f"`pip download {WHEEL_REQUIREMENT}` failed ({exc})") from exc
        if result.returncode != 0 or not wheel.is_file():
            tail = (result.stderr or result.stdout).strip().splitlines()[-1:] or ["no output"]
            raise Unavailable(f"`pip download {WHEEL_REQUIREMENT}` failed: {tail[0]}")
    digest = _sha256(wheel)
    if digest != WHEEL_SHA256:
        wheel.unlink()
        raise Unavailable(f"{WHEEL_NAME} has SHA-256 {digest}, expected {WHEEL_SHA256}")
    return wheel


def build(root: Path | None = None) -> Path:
    """The compiled tool (``.cache/tsqlcheck/build/tsqlcheck-<hash>.exe``), built if needed."""
    root = root or project_root()
    for tool in ("mono", "mcs"):
        if shutil.which(tool) is None:
            raise Unavailable(f"no `{tool}` on PATH (Debian: apt-get install mono-devel)")
    facades = _facade_dir()
    if facades is None:
        raise Unavailable("Mono's 4.5 facades (netstandard.dll, System.Runtime.dll) are missing")
    source = source_dir(root) / "TsqlCheck.cs"
    if not source.is_file():
        raise Unavailable(f"{source} is missing (the tool is built from a source checkout)")
    out_dir = cache_dir(root) / "build"
    exe = out_dir / f"tsqlcheck-{_sha256(source)[:12]}.exe"
    if exe.is_file() and all((out_dir / a).is_file() for a in ASSEMBLIES):
        return exe
    wheel = fetch_wheel(root)
    out_dir.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(wheel) as zf:
        for name in ASSEMBLIES:
            (out_dir / name).write_bytes(zf.read(WHEEL_BIN + name))
    for old in out_dir.glob("tsqlcheck-*.exe"):
        old.unlink()
    refs = [f"-r:{facades / f}" for f in FACADES] + [f"-r:{out_dir / a}" for a in COMPILE_REFERENCES]
    tmp = exe.with_suffix(".tmp")
    result = subprocess.run(["mcs", "-nologo", "-target:exe", f"-out:{tmp}", *refs, str(source)],
                            capture_output=True, text=True, timeout=300)
    if result.returncode != 0:
        # A compile error is a defect of the tool, never a reason to skip.
        raise RuntimeError(f"mcs failed to compile {source}:\n{result.stdout}{result.stderr}")
    tmp.replace(exe)
    return exe


_AVAILABLE: dict[Path, Path | str] = {}


def tool_or_reason(root: Path | None = None) -> tuple[Path | None, str | None]:
    """(the tool, None) or (None, the one skip reason), computed once per checkout."""
    root = root or project_root()
    if root not in _AVAILABLE:
        try:
            _AVAILABLE[root] = build(root)
        except Unavailable as exc:
            _AVAILABLE[root] = f"{SKIP_PREFIX}: {exc}"
    value = _AVAILABLE[root]
    return (value, None) if isinstance(value, Path) else (None, value)


def run(args: list[str], root: Path | None = None) -> list[dict]:
    """Run the tool; its JSON lines as dicts."""
    exe = build(root)
    result = subprocess.run(["mono", str(exe), *args], capture_output=True, text=True, timeout=600,
                            encoding="utf-8")
    if result.returncode != 0:
        raise RuntimeError(f"tsqlcheck {args[:1]} failed ({result.returncode}):\n{result.stderr[-3000:]}")
    return [json.loads(line) for line in result.stdout.splitlines() if line.strip()]


def parse(files: list[Path], root: Path | None = None) -> dict[str, list[dict]]:
    """file -> ScriptDom TSql150Parser errors (empty when it parses)."""
    return {r["source"]: r["errors"] for r in run(["parse", *map(str, files)], root)}


def preprocess(files: list[Path], root: Path | None = None) -> list[dict]:
    return run(["preprocess", *map(str, files)], root)


def model(target: str, files: list[Path], root: Path | None = None) -> list[dict]:
    """Preprocess records, DacFx validation messages and a summary, for a model of ``files``."""
    return run(["model", target, *map(str, files)], root)


# --------------------------------------------------------------------------
# DacFx messages
# --------------------------------------------------------------------------

#: SQL71501 (error) / SQL71502 (warning): an unresolved reference.
UNRESOLVED = (71501, 71502)
_HAS = re.compile(r"has an unresolved reference to object (?P<name>.+?)\.$")
_ANY = re.compile(r"could refer to any of the following objects: (?P<names>.+?)\.$")
_PART = re.compile(r"\[((?:[^\]]|\]\])*)\]")
_ELEMENT = re.compile(r"Error validating element (?P<name>\S+?):")


def referenced_objects(message: str) -> list[str]:
    """The objects (``schema.name``, lower case) an unresolved-reference message may mean.

    ``[sys].[databases].[d]::[name]`` and ``[sys].[sp_getapplock].[@LockMode]``
    both name the object ``sys.databases`` / ``sys.sp_getapplock``.
    """
    match = _HAS.search(message)
    if match:
        candidates = [match.group("name")]
    else:
        match = _ANY.search(message)
        if not match:
            return []
        candidates = re.split(r", | or ", match.group("names"))
    objects = []
    for candidate in candidates:
        parts = _PART.findall(candidate.split("::")[0])
        if len(parts) == 1:
            objects.append(parts[0].lower())
        elif parts:
            objects.append(".".join(parts[:2]).lower())
    return objects


def element(message: str) -> str:
    match = _ELEMENT.search(message)
    return match.group("name") if match else ""


@dataclass(frozen=True)
class Allowed:
    name: str
    why: str


def allowlist(root: Path | None = None) -> dict[str, Allowed]:
    """``tools/tsqlcheck/allowlist.txt``: ``name  # why`` per line."""
    entries = {}
    for line in (source_dir(root) / "allowlist.txt").read_text(encoding="utf-8").splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        name, _, why = line.partition("#")
        entries[name.strip().lower()] = Allowed(name.strip().lower(), why.strip())
    return entries


_ALIAS_COLUMN = re.compile(r"^\[(?P<schema>[^\]]+)\]\.\[(?P<table>[^\]]+)\]\.\[[^\]]+\]::\[(?P<column>[^\]]+)\]$")
_TABLE_DDL = re.compile(r"\b(?:CREATE|ALTER)\s+TABLE\s+\[?(?P<schema>\w+)\]?\.\[?(?P<table>\w+)\]?", re.I)


def table_texts(files: list[Path]) -> dict[str, str]:
    """``schema.table`` (lower case) -> the text of every file that creates or alters it."""
    texts: dict[str, str] = {}
    for path in files:
        text = path.read_text(encoding="utf-8")
        for match in _TABLE_DDL.finditer(text):
            key = f"{match.group('schema')}.{match.group('table')}".lower()
            texts[key] = texts.get(key, "") + "\n" + text
    return texts


def _spurious(candidate: str, tables: dict[str, str]) -> bool:
    """DacFx, unable to resolve a column of an unresolved ``sys`` view, also offers
    ``[schema].[table].[alias]::[column]`` for every project table in scope (a CTE's
    or a correlated subquery's).  Such a candidate is dismissed only when the
    project table cannot have that column: its name appears nowhere in the DDL
    of that table (a conservative test: any mention keeps the candidate)."""
    match = _ALIAS_COLUMN.match(candidate.strip())
    if not match:
        return False
    key = f"{match.group('schema')}.{match.group('table')}".lower()
    if key not in tables:
        return False
    return not re.search(rf"\b{re.escape(match.group('column'))}\b", tables[key], re.I)


def classify(records: list[dict], allowed: dict[str, Allowed],
             tables: dict[str, str] | None = None) -> tuple[list[dict], set[str]]:
    """(problems, allow-list entries used): every model message that is not an
    unresolved reference to allow-listed objects only is a problem.  With
    ``tables`` (:func:`table_texts`), spurious alias candidates on project
    tables are dismissed first (see :func:`_spurious`)."""
    problems, used = [], set()
    for rec in records:
        if rec.get("kind") == "parse" and rec.get("errors"):
            problems.append(rec)
        if rec.get("kind") != "model":
            continue
        names = []
        if rec["number"] in UNRESOLVED:
            message = rec["message"]
            if tables:
                match = _ANY.search(message)
                if match:
                    kept = [c for c in re.split(r", | or ", match.group("names")) if not _spurious(c, tables)]
                    message = message[:match.start("names")] + " or ".join(kept) + "."
            names = referenced_objects(message)
        if names and all(n in allowed for n in names):
            used.update(names)
            continue
        problems.append(rec)
    return problems, used


def describe_problem(rec: dict) -> str:
    if rec.get("kind") == "parse":
        return f"{rec['source']}: parse errors {rec['errors']}"
    return f"SQL{rec['number']} ({rec['severity']}): {rec['message']}"


# --------------------------------------------------------------------------
# Command line (used by .ci/run)
# --------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in ("prepare", "parse", "preprocess", "model"):
        print(__doc__, file=sys.stderr)
        return 2
    if argv[0] == "prepare":
        start = time.monotonic()
        try:
            exe = build()
        except Unavailable as exc:
            print(f"tsqlcheck: {SKIP_PREFIX}: {exc} (its static tests will skip)", file=sys.stderr)
            return 0 if os.environ.get(REQUIRE_ENV) != "1" else 1
        print(f"tsqlcheck: {exe} ready in {time.monotonic() - start:.1f}s")
        return 0
    for rec in run(argv):
        print(json.dumps(rec, ensure_ascii=False))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
