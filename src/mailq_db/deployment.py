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
import logging
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable

PACKAGE_DIR = Path(__file__).resolve().parent
BUNDLE_DIR = PACKAGE_DIR / "_bundle"  # present in the installed wheel only
VERSION_TABLE = "mailq_alembic_version"
#: Alembic's version table lives in dbo whatever the deploying user's default
#: schema is (``version_table_schema``): GetInstallationHealth and the docs
#: read ``dbo.mailq_alembic_version``.
VERSION_SCHEMA = "dbo"
#: Bookkeeping of the deployment itself, beside the version table (dbo):
#: the stored ``-x`` options and the checksum of every file each revision applied.
OPTION_TABLE = "dbo.mailq_deployment_option"
FILE_TABLE = "dbo.mailq_deployment_file"

#: Sent before every revision's batches.  Modules keep the SET options of the
#: session that creates them, and DML on a table with a filtered index fails
#: (error 1934) unless ANSI_NULLS, ANSI_PADDING, ANSI_WARNINGS, ARITHABORT,
#: CONCAT_NULL_YIELDS_NULL and QUOTED_IDENTIFIER are ON and NUMERIC_ROUNDABORT
#: is OFF ("SET options required for filtered indexes", CREATE INDEX reference);
#: sqlcmd runs with QUOTED_IDENTIFIER OFF unless given -I and drivers differ in
#: the others, so the script sets the full line itself.  XACT_ABORT ON: a
#: run-time error rolls the revision's transaction back at once (SET XACT_ABORT
#: reference); NOCOUNT ON keeps row counts out of the output.
SESSION_OPTIONS = (
    "SET ANSI_NULLS, ANSI_PADDING, ANSI_WARNINGS, ARITHABORT, CONCAT_NULL_YIELDS_NULL, "
    "QUOTED_IDENTIFIER ON;\nSET NUMERIC_ROUNDABORT OFF;\nSET NOCOUNT, XACT_ABORT ON"
)


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
    r"(?P<kind>PROCEDURE|PROC|VIEW|FUNCTION|TRIGGER|TABLE|TYPE|SCHEMA|ROLE|USER|QUEUE|SERVICE|CONTRACT"
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
        "type": f"DROP TYPE IF EXISTS {n}",
        "index": f"DROP INDEX IF EXISTS {n} ON {obj.parent}",
    }
    if obj.kind in simple:
        return simple[obj.kind]
    literal = _unbracket(n.split(".")[-1]).replace("'", "''")
    if obj.kind == "user":
        # A user WITHOUT LOGIN owns nothing here; what was granted to it goes with it.
        return f"IF DATABASE_PRINCIPAL_ID(N'{literal}') IS NOT NULL\n    DROP USER {n}"
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


_BARE_SCHEMA = re.compile(r"^CREATE\s+SCHEMA\s+(?P<name>\[[^\]]+\]|\w+)(?:\s+AUTHORIZATION\s+\S+?)?\s*;?$", re.I)


def guarded_schema(sql: str) -> str:
    """A file whose only statement is ``CREATE SCHEMA`` (which must be alone in
    its batch, so the file cannot guard it) is sent as ``IF SCHEMA_ID(...) IS
    NULL EXEC (N'CREATE SCHEMA ...')``, its comment kept: re-running the script
    keeps an existing schema.  Any other text is returned unchanged."""
    code = strip_comments(sql).strip()
    match = _BARE_SCHEMA.match(code)
    if not match:
        return sql
    statement = code.rstrip(";").rstrip()
    at = sql.rfind(statement)
    prefix = sql[:at].rstrip() + "\n" if at > 0 else ""
    name = _unbracket(match.group("name")).replace("'", "''")
    return (f"{prefix}IF SCHEMA_ID(N'{name}') IS NULL\n"
            f"    EXEC (N'{statement.replace(chr(39), chr(39) * 2)}')")


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
    return [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith(("#", "--"))]


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
    """The frozen SQL of ``rel`` in ``revision``, without the generated marker line:
    the text every consumer (rendering, drift, checksums, tests) uses."""
    return strip_generated_marker((frozen_dir(root) / revision / rel).read_text(encoding="utf-8"))


