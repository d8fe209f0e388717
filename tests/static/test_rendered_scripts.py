"""(f) The rendered deployment scripts: `alembic upgrade head --sql` and
`alembic downgrade head:base --sql` render with no server, in GO-separated
batches, create and remove every object of sql/, and never contain ALTER
DATABASE, NOLOCK, TRUSTWORTHY, WAITFOR DELAY or an empty statement (END;;)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from mailq_db.devtools.scripts import batches, missing_objects, problems_in, render

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def upgrade() -> str:
    return render("upgrade", "head")


@pytest.fixture(scope="module")
def downgrade() -> str:
    return render("downgrade", "head:base")


def test_upgrade_script_is_clean(upgrade):
    assert problems_in(upgrade) == []


def test_downgrade_script_is_clean(downgrade):
    assert problems_in(downgrade) == []


def test_every_object_is_created_and_removed(upgrade, downgrade):
    assert missing_objects(upgrade, downgrade) == []


def test_upgrade_has_one_batch_per_frozen_file_and_records_the_revision(upgrade):
    from mailq_db.deployment import head_revision, revision_files, revisions

    files = sum(len(revision_files(rev)) for rev in revisions())
    assert len(batches(upgrade)) >= files
    assert f"VALUES ('{head_revision()}')" in upgrade or f"version_num='{head_revision()}'" in upgrade


def test_downgrade_leaves_only_the_version_table(downgrade):
    assert "DROP SCHEMA IF EXISTS mailq" in downgrade
    assert "DELETE FROM dbo.mailq_alembic_version" in downgrade


def test_alembic_cli_renders_from_the_checkout():
    result = subprocess.run(
        [sys.executable, "-m", "alembic", "upgrade", "head", "--sql"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "CREATE OR ALTER PROCEDURE mailq.ClaimMail" in result.stdout
    assert "\nGO\n" in result.stdout


# -- the checker fails on broken samples -------------------------------------

GOOD = "CREATE OR ALTER PROCEDURE mailq.P\nAS\nBEGIN\n    SELECT 1;\nEND;\nGO\n"


def test_clean_sample_passes():
    assert problems_in(GOOD) == []


@pytest.mark.parametrize(
    "script,expected",
    [
        ("CREATE OR ALTER PROCEDURE mailq.P AS BEGIN SELECT 1; END;;\nGO\n", "empty statement"),
        ("SELECT q.ID FROM mailq.MailQueue AS q WITH (NOLOCK);\nGO\n", "NOLOCK"),
        ("ALTER DATABASE CURRENT SET ENABLE_BROKER;\nGO\n", "ALTER DATABASE"),
        ("ALTER DATABASE CURRENT SET TRUSTWORTHY ON;\nGO\n", "TRUSTWORTHY"),
        ("WAITFOR DELAY '00:00:05';\nGO\n", "WAITFOR DELAY"),
        ("SELECT GETDATE();\nGO\n", "GETDATE()"),
        ("CREATE OR ALTER PROCEDURE mailq.P AS SELECT 1;\n", "no GO"),
        ("CREATE OR ALTER VIEW mailq.V AS SELECT 1 AS A;\nCREATE OR ALTER VIEW mailq.W AS SELECT 1 AS A;\nGO\n",
         "alone in a batch"),
    ],
    ids=["END;;", "NOLOCK", "ALTER DATABASE", "TRUSTWORTHY", "WAITFOR DELAY", "GETDATE", "no GO", "two CREATEs"],
)
def test_checker_reports_a_broken_script(script, expected):
    assert any(expected in p for p in problems_in(script))


def test_words_inside_strings_and_comments_are_not_statements():
    script = ("-- never NOLOCK here\nTHROW 50401, N'Run ALTER DATABASE [x] SET ENABLE_BROKER "
              "WITH ROLLBACK IMMEDIATE;', 1;\nGO\n")
    assert problems_in(script) == []


def test_missing_object_is_reported(upgrade, downgrade):
    without_claim = upgrade.replace("CREATE OR ALTER PROCEDURE mailq.ClaimMail", "-- removed")
    problems = missing_objects(without_claim, downgrade)
    assert any("mailq.ClaimMail is not created" in p for p in problems)


# -- issue 21: the fresh install creates each object exactly once ---------------

_CREATES = re.compile(
    r"\bCREATE\s+(?:OR\s+ALTER\s+)?(?:UNIQUE\s+)?(?:NONCLUSTERED\s+|CLUSTERED\s+)?"
    r"(PROCEDURE|VIEW|FUNCTION|TRIGGER|TABLE|TYPE|SCHEMA|ROLE|USER|QUEUE|SERVICE|CONTRACT|MESSAGE\s+TYPE|INDEX)\s+"
    r"(\[[^\]]+\]|[\w.]+)", re.I)


def created_objects(script: str) -> dict[str, int]:
    """``KIND name`` -> how often the script's code (not its comments or
    strings) creates it; a schema's CREATE sits inside an EXEC string."""
    from mailq_db.deployment import code_only

    counts: dict[str, int] = {}
    code = code_only(script) + "\n" + "\n".join(re.findall(r"EXEC \(N'(CREATE SCHEMA [^']*)'\)", script))
    for kind, name in _CREATES.findall(code):
        key = " ".join(kind.upper().split()) + " " + name
        counts[key] = counts.get(key, 0) + 1
    return counts


def test_the_fresh_install_creates_each_object_once(upgrade):
    from mailq_db.deployment import build_order, describe, revisions, sql_dir

    counts = created_objects(upgrade)
    assert revisions() == ["0001"]
    twice = {k: n for k, n in counts.items() if n != 1 and not k.startswith("TABLE #")}
    assert twice == {}
    wanted = {describe((sql_dir() / rel).read_text(encoding="utf-8")) for rel in build_order()}
    names = {k.split(" ", 1)[1] if not k.startswith("MESSAGE") else k.split(" ", 2)[2] for k in counts}
    for obj in wanted:
        if obj.kind not in ("grant", "script"):
            assert obj.name in names, obj


def test_the_counter_sees_a_second_create():
    sample = "CREATE OR ALTER PROCEDURE mailq.P AS SELECT 1;\nGO\nCREATE OR ALTER PROCEDURE mailq.P AS SELECT 2;\nGO\n"
    assert created_objects(sample) == {"PROCEDURE mailq.P": 2}


def test_the_fresh_install_is_a_script_a_dba_can_review(upgrade):
    """At most 12,000 lines, headers included (a module's header is stored and shipped
    with it); the queue-only install and the downgrade are smaller still."""
    assert upgrade.count("\n") <= 12_000, upgrade.count("\n")
    queue_only = render("upgrade", "head", ("broker=off",))
    assert queue_only.count("\n") < upgrade.count("\n")
