"""Issue 12: the rendered script is safe wherever it runs, re-runnable,
revision-checked, and rendered from validated options into a buffer.

Each test reads the text `alembic upgrade|downgrade --sql` renders (no server)
and fails on the script the package rendered before issue 12.
"""

from __future__ import annotations

import io
import re
from pathlib import Path

import pytest

from mailq_db import deployment as d
from mailq_db.devtools.scripts import batches, render
from mailq_db.errors import ConfigurationError

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def script() -> str:
    return render("upgrade", "head")


@pytest.fixture(scope="module")
def downgrade() -> str:
    return render("downgrade", "head:base")


def revision_sections(script: str) -> dict[str, str]:
    """Each revision's part of a script, keyed by the revision it applies
    (upgrade) or removes (downgrade)."""
    parts = re.split(r"^-- Running (upgrade|downgrade) (\S*) ?-> ?(\S*)$", script, flags=re.M)
    return {(parts[i + 2] if parts[i] == "upgrade" else parts[i + 1]): parts[i + 3]
            for i in range(1, len(parts) - 3, 4)}


# -- 1. safe outside sqlcmd -b -------------------------------------------------


def test_script_opens_with_the_sqlcmd_mode_guard_and_on_error_exit(script):
    before = script[: script.index("BEGIN TRANSACTION")]
    lines = [ln for ln in before.splitlines() if ln.strip() and not ln.startswith("--")]
    assert lines[0] == ":on error exit"
    assert ':setvar __IsSqlCmdEnabled "True"' in lines
    guard = batches(before)[1]
    assert "IF N'$(__IsSqlCmdEnabled)' NOT LIKE N'True'" in guard and "SET NOEXEC ON" in guard


def test_session_options_come_before_the_first_transaction(script):
    before = script[: script.index("BEGIN TRANSACTION")]
    assert "SET NOCOUNT, XACT_ABORT ON" in before
    assert re.search(r"SET LOCK_TIMEOUT \d+", before)
    for option in ("ANSI_NULLS", "ANSI_PADDING", "ANSI_WARNINGS", "ARITHABORT", "CONCAT_NULL_YIELDS_NULL",
                   "QUOTED_IDENTIFIER"):
        assert re.search(rf"SET [A-Z_, ]*\b{option}\b[A-Z_, ]* ON", before), option
    assert "SET NUMERIC_ROUNDABORT OFF" in before


@pytest.mark.parametrize("direction", ["upgrade", "downgrade"])
def test_every_batch_of_a_revision_is_followed_by_the_transaction_guard(direction, script, downgrade):
    text = script if direction == "upgrade" else downgrade
    sections = revision_sections(text)
    assert sections, "no revision rendered"
    for rev, section in sections.items():
        body = section.split("\nCOMMIT;")[0]
        parts = batches(body)
        # session options, then (work batch, guard) pairs, then Alembic's version row
        work = parts[1:-1]
        assert len(work) % 2 == 0, rev
        guard = d.guard_batch(rev)
        for i in range(0, len(work), 2):
            assert work[i].rstrip(";") != guard, (rev, i)
            assert work[i + 1].rstrip(";") == guard, (rev, work[i][:200])
        assert "mailq_alembic_version" in parts[-1], rev


def test_a_failed_revision_never_reaches_its_version_row(script):
    """The batch right before each version INSERT/UPDATE is the guard."""
    for match in re.finditer(r"^(INSERT INTO|UPDATE) dbo\.mailq_alembic_version", script, re.M):
        previous = batches(script[: match.start()])[-1]
        assert "failed and was rolled back" in previous and "SET NOEXEC ON" in previous


def test_broker_revisions_check_the_broker_first_inside_their_transaction(script):
    section = revision_sections(script)["0001"]
    assert section.index("THROW 50401") < section.index("CREATE QUEUE")


# -- 2. re-runnable, starting-revision check ---------------------------------


