"""``mailq-db dev``: maintainer commands that freeze sql/ into Alembic revisions."""

from __future__ import annotations

import argparse
import re
import shutil
from pathlib import Path

from .. import deployment as d
from ..errors import ConfigurationError

HELP = """\
Freeze the current sql/ files into Alembic revisions (run in a checkout).

examples:
  mailq-db dev new-revision -m "add mailq.GetQueueStats"
  mailq-db dev refreeze            re-freeze the unreleased head revision (the baseline: all of sql/)
  mailq-db dev status              list the files that differ from their frozen copy
  mailq-db dev mark-generated      add the generated-copy marker to every frozen file
  mailq-db dev release             mark the head revision released (never refrozen)
  mailq-db dev golden              rewrite the golden scripts in tests/static/golden/ and the
                                   roles and index tables of docs/dba-guide.md
"""

#: The golden copies of the rendered scripts: (file name, alembic command,
#: revision range, -x options).  A dependency upgrade or a code change that
#: alters the script fails tests/static/test_golden_script.py until
#: `mailq-db dev golden` rewrites them (then review the diff).
GOLDEN = (
    ("upgrade-head.sql", "upgrade", "head", ()),
    ("upgrade-head-broker-off.sql", "upgrade", "head", ("broker=off",)),
    ("downgrade-head-base.sql", "downgrade", "head:base", ()),
)


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "dev", help="maintainer tools: freeze sql/ into revisions", description=HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="dev_command", metavar="DEV_COMMAND", required=True)
    new = sub.add_parser("new-revision", help="freeze changed sql/ files into a new revision",
                         description="Freeze every sql/ file that differs from its newest frozen copy "
                         "into a new revision.\n\nexample:\n  mailq-db dev new-revision -m \"why\"",
                         formatter_class=argparse.RawDescriptionHelpFormatter)
    new.add_argument("-m", "--message", required=True, help="what the revision does and why")
    new.add_argument("paths", nargs="*", metavar="PATH",
                     help="freeze only changed files under these sql/ sub-paths (e.g. broker/)")
    new.set_defaults(func=new_revision)
    ref = sub.add_parser("refreeze", help="re-freeze the head revision if it is not released",
                         description="Re-freeze the head revision from sql/ (refused once the revision "
                         "is listed in alembic/frozen/RELEASED).\n\nexample:\n  mailq-db dev refreeze",
                         formatter_class=argparse.RawDescriptionHelpFormatter)
    ref.add_argument("paths", nargs="*", metavar="PATH",
                     help="re-freeze only changed files under these sql/ sub-paths")
    ref.set_defaults(func=refreeze)
    st = sub.add_parser("status", help="list sql/ files that differ from their newest frozen copy",
                        description="List sql/ files not yet frozen.\n\nexample:\n  mailq-db dev status",
                        formatter_class=argparse.RawDescriptionHelpFormatter)
    st.set_defaults(func=status)
    mark = sub.add_parser("mark-generated", help="mark every frozen copy as generated; rewrite the manifest",
                          description="Give every file under alembic/frozen/<rev>/ that lacks it the first "
                          "line\n  " + generated_marker("<path>") + "\nand rewrite MANIFEST.sha256. "
                          "Idempotent: marked files are left alone.\n\nexample:\n  mailq-db dev mark-generated",
                          formatter_class=argparse.RawDescriptionHelpFormatter)
    mark.set_defaults(func=mark_generated)
    rel = sub.add_parser("release", help="mark revisions released in alembic/frozen/RELEASED",
                         description="Pin revisions as released: their digest goes into "
                         "alembic/frozen/RELEASED, refreeze refuses them, and a test fails if their "
                         "frozen SQL ever changes.\n\nexample:\n  mailq-db dev release          # the head\n"
                         "  mailq-db dev release 0005 0006",
                         formatter_class=argparse.RawDescriptionHelpFormatter)
    rel.add_argument("revisions", nargs="*", metavar="REVISION", help="revisions to release (default: head)")
    rel.set_defaults(func=release)
    gold = sub.add_parser("golden", help="rewrite the golden scripts and the dba-guide's roles and index tables",
                          description="Render the deployment scripts into tests/static/golden/ and bring "
                          "the roles and index tables of docs/dba-guide.md in step with sql/ (run after "
                          "changing sql/ and refreezing, or after upgrading alembic/SQLAlchemy; then "
                          "review the diff).\n\nexample:\n  mailq-db dev golden",
                          formatter_class=argparse.RawDescriptionHelpFormatter)
    gold.set_defaults(func=golden)


