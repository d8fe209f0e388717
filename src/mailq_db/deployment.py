"""Deploy the frozen SQL of each Alembic revision ("replaceable objects", made mechanical).

How it works (docs/CONVENTIONS.md, "Adding or changing SQL"):

* ``sql/`` holds the current text of every object, one object per file, and
  ``sql/BuildOrder.txt`` the order in which they deploy.
* Each revision ``NNNN`` has a folder ``alembic/frozen/NNNN/`` holding a copy of
  every ``sql/`` file it deploys and ``FILES``, their order.  The copies are
  made by ``mailq-db dev new-revision`` and never edited by hand: their SHA-256
  hashes are pinned in ``alembic/frozen/MANIFEST.sha256``.
* Upgrading revision N executes its frozen files in order, one batch each.
* Downgrading revision N walks its files backwards: a file that an earlier
  revision also froze is restored from the newest earlier copy; a file that N
  introduced is removed with the ``DROP`` derived from its first ``CREATE``.
  Grant files are revoked statement by statement first.

A migration never reads the live ``sql/`` folder, so an old revision always
replays the SQL it was released with.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable

PACKAGE_DIR = Path(__file__).resolve().parent
BUNDLE_DIR = PACKAGE_DIR / "_bundle"  # present in the installed wheel only
VERSION_TABLE = "mailq_alembic_version"

#: Sent before every revision's batches.  Modules keep the SET options of the
#: session that creates them, and DML on a table with a filtered index fails
#: (error 1934) unless QUOTED_IDENTIFIER and ANSI_NULLS are ON; sqlcmd runs
#: with QUOTED_IDENTIFIER OFF unless given -I, so the script sets them itself.
SESSION_OPTIONS = "SET ANSI_NULLS, QUOTED_IDENTIFIER ON"


def project_root() -> Path:
    """Where sql/, alembic/ and alembic.ini live: the wheel's bundle or the checkout."""
    if (BUNDLE_DIR / "alembic.ini").is_file():
        return BUNDLE_DIR
    return PACKAGE_DIR.parents[1]


def sql_dir(root: Path | None = None) -> Path:
    return (root or project_root()) / "sql"


def alembic_dir(root: Path | None = None) -> Path:
    return (root or project_root()) / "alembic"


def frozen_dir(root: Path | None = None) -> Path:
    return alembic_dir(root) / "frozen"


def alembic_ini(root: Path | None = None) -> Path:
    return (root or project_root()) / "alembic.ini"


# --------------------------------------------------------------------------
# Reading SQL files
# --------------------------------------------------------------------------

_STRING = re.compile(r"N?'(?:[^']|'')*'")


def strip_comments(sql: str) -> str:
    """SQL without comments (string literals kept)."""
    out, pos = [], 0
    pattern = re.compile(r"/\*.*?\*/|--[^\n]*|N?'(?:[^']|'')*'", re.S)
    for match in pattern.finditer(sql):
        token = match.group(0)
        out.append(sql[pos : match.start()])
        out.append(token if token.startswith(("'", "N'")) else " ")
        pos = match.end()
    out.append(sql[pos:])
    return "".join(out)


def code_only(sql: str) -> str:
    """SQL without comments and with every string literal emptied (``''``):
    what remains are statements, never words inside messages."""
    return _STRING.sub("''", strip_comments(sql))


def statement_text(sql: str) -> str:
    """The text sent as one batch: trailing white space and one trailing ``;`` removed.

    Alembic's offline renderer appends its own ``;`` to every statement, so a
    module that ends in ``END;`` would otherwise render as ``END;;``.
    """
    text = sql.rstrip()
    if text.endswith(";"):
        text = text[:-1].rstrip()
    return text