def text_sha256(text: str) -> str:
    """SHA-256 of a frozen file's text as deployed (marker stripped, UTF-8)."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


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


def released_path(root: Path | None = None) -> Path:
    return frozen_dir(root) / "RELEASED"


def released_digests(root: Path | None = None) -> dict[str, str | None]:
    """``alembic/frozen/RELEASED``: each shipped revision with its pinned digest
    (``None`` for a line that names the revision only)."""
    path = released_path(root)
    if not path.is_file():
        return {}
    out: dict[str, str | None] = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        parts = line.split("#", 1)[0].split()
        if parts:
            out[parts[0]] = parts[1] if len(parts) > 1 else None
    return out


def released(root: Path | None = None) -> list[str]:
    """Revisions that have shipped: the dev tooling never refreezes them."""
    return list(released_digests(root))


def revision_digest(revision: str, root: Path | None = None) -> str:
    """One SHA-256 over a revision's FILES list and the text of each frozen file
    (generated marker stripped, so re-marking a release does not change it)."""
    h = hashlib.sha256()
    files = revision_files(revision, root)
    h.update(("\n".join(files) + "\n").encode("utf-8"))
    for rel in files:
        h.update(f"{rel}\0{text_sha256(frozen_text(revision, rel, root))}\n".encode("utf-8"))
    return h.hexdigest()


def manifest_problems(root: Path | None = None) -> list[str]:
    """Frozen files whose bytes differ from MANIFEST.sha256, files it lacks or
    lists in vain, and released revisions whose digest changed."""
    pinned, actual = read_manifest(root), frozen_entries(root)
    problems = [f"{rel}: changed since it was frozen" for rel in sorted(pinned) if rel in actual
                and actual[rel] != pinned[rel]]
    problems += [f"{rel}: missing" for rel in sorted(set(pinned) - set(actual))]
    problems += [f"{rel}: not in MANIFEST.sha256" for rel in sorted(set(actual) - set(pinned))]
    for rev, digest in released_digests(root).items():
        if rev not in revisions(root):
            problems.append(f"released revision {rev} has no frozen folder")
        elif digest and revision_digest(rev, root) != digest:
            problems.append(f"released revision {rev}: its frozen SQL differs from the released digest")
    return problems


# --------------------------------------------------------------------------
# Deployment options (-x), validated and stored in the database
# --------------------------------------------------------------------------

#: Every ``-x`` key the deployment understands; any other key is refused.
KNOWN_OPTIONS = ("url", "broker", "readers", "lock_timeout", "seed", "drop_data")
#: ``-x seed=...``: how the deployment of delayed execution treats what the
#: seed design left on the platform table and the queue (:func:`seed_checks`).
SEED_MODES = ("check", "disable-triggers", "ignore")
#: ``-x drop_data=yes``: a downgrade may drop tables that hold rows.
DROP_DATA_VALUES = {"yes": True, "no": False}
DEFAULT_READERS = 5
MAX_READERS = 32767
DEFAULT_LOCK_TIMEOUT_MS = 30000
#: Files under this sql/ folder need Service Broker; ``-x broker=off`` skips them.
BROKER_PREFIX = "broker/"
#: In-place changes of existing tables (a revision after the baseline names their downgrade).
UPGRADES_PREFIX = "upgrades/"
#: The application lock that keeps two deployers of one database apart.
DEPLOY_LOCK = "mailq-db deploy"


@dataclass(frozen=True)
class DeployOptions:
    """The validated ``-x`` options of one run.

    ``broker``: ``on`` deploys delayed execution, ``off`` the mail queue alone,
    ``add`` adds delayed execution to a database deployed with ``off``.
    ``readers``: MAX_QUEUE_READERS (``None``: keep the stored value, default 5).
    ``lock_timeout_ms``: SET LOCK_TIMEOUT for the deployment's session.
    ``seed``: ``check``, ``disable-triggers`` or ``ignore`` (:func:`seed_checks`).
    ``drop_data``: a downgrade may drop tables that hold rows (else 50420).
    ``explicit``: the keys given on the command line.
    """

    broker: str = "on"
    readers: int | None = None
    lock_timeout_ms: int = DEFAULT_LOCK_TIMEOUT_MS
    explicit: frozenset = frozenset()
    seed: str = "check"
    drop_data: bool = False

    @property
    def files_broker(self) -> bool:
        """Whether the revisions themselves apply broker files (``add`` applies
        them once, after the revisions, through the catch-up)."""
        return self.broker == "on"


def parse_options(x_args: dict[str, str] | Iterable[str] | None) -> DeployOptions:
    """Validate ``-x`` options before anything is rendered or executed.

    Unknown keys are refused (with the nearest known key), values are checked.
    """
    from difflib import get_close_matches

    from .errors import ConfigurationError

    if x_args is None:
        items: dict[str, str] = {}
    elif isinstance(x_args, dict):
        items = dict(x_args)
    else:
        items = {}
        for arg in x_args:
            if "=" not in arg:
                raise ConfigurationError(f"-x takes KEY=VALUE; got {arg!r}")
            key, value = arg.split("=", 1)
            items[key.strip()] = value
    for key in items:
        if key not in KNOWN_OPTIONS:
            near = get_close_matches(key, KNOWN_OPTIONS, n=1)
            hint = f" (did you mean {near[0]}?)" if near else ""
            raise ConfigurationError(
                f"unknown -x option {key!r}{hint}; known: {', '.join(KNOWN_OPTIONS)}")
    broker = (items.get("broker", "on") or "").strip().lower()
    broker = {"true": "on", "yes": "on", "1": "on", "false": "off", "no": "off", "0": "off"}.get(broker, broker)
    if broker not in ("on", "off", "add"):
        raise ConfigurationError(
            f"-x broker must be on or off (or add: add delayed execution to a database "
            f"deployed with broker=off); got {items.get('broker')!r}")
    readers = None
    if "readers" in items:
        text = (items["readers"] or "").strip()
        if not re.fullmatch(r"[0-9]+", text) or not 1 <= int(text) <= MAX_READERS:
            raise ConfigurationError(
                f"-x readers must be an integer from 1 to {MAX_READERS} "
                f"(MAX_QUEUE_READERS of dbo.DelayServiceQueue); got {items['readers']!r}")
        readers = int(text)
    lock_timeout = DEFAULT_LOCK_TIMEOUT_MS
    if "lock_timeout" in items:
        text = (items["lock_timeout"] or "").strip()
        if not re.fullmatch(r"-1|[0-9]+", text) or int(text) > 2_147_483_647:
            raise ConfigurationError(
                "-x lock_timeout must be milliseconds (0 or more; -1 waits forever); "
                f"got {items['lock_timeout']!r}")
        lock_timeout = int(text)
    seed = (items.get("seed", "check") or "").strip().lower()
    if seed not in SEED_MODES:
        raise ConfigurationError(f"-x seed must be one of {', '.join(SEED_MODES)}; got {items['seed']!r}")
    drop_data = (items.get("drop_data", "no") or "").strip().lower()
    if drop_data not in DROP_DATA_VALUES:
        raise ConfigurationError(
            "-x drop_data must be yes (a downgrade may drop tables that hold rows, with their rows) "
            f"or no (the default: such a downgrade stops with 50420); got {items['drop_data']!r}")
    return DeployOptions(broker, readers, lock_timeout, frozenset(k for k in items if k != "url"),
                         seed, DROP_DATA_VALUES[drop_data])


OPTIONS_ATTRIBUTE = "mailq_db.options"


def current_options() -> DeployOptions:
    """The options of the running migration (set by env.py), or defaults when
    no migration runs (a tool reading a plan)."""
    from alembic import context

    try:
        attrs = context.config.attributes
    except (NameError, AttributeError):
        return DeployOptions()
    opts = attrs.get(OPTIONS_ATTRIBUTE)
    if opts is None:
        opts = parse_options(context.get_x_argument(as_dictionary=True))
        attrs[OPTIONS_ATTRIBUTE] = opts
    return opts


def x_argument(name: str, default: str | None = None) -> str | None:
    """An Alembic ``-x name=value`` argument of the running migration
    (``default`` outside a migration, e.g. when a tool reads a plan)."""
    from alembic import context

    try:
        return context.get_x_argument(as_dictionary=True).get(name, default)
    except (NameError, AttributeError):  # Alembic's proxy: no migration is running
        return default


def broker_enabled() -> bool:
    """Whether the revisions apply their ``broker/`` files (``-x broker=on``, the
    default); off (or add, which applies them after the revisions) skips them."""
    return current_options().files_broker


def _offline() -> bool:
    from alembic import context

    try:
        return bool(context.is_offline_mode())
    except (NameError, AttributeError):
        return False


def _lit(value: str) -> str:
    return value.replace("'", "''")


# --------------------------------------------------------------------------
# The batches around the frozen files
# --------------------------------------------------------------------------

V = f"{VERSION_SCHEMA}.{VERSION_TABLE}"


def script_header(options: DeployOptions) -> list[str]:
    """Batches run once per deployment before any revision (online and offline):
    session options, the system-database guard, the db_owner check, the
    deployers' application lock, and the bookkeeping tables.  Offline, each is
    followed by :data:`HEADER_GUARD`."""
    broker_objects = " and Service Broker objects" if options.broker != "off" else ""
    return [
        SESSION_OPTIONS + f";\nSET LOCK_TIMEOUT {options.lock_timeout_ms}",
        # DB_NAME(), not DB_ID() <= 4: the names are what a DBA recognises.
        "DECLARE @Msg NVARCHAR(2048);\n"
        "IF DB_NAME() IN (N'master', N'msdb', N'tempdb', N'model')\n"
        "BEGIN\n"
        "    SET @Msg = CONCAT(N'mailq-db deploys into an application database, never into the system database ',\n"
        "        QUOTENAME(DB_NAME()), N'. Connect to the target database (sqlcmd -d <database>, or the database in the URL).');\n"
        "    THROW 50412, @Msg, 1;\n"
        "END;\n"
        # USER_NAME() = dbo: the database owner, a sysadmin, or Azure SQL Database's Microsoft Entra
        # admin, for whom IS_ROLEMEMBER is documented as unsupported when the admin is a group.
        "IF IS_ROLEMEMBER(N'db_owner') = 0 AND IS_SRVROLEMEMBER(N'sysadmin') = 0 AND USER_NAME() <> N'dbo'\n"
        "BEGIN\n"
        f"    SET @Msg = CONCAT(N'The deployment creates schemas, roles, tables{broker_objects}: the login ',\n"
        "        QUOTENAME(SUSER_SNAME()), N' (user ', QUOTENAME(USER_NAME()), N') must be a member of db_owner in ',\n"
        "        QUOTENAME(DB_NAME()), N' for the deployment, nothing afterwards.');\n"
        "    THROW 50413, @Msg, 1;\n"
        "END;\n"
        # An older setup may have created Alembic's table in the deploying user's
        # default schema: say how to move it rather than deploy from base again.
        f"IF OBJECT_ID(N'{V}', N'U') IS NULL\n"
        "BEGIN\n"
        "    DECLARE @Elsewhere NVARCHAR(300) = (\n"
        "        SELECT TOP (1) QUOTENAME(SCHEMA_NAME(t.schema_id)) + N'.' + QUOTENAME(t.name)\n"
        f"        FROM sys.tables AS t WHERE t.name = N'{VERSION_TABLE}' AND t.schema_id <> SCHEMA_ID(N'{VERSION_SCHEMA}'));\n"
        "    IF @Elsewhere IS NOT NULL\n"
        "    BEGIN\n"
        "        SET @Msg = CONCAT(N'The mailq-db version table is ', @Elsewhere, N' (an older mailq-db created it in the ',\n"
        f"            N'deploying user''s default schema); it now lives in {VERSION_SCHEMA}. Move it with: ALTER SCHEMA {VERSION_SCHEMA} TRANSFER ',\n"
        "            @Elsewhere, N'; then deploy again.');\n"
        "        THROW 50417, @Msg, 1;\n"
        "    END;\n"
        "END",
        # A session-owned application lock: a second deployer waits up to the
        # lock timeout, then stops with 50416 (sp_getapplock returns < 0).
        "DECLARE @Lock INT;\n"
        f"EXEC @Lock = sys.sp_getapplock @Resource = N'{DEPLOY_LOCK}', @LockMode = N'Exclusive',\n"
        f"    @LockOwner = N'Session', @LockTimeout = {options.lock_timeout_ms};\n"
        "IF @Lock < 0\n"
        "BEGIN\n"
        "    DECLARE @Msg NVARCHAR(2048) = CONCAT(N'Another mailq-db deployment holds the deployment lock on ',\n"
        f"        QUOTENAME(DB_NAME()), N' (sp_getapplock returned ', @Lock, N'); run again when it has finished.');\n"
        "    THROW 50416, @Msg, 1;\n"
        "END",
        f"IF OBJECT_ID(N'{OPTION_TABLE}', N'U') IS NULL\n"
        f"    CREATE TABLE {OPTION_TABLE} (\n"
        "        Name NVARCHAR(128) NOT NULL CONSTRAINT PK_mailq_deployment_option PRIMARY KEY,\n"
        "        Value NVARCHAR(400) NOT NULL,\n"
        "        ChangedAtUtc DATETIME2(3) NOT NULL CONSTRAINT DF_mailq_deployment_option_ChangedAtUtc "
        "DEFAULT SYSUTCDATETIME()\n"
        "    );\n"
        f"IF OBJECT_ID(N'{FILE_TABLE}', N'U') IS NULL\n"
        f"    CREATE TABLE {FILE_TABLE} (\n"
        "        Revision VARCHAR(32) NOT NULL,\n"
        "        FilePath NVARCHAR(400) NOT NULL,\n"
        "        Sha256 CHAR(64) NOT NULL,\n"
        "        AppliedAtUtc DATETIME2(3) NOT NULL CONSTRAINT DF_mailq_deployment_file_AppliedAtUtc "
        "DEFAULT SYSUTCDATETIME(),\n"
        "        CONSTRAINT PK_mailq_deployment_file PRIMARY KEY (Revision, FilePath)\n"
        "    );",
    ]


#: The offline script's last word when it ran to the end (under NOEXEC ON,
#: after a stop or "nothing to do", it is not executed): sqlcmd prints it.
DONE_MESSAGE = (
    "DECLARE @Reached VARCHAR(32);\n"
    f"IF OBJECT_ID(N'{VERSION_SCHEMA}.{VERSION_TABLE}', N'U') IS NOT NULL\n"
    f"    SELECT @Reached = MAX(version_num) FROM {VERSION_SCHEMA}.{VERSION_TABLE};\n"
    "PRINT CONCAT(N'mailq-db: database ', QUOTENAME(DB_NAME()), N' is now at revision ',\n"
    "    ISNULL(@Reached, N'base (no revision)'), N'.')"
)


def script_footer(offline: bool = True) -> list[str]:
    """The last batches of a script: offline, the revision reached is printed
    and execution switched back on for the session (SSMS keeps it); then the
    deployment lock is released."""
    release = (f"IF APPLOCK_MODE(N'public', N'{DEPLOY_LOCK}', N'Session') = N'Exclusive'\n"
               f"    EXEC sys.sp_releaseapplock @Resource = N'{DEPLOY_LOCK}', @LockOwner = N'Session'")
    return [DONE_MESSAGE, "SET NOEXEC OFF", release] if offline else [release]


# References for the script's safety net (checked in Microsoft's docs):
# * "SET XACT_ABORT": with ON, a run-time error terminates and rolls back the
#   whole transaction; compile errors (syntax) are not affected by it.
# * "SET NOEXEC": when ON, SQL Server compiles each batch but does not execute
#   it; the setting is applied at execute time (so an IF can set it).
# * "sqlcmd commands": ":On Error [exit | ignore]" -- exit ends sqlcmd with the
#   error's value; commands are recognised only at the start of a line.
# * SSDT's publish scripts open with ":on error exit" and the
#   "$(__IsSqlCmdEnabled)" guard that sets NOEXEC ON outside SQLCMD mode.
# * "sp_getapplock": returns < 0 on timeout (-1), cancel, deadlock or a bad
#   call; a Session-owned lock is released by sp_releaseapplock or at logoff.

#: After every batch of the script header (offline): a client that ignores
#: ``:on error exit`` but honours ``:setvar`` (Azure Data Studio's SQLCMD mode)
#: goes on to the next batch after a THROW; this one then stops the script.
#: @@ERROR still holds the number of the last statement of the previous batch
#: (SSDT's and Redgate SQL Compare's scripts check it after every GO the same
#: way).  RAISERROR, not THROW: the batch must go on to SET NOEXEC ON (SET
#: NOEXEC: batches are then compiled, never executed).
HEADER_GUARD = (
    "IF @@ERROR <> 0 BEGIN RAISERROR(N'mailq-db: the checks before the first revision stopped the deployment "
    "(see the error above); the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END"
)


def guard_batch(revision: str) -> str:
    """After every GO of a revision in an offline script: if the previous batch
    failed with its transaction still open (a compile error, which XACT_ABORT
    does not cover) roll it back, and once the revision's transaction is gone,
    stop executing the rest of the script (SET NOEXEC ON).  SSDT's pattern
    (``IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK``), for runs where ``:on
    error exit`` did not stop; RAISERROR so that SET NOEXEC ON still runs.
    One line: it follows every batch, and a reader learns it once."""
    return (
        "IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; "
        f"IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision {revision} failed and was rolled back; "
        "the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END"
    )


def version_check(revision: str, expected: str | None, direction: str,
                  destination: str | None | bool, offline: bool, known: Iterable[str] = ()) -> list[str]:
    """The batches that open a revision: the database must be at ``expected``
    (``None``: no revision yet), else THROW with the command that renders the
    script this database needs; a database at a revision outside ``known``
    (this package's revisions) was deployed by a newer mailq-db (50421).
    Offline, a database already at the script's destination skips the whole
    rest of the script (a re-run is a no-op)."""
    read = (
        "DECLARE @Current VARCHAR(32), @Rows INT = 0, @Msg NVARCHAR(2048);\n"
        f"IF OBJECT_ID(N'{V}', N'U') IS NOT NULL\n"
        f"    SELECT @Rows = COUNT(*), @Current = MAX(version_num) FROM {V};\n"
    )
    known = list(known)
    newer = ""
    if known:
        listed = ", ".join(f"'{_lit(k)}'" for k in known)
        newer = (
            f"IF @Rows = 1 AND @Current NOT IN ({listed})\n"
            "BEGIN\n"
            "    SET @Msg = CONCAT(N'Database ', QUOTENAME(DB_NAME()), N' is at revision ', @Current,\n"
            f"        N', which this mailq-db does not know (its newest is {_lit(known[-1])}): a newer mailq-db "
            "deployed it. Deploy with that version or a later one.');\n"
            "    THROW 50421, @Msg, 1;\n"
            "END;\n"
        )
    batches = []
    if offline and destination is not False:
        at_dest = "@Rows = 0" if destination is None else f"@Rows = 1 AND @Current = '{_lit(str(destination))}'"
        batches.append(
            read
            + f"IF {at_dest}\n"
            "BEGIN\n"
            "    -- Nothing was done in this transaction yet: end it and skip the rest.\n"
            "    IF @@TRANCOUNT > 0 ROLLBACK TRANSACTION;\n"
            f"    PRINT CONCAT(N'mailq-db: the database is already at ', ISNULL(@Current, N'base'), N'; nothing to do.');\n"
            "    SET NOEXEC ON;\n"
            "END"
        )
    if direction == "upgrade":
        ok = "@Rows = 0" if expected is None else f"@Rows = 1 AND @Current = '{_lit(expected)}'"
        want = expected or "no revision (an empty database)"
        fix = ("N'mailq-db deploy --sql --revision ', @Current, N':head'" )
        batches.append(
            read + newer
            + f"IF NOT ({ok})\n"
            "BEGIN\n"
            f"    SET @Msg = CONCAT(N'Revision {revision} upgrades a database at {want}; ', QUOTENAME(DB_NAME()),\n"
            "        N' is at ', IIF(@Rows > 1, N'several revisions', ISNULL(@Current, N'no revision')),\n"
            "        N'. Render the script for this database with: ', IIF(@Current IS NULL, N'mailq-db deploy --sql', "
            f"CONCAT({fix})),\n"
            "        N' (or apply online with mailq-db deploy, which picks the revisions itself).');\n"
            "    THROW 50410, @Msg, 1;\n"
            "END"
        )
    else:
        batches.append(
            read + newer
            + f"IF NOT (@Rows = 1 AND @Current = '{_lit(revision)}')\n"
            "BEGIN\n"
            f"    SET @Msg = CONCAT(N'This downgrade removes revision {revision}; ', QUOTENAME(DB_NAME()),\n"
            "        N' is at ', ISNULL(@Current, N'no revision'),\n"
            "        N'. Render the downgrade for this database with: mailq-db deploy --sql --downgrade ', "
            "ISNULL(@Current, N'head'), N':<target>.');\n"
            "    THROW 50411, @Msg, 1;\n"
            "END"
        )
    return batches


def option_batch(options: DeployOptions, *, adding_broker: bool = False) -> str:
    """Compare the broker option the script was rendered with against the one
    stored in the database, then store this run's options (in the revision's
    transaction: a failed revision stores nothing)."""
    mode = "off" if options.broker == "add" and not adding_broker else ("on" if adding_broker else options.broker)
    lines = [
        "DECLARE @Stored NVARCHAR(400), @Msg NVARCHAR(2048);",
        f"SELECT @Stored = Value FROM {OPTION_TABLE} WHERE Name = N'broker';",
    ]
    if adding_broker:
        lines += [
            "IF @Stored = N'on'",
            "    THROW 50415, N'Delayed execution is already deployed in this database (stored option broker=on): "
            "nothing to add; deploy without -x broker=add.', 1;",
        ]
    elif mode == "on":
        lines += [
            "IF @Stored = N'off'",
            "BEGIN",
            "    SET @Msg = CONCAT(N'Database ', QUOTENAME(DB_NAME()), N' was deployed with -x broker=off (stored in "
            f"{OPTION_TABLE}); this script includes delayed execution. Render it with -x broker=off, or add delayed "
            "execution with -x broker=add (docs/dba-guide.md, section 4).');",
            "    THROW 50414, @Msg, 1;",
            "END;",
        ]
    else:
        lines += [
            "IF @Stored = N'on'",
            "BEGIN",
            "    SET @Msg = CONCAT(N'Database ', QUOTENAME(DB_NAME()), N' has delayed execution (stored option "
            "broker=on); this script was rendered with -x broker=off and would leave its objects at an old "
            "revision. Render it without -x broker=off.');",
            "    THROW 50414, @Msg, 1;",
            "END;",
        ]
    store = {"broker": mode}
    if options.readers is not None:
        store["readers"] = str(options.readers)
    for name, value in store.items():
        lines += [
            f"UPDATE {OPTION_TABLE} SET Value = N'{value}', ChangedAtUtc = SYSUTCDATETIME() "
            f"WHERE Name = N'{name}' AND Value <> N'{value}';",
            f"IF NOT EXISTS (SELECT 1 FROM {OPTION_TABLE} WHERE Name = N'{name}')",
            f"    INSERT INTO {OPTION_TABLE} (Name, Value) VALUES (N'{name}', N'{value}');",
        ]
    return "\n".join(lines)


#: Stops a revision that deploys broker files when Service Broker is disabled.
#: The statement that enables it is spelled out for the DBA, built with CONCAT
#: so that the script never contains that statement's text: the script itself
#: never changes database options.
BROKER_CHECK = """\
IF NOT EXISTS (
    SELECT 1 FROM sys.databases
    WHERE database_id = DB_ID() AND is_broker_enabled = 1
)
BEGIN
    DECLARE @Msg NVARCHAR(2048) = CONCAT(
        N'Service Broker is not enabled in database ', QUOTENAME(DB_NAME()),
        N'; delayed execution needs it. A DBA enables it with: ',
        N'ALTER', N' DATABASE ', QUOTENAME(DB_NAME()), N' SET ENABLE_BROKER WITH ROLLBACK IMMEDIATE; ',
        N'this needs exclusive access to the database: WITH ROLLBACK IMMEDIATE rolls back ',
        N'every open transaction of the other sessions in it and disconnects them. ',
        N'(A database restored or attached as a copy may need NEW_BROKER instead, which ',
        N'also ends every existing conversation.) To deploy the mail queue alone, run ',
        N'mailq-db deploy -x broker=off (alembic -x broker=off upgrade head).'
    );
    THROW 50401, @Msg, 1;