def _checkout() -> Path:
    root = d.project_root()
    if root == d.BUNDLE_DIR or not (root / "sql" / "BuildOrder.txt").is_file():
        raise ConfigurationError("mailq-db dev works in a source checkout, not in an installed wheel")
    return root


def check_build_order(root: Path) -> list[str]:
    """BuildOrder.txt entries; every .sql file must be listed exactly once."""
    order = d.build_order(root)
    files = {p.relative_to(d.sql_dir(root)).as_posix() for p in d.sql_dir(root).rglob("*.sql")}
    problems = [f"listed twice: {f}" for f in {f for f in order if order.count(f) > 1}]
    problems += [f"listed but missing: {f}" for f in order if f not in files]
    problems += [f"not listed in sql/BuildOrder.txt: {f}" for f in sorted(files - set(order))]
    if problems:
        raise ConfigurationError("sql/BuildOrder.txt is out of date:\n  " + "\n  ".join(problems))
    return order


def changed_files(root: Path, before: str | None = None, paths: list[str] | None = None) -> list[str]:
    """Files (in build order) whose text differs from their newest frozen copy before ``before``,
    limited to those under ``paths`` (sub-paths of sql/) when given."""
    changed = []
    for rel in check_build_order(root):
        if paths and not any(rel == p or rel.startswith(p.rstrip("/") + "/") for p in paths):
            continue
        rev = d.newest_frozen(rel, before=before, root=root)
        current = (d.sql_dir(root) / rel).read_text(encoding="utf-8")
        # frozen_text() drops the generated-marker line the freeze adds.
        if rev is None or d.frozen_text(rev, rel, root) != current:
            changed.append(rel)
    return changed


def generated_marker(rel: str) -> str:
    """The first line of the frozen copy of ``sql/<rel>`` (stripped again by
    ``deployment.frozen_text``, so it never reaches a script or sys.sql_modules)."""
    return f"{d.GENERATED_MARKER} by mailq-db dev new-revision from sql/{rel}; do not edit\n"


def _freeze(root: Path, revision: str, files: list[str]) -> None:
    if revision in d.released(root):
        raise ConfigurationError(f"revision {revision} is released (alembic/frozen/RELEASED); "
                                 "its frozen SQL never changes: make a new revision instead")
    target = d.frozen_dir(root) / revision
    if target.exists():
        shutil.rmtree(target)
    for rel in files:
        dest = target / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_bytes(generated_marker(rel).encode("utf-8") + (d.sql_dir(root) / rel).read_bytes())
    (target / "FILES").write_text("\n".join(files) + "\n", encoding="utf-8")
    d.write_manifest(root)
    for rel in files:
        if d.newest_frozen(rel, before=revision, root=root) and rel.startswith(("tables/", "indexes/")):
            print(f"warning: {rel} changed; a table or index changes through an explicit ALTER "
                  "script in this revision, not by re-running its CREATE")


def new_revision(args) -> int:
    from alembic import command

    root = _checkout()
    head = d.head_revision(root)
    if head is not None and head not in d.released(root):
        raise ConfigurationError(
            f"revision {head} is not released: until it is, a change to sql/ edits it in place "
            "(mailq-db dev refreeze; docs/CONVENTIONS.md). A new revision follows a released one "
            "(mailq-db dev release).")
    files = changed_files(root, paths=args.paths)
    if not files:
        raise ConfigurationError("nothing to freeze: every sql/ file equals its newest frozen copy")
    revision = f"{int(head or 0) + 1:04d}"
    _freeze(root, revision, files)
    command.revision(d.alembic_config(root), message=args.message, rev_id=revision)
    print(f"revision {revision}: froze {len(files)} file(s)")
    return 0