_NAME = r"(?:\[[^\]]+\]|[A-Za-z_#@][\w@$#]*)(?:\s*\.\s*(?:\[[^\]]+\]|[A-Za-z_][\w@$#]*))*"
_CREATE = re.compile(
    r"\bCREATE\s+(?:OR\s+ALTER\s+)?"
    r"(?P<kind>PROCEDURE|PROC|VIEW|FUNCTION|TRIGGER|TABLE|SCHEMA|ROLE|QUEUE|SERVICE|CONTRACT"
    r"|MESSAGE\s+TYPE|(?:UNIQUE\s+)?(?:NONCLUSTERED\s+|CLUSTERED\s+)?INDEX)\s+"
    rf"(?P<name>{_NAME})(?:\s+ON\s+(?P<parent>{_NAME}))?",
    re.I,
)
_GRANT = re.compile(r"^\s*GRANT\s+(?P<body>.+?)\s+TO\s+(?P<grantee>[^;]+?)\s*;?\s*$", re.I | re.M)


@dataclass(frozen=True)
class SqlObject:
    """What a file creates: kind (``procedure``, ``table``, ``index``...), name, parent."""

    kind: str
    name: str
    parent: str | None = None


def describe(sql: str) -> SqlObject:
    """The object a file creates, from its first ``CREATE`` (``grant`` or ``script`` otherwise)."""
    code = code_only(sql)
    match = _CREATE.search(code)
    if match is None:
        return SqlObject("grant" if _GRANT.search(code) else "script", "")
    kind = re.sub(r"\s+", " ", match.group("kind").upper())
    if kind.endswith("INDEX"):
        kind = "INDEX"
    kind = {"PROC": "PROCEDURE"}.get(kind, kind).lower()
    parent = match.group("parent") if kind in ("index", "trigger", "queue") else None
    if kind == "queue":
        parent = None  # "ON filegroup" is not a parent object
    return SqlObject(kind, re.sub(r"\s+", "", match.group("name")), parent)


def _unbracket(name: str) -> str:
    return name[1:-1] if name.startswith("[") and name.endswith("]") else name


def drop_statement(obj: SqlObject) -> str | None:
    """The batch that removes ``obj`` (``None`` when there is nothing to drop)."""
    n = obj.name
    simple = {
        "procedure": f"DROP PROCEDURE IF EXISTS {n}",
        "view": f"DROP VIEW IF EXISTS {n}",
        "function": f"DROP FUNCTION IF EXISTS {n}",
        "trigger": f"DROP TRIGGER IF EXISTS {n}",
        "table": f"DROP TABLE IF EXISTS {n}",
        "schema": f"DROP SCHEMA IF EXISTS {n}",
        "index": f"DROP INDEX IF EXISTS {n} ON {obj.parent}",
    }
    if obj.kind in simple:
        return simple[obj.kind]
    literal = _unbracket(n.split(".")[-1]).replace("'", "''")
    if obj.kind == "role":
        # A role with members cannot be dropped: remove the members first.
        return (
            f"IF DATABASE_PRINCIPAL_ID(N'{literal}') IS NOT NULL\n"
            "BEGIN\n"
            "    DECLARE @DropMembers NVARCHAR(MAX) = N'';\n"
            f"    SELECT @DropMembers += N'ALTER ROLE {n} DROP MEMBER ' + QUOTENAME(m.name) + N';'\n"
            "    FROM sys.database_role_members AS rm\n"
            "    INNER JOIN sys.database_principals AS m ON m.principal_id = rm.member_principal_id\n"
            f"    WHERE rm.role_principal_id = DATABASE_PRINCIPAL_ID(N'{literal}');\n"
            "    EXEC sys.sp_executesql @DropMembers;\n"
            f"    DROP ROLE {n};\n"
            "END"
        )
    catalog = {
        "queue": ("sys.service_queues", "QUEUE", "object_id = OBJECT_ID(N'{full}')"),
        "service": ("sys.services", "SERVICE", "name = N'{lit}'"),
        "contract": ("sys.service_contracts", "CONTRACT", "name = N'{lit}'"),
        "message type": ("sys.service_message_types", "MESSAGE TYPE", "name = N'{lit}'"),
    }
    if obj.kind in catalog:
        view, keyword, predicate = catalog[obj.kind]
        where = predicate.format(full=n.replace("'", "''"), lit=literal)
        return f"IF EXISTS (SELECT 1 FROM {view} WHERE {where})\n    DROP {keyword} {n}"
    return None