END"""

ACTIVATION_KEY = "mailq_db.activation"

#: While a revision changes broker files, activation is
#: off, so no reader starts old code against new tables (or new code against
#: old ones).  The status is kept in SESSION_CONTEXT (sp_set_session_context,
#: SQL Server 2016+) and restored at the end of the revision, inside its
#: transaction; a queue that does not exist yet is left alone.  Readers that
#: are already running keep their Sch-S lock on dbo.ProcessDelayQueue, so an
#: ALTER of it waits for them (bounded by the lock timeout).
ACTIVATION_OFF = f"""\
DECLARE @Activation INT = (
    SELECT CAST(q.is_activation_enabled AS INT) FROM sys.service_queues AS q
    WHERE q.object_id = OBJECT_ID(N'dbo.DelayServiceQueue', N'SQ'));
EXEC sys.sp_set_session_context @key = N'{ACTIVATION_KEY}', @value = @Activation;
IF @Activation = 1
    ALTER QUEUE dbo.DelayServiceQueue WITH ACTIVATION (STATUS = OFF)"""

ACTIVATION_RESTORE = f"""\
DECLARE @Activation INT = CAST(SESSION_CONTEXT(N'{ACTIVATION_KEY}') AS INT);
IF @Activation IS NOT NULL AND EXISTS (
    SELECT 1 FROM sys.service_queues AS q
    WHERE q.object_id = OBJECT_ID(N'dbo.DelayServiceQueue', N'SQ') AND q.activation_procedure IS NOT NULL)