def test_version_table_and_schemas_are_guarded(script):
    assert ("IF OBJECT_ID(N'dbo.mailq_alembic_version', N'U') IS NULL\nCREATE TABLE dbo.mailq_alembic_version"
            in script)
    code = d.strip_comments(script)
    assert re.search(r"^\s*CREATE\s+SCHEMA\b", code, re.M | re.I) is None
    for schema in ("mailq", "delay"):
        assert f"IF SCHEMA_ID(N'{schema}') IS NULL\n    EXEC (N'CREATE SCHEMA {schema} AUTHORIZATION dbo')" in script


def test_every_revision_checks_its_starting_revision_and_names_the_command(script):
    sections = revision_sections(script)
    previous = None
    for rev in d.revisions(ROOT):
        section = sections[rev]
        expect = "@Rows = 0" if previous is None else f"@Rows = 1 AND @Current = '{previous}'"
        check = section.index(f"IF NOT ({expect})")
        assert section.index("THROW 50410", check) > check
        assert "mailq-db deploy --sql --revision " in section
        previous = rev


def test_a_database_newer_than_the_package_is_told_so(script, downgrade):
    """A database at a revision this package does not know was deployed by a
    newer mailq-db: 50421 says so, instead of a command that cannot work."""
    known = ", ".join(f"'{rev}'" for rev in d.revisions(ROOT))
    for text in (script, downgrade):
        for section in revision_sections(text).values():
            check = section.index(f"IF @Rows = 1 AND @Current NOT IN ({known})")
            throw = section.index("THROW 50421", check)
            assert "a newer mailq-db deployed it" in section[check:throw]
            assert throw < section.index("THROW 5041")  # before the starting-revision check


def test_rerun_at_head_is_a_no_op_and_rendering_is_deterministic(script):
    """Rendering twice gives the same text, and its first revision skips the
    whole rest of the script on a database already at head."""
    again = render("upgrade", "head")
    assert again == script
    head = d.head_revision(ROOT)
    first = revision_sections(script)["0001"]
    noop = next(b for b in batches(first) if f"@Current = '{head}'" in b and "nothing to do" in b)
    assert noop.index("ROLLBACK TRANSACTION") < noop.index("SET NOEXEC ON")
    # Execution is switched back on only at the very end (SSMS keeps the setting).
    assert batches(script)[-2].strip().rstrip(";") == "SET NOEXEC OFF"


def test_downgrade_checks_the_revision_it_removes(downgrade):
    assert "THROW 50411" in downgrade
    assert f"IF NOT (@Rows = 1 AND @Current = '{d.head_revision(ROOT)}')" in downgrade


# -- 3. version table pinned to dbo --------------------------------------------


def test_a_version_table_in_another_schema_is_moved_not_ignored(script):
    before = script[: script.index("BEGIN TRANSACTION")]
    check = before.index("THROW 50417")
    assert "ALTER SCHEMA dbo TRANSFER" in before[:check]
    assert "t.name = N'mailq_alembic_version' AND t.schema_id <> SCHEMA_ID(N'dbo')" in before


def test_version_table_is_schema_qualified_everywhere(script, downgrade):
    for text in (script, downgrade):
        code = d.code_only(text)
        assert re.search(r"(?<![.\w])mailq_alembic_version\b", code) is None


# -- 8. validated, buffered, guarded --------------------------------------------


@pytest.mark.parametrize("arg,message", [
    ("brokr=off", r"unknown -x option 'brokr' \(did you mean broker\?\)"),
    ("readers=0", r"-x readers must be an integer"),
    ("broker=maybe", r"-x broker must be on or off"),
    ("lock_timeout=soon", r"-x lock_timeout must be milliseconds"),
])
def test_bad_options_are_refused_before_anything_is_written(arg, message):
    out = io.StringIO()
    with pytest.raises(ConfigurationError, match=message):
        render_into(out, "upgrade", "head", arg)
    assert out.getvalue() == ""