def revoke_statements(sql: str) -> list[str]:
    """``REVOKE`` statements undoing every ``GRANT`` in a grant file."""
    code = strip_comments(sql)
    return [f"REVOKE {m.group('body')} FROM {m.group('grantee')}" for m in _GRANT.finditer(code)]


# --------------------------------------------------------------------------
# Build order, frozen copies, manifest
# --------------------------------------------------------------------------


def build_order(root: Path | None = None) -> list[str]:
    """Files of ``sql/BuildOrder.txt`` (relative to ``sql/``), comments and blanks skipped."""
    lines = (sql_dir(root) / "BuildOrder.txt").read_text(encoding="utf-8").splitlines()
    return [ln.strip() for ln in lines if ln.strip() and not ln.strip().startswith("#")]


def revisions(root: Path | None = None) -> list[str]:
    """Revision IDs that have a frozen folder, oldest first (IDs are zero-padded numbers)."""
    base = frozen_dir(root)
    if not base.is_dir():
        return []
    return sorted(p.name for p in base.iterdir() if p.is_dir() and p.name.isdigit())


def head_revision(root: Path | None = None) -> str | None:
    revs = revisions(root)
    return revs[-1] if revs else None


def revision_files(revision: str, root: Path | None = None) -> list[str]:
    text = (frozen_dir(root) / revision / "FILES").read_text(encoding="utf-8")
    return [ln.strip() for ln in text.splitlines() if ln.strip()]


#: First line of every frozen copy (added by ``mailq-db dev new-revision``/``refreeze``
#: and ``mailq-db dev mark-generated``): it tells readers and tools that the file is
#: a generated copy.  It is never deployed: :func:`frozen_text` strips it.
GENERATED_MARKER = "-- GENERATED"


def strip_generated_marker(text: str) -> str:
    """``text`` without its first line when that line is the generated-copy marker."""
    if not text.startswith(GENERATED_MARKER):
        return text
    newline = text.find("\n")
    return "" if newline < 0 else text[newline + 1 :]


def frozen_text(revision: str, rel: str, root: Path | None = None) -> str:
    """The frozen copy as deployed: its generated-copy marker line stripped."""
    return strip_generated_marker((frozen_dir(root) / revision / rel).read_text(encoding="utf-8"))


def newest_frozen(rel: str, before: str | None = None, root: Path | None = None) -> str | None:
    """The newest revision (strictly before ``before`` if given) that froze ``rel``."""
    for rev in reversed(revisions(root)):
        if before is not None and rev >= before:
            continue
        if (frozen_dir(root) / rev / rel).is_file():
            return rev
    return None


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def manifest_path(root: Path | None = None) -> Path:
    return frozen_dir(root) / "MANIFEST.sha256"


def read_manifest(root: Path | None = None) -> dict[str, str]:
    path = manifest_path(root)
    if not path.is_file():
        return {}
    entries = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip():
            digest, rel = line.split(None, 1)
            entries[rel.strip()] = digest
    return entries


def frozen_entries(root: Path | None = None) -> dict[str, str]:
    """Every frozen file (``REV/path``) with its current hash."""
    base = frozen_dir(root)
    return {
        p.relative_to(base).as_posix(): sha256(p)
        for rev in revisions(root)
        for p in sorted((base / rev).rglob("*"))
        if p.is_file()
    }


def write_manifest(root: Path | None = None) -> None:
    entries = frozen_entries(root)
    lines = [f"{digest}  {rel}" for rel, digest in sorted(entries.items())]
    manifest_path(root).write_text("\n".join(lines) + "\n", encoding="utf-8")


def released(root: Path | None = None) -> list[str]:
    path = frozen_dir(root) / "RELEASED"
    if not path.is_file():
        return []
    return [
        ln.strip()
        for ln in path.read_text(encoding="utf-8").splitlines()
        if ln.strip() and not ln.startswith("#")
    ]