BEGIN
    IF @Activation = 1
        ALTER QUEUE dbo.DelayServiceQueue WITH ACTIVATION (STATUS = ON);
    ELSE
        ALTER QUEUE dbo.DelayServiceQueue WITH ACTIVATION (STATUS = OFF);
END;
EXEC sys.sp_set_session_context @key = N'{ACTIVATION_KEY}', @value = NULL"""


def readers_batch(options: DeployOptions) -> str:
    """MAX_QUEUE_READERS after a revision that touched the broker: the value
    given with -x readers=N, else the stored one (a re-applied activation file
    resets it to the frozen 5, so the stored value survives refreezes)."""
    if options.readers is not None:
        return (
            "IF EXISTS (SELECT 1 FROM sys.service_queues AS q\n"
            "    WHERE q.object_id = OBJECT_ID(N'dbo.DelayServiceQueue', N'SQ') AND q.activation_procedure IS NOT NULL\n"
            f"    AND q.max_readers <> {options.readers})\n"
            "    ALTER QUEUE dbo.DelayServiceQueue\n"
            f"    WITH ACTIVATION (MAX_QUEUE_READERS = {options.readers})"
        )
    return (
        f"DECLARE @Readers INT = (SELECT TRY_CONVERT(INT, Value) FROM {OPTION_TABLE} WHERE Name = N'readers');\n"
        "IF @Readers BETWEEN 1 AND 32767 AND EXISTS (SELECT 1 FROM sys.service_queues AS q\n"
        "    WHERE q.object_id = OBJECT_ID(N'dbo.DelayServiceQueue', N'SQ') AND q.activation_procedure IS NOT NULL\n"
        "    AND q.max_readers <> @Readers)\n"
        "BEGIN\n"
        "    DECLARE @Sql NVARCHAR(400) = CONCAT(N'ALTER QUEUE dbo.DelayServiceQueue WITH ACTIVATION ',\n"
        "        N'(MAX_QUEUE_READERS = ', @Readers, N')');  -- an INT: nothing to inject\n"
        "    EXEC sys.sp_executesql @Sql;\n"
        "END"
    )


def checksum_batch(revision_of: dict[str, str], texts: dict[str, str], revision: str, *, delete: bool) -> str:
    """Record (or, for a downgrade, forget) the checksum of every file applied."""
    if delete:
        return f"DELETE FROM {FILE_TABLE} WHERE Revision = '{_lit(revision)}'"
    rows = ",\n    ".join(
        f"('{_lit(revision_of[rel])}', N'{_lit(rel)}', '{text_sha256(texts[rel])}')" for rel in texts)
    # One list of the files (a reviewer reads it once): earlier rows of these
    # revisions and paths are replaced.
    return (
        "DECLARE @Files TABLE (Revision VARCHAR(32) NOT NULL, FilePath NVARCHAR(400) NOT NULL, "
        "Sha256 CHAR(64) NOT NULL);\n"
        f"INSERT INTO @Files (Revision, FilePath, Sha256) VALUES\n    {rows};\n"
        f"DELETE FROM {FILE_TABLE} WHERE Revision IN (SELECT n.Revision FROM @Files AS n)\n"
        "    AND FilePath IN (SELECT n.FilePath FROM @Files AS n);\n"
        f"INSERT INTO {FILE_TABLE} (Revision, FilePath, Sha256) SELECT n.Revision, n.FilePath, n.Sha256 FROM @Files AS n"
    )


# --------------------------------------------------------------------------
# What the seed design may have left (-x seed=...)
# --------------------------------------------------------------------------

#: Other enabled triggers on the platform table: the seed design's trigger ran
#: targets synchronously inside the platform's INSERT (every task would run
#: twice).  ``{disable}`` = 1 disables them and records each in
#: delay.Installation (Detail = the revision), so the downgrade enables them again.
SEED_TRIGGERS = """\
DECLARE @Disable BIT = {disable};
DECLARE @Other NVARCHAR(MAX), @Msg NVARCHAR(2048), @Sql NVARCHAR(MAX);
DECLARE @Found TABLE (TriggerName NVARCHAR(300) NOT NULL PRIMARY KEY);
INSERT INTO @Found (TriggerName)
SELECT QUOTENAME(SCHEMA_NAME(o.schema_id)) + N'.' + QUOTENAME(tr.name)
FROM sys.triggers AS tr
INNER JOIN sys.objects AS o ON o.object_id = tr.object_id
WHERE
    tr.parent_id = OBJECT_ID(N'dbo.tabDIYTable12402')
    AND tr.is_disabled = 0
    AND tr.name <> N'trg_tabDIYTable12402_ScheduleDelay';