def refreeze(args) -> int:
    root = _checkout()
    head = d.head_revision(root)
    if head is None:
        raise ConfigurationError("no revision yet: use mailq-db dev new-revision")
    if head in d.released(root):
        raise ConfigurationError(f"revision {head} is released (alembic/frozen/RELEASED); "
                                 "make a new revision instead")
    paths = list(getattr(args, "paths", None) or [])
    if d.revisions(root)[0] == head:
        return refreeze_baseline(root, head, paths)
    files = changed_files(root, before=head, paths=paths or _frozen_prefixes(root, head))
    if not files:
        raise ConfigurationError(f"revision {head} would freeze nothing; delete it instead")
    _freeze(root, head, files)
    print(f"revision {head}: re-froze {len(files)} file(s)")
    return 0


def refreeze_baseline(root: Path, head: str, paths: list[str]) -> int:
    """The baseline (the first revision) freezes every file of sql/BuildOrder.txt
    in its order: files added to or removed from sql/ come and go with it."""
    if paths:
        raise ConfigurationError(f"revision {head} is the baseline: it freezes every file of "
                                 "sql/BuildOrder.txt; run mailq-db dev refreeze without paths")
    order = check_build_order(root)
    upgrades = [rel for rel in order if rel.startswith("upgrades/")]
    if upgrades:
        raise ConfigurationError(
            f"{upgrades[0]}: the baseline creates every table in its final shape; change the table's "
            "file under sql/tables/ (or sql/broker/) instead. sql/upgrades/ serves revisions after "
            "the baseline is released.")
    current = d.revision_files(head, root) if (d.frozen_dir(root) / head / "FILES").is_file() else []
    same = current == order and all(
        d.frozen_text(head, rel, root) == (d.sql_dir(root) / rel).read_text(encoding="utf-8") for rel in order)
    if same and d.manifest_problems(root) == []:
        print(f"revision {head}: up to date ({len(order)} files)")
        return 0
    _freeze(root, head, order)
    added, removed = sorted(set(order) - set(current)), sorted(set(current) - set(order))
    print(f"revision {head}: re-froze the baseline ({len(order)} files; "
          f"{len(added)} added, {len(removed)} removed)")
    return 0


def _frozen_prefixes(root: Path, revision: str) -> list[str]:
    """The top-level sql/ folders a revision froze: refreeze keeps a revision to its own area."""
    return sorted({rel.split("/")[0] for rel in d.revision_files(revision, root)})


def status(args) -> int:
    root = _checkout()
    files = changed_files(root)
    for rel in files:
        print(rel)
    return 1 if files else 0


def mark_frozen_files(root: Path) -> list[str]:
    """Add the generated-copy marker to every frozen .sql file that lacks it and
    rewrite the manifest; the files marked (``REV/path``).  Idempotent."""
    marked = []
    base = d.frozen_dir(root)
    for rev in d.revisions(root):
        for path in sorted((base / rev).rglob("*.sql")):
            data = path.read_bytes()
            if data.startswith(d.GENERATED_MARKER.encode("utf-8")):
                continue
            rel = path.relative_to(base / rev).as_posix()
            path.write_bytes(generated_marker(rel).encode("utf-8") + data)
            marked.append(f"{rev}/{rel}")
    d.write_manifest(root)
    return marked


def mark_generated(args) -> int:
    root = _checkout()
    marked = mark_frozen_files(root)
    for rel in marked:
        print(f"marked {rel}")
    print(f"{len(marked)} frozen file(s) marked; {d.manifest_path(root).relative_to(root)} rewritten")
    return 0


def release(args) -> int:
    root = _checkout()
    wanted = list(getattr(args, "revisions", None) or [d.head_revision(root)])
    known = d.revisions(root)
    entries = d.released_digests(root)
    for rev in wanted:
        if rev not in known:
            raise ConfigurationError(f"no revision {rev} (known: {', '.join(known)})")
        entries[rev] = d.revision_digest(rev, root)
    lines = ["# Released revisions: their frozen SQL never changes (mailq-db dev release).",
             "# <revision> <sha256 over FILES and each file's text, generated marker stripped>"]
    lines += [f"{rev} {digest}" for rev, digest in sorted(entries.items())]
    d.released_path(root).write_text("\n".join(lines) + "\n", encoding="utf-8")
    print(f"released: {', '.join(wanted)}")
    return 0


def golden_dir(root: Path) -> Path:
    return root / "tests" / "static" / "golden"