# --------------------------------------------------------------------------
# Executing a revision
# --------------------------------------------------------------------------


def _execute(sql: str) -> None:
    from alembic import op
    from sqlalchemy import text

    # text() treats ":name" as a bind parameter; T-SQL never means that, so
    # every colon is escaped (text() renders "\:" back as ":").
    op.execute(text(sql.replace(":", "\\:")))


@dataclass
class RevisionPlan:
    """The frozen files of one revision and how to apply or undo them."""

    revision: str
    root: Path
    execute: Callable[[str], None] = _execute
    drop_overrides: dict[str, list[str]] | None = None

    @classmethod
    def load(cls, revision: str, revision_file: str, **kw) -> "RevisionPlan":
        """The plan of ``revision``; ``revision_file`` is the migration's ``__file__``."""
        return cls(revision, Path(revision_file).resolve().parents[2], **kw)

    @property
    def files(self) -> list[str]:
        """The revision's frozen files, without the broker's under ``-x broker=off``."""
        files = revision_files(self.revision, self.root)
        if not broker_enabled():
            files = [rel for rel in files if not rel.startswith(BROKER_PREFIX)]
        return files

    def upgrade_statements(self) -> list[str]:
        return [statement_text(frozen_text(self.revision, rel, self.root)) for rel in self.files]

    def downgrade_statements(self) -> list[str]:
        statements: list[str] = []
        for rel in reversed(self.files):
            current = frozen_text(self.revision, rel, self.root)
            obj = describe(current)
            if obj.kind == "grant":
                statements += revoke_statements(current)
            previous = newest_frozen(rel, before=self.revision, root=self.root)
            if previous is not None:
                statements.append(statement_text(frozen_text(previous, rel, self.root)))
            elif self.drop_overrides and rel in self.drop_overrides:
                statements += self.drop_overrides[rel]
            else:
                drop = drop_statement(obj)
                if drop:
                    statements.append(drop)
        return statements

    def upgrade(self) -> None:
        for sql in [SESSION_OPTIONS, *self.upgrade_statements()]:
            self.execute(sql)

    def downgrade(self) -> None:
        for sql in [SESSION_OPTIONS, *self.downgrade_statements()]:
            self.execute(sql)


# --------------------------------------------------------------------------
# Alembic command helpers (used by the CLI and the tests)
# --------------------------------------------------------------------------


def alembic_config(root: Path | None = None, x_args: Iterable[str] = (), stdout=None):
    """An Alembic Config for the bundled migrations, with ``-x`` arguments."""
    from alembic.config import Config

    root = root or project_root()
    # stdout: Alembic's messages; output_buffer: the offline (--sql) script.
    streams = {"stdout": stdout, "output_buffer": stdout} if stdout else {}
    cfg = Config(str(alembic_ini(root)), **streams)
    cfg.set_main_option("script_location", str(alembic_dir(root)))
    cfg.cmd_opts = type("Opts", (), {"x": list(x_args)})()
    return cfg


def x_argument(name: str, default: str | None = None) -> str | None:
    """An Alembic ``-x name=value`` argument of the running migration
    (``default`` outside a migration, e.g. when a tool reads a plan)."""
    from alembic import context

    try:
        return context.get_x_argument(as_dictionary=True).get(name, default)
    except (NameError, AttributeError):  # Alembic's proxy: no migration is running
        return default


#: Files under this sql/ folder need Service Broker; ``-x broker=off`` skips them.
BROKER_PREFIX = "broker/"


def broker_enabled() -> bool:
    """``-x broker=on|off`` (default on): off deploys the mail queue alone,
    e.g. on Azure SQL Database, which has no Service Broker."""
    from .errors import ConfigurationError

    value = (x_argument("broker", "on") or "on").strip().lower()
    if value in ("on", "true", "yes", "1"):
        return True
    if value in ("off", "false", "no", "0"):
        return False
    raise ConfigurationError(f"-x broker must be on or off; got {value!r}")