SELECT
    @Other = STRING_AGG(CONVERT(NVARCHAR(MAX), f.TriggerName), N', '),
    @Sql = STRING_AGG(CONVERT(NVARCHAR(MAX), CONCAT(N'DISABLE TRIGGER ', f.TriggerName, N' ON dbo.tabDIYTable12402;')), N' ')
FROM @Found AS f;
IF @Other IS NOT NULL AND @Disable = 0
BEGIN
    SET @Msg = CONCAT(
        N'dbo.tabDIYTable12402 has other enabled triggers: ', @Other,
        N'. The seed design''s trigger runs targets synchronously inside the platform''s INSERT, ',
        N'so every task would run twice. Disable or drop them, or rerun with ',
        N'-x seed=disable-triggers (the downgrade enables them again).'
    );
    THROW 50370, @Msg, 1;
END;
IF @Other IS NOT NULL
BEGIN
    EXEC sys.sp_executesql @Sql;
    INSERT INTO delay.Installation (Item, Detail)
    SELECT CONCAT(N'disabled trigger ', f.TriggerName), N'{revision}'
    FROM @Found AS f
    WHERE NOT EXISTS (
        SELECT 1 FROM delay.Installation AS i WHERE i.Item = CONCAT(N'disabled trigger ', f.TriggerName)
    );
END"""

#: Other services on the queue, and messages that are not delayed execution's on it.
SEED_QUEUE = """\
DECLARE @Other NVARCHAR(MAX), @Msg NVARCHAR(2048), @Foreign INT;
SELECT @Other = STRING_AGG(CONVERT(NVARCHAR(MAX), QUOTENAME(s.name)), N', ')
FROM sys.services AS s
WHERE s.service_queue_id = OBJECT_ID(N'dbo.DelayServiceQueue') AND s.name <> N'MailqDelayService';
IF @Other IS NOT NULL
BEGIN
    SET @Msg = CONCAT(
        N'dbo.DelayServiceQueue also serves ', @Other,
        N'; dbo.ProcessDelayQueue ends every conversation that is not a delayed task''s. ',
        N'Move those services to a queue of their own (ALTER SERVICE ... ON QUEUE ...) and rerun, ',
        N'or rerun with -x seed=ignore.'
    );
    THROW 50371, @Msg, 1;
END;
SELECT @Foreign = COUNT(*)
FROM dbo.DelayServiceQueue
WHERE message_type_name NOT IN (
    N'MailqDelayRequest',
    N'http://schemas.microsoft.com/SQL/ServiceBroker/DialogTimer',
    N'http://schemas.microsoft.com/SQL/ServiceBroker/EndDialog',
    N'http://schemas.microsoft.com/SQL/ServiceBroker/Error'
);
IF @Foreign > 0
BEGIN
    SET @Msg = CONCAT(
        N'dbo.DelayServiceQueue holds ', @Foreign, N' message(s) of types that are not delayed execution''s ',
        N'(the seed design''s?). Drain them with their own program first, or rerun with -x seed=ignore ',
        N'(dbo.ProcessDelayQueue then ends their conversations).'
    );
    THROW 50372, @Msg, 1;
END"""

#: Enables the triggers the seed check disabled (recorded with Detail = the revision).
ENABLE_SEED_TRIGGERS = """\
IF OBJECT_ID(N'delay.Installation', N'U') IS NOT NULL
BEGIN
    DECLARE @Sql NVARCHAR(MAX) = N'';
    SELECT @Sql += CONCAT(N'ENABLE TRIGGER ', SUBSTRING(i.Item, 18, 400), N' ON dbo.tabDIYTable12402; ')
    FROM delay.Installation AS i
    WHERE i.Item LIKE N'disabled trigger %' AND i.Detail = N'{revision}';
    EXEC sys.sp_executesql @Sql;
    DELETE FROM delay.Installation WHERE Item LIKE N'disabled trigger %' AND Detail = N'{revision}';