def render_golden(root: Path | None, command: str, revision: str, x_args: tuple[str, ...]) -> str:
    import io

    from alembic import command as alembic_command

    out = io.StringIO()
    cfg = d.alembic_config(root, x_args=list(x_args), stdout=out)
    getattr(alembic_command, command)(cfg, revision, sql=True)
    return out.getvalue()


def golden(args) -> int:
    root = _checkout()
    target = golden_dir(root)
    target.mkdir(parents=True, exist_ok=True)
    for name, command, revision, x_args in GOLDEN:
        text = render_golden(root, command, revision, x_args)
        (target / name).write_text(text, encoding="utf-8", newline="\n")
        print(f"wrote {(target / name).relative_to(root)} ({len(text.splitlines())} lines)")
    guide = root / DBA_GUIDE
    if guide.is_file():
        text = guide.read_text(encoding="utf-8")
        synced = sync_dba_guide(text, root)
        if synced != text:
            guide.write_text(synced, encoding="utf-8", newline="\n")
            print(f"wrote {DBA_GUIDE} (roles and index tables brought in step with sql/)")
    return 0


# --------------------------------------------------------------------------
# The tables of docs/dba-guide.md that sql/ decides
# --------------------------------------------------------------------------

DBA_GUIDE = "docs/dba-guide.md"
_GRANT_LINE = re.compile(r"GRANT\s+(\w+)\s+ON\s+(OBJECT|TYPE)::([\w.]+)\s+TO\s+(\w+)", re.I)


def _table_at(text: str, header: str) -> tuple[int, int]:
    """(start, end) of the rows of the markdown table whose header line is ``header``."""
    start = text.index(header + "\n")
    rows = text.index("\n", text.index("\n", start) + 1) + 1  # after the | --- | line
    end = rows
    while text.startswith("| ", end):
        end = text.index("\n", end) + 1
    return rows, end


def _first_cells(rows: str) -> dict[str, list[str]]:
    out = {}
    for line in rows.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        out[cells[0].strip("`")] = cells
    return out


def sync_dba_guide(text: str, root: Path) -> str:
    """The guide's roles table lists every grant of the grant files (the
    'for' column is kept), and its index table every index of sql/ in build
    order (existing rows kept; a new index gets a row from its header)."""
    order = check_build_order(root)
    texts = {rel: (d.sql_dir(root) / rel).read_text(encoding="utf-8") for rel in order}
    grants: dict[str, list[tuple[str, str, str]]] = {}
    roles = [d.describe(texts[rel]).name for rel in order if rel.endswith(".role.sql")]
    for rel in order:
        for perm, kind, obj, role in _GRANT_LINE.findall(d.strip_comments(texts[rel])):
            grants.setdefault(role, []).append((perm.upper(), kind.upper(), obj))
    start, end = _table_at(text, "| role | grants | for |")
    old = _first_cells(text[start:end])
    rows = []
    for role in roles:
        parts: list[str] = []
        for perm, kind in (("EXECUTE", "OBJECT"), ("SELECT", "OBJECT"), ("EXECUTE", "TYPE")):
            names = [o for p, k, o in grants.get(role, []) if (p, k) == (perm, kind)]
            if names:
                label = "EXECUTE on type" if kind == "TYPE" else perm
                parts.append(f"{label} " + ", ".join(f"`{n}`" for n in dict.fromkeys(names)))
        purpose = old.get(role, [None, None, f"see sql/security/{role}.role.sql"])[2]
        rows.append(f"| `{role}` | {'; '.join(parts) or 'nothing'} | {purpose} |\n")
    text = text[:start] + "".join(rows) + text[end:]
    start, end = _table_at(text, "| index | serves | why |")
    old = _first_cells(text[start:end])
    rows = []
    for rel in order:
        obj = d.describe(texts[rel])
        if obj.kind != "index":
            continue
        key = f"{obj.parent}.{obj.name}"
        if key in old:
            rows.append("| " + " | ".join(old[key]) + " |\n")
            continue
        header = re.search(r"/\*(.*?)\*/", texts[rel], re.S)
        why = " ".join(header.group(1).split()) if header else "(no header)"
        rows.append(f"| `{key}` | see `sql/{rel}` | {why} |\n")
    return text[:start] + "".join(rows) + text[end:]