def render_into(out: io.StringIO, command: str, revision: str, *x_args: str) -> None:
    from alembic import command as alembic_command

    cfg = d.alembic_config(ROOT, x_args=list(x_args), stdout=out)
    getattr(alembic_command, command)(cfg, revision, sql=True)


def test_a_failing_render_writes_nothing(monkeypatch):
    """The script is buffered: a failure in the last revision leaves no partial
    script ending in an open BEGIN TRANSACTION."""
    real = d.RevisionPlan.upgrade_batches

    def failing(self):
        if self.revision == d.head_revision(ROOT):
            raise RuntimeError("render failed")
        return real(self)

    monkeypatch.setattr(d.RevisionPlan, "upgrade_batches", failing)
    out = io.StringIO()
    with pytest.raises(RuntimeError, match="render failed"):
        render_into(out, "upgrade", "head")
    assert out.getvalue() == ""


def test_system_databases_and_non_owners_are_refused_up_front(script):
    before = script[: script.index("BEGIN TRANSACTION")]
    assert "IF DB_NAME() IN (N'master', N'msdb', N'tempdb', N'model')" in before
    assert before.index("THROW 50412") < before.index("THROW 50413")
    assert "IS_ROLEMEMBER(N'db_owner') = 0" in before
    # The database's own dbo passes whatever IS_ROLEMEMBER says: on Azure SQL Database
    # IS_SRVROLEMEMBER is always 0 and IS_ROLEMEMBER is unsupported for an Entra admin group.
    refusal = before[before.index("IF IS_ROLEMEMBER(N'db_owner')"):before.index("THROW 50413")]
    assert "USER_NAME() <> N'dbo'" in refusal.splitlines()[0]


def test_the_deployers_take_an_application_lock(script):
    before = script[: script.index("BEGIN TRANSACTION")]
    assert "sys.sp_getapplock @Resource = N'mailq-db deploy'" in before and "THROW 50416" in before
    assert "sys.sp_releaseapplock @Resource = N'mailq-db deploy'" in batches(script)[-1]


def test_script_has_nothing_sqlcmd_would_misread():
    """sqlcmd substitutes $(name) anywhere, and treats a line that is only GO,
    or that starts with ':' or '!!', as its own command."""
    for rev in d.revisions(ROOT):
        for rel in d.revision_files(rev, ROOT):
            text = d.frozen_text(rev, rel, ROOT)
            assert "$(" not in text, f"{rev}/{rel}"
            assert not re.search(r"^\s*(GO\s*$|:|!!)", text, re.M | re.I), f"{rev}/{rel}"


def test_generated_marker_is_stripped_from_frozen_text(tmp_path):
    folder = tmp_path / "alembic/frozen/0001/procedures"
    folder.mkdir(parents=True)
    body = "CREATE OR ALTER PROCEDURE mailq.P AS SELECT 1;\n"
    for marker in ("-- GENERATED by mailq-db dev refreeze: do not edit\n",
                   "-- GENERATED by mailq-db dev new-revision from sql/procedures/mailq.P.sql; do not edit\r\n",
                   ""):
        (folder / "mailq.P.sql").write_text(marker + body, encoding="utf-8")
        assert d.frozen_text("0001", "procedures/mailq.P.sql", tmp_path) == body
    kept = "-- a comment that belongs to the object\n" + body
    (folder / "mailq.P.sql").write_text(kept, encoding="utf-8")
    assert d.frozen_text("0001", "procedures/mailq.P.sql", tmp_path) == kept