END"""


def seed_checks(mode: str, revision: str) -> list[str]:
    """What the seed design (the source document's trigger version and its own
    queue) may have left, checked after the broker files ran: another enabled
    trigger on dbo.tabDIYTable12402 (50370), another service on
    dbo.DelayServiceQueue (50371), foreign messages on it (50372).  ``check``
    stops; ``disable-triggers`` disables the other triggers (and still stops on
    the other two); ``ignore`` skips the checks."""
    if mode == "ignore":
        return []
    return [SEED_TRIGGERS.format(disable=1 if mode == "disable-triggers" else 0, revision=_lit(revision)),
            SEED_QUEUE]


def seed_restore(revision: str) -> str:
    """The batch that enables the triggers :func:`seed_checks` disabled."""
    return ENABLE_SEED_TRIGGERS.format(revision=_lit(revision))


# --------------------------------------------------------------------------
# A downgrade never drops rows silently (-x drop_data=yes)
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class DroppedTable:
    """A table a downgrade drops.  ``rows``: a WHERE condition selecting the rows
    that count as data (``None``: all of them; rows the deployment itself
    wrote are left out); ``when``: a table that must exist for ``rows`` to be
    evaluated (else the table is not counted)."""

    name: str
    rows: str | None = None
    when: str | None = None


def data_loss_check(revision: str, tables: list[DroppedTable]) -> str:
    """The batch that stops a downgrade (50420) when a table it drops holds
    rows, naming each such table and its row count (COUNT_BIG, exact).  The
    names and conditions are the package's own, rendered here, never input."""
    values = ",\n    ".join(
        "(N'{}', {}, {})".format(_lit(t.name), f"N'{_lit(t.rows)}'" if t.rows else "NULL",
                                 f"N'{_lit(t.when)}'" if t.when else "NULL")
        for t in tables)
    return (
        "DECLARE @Dropped TABLE (Seq INT IDENTITY (1, 1) PRIMARY KEY, Name NVARCHAR(300) NOT NULL,\n"
        "    RowFilter NVARCHAR(1000) NULL, NeedsTable NVARCHAR(300) NULL);\n"
        f"INSERT INTO @Dropped (Name, RowFilter, NeedsTable) VALUES\n    {values};\n"
        "DECLARE @Seq INT = 0, @Name NVARCHAR(300), @RowFilter NVARCHAR(1000), @NeedsTable NVARCHAR(300),\n"
        "    @Count BIGINT, @Sql NVARCHAR(MAX), @Found NVARCHAR(MAX) = N'', @Msg NVARCHAR(2048);\n"
        "WHILE 1 = 1\n"
        "BEGIN\n"
        "    SELECT TOP (1) @Seq = d.Seq, @Name = d.Name, @RowFilter = d.RowFilter, @NeedsTable = d.NeedsTable\n"
        "    FROM @Dropped AS d WHERE d.Seq > @Seq ORDER BY d.Seq;\n"
        "    IF @@ROWCOUNT = 0 BREAK;\n"
        "    IF OBJECT_ID(@Name, N'U') IS NULL OR (@NeedsTable IS NOT NULL AND OBJECT_ID(@NeedsTable, N'U') IS NULL)\n"
        "        CONTINUE;\n"
        "    SET @Sql = CONCAT(N'SELECT @n = COUNT_BIG(*) FROM ', QUOTENAME(PARSENAME(@Name, 2)), N'.',\n"
        "        QUOTENAME(PARSENAME(@Name, 1)), N' WHERE ' + @RowFilter, N';');\n"
        "    EXEC sys.sp_executesql @Sql, N'@n BIGINT OUTPUT', @n = @Count OUTPUT;\n"
        "    IF @Count > 0 SET @Found = CONCAT(@Found, N', ', @Name, N' (', @Count, N' rows)');\n"
        "END;\n"
        "IF @Found <> N''\n"
        "BEGIN\n"
        f"    SET @Msg = CONCAT(N'This downgrade of revision {_lit(revision)} would drop tables that hold rows: ',\n"
        "        STUFF(@Found, 1, 2, N''), N'. Nothing was changed. Back them up and run the downgrade with ',\n"
        "        N'-x drop_data=yes to drop them with their rows, or empty them first.');\n"
        "    THROW 50420, @Msg, 1;\n"
        "END"
    )


def drop_column(table: str, column: str) -> Callable[[], list[str]]:
    """The downgrade of an upgrades/ file that added ``column`` to ``table``
    (for ``RevisionPlan(drop_overrides=...)``): refused with 50422 while the
    column holds a value (not NULL) unless ``-x drop_data=yes``, then dropped
    with its own default and column check constraints (a table-level
    constraint naming it needs an override of its own).  Dynamic SQL: the
    column may be gone already."""
    t, c = _lit(table), _lit(column)

    def batches() -> list[str]:
        check = (
            f"IF COL_LENGTH(N'{t}', N'{c}') IS NOT NULL\n"
            "BEGIN\n"
            "    DECLARE @Values BIGINT, @Msg NVARCHAR(2048);\n"
            f"    EXEC sys.sp_executesql N'SELECT @n = COUNT_BIG({c}) FROM {t};', N'@n BIGINT OUTPUT',\n"
            "        @n = @Values OUTPUT;\n"
            "    IF @Values > 0\n"
            "    BEGIN\n"
            f"        SET @Msg = CONCAT(N'This downgrade would drop column {t}.{c}, which holds ', @Values,\n"
            "            N' value(s). Nothing was changed. Back them up and run the downgrade with -x drop_data=yes, ',\n"
            "            N'or set them to NULL first.');\n"
            "        THROW 50422, @Msg, 1;\n"
            "    END;\n"
            "END"
        )
        drop = (
            f"IF COL_LENGTH(N'{t}', N'{c}') IS NOT NULL\n"
            "BEGIN\n"
            "    DECLARE @Sql NVARCHAR(MAX) = N'';\n"
            "    SELECT @Sql += CONCAT(N'ALTER TABLE ', QUOTENAME(SCHEMA_NAME(o.schema_id)), N'.', QUOTENAME(o.name),\n"
            "        N' DROP CONSTRAINT ', QUOTENAME(k.name), N'; ')\n"
            "    FROM sys.objects AS k\n"
            "    INNER JOIN sys.objects AS o ON o.object_id = k.parent_object_id\n"
            "    LEFT JOIN sys.default_constraints AS dc ON dc.object_id = k.object_id\n"
            "    LEFT JOIN sys.check_constraints AS cc ON cc.object_id = k.object_id\n"
            f"    WHERE k.parent_object_id = OBJECT_ID(N'{t}')\n"
            f"        AND COALESCE(dc.parent_column_id, cc.parent_column_id) = COLUMNPROPERTY(OBJECT_ID(N'{t}'), N'{c}', 'ColumnId');\n"
            f"    SET @Sql += N'ALTER TABLE {t} DROP COLUMN {c};';\n"
            "    EXEC sys.sp_executesql @Sql;\n"
            "END"
        )
        return [drop] if current_options().drop_data else [check, drop]

    return batches


# --------------------------------------------------------------------------
# Executing a revision
# --------------------------------------------------------------------------

#: What the deployment is doing now: read by the CLI to report a failure as
#: "revision, file, lines: message" on one line.  ``file`` is the batch's label
#: (a file under sql/, or "(revision check)" and the like for the batches the
#: tool adds); ``path``/``first_line``/``last_line`` locate a file's batch in
#: the frozen copy that was sent (see :func:`batch_location`); ``batch`` is the
#: batch's position in its revision, 1-based.
PROGRESS: dict[str, object] = {"revision": None, "file": None}


def reset_progress() -> None:
    """Nothing deployed yet: the state before a deployment starts."""
    PROGRESS.clear()
    PROGRESS.update(revision=None, file=None)


def batch_location(revision: str, rel: str, root: Path | None = None) -> tuple[str, int, int] | None:
    """(the frozen copy's path, its first line, its last line) of the batch the
    frozen file ``rel`` of ``revision`` sends; ``None`` when it cannot be read.

    Each frozen file is one batch sent from its first line (the generated-copy
    marker, when present, is line 1 and is not sent); trailing blank lines and
    a trailing ``;`` are not sent (:func:`statement_text`).  SQL Server numbers
    the lines of an error from the first line of the batch, so line N of the
    server is line ``first + N - 1`` of the file.
    """
    try:
        raw = (frozen_dir(root) / revision / rel).read_text(encoding="utf-8")
    except OSError:
        return None
    offset = 1 if raw.startswith(GENERATED_MARKER) else 0
    body = statement_text(strip_generated_marker(raw))
    first = offset + 1
    return f"alembic/frozen/{revision}/{rel}", first, first + body.count("\n")


def note_batch(label: str, index: int, revision: str | None = None, root: Path | None = None) -> None:
    """Record in :data:`PROGRESS` the batch about to be sent (label, position,
    and for a frozen file of ``revision`` where it is)."""
    for key in ("path", "first_line", "last_line"):
        PROGRESS.pop(key, None)
    PROGRESS["file"] = label
    PROGRESS["batch"] = index
    if revision and not label.startswith("("):
        where = batch_location(revision, label, root)
        if where:
            PROGRESS["path"], PROGRESS["first_line"], PROGRESS["last_line"] = where

_log = logging.getLogger("mailq_db.deploy")


def _execute(sql: str) -> None:
    from alembic import op
    from sqlalchemy import text

    # text() treats ":name" as a bind parameter; T-SQL never means that, so
    # every colon is escaped (text() renders "\:" back as ":").
    op.execute(text(sql.replace(":", "\\:")))


