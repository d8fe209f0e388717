"""The machinery for revisions after the baseline, proven before the first one
is needed (issue 21 point 3).

A scratch copy of the checkout plays a maintainer after the 1.0 release:
``mailq-db dev release`` pins the baseline, then one change to sql/ (a
procedure altered, a nullable column added through sql/upgrades/, an index
added) becomes revision 0002 with ``mailq-db dev new-revision``.  The tests
render its upgrade and downgrade with ``mailq-db deploy --sql`` run from the
copy and check the starting-revision guard, the frozen copies, the manifest
and drift.  The scratch copy is deleted at the end.  No SQL runs here: what
the rendered text does on a server is what tests/integration checks for the
baseline.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from mailq_db import deployment as d

ROOT = Path(__file__).resolve().parents[2]

PROCEDURE = "procedures/mailq.CancelMail.sql"
UPGRADE = "upgrades/mailq.0002.MailQueue.sql"
INDEX = "indexes/mailq.MailQueue.IX_MailQueue_Note.sql"
TABLE = "tables/mailq.MailQueue.sql"
#: What revision 0002 changes in the procedure (a comment is part of its text).
CHANGE = "-- changed by revision 0002"

UPGRADE_SQL = """\
/*
Revision 0002: mailq.MailQueue gains Note NVARCHAR(200) NULL (no existing row
needs a value).  Guarded: a second run changes nothing.  Dynamic SQL: the
schema model already holds the column (sql/tables/mailq.MailQueue.sql).
*/
IF COL_LENGTH(N'mailq.MailQueue', N'Note') IS NULL
    EXEC sys.sp_executesql N'ALTER TABLE mailq.MailQueue ADD Note NVARCHAR(200) NULL;';
"""

INDEX_SQL = """\
/*
IX_MailQueue_Note: mail that carries a note.  Keys (Note, ID), filtered to Note IS NOT NULL.
*/
IF NOT EXISTS (
    SELECT 1
    FROM sys.indexes
    WHERE name = N'IX_MailQueue_Note' AND object_id = OBJECT_ID(N'mailq.MailQueue')
)
    CREATE NONCLUSTERED INDEX IX_MailQueue_Note
    ON mailq.MailQueue (Note ASC, ID ASC)
    WHERE Note IS NOT NULL;