def machinery_batches() -> dict[str, str]:
    """Every batch the deployment adds around the frozen files."""
    opts, seven = d.DeployOptions(), d.parse_options(["readers=7"])
    out = {f"header{i}": b for i, b in enumerate(d.script_header(opts))}
    out.update({f"footer{i}": b for i, b in enumerate(d.script_footer())})
    out.update({f"upgrade check {i}": b for i, b in enumerate(d.version_check("0002", "0001", "upgrade", "0004", True))})
    out.update({f"downgrade check {i}": b for i, b in enumerate(d.version_check("0002", None, "downgrade", None, True))})
    out.update({
        "guard": d.guard_batch("0001"), "options on": d.option_batch(opts),
        "options off": d.option_batch(d.parse_options(["broker=off"])),
        "options add": d.option_batch(opts, adding_broker=True), "options readers": d.option_batch(seven),
        "broker check": d.BROKER_CHECK, "activation off": d.ACTIVATION_OFF,
        "activation restored": d.ACTIVATION_RESTORE, "stored readers": d.readers_batch(opts),
        "readers 7": d.readers_batch(seven),
        "checksums": d.checksum_batch({"a.sql": "0001"}, {"a.sql": "x"}, "0001", delete=False),
        "schema": d.guarded_schema(d.statement_text(d.frozen_text("0001", "schemas/mailq.sql", ROOT))),
        "header guard": d.HEADER_GUARD, "done": d.DONE_MESSAGE,
        "data check": d.data_loss_check("0001", [d.DroppedTable("mailq.T"), d.DroppedTable(
            "dbo.P", "EXISTS (SELECT 1 FROM x.I AS i WHERE i.Item = N'dbo.P')", "x.I")]),
        "seed restore": d.seed_restore("0001"),
    })
    out.update({f"drop column {i}": b for i, b in enumerate(d.drop_column("mailq.T", "Note")())})
    out.update({f"seed check {i}": b for i, b in enumerate(d.seed_checks("disable-triggers", "0001"))})
    return out


@pytest.mark.parametrize("name,sql", sorted(machinery_batches().items()))
def test_every_batch_the_deployment_adds_parses_as_tsql(name, sql):
    import sqlfluff

    sqlfluff.parse(sql, dialect="tsql")  # raises APIParsingError on any unparsable section


# -- issue 21 point 4: the header fails closed too ---------------------------------

HEADER_REFUSALS = (50412, 50413, 50416, 50417)


def header_of(script: str) -> str:
    return script[: script.index("-- Running ")]


def test_every_header_refusal_is_followed_by_the_header_guard(script):
    """Each header batch that can THROW (and the SQLCMD-mode check) is followed
    by RAISERROR + SET NOEXEC ON, so a client that ignores ':on error exit' but
    honours ':setvar' (Azure Data Studio's SQLCMD mode) stops there too."""
    parts = batches(header_of(script).replace(":on error exit\n", ""))
    refusals = [i for i, b in enumerate(parts) if re.search(r"THROW 504\d\d", b)]
    assert {int(n) for b in parts for n in re.findall(r"THROW (504\d\d)", b)} == set(HEADER_REFUSALS)
    sqlcmd = next(i for i, b in enumerate(parts) if "$(__IsSqlCmdEnabled)" in b and "NOT LIKE" in b)
    assert "RAISERROR(" in parts[sqlcmd] and "SET NOEXEC ON" in parts[sqlcmd]
    for i in refusals + [sqlcmd]:
        assert parts[i + 1].rstrip(";") == d.HEADER_GUARD, parts[i][:120]
    assert "SET NOEXEC ON" in d.HEADER_GUARD and "RAISERROR(" in d.HEADER_GUARD
    assert "IF @@ERROR <> 0" in d.HEADER_GUARD


def test_every_batch_that_can_throw_is_followed_by_a_guard(script, downgrade):
    for text in (script, downgrade):
        parts = batches(text)
        for i, batch in enumerate(parts):
            if re.search(r"\bTHROW\b", d.code_only(batch)) and not batch.lstrip().startswith("CREATE"):
                following = parts[i + 1]
                assert "SET NOEXEC ON" in following and "RAISERROR(" in following, batch[:160]