def _revision_context(revision: str) -> tuple[str | None, str | None | bool]:
    """(the revision this one upgrades from, the script's destination); the
    destination is ``False`` when unknown (no migration runs)."""
    from alembic import context

    try:
        script = context.script
        down = script.get_revision(revision).down_revision
    except (NameError, AttributeError):
        return None, False
    if isinstance(down, (tuple, list)):
        down = down[0] if len(down) == 1 else None
    try:
        arg = context.get_revision_argument()
        if isinstance(arg, (tuple, list)):
            arg = arg[0] if len(arg) == 1 else None
        if arg in (None, "base"):
            dest: str | None | bool = None
        else:
            dest = script.get_revision(arg).revision
    except Exception:  # noqa: BLE001 - e.g. a relative target: no no-op check
        dest = False
    return down, dest


@dataclass
class RevisionPlan:
    """The frozen files of one revision and how to apply or undo them.

    ``upgrade()`` and ``downgrade()`` run, in the revision's transaction: the
    session options, the starting-revision check, the stored-option check,
    activation off (revisions with broker files), every file, checksums,
    MAX_QUEUE_READERS, activation restored; offline, a guard after every GO.
    A downgrade first refuses (50420) when a table it drops holds rows, unless
    ``-x drop_data=yes``.
    """

    revision: str
    root: Path
    execute: Callable[[str], None] = _execute
    #: Batches that undo a file instead of the DROP derived from its CREATE
    #: (a script, an upgrades/ file, or an object the package may have
    #: adopted); a callable is called when the plan is rendered or run (so it
    #: may read -x options, as :func:`drop_column` does).
    drop_overrides: dict[str, list[str] | Callable[[], list[str]]] | None = None
    #: Revision-specific batches, called when the plan is rendered or run (so
    #: they may read -x options): ``before_files`` and ``after_files`` around
    #: the files of an upgrade, ``before_downgrade`` and ``after_downgrade``
    #: around the files of a downgrade.
    before_files: Callable[[], list[str]] | None = None
    after_files: Callable[[], list[str]] | None = None
    before_downgrade: Callable[[], list[str]] | None = None
    after_downgrade: Callable[[], list[str]] | None = None
    #: Tables the downgrade drops whose rows are checked differently (file ->
    #: DroppedTable, or None: not checked, the deployment's own bookkeeping);
    #: every other table file this revision introduced is checked whole.
    dropped_tables: dict[str, DroppedTable | None] | None = None

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

    @property
    def touches_broker(self) -> bool:
        return any(rel.startswith(BROKER_PREFIX) for rel in self.files)

    def upgrade_statements(self) -> list[str]:
        return [statement_text(frozen_text(self.revision, rel, self.root)) for rel in self.files]

    def check_names(self) -> None:
        """Every file the migration names in ``drop_overrides`` or
        ``dropped_tables`` must be one the revision froze: a renamed file
        would otherwise lose its override silently (an adopted table dropped,
        the deployment's own rows counted as data)."""
        from .errors import ConfigurationError

        frozen = set(revision_files(self.revision, self.root))
        named = set(self.drop_overrides or ()) | set(self.dropped_tables or ())
        unknown = sorted(named - frozen)
        if unknown:
            raise ConfigurationError(
                f"revision {self.revision}: its migration names {', '.join(unknown)}, which "
                f"alembic/frozen/{self.revision}/FILES does not list; update the migration in alembic/versions/")

    def downgrade_statements(self) -> list[str]:
        statements: list[str] = []
        for rel in reversed(self.files):
            current = frozen_text(self.revision, rel, self.root)
            obj = describe(current)
            if obj.kind == "grant":
                statements += [_guard_object(r) for r in revoke_statements(current)]
            previous = newest_frozen(rel, before=self.revision, root=self.root)
            if previous is not None:
                statements.append(statement_text(frozen_text(previous, rel, self.root)))
            elif self.drop_overrides and rel in self.drop_overrides:
                override = self.drop_overrides[rel]
                statements += override() if callable(override) else override
            elif rel.startswith(UPGRADES_PREFIX):
                from .errors import ConfigurationError

                raise ConfigurationError(
                    f"revision {self.revision}: {rel} changes a table in place and its migration names no "
                    "downgrade for it: add drop_overrides={...} in alembic/versions/ (an empty list when there "
                    "is nothing to undo; docs/CONVENTIONS.md)")
            else:
                drop = drop_statement(obj)
                if drop:
                    statements.append(_guard_object(drop))
        return statements

    def tables_dropped(self) -> list[DroppedTable]:
        """The tables this revision's downgrade drops, in build order: each
        table file it introduced (no earlier frozen copy), as ``dropped_tables``
        says."""
        special = self.dropped_tables or {}
        out = []
        for rel in self.files:
            if newest_frozen(rel, before=self.revision, root=self.root) is not None:
                continue
            if rel in special:
                entry = special[rel]
                if entry is not None:
                    out.append(entry)
                continue
            obj = describe(frozen_text(self.revision, rel, self.root))
            if obj.kind == "table" and not (self.drop_overrides and rel in self.drop_overrides):
                out.append(DroppedTable(obj.name))
        return out

    # -- the batches, labelled by file ------------------------------------

    def _wrap(self, direction: str, labelled: list[tuple[str, str]], epilogue: list[tuple[str, str]]
              ) -> list[tuple[str, str]]:
        options = current_options()
        offline = _offline()
        down, dest = _revision_context(self.revision)
        expected = down if direction == "upgrade" else self.revision
        head: list[tuple[str, str]] = [("(session options)", SESSION_OPTIONS)]
        head += [("(revision check)", sql) for sql in
                 version_check(self.revision, expected, direction, dest, offline, revisions(self.root))]
        head.append(("(stored options)", option_batch(options)))
        if direction == "downgrade" and not options.drop_data:
            tables = self.tables_dropped()
            if tables:
                head.append(("(data check)", data_loss_check(self.revision, tables)))
        broker = self.touches_broker
        if broker and direction == "upgrade":
            head.append(("(broker check)", BROKER_CHECK))
        if broker:
            head.append(("(activation off)", ACTIVATION_OFF))
        tail = list(epilogue)
        if direction == "downgrade" and down is None and dest is not False:
            # Down to base: the deployment's own bookkeeping goes too, so only
            # Alembic's (empty) version table is left, as Alembic leaves it.
            tail.append(("(bookkeeping)", f"DROP TABLE IF EXISTS {FILE_TABLE};\nDROP TABLE IF EXISTS {OPTION_TABLE}"))
        if broker:
            if direction == "upgrade":
                tail.append(("(queue readers)", readers_batch(options)))
            tail.append(("(activation restored)", ACTIVATION_RESTORE))
        batches = head + labelled + tail
        if not offline:
            return batches
        guard = guard_batch(self.revision)
        out: list[tuple[str, str]] = []
        for label, sql in batches:
            out.append((label, sql))
            if label not in ("(session options)",):
                out.append(("(guard)", guard))
        return out

    def upgrade_batches(self) -> list[tuple[str, str]]:
        self.check_names()
        files = self.files
        texts = {rel: frozen_text(self.revision, rel, self.root) for rel in files}
        labelled = [("(revision checks)", sql) for sql in (self.before_files() if self.before_files else [])]
        labelled += [(rel, guarded_schema(statement_text(texts[rel]))) for rel in files]
        labelled += [("(revision checks)", sql) for sql in (self.after_files() if self.after_files else [])]
        epilogue = [("(checksums)", checksum_batch({rel: self.revision for rel in files}, texts,
                                                    self.revision, delete=False))] if files else []
        return self._wrap("upgrade", labelled, epilogue)

    def downgrade_batches(self) -> list[tuple[str, str]]:
        self.check_names()
        labelled = [("(downgrade)", sql) for sql in (self.before_downgrade() if self.before_downgrade else [])]
        labelled += [("(downgrade)", sql) for sql in self.downgrade_statements()]
        labelled += [("(downgrade)", sql) for sql in (self.after_downgrade() if self.after_downgrade else [])]
        epilogue = [("(checksums)", checksum_batch({}, {}, self.revision, delete=True))]
        return self._wrap("downgrade", labelled, epilogue)

    def _run(self, batches: list[tuple[str, str]]) -> None:
        PROGRESS["revision"] = self.revision
        for index, (label, sql) in enumerate(batches, 1):
            note_batch(label, index, self.revision, self.root)
            self.execute(statement_text(sql))
            if not label.startswith("(") and not _offline():
                _log.info("revision %s: applied %s", self.revision, label)
        reset_progress()
        PROGRESS["revision"] = self.revision  # cleared by the next revision or the CLI

    def upgrade(self) -> None:
        self._run(self.upgrade_batches())

    def downgrade(self) -> None:
        self._run(self.downgrade_batches())


