"""Issue 12 points 4 and 5 (and issue 11 point 10), in the rendered scripts:
options stored in the database and checked against it, delayed execution
added later without a downgrade, activation off while a revision changes the
broker, released revisions pinned, the manifest verified at deploy time, drift
computed object by object."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from mailq_db import deployment as d
from mailq_db.commands import dev
from mailq_db.devtools.scripts import batches, render
from mailq_db.errors import ConfigurationError

ROOT = Path(__file__).resolve().parents[2]


def sections(script: str) -> dict[str, str]:
    import re

    parts = re.split(r"^-- Running (?:upgrade|downgrade) \S* ?-> (\S+)$", script, flags=re.M)
    return {parts[i]: parts[i + 1] for i in range(1, len(parts) - 1, 2)}


@pytest.fixture(scope="module")
def script() -> str:
    return render("upgrade", "head")


# -- 4. options live in the database -------------------------------------------


def test_options_are_stored_in_each_revision_transaction(script):
    for rev, section in sections(script).items():
        assert "INSERT INTO dbo.mailq_deployment_option (Name, Value) VALUES (N'broker', N'on')" in section, rev


def test_broker_off_refuses_a_database_that_has_the_broker_and_stores_off():
    off = render("upgrade", "head", ("broker=off",))
    for rev, section in sections(off).items():
        assert "IF @Stored = N'on'" in section and "THROW 50414" in section, rev
        assert "VALUES (N'broker', N'off')" in section
        assert "sp_set_session_context" not in section and "CREATE QUEUE" not in section, rev


def test_default_script_refuses_a_database_deployed_without_broker(script):
    first = sections(script)["0001"]
    check = first.index("IF @Stored = N'off'")
    assert first.index("THROW 50414", check) > check
    assert "-x broker=add" in first[check: first.index("THROW 50414", check)]


def test_readers_are_stored_and_reapplied_after_every_broker_revision():
    seven = render("upgrade", "head", ("readers=7",))
    assert "VALUES (N'readers', N'7')" in seven
    default = render("upgrade", "head")
    for rev, section in sections(default).items():
        assert "SELECT TRY_CONVERT(INT, Value) FROM dbo.mailq_deployment_option WHERE Name = N'readers'" in section


def test_unknown_option_is_refused():
    with pytest.raises(ConfigurationError, match="unknown -x option 'brokr'"):
        d.parse_options(["brokr=off"])
    assert d.parse_options(["broker=add"]).broker == "add"


def test_broker_add_is_a_catch_up_without_any_downgrade():
    script = render("upgrade", "head", ("broker=add",))
    head = d.head_revision(ROOT)
    assert "-- Running" not in script and f"-- Adding delayed execution at revision {head}" in script
    assert "DELETE FROM dbo.mailq_alembic_version" not in script and "DROP " not in d.code_only(script)
    assert f"IF NOT (@Rows = 1 AND @Current = '{head}')" in script
    assert "THROW 50415" in script and "THROW 50401" in script
    assert "VALUES (N'broker', N'on')" in script
    # the newest frozen copy of every broker file, once each, in build order
    files = d.broker_catch_up_files(head, ROOT)
    assert [rel for rel, _ in files] == [rel for rel in d.build_order(ROOT) if rel.startswith("broker/")]
    for rel, rev in files:
        assert rev == d.newest_frozen(rel, before=f"{int(head) + 1:04d}", root=ROOT)
        assert d.guarded_schema(d.statement_text(d.frozen_text(rev, rel, ROOT))) in script, rel
    assert "CREATE OR ALTER PROCEDURE mailq.ClaimMail" not in script  # the broker part only


# -- issue 11 point 10: activation off during upgrades ---------------------------


def test_revisions_with_broker_files_switch_activation_off_and_restore_it(script):
    for rev, section in sections(script).items():
        touches = any(rel.startswith("broker/") for rel in d.revision_files(rev, ROOT))
        if not touches:
            assert "sp_set_session_context" not in section, rev
            continue
        parts = [b.rstrip(";") for b in batches(section.split("\nCOMMIT;")[0])]
        off = parts.index(d.ACTIVATION_OFF)
        on = parts.index(d.ACTIVATION_RESTORE)
        sent = {d.guarded_schema(d.statement_text(d.frozen_text(rev, rel, ROOT)))
                for rel in d.revision_files(rev, ROOT) if rel.startswith("broker/")}
        broker_files = [i for i, b in enumerate(parts) if b in sent]
        assert broker_files, rev
        assert off < min(broker_files) and on > max(broker_files), rev
        assert "mailq_alembic_version" in parts[-1] and on < len(parts) - 1


def test_downgrade_also_switches_activation_off():
    down = render("downgrade", "head:base")
    assert d.ACTIVATION_OFF in down and d.ACTIVATION_RESTORE in down


# -- 5. frozen means frozen -------------------------------------------------------


def test_released_revisions_keep_their_digest():
    for rev, digest in d.released_digests(ROOT).items():
        assert digest == d.revision_digest(rev, ROOT), rev


def test_nothing_is_released_before_1_0():
    """Until 1.0 the baseline is refrozen in place (docs/CONVENTIONS.md)."""
    import tomllib

    version = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["version"]
    assert int(version.split(".")[0]) < 1, version
    assert d.released_digests(ROOT) == {}


def test_manifest_has_no_problem():
    assert d.manifest_problems(ROOT) == []


@pytest.fixture
def project(tmp_path):
    for name in ("sql", "alembic", "src"):
        shutil.copytree(ROOT / name, tmp_path / name, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    shutil.copy(ROOT / "alembic.ini", tmp_path / "alembic.ini")
    return tmp_path


def test_edited_frozen_copy_stops_the_render(project):
    frozen = project / "alembic/frozen/0001/procedures/mailq.ClaimMail.sql"
    frozen.write_text(frozen.read_text(encoding="utf-8").replace("SELECT", "SELECT ", 1), encoding="utf-8")
    with pytest.raises(ConfigurationError, match="MANIFEST.sha256"):
        render("upgrade", "head", root=project)


def release(project, monkeypatch):
    monkeypatch.setattr(d, "project_root", lambda: project)
    dev.release(type("A", (), {"revisions": []})())


def test_rewritten_manifest_does_not_hide_a_changed_release(project, monkeypatch):
    release(project, monkeypatch)
    frozen = project / "alembic/frozen/0001/broker/dbo.ProcessDelayQueue.sql"
    frozen.write_text(frozen.read_text(encoding="utf-8") + "\n-- edited\n", encoding="utf-8")
    d.write_manifest(project)
    assert any("released revision 0001" in p for p in d.manifest_problems(project))


def test_generated_marker_does_not_change_a_release_digest(project, monkeypatch):
    release(project, monkeypatch)
    frozen = project / "alembic/frozen/0001/broker/dbo.ProcessDelayQueue.sql"
    # Frozen copies carry the marker (mailq-db dev mark-generated): take it off, then
    # put a differently worded one on; neither changes the released digest.
    text = frozen.read_text(encoding="utf-8")
    assert text.startswith(d.GENERATED_MARKER)
    frozen.write_text(d.strip_generated_marker(text), encoding="utf-8")
    d.write_manifest(project)
    assert d.manifest_problems(project) == []
    frozen.write_text("-- GENERATED by mailq-db dev: do not edit\n" + d.strip_generated_marker(text),
                      encoding="utf-8")
    d.write_manifest(project)
    assert d.manifest_problems(project) == []


def test_released_revision_cannot_be_overwritten_by_the_freeze(project, monkeypatch):
    release(project, monkeypatch)
    with pytest.raises(ConfigurationError, match="released"):
        dev._freeze(project, "0001", ["broker/dbo.ProcessDelayQueue.sql"])


def test_release_command_pins_the_head(project, monkeypatch):
    monkeypatch.setattr(d, "project_root", lambda: project)
    dev.release(type("A", (), {"revisions": []})())
    head = d.head_revision(project)
    assert d.released_digests(project) == {head: d.revision_digest(head, project)}


def test_drift_names_each_object_that_differs():
    head = d.head_revision(ROOT)
    expected = d.expected_modules(head, broker=True, root=ROOT)
    actual = {name: text + ";\r\n" for name, (_, _, text) in expected.items()}  # as sqlcmd stores it
    assert d.drift(expected, actual) == []
    claim = expected["mailq.ClaimMail"][2]
    actual["mailq.ClaimMail"] = claim.replace("SET NOCOUNT", "SET  NOCOUNT", 1)
    actual.pop("dbo.ProcessDelayQueue")
    problems = d.drift(expected, actual)
    assert len(problems) == 2
    delay_rev = d.newest_frozen("broker/dbo.ProcessDelayQueue.sql", root=ROOT)
    claim_rev = d.newest_frozen("procedures/mailq.ClaimMail.sql", root=ROOT)
    assert problems[0].startswith(f"dbo.ProcessDelayQueue: missing (frozen in {delay_rev}/")
    assert problems[1].startswith(f"mailq.ClaimMail: differs from {claim_rev}/procedures/mailq.ClaimMail.sql from line")
    queue_only = d.expected_modules(head, broker=False, root=ROOT)
    assert "dbo.ProcessDelayQueue" not in queue_only and "mailq.ClaimMail" in queue_only


def test_doctor_reports_drift_object_by_object():
    from mailq_db.commands.doctor import drift_report

    head = d.head_revision(ROOT)
    expected = d.expected_modules(head, broker=True, root=ROOT)
    actual = {name: text for name, (_, _, text) in expected.items()}
    assert [c.status for c in drift_report(head, True, actual)] == ["OK"]
    actual["mailq.CancelMail"] = "CREATE OR ALTER PROCEDURE mailq.CancelMail AS SELECT 1"
    checks = drift_report(head, True, actual, {("0001", "procedures/mailq.CancelMail.sql"): "0" * 64})
    assert [(c.name, c.status) for c in checks] == [("Drift mailq.CancelMail", "FAIL"),
                                                    ("Checksum 0001/procedures/mailq.CancelMail.sql", "WARN")]