def run_as_a_client(script: str, *, failing: int | None = None, sqlcmd_mode: bool = True) -> list[str]:
    """The batches a client that ignores ':on error exit' executes, when the
    THROW ``failing`` fires (a model of SET NOEXEC, @@ERROR, XACT_ABORT and
    @@TRANCOUNT as Microsoft documents them; no T-SQL runs here)."""
    noexec, error, trancount, executed = False, 0, 0, []
    for batch in batches(script.replace(":on error exit\n", "")):
        body = batch.strip().rstrip(";")
        if body == "SET NOEXEC OFF":
            noexec = False
            continue
        if noexec:
            continue
        executed.append(body)
        if body.startswith(":setvar"):
            error = 0 if sqlcmd_mode else 102  # a syntax error outside SQLCMD mode
            continue
        if "$(__IsSqlCmdEnabled)" in body:
            if not sqlcmd_mode:
                error, noexec = 50000, True
            else:
                error = 0
            continue
        if body == d.HEADER_GUARD:
            noexec = error != 0
            continue
        if body.startswith("IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION"):
            if error and trancount:
                trancount = 0
            if trancount == 0:
                noexec = True
            error = 0
            continue
        if body.startswith("BEGIN TRANSACTION"):
            trancount += 1
        elif body == "COMMIT":
            trancount = 0
        if failing is not None and f"THROW {failing}," in body:
            error, trancount = failing, 0  # XACT_ABORT: the transaction is rolled back
        else:
            error = 0
    return executed


def test_a_client_without_on_error_exit_stops_at_each_refusal(script):
    everything = run_as_a_client(script)
    assert any("CREATE OR ALTER PROCEDURE mailq.ClaimMail" in b for b in everything)
    assert any(b.startswith("INSERT INTO dbo.mailq_alembic_version") for b in everything)
    for number in HEADER_REFUSALS + (50410, 50401, 50414):
        executed = run_as_a_client(script, failing=number)
        after = executed[next(i for i, b in enumerate(executed) if f"THROW {number}," in b):]
        assert not any(re.search(r"\bCREATE\b", d.code_only(b)) for b in after[1:]), number
        assert not any(b.startswith("INSERT INTO dbo.mailq_alembic_version") for b in after), number
    outside = run_as_a_client(script, sqlcmd_mode=False)
    assert not any("CREATE" in d.code_only(b) for b in outside), "outside SQLCMD mode nothing runs"


def test_the_model_sees_a_missing_header_guard(script):
    """The checks above fail on the header of before issue 21 (no guard)."""
    unguarded = script.replace(d.HEADER_GUARD + ";\nGO\n", "")
    executed = run_as_a_client(unguarded, failing=50412)
    assert any("CREATE OR ALTER PROCEDURE mailq.ClaimMail" in b for b in executed)


# -- issue 21 point 5: a downgrade never drops data silently -------------------------


def test_downgrade_refuses_to_drop_tables_that_hold_rows(downgrade):
    section = revision_sections(downgrade)[d.head_revision(ROOT)]
    check = section.index("THROW 50420")
    assert check < section.index("DROP TABLE IF EXISTS mailq.MailQueue")
    assert section.index("THROW 50411") < check
    listed = section[section.index("INSERT INTO @Dropped"):check]
    plan = d.RevisionPlan(d.head_revision(ROOT), ROOT)
    tables = [d.describe(d.frozen_text(plan.revision, rel, ROOT)).name for rel in plan.files
              if d.describe(d.frozen_text(plan.revision, rel, ROOT)).kind == "table"]
    for table in tables:
        if table in ("delay.Installation", "delay.Setting", "delay.Dispatcher"):
            assert f"(N'{table}'," not in listed, table  # the deployment's own rows
        else:
            assert f"(N'{table}'," in listed, table
    assert "COUNT_BIG(*)" in section[:check] and "rows)" in section[:check] and "-x drop_data=yes" in section[:check]