_REVOKE_ON_OBJECT = re.compile(r"^REVOKE\s+.+?\s+ON\s+OBJECT::(?P<name>\S+)\s+FROM\s", re.I | re.S)
_REVOKE_ON_TYPE = re.compile(r"^REVOKE\s+.+?\s+ON\s+TYPE::(?P<name>\S+)\s+FROM\s", re.I | re.S)
_DROP_INDEX = re.compile(r"^DROP\s+INDEX\s+IF\s+EXISTS\s+\S+\s+ON\s+(?P<name>\S+)\s*$", re.I)


def _guard_object(sql: str) -> str:
    """REVOKE ... ON OBJECT:: / TYPE:: and DROP INDEX ... ON fail when the
    object is gone: guard them, so a downgrade removes what exists and nothing else."""
    match = _REVOKE_ON_OBJECT.match(sql) or _DROP_INDEX.match(sql)
    if match:
        name = match.group("name").replace("'", "''")
        return f"IF OBJECT_ID(N'{name}') IS NOT NULL\n    {sql}"
    match = _REVOKE_ON_TYPE.match(sql)
    if match:
        name = match.group("name").replace("'", "''")
        return f"IF TYPE_ID(N'{name}') IS NOT NULL\n    {sql}"
    return sql


# --------------------------------------------------------------------------
# Adding delayed execution later (-x broker=add)
# --------------------------------------------------------------------------


def broker_catch_up_files(target: str, root: Path | None = None) -> list[tuple[str, str]]:
    """(file, revision) for every broker file at ``target``: the newest frozen
    copy of each up to ``target``, in sql/BuildOrder.txt order (below the head,
    files the build order no longer lists follow in the order they were first frozen)."""
    newest: dict[str, str] = {}
    first_seen: list[str] = []
    for rev in revisions(root):
        if rev > target:
            break
        for rel in revision_files(rev, root):
            if rel.startswith(BROKER_PREFIX):
                if rel not in newest:
                    first_seen.append(rel)
                newest[rel] = rev
    try:
        order = build_order(root)
    except OSError:
        order = []
    ordered = [rel for rel in order if rel in newest]
    # Files the build order no longer lists belong to older revisions only: at
    # the head they were retired (and their objects may no longer compile).
    if target != head_revision(root):
        ordered += [rel for rel in first_seen if rel not in ordered]
    return [(rel, newest[rel]) for rel in ordered]


def broker_catch_up_batches(target: str, options: DeployOptions, offline: bool,
                            root: Path | None = None) -> list[tuple[str, str]]:
    """The batches that add delayed execution to a database at ``target``
    deployed with broker=off: a fresh install of the broker part at that
    revision (the newest frozen copy of every broker file), the seed checks
    (``-x seed=``), the option stored as on, checksums recorded.  Run in one
    transaction."""
    files = broker_catch_up_files(target, root)
    texts = {rel: frozen_text(rev, rel, root) for rel, rev in files}
    batches: list[tuple[str, str]] = [("(session options)", SESSION_OPTIONS)]
    batches += [("(revision check)", sql) for sql in version_check(
        "broker=add", target, "upgrade", False, offline, revisions(root))]
    batches += [("(stored options)", option_batch(options, adding_broker=True)), ("(broker check)", BROKER_CHECK)]
    batches += [(rel, guarded_schema(statement_text(texts[rel]))) for rel, _ in files]
    batches += [("(revision checks)", sql) for sql in seed_checks(options.seed, target)]
    batches += [("(checksums)", checksum_batch(dict(files), texts, target, delete=False)),
                ("(queue readers)", readers_batch(options))]
    if not offline:
        return batches
    guard = guard_batch(f"{target} (broker=add)")
    out: list[tuple[str, str]] = []
    for label, sql in batches:
        out.append((label, sql))
        if label != "(session options)":
            out.append(("(guard)", guard))
    return out


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


_VERSION_GUARD_INSTALLED = False


def install_version_table_guard() -> None:
    """Make the CREATE TABLE of Alembic's version table idempotent.

    Offline, Alembic writes an unguarded ``CREATE TABLE`` for its version table
    at the top of a script that starts from base, so a second run of the same
    script stopped at its first batch.  This compiles that one table's CREATE
    (and no other) as ``IF OBJECT_ID(...) IS NULL CREATE TABLE ...``; online,
    Alembic checks for the table first, and the guard changes nothing.
    """
    global _VERSION_GUARD_INSTALLED
    if _VERSION_GUARD_INSTALLED:
        return
    from sqlalchemy.ext.compiler import compiles
    from sqlalchemy.schema import CreateTable

    @compiles(CreateTable, "mssql")
    def _create_table(element, compiler, **kw):  # noqa: ANN001 - SQLAlchemy's hook
        sql = compiler.visit_create_table(element, **kw)
        table = element.element
        if table.name == VERSION_TABLE:
            full = f"{table.schema or VERSION_SCHEMA}.{table.name}"
            return f"IF OBJECT_ID(N'{full}', N'U') IS NULL\n" + sql.strip("\n")
        return sql

    _VERSION_GUARD_INSTALLED = True


# --------------------------------------------------------------------------
# Drift: what the database should hold at a revision
# --------------------------------------------------------------------------

MODULE_KINDS = ("procedure", "view", "function", "trigger")


def expected_modules(deployed: str, broker: bool = True, root: Path | None = None
                     ) -> dict[str, tuple[str, str, str]]:
    """Every module (procedure, view, function, trigger) a database at
    ``deployed`` holds: name -> (file, revision of its newest frozen copy up to
    ``deployed``, the text sent, i.e. what sys.sql_modules stores)."""
    newest: dict[str, str] = {}
    for rev in revisions(root):
        if rev > deployed:
            break
        for rel in revision_files(rev, root):
            if broker or not rel.startswith(BROKER_PREFIX):
                newest[rel] = rev
    out: dict[str, tuple[str, str, str]] = {}
    for rel, rev in newest.items():
        text = statement_text(frozen_text(rev, rel, root))
        obj = describe(text)
        if obj.kind in MODULE_KINDS:
            out[obj.name] = (rel, rev, text)
    return out


def normalise_module(text: str | None) -> str | None:
    """Module text compared for drift: line ends unified, surrounding white
    space and one trailing ``;`` (the script's terminator) removed."""
    if text is None:
        return None
    return statement_text(text.replace("\r\n", "\n").replace("\r", "\n").strip())


def drift(expected: dict[str, tuple[str, str, str]], actual: dict[str, str | None]) -> list[str]:
    """One line per object whose definition in the database is not the frozen
    text of the revision the database is at (missing objects included)."""
    problems = []
    for name, (rel, rev, text) in sorted(expected.items()):
        have = normalise_module(actual.get(name))
        want = normalise_module(text)
        if have is None:
            problems.append(f"{name}: missing (frozen in {rev}/{rel})")
        elif have != want:
            have_lines, want_lines = have.split("\n"), (want or "").split("\n")
            line = next((i + 1 for i, (a, b) in enumerate(zip(have_lines, want_lines, strict=False)) if a != b),
                        min(len(have_lines), len(want_lines)) + 1)
            problems.append(f"{name}: differs from {rev}/{rel} from line {line} "
                            "(changed by hand? re-apply the frozen text or make a revision)")
    return problems
