"""Revisions freeze the SQL they deploy (DESIGN.md, "Alembic"): the newest
frozen copy of every sql/ file equals sql/, released copies never change
(their hashes are pinned in MANIFEST.sha256), and BuildOrder.txt lists every
file exactly once.  Until 1.0 there is one revision, the baseline: it freezes
every file of sql/ once, and `mailq-db dev refreeze` rewrites it in place."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from mailq_db import deployment as d
from mailq_db.commands import dev

ROOT = Path(__file__).resolve().parents[2]


def test_build_order_lists_every_sql_file_once():
    order = dev.check_build_order(ROOT)
    assert len(order) == len(list((ROOT / "sql").rglob("*.sql")))


def test_every_sql_file_equals_its_newest_frozen_copy():
    assert dev.changed_files(ROOT) == [], "run `mailq-db dev new-revision` (or `dev refreeze`)"


def test_manifest_pins_every_frozen_file():
    assert d.read_manifest(ROOT) == d.frozen_entries(ROOT)


def test_released_revisions_are_pinned():
    manifest = d.read_manifest(ROOT)
    for rev in d.released(ROOT):
        files = [rel for rel in manifest if rel.startswith(f"{rev}/")]
        assert files, f"released revision {rev} has no pinned files"


def test_every_revision_has_a_migration_and_a_frozen_folder():
    versions = sorted(p.name.split("_")[0] for p in (ROOT / "alembic/versions").glob("*.py"))
    assert versions == d.revisions(ROOT)


def test_one_baseline_revision_freezes_every_file_once():
    assert d.revisions(ROOT) == ["0001"]
    assert d.revision_files("0001", ROOT) == d.build_order(ROOT)
    frozen = sorted(p.relative_to(d.frozen_dir(ROOT) / "0001").as_posix()
                    for p in (d.frozen_dir(ROOT) / "0001").rglob("*.sql"))
    assert frozen == sorted(d.build_order(ROOT))
    assert sorted(p.name for p in d.frozen_dir(ROOT).iterdir()) == ["0001", "MANIFEST.sha256", "RELEASED"]


def test_sql_upgrades_is_empty_until_a_revision_after_the_baseline():
    folder = ROOT / "sql" / "upgrades"
    assert folder.is_dir() and list(folder.glob("*.sql")) == []
    assert (folder / "README.md").is_file()


def test_revision_files_follow_the_build_order():
    order = d.build_order(ROOT)
    for rev in d.revisions(ROOT):
        # A file removed from sql/ before 1.0 (mailq.RenderDbMailQuery, issue 25)
        # stays in older revisions until the baseline replaces them.
        files = [f for f in d.revision_files(rev, ROOT) if f in order]
        assert files == sorted(files, key=order.index), rev


# -- negative samples: a copy of the project with a defect --------------------


@pytest.fixture
def project(tmp_path):
    for name in ("sql", "alembic"):
        shutil.copytree(ROOT / name, tmp_path / name)
    shutil.copy(ROOT / "alembic.ini", tmp_path / "alembic.ini")
    return tmp_path


def test_hand_edited_frozen_copy_is_detected(project):
    frozen = project / "alembic/frozen/0001/procedures/mailq.ClaimMail.sql"
    frozen.write_text(frozen.read_text(encoding="utf-8") + "\n-- edited by hand\n", encoding="utf-8")
    assert d.read_manifest(project) != d.frozen_entries(project)


def test_unfrozen_change_is_detected(project):
    path = project / "sql/procedures/mailq.CancelMail.sql"
    path.write_text(path.read_text(encoding="utf-8").replace("@ID BIGINT", "@ID BIGINT ", 1), encoding="utf-8")
    assert dev.changed_files(project) == ["procedures/mailq.CancelMail.sql"]


def test_file_missing_from_build_order_is_detected(project):
    (project / "sql/procedures/mailq.Extra.sql").write_text("SELECT 1;\n", encoding="utf-8")
    with pytest.raises(Exception, match="not listed"):
        dev.check_build_order(project)


def test_released_revision_cannot_be_refrozen(project, monkeypatch):
    head = d.head_revision(project)
    (project / "alembic/frozen/RELEASED").write_text(f"{head}\n", encoding="utf-8")
    monkeypatch.setattr(d, "project_root", lambda: project)
    with pytest.raises(Exception, match="released"):
        dev.refreeze(None)


def refreeze(project, monkeypatch, capsys=None) -> str:
    monkeypatch.setattr(d, "project_root", lambda: project)
    assert dev.refreeze(type("Args", (), {"paths": []})()) == 0
    return capsys.readouterr().out if capsys else ""


def test_refreezing_the_baseline_follows_added_and_removed_files(project, monkeypatch, capsys):
    order = (project / "sql/BuildOrder.txt").read_text(encoding="utf-8")
    (project / "sql/procedures/mailq.CancelMail.sql").unlink()
    (project / "sql/procedures/mailq.Extra.sql").write_text(
        "CREATE OR ALTER PROCEDURE mailq.Extra\nAS\nSELECT 1;\n", encoding="utf-8")
    order = order.replace("procedures/mailq.CancelMail.sql\n", "procedures/mailq.Extra.sql\n")
    (project / "sql/BuildOrder.txt").write_text(order, encoding="utf-8")
    out = refreeze(project, monkeypatch, capsys)
    assert "1 added, 1 removed" in out
    assert d.revision_files("0001", project) == d.build_order(project)
    assert not (d.frozen_dir(project) / "0001/procedures/mailq.CancelMail.sql").exists()
    assert d.frozen_text("0001", "procedures/mailq.Extra.sql", project).startswith("CREATE OR ALTER")
    assert d.manifest_problems(project) == [] and dev.changed_files(project) == []
    assert "up to date" in refreeze(project, monkeypatch, capsys)  # a second run changes nothing


def test_the_baseline_refuses_an_upgrades_file(project, monkeypatch):
    (project / "sql/upgrades/mailq.0001.MailQueue.sql").write_text(
        "IF COL_LENGTH(N'mailq.MailQueue', N'X') IS NULL ALTER TABLE mailq.MailQueue ADD X INT NULL;\n",
        encoding="utf-8")
    order = (project / "sql/BuildOrder.txt").read_text(encoding="utf-8")
    (project / "sql/BuildOrder.txt").write_text(order + "upgrades/mailq.0001.MailQueue.sql\n", encoding="utf-8")
    monkeypatch.setattr(d, "project_root", lambda: project)
    with pytest.raises(Exception, match="sql/tables/"):
        dev.refreeze(type("Args", (), {"paths": []})())


def test_no_new_revision_before_the_baseline_is_released(project, monkeypatch):
    monkeypatch.setattr(d, "project_root", lambda: project)
    path = project / "sql/procedures/mailq.CancelMail.sql"
    path.write_text(path.read_text(encoding="utf-8") + "\n", encoding="utf-8")
    with pytest.raises(Exception, match="not released.*refreeze"):
        dev.new_revision(type("Args", (), {"message": "x", "paths": []})())


def release(project, monkeypatch):
    monkeypatch.setattr(d, "project_root", lambda: project)
    dev.release(type("A", (), {"revisions": []})())


def test_new_revision_freezes_only_the_changed_file_and_downgrade_restores_it(project, monkeypatch):
    release(project, monkeypatch)
    path = project / "sql/procedures/mailq.CancelMail.sql"
    old_text = path.read_text(encoding="utf-8")
    path.write_text(old_text.replace("only an UnSent mail can be cancelled", "only UnSent mail can be cancelled"),
                    encoding="utf-8")
    args = type("Args", (), {"message": "reword CancelMail", "paths": []})()
    assert dev.new_revision(args) == 0
    head = d.head_revision(project)
    assert d.revision_files(head, project) == ["procedures/mailq.CancelMail.sql"]
    assert d.read_manifest(project) == d.frozen_entries(project)
    plan = d.RevisionPlan(head, project)
    assert plan.upgrade_statements()[0].endswith("END")  # trailing ';' stripped
    # downgrading the new revision restores the previous frozen text, not a DROP
    assert plan.downgrade_statements() == [d.statement_text(old_text)]


# -- the generated-copy marker -------------------------------------------------


def test_every_frozen_file_carries_the_generated_marker():
    base = d.frozen_dir(ROOT)
    unmarked = []
    for rev in d.revisions(ROOT):
        for path in sorted((base / rev).rglob("*.sql")):
            rel = path.relative_to(base / rev).as_posix()
            first = path.read_text(encoding="utf-8").split("\n", 1)[0] + "\n"
            if first != dev.generated_marker(rel):
                unmarked.append(f"{rev}/{rel}")
    assert unmarked == [], "run `mailq-db dev mark-generated`"


def test_gitattributes_marks_the_frozen_copies_generated():
    lines = (ROOT / ".gitattributes").read_text(encoding="utf-8").splitlines()
    assert "alembic/frozen/** linguist-generated=true" in lines


def test_strip_generated_marker_removes_only_a_leading_marker_line():
    body = "CREATE OR ALTER PROCEDURE mailq.P\nAS\nSELECT 1;\n"
    assert d.strip_generated_marker(dev.generated_marker("procedures/mailq.P.sql") + body) == body
    assert d.strip_generated_marker(body) == body
    inner = body + "-- GENERATED by hand\n"
    assert d.strip_generated_marker(inner) == inner  # only the first line is a marker
    assert d.strip_generated_marker("-- GENERATED") == ""


def test_deployed_text_never_carries_the_marker():
    for rev in d.revisions(ROOT):
        plan = d.RevisionPlan(rev, ROOT)
        for sql in plan.upgrade_statements() + plan.downgrade_statements():
            assert d.GENERATED_MARKER not in sql, rev


def test_freezing_writes_the_marker_and_frozen_equals_sql_without_it(project, monkeypatch):
    release(project, monkeypatch)
    path = project / "sql/procedures/mailq.CancelMail.sql"
    path.write_text(path.read_text(encoding="utf-8") + "\n", encoding="utf-8")
    args = type("Args", (), {"message": "touch CancelMail", "paths": []})()
    assert dev.new_revision(args) == 0
    head = d.head_revision(project)
    raw = (d.frozen_dir(project) / head / "procedures/mailq.CancelMail.sql").read_text(encoding="utf-8")
    assert raw == dev.generated_marker("procedures/mailq.CancelMail.sql") + path.read_text(encoding="utf-8")
    assert d.frozen_text(head, "procedures/mailq.CancelMail.sql", project) == path.read_text(encoding="utf-8")
    assert dev.changed_files(project) == []


def test_mark_generated_marks_unmarked_copies_once_and_rewrites_the_manifest(project):
    # another branch adds a frozen file without the marker, and does not update the manifest
    base = d.frozen_dir(project)
    copy = base / "0001/broker/dbo.ProcessDelayQueue.sql"
    bare = d.frozen_text("0001", "broker/dbo.ProcessDelayQueue.sql", project)
    copy.write_text(bare, encoding="utf-8")
    assert d.read_manifest(project) != d.frozen_entries(project)
    assert dev.mark_frozen_files(project) == ["0001/broker/dbo.ProcessDelayQueue.sql"]
    assert copy.read_text(encoding="utf-8") == dev.generated_marker("broker/dbo.ProcessDelayQueue.sql") + bare
    assert d.read_manifest(project) == d.frozen_entries(project)
    before = {p: p.read_bytes() for p in base.rglob("*") if p.is_file()}
    assert dev.mark_frozen_files(project) == []  # idempotent
    assert {p: p.read_bytes() for p in base.rglob("*") if p.is_file()} == before


def test_a_migration_naming_a_file_the_revision_lacks_is_refused(project, monkeypatch):
    """A file renamed under sql/ would otherwise lose its drop override
    silently (e.g. an adopted platform table dropped on downgrade)."""
    import importlib.util

    from mailq_db.devtools.scripts import render

    [path] = (project / "alembic/versions").glob("0001_*.py")
    spec = importlib.util.spec_from_file_location("baseline", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.PLAN.check_names()  # the real migration names only frozen files
    text = path.read_text(encoding="utf-8").replace('"broker/dbo.tabDIYTable12402.sql": [DROP_PLATFORM_TABLE]',
                                                    '"broker/dbo.tabDIYTable.sql": [DROP_PLATFORM_TABLE]')
    path.write_text(text, encoding="utf-8")
    with pytest.raises(Exception, match="names broker/dbo.tabDIYTable.sql"):
        render("downgrade", "head:base", root=project)