def test_rows_the_deployment_writes_do_not_count_as_data(downgrade):
    """A table whose own file writes a row at deployment (a default policy, a
    single settings row) is either not checked or checked with a row filter:
    else the downgrade of a fresh, empty installation stops with 50420."""
    section = revision_sections(downgrade)[d.head_revision(ROOT)]
    listed = section[section.index("INSERT INTO @Dropped"):section.index("THROW 50420")]
    plan = d.RevisionPlan(d.head_revision(ROOT), ROOT)
    seeded = []
    for rel in plan.files:
        obj = d.describe(d.frozen_text(plan.revision, rel, ROOT))
        if obj.kind == "table" and f"INSERT INTO {obj.name} " in d.frozen_text(plan.revision, rel, ROOT):
            seeded.append(obj.name)
            assert f"(N'{obj.name}', NULL," not in listed, f"{obj.name}: the deployment's own row counts as data"
    assert "mailq.EnqueuePolicy" in seeded
    assert "(N'mailq.EnqueuePolicy', N'ChangedBy IS NOT NULL', NULL)" in listed


def test_the_checksums_list_each_file_once(script):
    """The checksum batch names each applied file once (it used to list them
    twice, about 200 lines of the fresh install): DELETE and INSERT read one list."""
    checksums = next(b for b in batches(script) if "INSERT INTO dbo.mailq_deployment_file" in b)
    assert checksums.count("N'procedures/mailq.ClaimMail.sql'") == 1
    assert "DELETE FROM dbo.mailq_deployment_file WHERE Revision IN (SELECT n.Revision FROM @Files AS n)" in checksums


def test_drop_data_yes_renders_no_data_check():
    down = render("downgrade", "head:base", ("drop_data=yes",))
    assert "THROW 50420" not in down and "DROP TABLE IF EXISTS mailq.MailQueue" in down


def test_the_data_check_counts_only_what_the_package_created():
    check = d.data_loss_check("0001", [d.DroppedTable("dbo.T", "EXISTS (SELECT 1 FROM x.Y AS i)", "x.Y")])
    assert "(N'dbo.T', N'EXISTS (SELECT 1 FROM x.Y AS i)', N'x.Y')" in check
    assert "QUOTENAME(PARSENAME(@Name, 2))" in check  # no name is pasted unquoted


def test_upgrade_range_going_down_is_refused():
    from mailq_db.cli import main

    for argv in (["deploy", "--sql", "--revision", "0001:base"], ["deploy", "--sql", "--revision", "head:head"],
                 ["deploy", "--sql", "--revision", "9999"]):
        out = io.StringIO()
        import contextlib

        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()) as err:
            assert main(argv) == 1, argv
        assert out.getvalue() == "", argv
        assert len(err.getvalue().strip().splitlines()) == 1, err.getvalue()


def test_alembic_itself_refuses_a_range_that_renders_nothing():
    out = io.StringIO()
    with pytest.raises(ConfigurationError, match="renders no revision"):
        render_into(out, "upgrade", "0001:base")
    assert out.getvalue() == ""


def test_every_batch_the_deployment_adds_parses_with_microsofts_parser(tmp_path):
    """ScriptDom (TSql150Parser), stricter than sqlfluff: e.g. two adjacent
    string literals without a comma are a syntax error there."""
    import os

    from mailq_db.devtools import tsqlcheck as t

    _, reason = t.tool_or_reason(ROOT)
    if reason is not None:
        if os.environ.get(t.REQUIRE_ENV) == "1":
            pytest.fail(f"{t.REQUIRE_ENV}=1 but: {reason}")
        pytest.skip(reason)
    paths = {}
    for i, (name, sql) in enumerate(sorted(machinery_batches().items())):
        paths[name] = tmp_path / f"b{i}.sql"
        paths[name].write_text(sql + "\nGO\n", encoding="utf-8")
    parsed = t.parse(list(paths.values()), ROOT)
    assert {name: parsed[str(path)] for name, path in paths.items() if parsed[str(path)]} == {}