"""


def cli(scratch: Path, *args: str) -> subprocess.CompletedProcess:
    """``mailq-db ARGS`` as a maintainer runs it in the scratch checkout."""
    env = {k: v for k, v in os.environ.items() if k != "MAILQ_DB_URL"}
    env["PYTHONPATH"] = str(scratch / "src")
    result = subprocess.run([sys.executable, "-m", "mailq_db.cli", *args], cwd=scratch, env=env,
                            capture_output=True, text=True, timeout=300)
    return result


def ok(result: subprocess.CompletedProcess) -> str:
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    return result.stdout


@pytest.fixture(scope="module")
def scratch(tmp_path_factory):
    """The scratch checkout after `dev release` and `dev new-revision`."""
    root = tmp_path_factory.mktemp("next-revision") / "checkout"
    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info", "_bundle")
    for name in ("sql", "alembic", "src"):
        shutil.copytree(ROOT / name, root / name, ignore=ignore)
    for name in ("alembic.ini", "pyproject.toml"):
        shutil.copy(ROOT / name, root / name)
    sql = root / "sql"
    state = {"root": root, "old_procedure": (sql / PROCEDURE).read_text(encoding="utf-8")}

    ok(cli(root, "dev", "release"))  # 1.0 ships: the baseline is pinned
    state["released"] = d.released_digests(root)

    # One change: a procedure altered, a nullable column through sql/upgrades/, an index.
    text = state["old_procedure"]
    assert "SET NOCOUNT, XACT_ABORT ON;" in text
    (sql / PROCEDURE).write_text(text.replace("SET NOCOUNT, XACT_ABORT ON;", "SET NOCOUNT, XACT_ABORT ON;  " + CHANGE, 1),
                                 encoding="utf-8")
    table = (sql / TABLE).read_text(encoding="utf-8")
    anchor = "        CONSTRAINT PK_MailQueue PRIMARY KEY"
    assert anchor in table
    (sql / TABLE).write_text(table.replace(anchor, "        Note NVARCHAR(200) NULL,\n" + anchor, 1), encoding="utf-8")
    (sql / UPGRADE).write_text(UPGRADE_SQL, encoding="utf-8")
    (sql / INDEX).write_text(INDEX_SQL, encoding="utf-8")
    order = (sql / "BuildOrder.txt").read_text(encoding="utf-8")
    order = order.replace(f"{TABLE}\n", f"{TABLE}\n{UPGRADE}\n{INDEX}\n", 1)
    (sql / "BuildOrder.txt").write_text(order, encoding="utf-8")

    refused = cli(root, "dev", "refreeze")  # the released baseline is never rewritten
    assert refused.returncode == 1 and "released" in refused.stderr
    state["new_revision"] = ok(cli(root, "dev", "new-revision", "-m", "note on mail"))

    # Without the downgrade of its upgrades/ file the revision does not render a downgrade.
    unnamed = cli(root, "deploy", "--sql", "--downgrade", "0002:0001")
    assert unnamed.returncode == 1 and unnamed.stdout == "" and "names no downgrade" in unnamed.stderr
    state["unnamed"] = unnamed.stderr
    # The maintainer names the upgrade file's downgrade in the generated revision.
    [migration] = (root / "alembic/versions").glob("0002_*.py")
    source = migration.read_text(encoding="utf-8")
    source = source.replace("from mailq_db.deployment import RevisionPlan",
                            "from mailq_db.deployment import RevisionPlan, drop_column")
    source = source.replace(
        "PLAN = RevisionPlan.load(revision, __file__)",
        f"PLAN = RevisionPlan.load(revision, __file__, drop_overrides={{\n"
        f"    {UPGRADE!r}: drop_column('mailq.MailQueue', 'Note'),\n}})")
    migration.write_text(source, encoding="utf-8")
    state["migration"] = source

    state["upgrade"] = ok(cli(root, "deploy", "--sql", "--revision", "0001:head"))
    state["downgrade"] = ok(cli(root, "deploy", "--sql", "--downgrade", "0002:0001"))
    state["downgrade_drop"] = ok(cli(root, "deploy", "--sql", "--downgrade", "0002:0001", "-x", "drop_data=yes"))
    state["fresh"] = ok(cli(root, "deploy", "--sql"))
    yield state
    shutil.rmtree(root)
    assert not root.exists()


def section(script: str, marker: str) -> str:
    start = script.index(marker)
    end = script.find("-- Running ", start + len(marker))
    return script[start:] if end < 0 else script[start:end]


def test_new_revision_freezes_exactly_the_changed_files(scratch):
    root = scratch["root"]
    assert "revision 0002: froze 4 file(s)" in scratch["new_revision"]
    assert d.revisions(root) == ["0001", "0002"]
    assert d.revision_files("0002", root) == [TABLE, UPGRADE, INDEX, PROCEDURE]
    for rel in d.revision_files("0002", root):
        raw = (d.frozen_dir(root) / "0002" / rel).read_text(encoding="utf-8")
        assert raw.startswith(d.GENERATED_MARKER) and d.frozen_text("0002", rel, root) == (
            root / "sql" / rel).read_text(encoding="utf-8")
    # the baseline is untouched: its digest is the released one
    assert scratch["released"] == {"0001": d.revision_digest("0001", root)}
    assert cli(root, "dev", "status").returncode == 0  # nothing left unfrozen
    assert "down_revision = '0001'" in scratch["migration"]


def test_the_manifest_pins_both_revisions_and_catches_a_changed_release(scratch):
    root = scratch["root"]
    assert d.manifest_problems(root) == []
    assert {rel.split("/")[0] for rel in d.read_manifest(root)} == {"0001", "0002"}
    frozen = d.frozen_dir(root) / "0001" / PROCEDURE
    original = frozen.read_text(encoding="utf-8")
    frozen.write_text(original + "\n-- edited\n", encoding="utf-8")
    try:
        d.write_manifest(root)  # even a rewritten manifest does not hide it
        assert any("released revision 0001" in p for p in d.manifest_problems(root))
        refused = cli(root, "deploy", "--sql")
        assert refused.returncode == 1 and refused.stdout == "" and "MANIFEST.sha256" in refused.stderr
    finally:
        frozen.write_text(original, encoding="utf-8")
        d.write_manifest(root)


def test_upgrade_checks_the_starting_revision_and_applies_only_the_change(scratch):
    up = scratch["upgrade"]
    assert "-- Running upgrade 0001 -> 0002" in up and "-- Running upgrade  -> 0001" not in up
    body = section(up, "-- Running upgrade 0001 -> 0002")
    check = body.index("IF NOT (@Rows = 1 AND @Current = '0001')")
    assert body.index("THROW 50410", check) > check
    assert "IF @Rows = 1 AND @Current NOT IN ('0001', '0002')" in body  # newer database: 50421
    code = d.code_only(body)
    assert code.count("CREATE OR ALTER PROCEDURE mailq.CancelMail") == 1
    assert CHANGE in body
    assert "ALTER TABLE mailq.MailQueue ADD Note NVARCHAR(200) NULL;" in body
    assert body.index("ADD Note") < body.index("CREATE NONCLUSTERED INDEX IX_MailQueue_Note")
    assert "CREATE OR ALTER PROCEDURE mailq.ClaimMail" not in code  # nothing else is replayed
    assert "UPDATE dbo.mailq_alembic_version SET version_num='0002' WHERE dbo.mailq_alembic_version.version_num = '0001'" in up
    assert "('0002', N'procedures/mailq.CancelMail.sql'," in body  # its checksum is stored
    # every batch of the revision is followed by the guard
    assert body.count("RAISERROR(N'mailq-db: revision 0002 failed") >= 4


def test_downgrade_restores_the_procedure_and_refuses_to_drop_a_column_with_values(scratch):
    down = section(scratch["downgrade"], "-- Running downgrade 0002 -> 0001")
    assert "IF NOT (@Rows = 1 AND @Current = '0002')" in down and "THROW 50411" in down
    assert d.statement_text(scratch["old_procedure"]) in down and CHANGE not in down  # 0001's text is back
    assert "DROP PROCEDURE IF EXISTS mailq.CancelMail" not in down
    assert "DROP INDEX IF EXISTS IX_MailQueue_Note ON mailq.MailQueue" in down
    refuse, drop = down.index("THROW 50422"), down.index("ALTER TABLE mailq.MailQueue DROP COLUMN Note;")
    assert down.index("DROP INDEX IF EXISTS IX_MailQueue_Note") < refuse < drop
    assert "DROP TABLE" not in d.code_only(down) and "THROW 50420" not in down  # no table is dropped
    assert "UPDATE dbo.mailq_alembic_version SET version_num='0001'" in scratch["downgrade"]
    with_data = section(scratch["downgrade_drop"], "-- Running downgrade 0002 -> 0001")
    assert "THROW 50422" not in with_data and "DROP COLUMN Note" in with_data


def test_a_fresh_install_runs_the_baseline_then_the_revision(scratch):
    fresh = scratch["fresh"]
    first, second = fresh.index("-- Running upgrade  -> 0001"), fresh.index("-- Running upgrade 0001 -> 0002")
    assert first < second
    assert "THROW 50410" in section(fresh, "-- Running upgrade 0001 -> 0002")


def test_drift_compares_with_the_revision_the_database_is_at(scratch):
    root = scratch["root"]
    at_2 = d.expected_modules("0002", root=root)
    at_1 = d.expected_modules("0001", root=root)
    assert at_2["mailq.CancelMail"][:2] == (PROCEDURE, "0002")
    assert at_1["mailq.CancelMail"][:2] == (PROCEDURE, "0001")
    assert at_2["mailq.ClaimMail"][1] == "0001"
    deployed_0001 = {name: text for name, (_, _, text) in at_1.items()}
    assert d.drift(at_1, deployed_0001) == []
    problems = d.drift(at_2, deployed_0001)  # a database at 0002 still holding 0001's text
    assert problems == [f"mailq.CancelMail: differs from 0002/{PROCEDURE} from line "
                        + re.search(r"from line (\d+)", problems[0]).group(1)
                        + " (changed by hand? re-apply the frozen text or make a revision)"]


def test_a_range_going_down_is_refused_in_the_scratch_copy(scratch):
    refused = cli(scratch["root"], "deploy", "--sql", "--revision", "0002:0001")
    assert refused.returncode == 1 and refused.stdout == ""
    assert "--downgrade 0002:0001" in refused.stderr and len(refused.stderr.strip().splitlines()) == 1


def test_rendered_scripts_parse_with_microsofts_parser(scratch, tmp_path):
    """ScriptDom (TSql150Parser) parses both rendered scripts of the scratch
    copy, the machinery's batches (drop_column, the 50422 check) included."""
    from mailq_db.devtools import tsqlcheck as t

    _, reason = t.tool_or_reason(ROOT)
    if reason is not None:
        if os.environ.get(t.REQUIRE_ENV) == "1":
            pytest.fail(f"{t.REQUIRE_ENV}=1 but: {reason}")
        pytest.skip(reason)
    paths = []
    for name in ("upgrade", "downgrade"):
        path = tmp_path / f"{name}.sql"
        path.write_text(re.sub(r"^(\s*):(?=[a-z]+\b)", r"\1-- sqlcmd :", scratch[name], flags=re.M | re.I),
                        encoding="utf-8")
        paths.append(path)
    parsed = t.parse(paths, ROOT)
    assert {str(p): parsed[str(p)] for p in paths} == {str(p): [] for p in paths}
