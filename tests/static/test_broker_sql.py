"""Static checks of delayed execution (sql/broker/), no server needed.

Parse, lint and reference checks over every file of sql/ are generic harness
tests; these check what is particular to the Service Broker half: the rendered
scripts, the -x options, the downgrade, and text rules of the
trigger and the activation procedure that a reader would otherwise have to
trust.
"""

from __future__ import annotations

import io
import re
from pathlib import Path

import pytest

from mailq_db import deployment as d
from mailq_db.errors import ConfigurationError

ROOT = Path(__file__).resolve().parents[2]
BROKER = ROOT / "sql" / "broker"
REVISION = "0001"
FORBIDDEN = ("WAITFOR DELAY", "ALTER DATABASE", "TRUSTWORTHY", "NOLOCK")


def render(direction: str, target: str, *x_args: str) -> str:
    """``alembic upgrade|downgrade <target> --sql`` with ``-x`` options, as text."""
    from alembic import command

    out = io.StringIO()
    cfg = d.alembic_config(ROOT, x_args=x_args)
    cfg.output_buffer = out  # where Alembic writes the --sql script
    getattr(command, direction)(cfg, target, sql=True)
    script = out.getvalue()
    assert "COMMIT" in script, "nothing rendered"
    return script


def code(path: Path) -> str:
    """A file's SQL without comments (string literals kept)."""
    return d.strip_comments(path.read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def upgrade_0002() -> str:
    """The fresh install (the baseline holds delayed execution)."""
    return render("upgrade", "head")


@pytest.fixture(scope="module")
def downgrade_0002() -> str:
    return render("downgrade", "head:base")


# --------------------------------------------------------------------------
# Rendered scripts
# --------------------------------------------------------------------------


@pytest.mark.parametrize("text", ("WAITFOR DELAY", "TRUSTWORTHY", "NOLOCK", "END;;"))
def test_full_scripts_render_without_forbidden_text(text):
    assert text not in render("upgrade", "head").upper()
    assert text not in render("downgrade", "head:base").upper()


def test_full_scripts_never_alter_the_database():
    """No ALTER DATABASE statement in either full script (messages may name it)."""
    for script in (render("upgrade", "head"), render("downgrade", "head:base")):
        statements = re.findall(r"^\s*ALTER\s+DATABASE\b", d.strip_comments(script), re.I | re.M)
        assert statements == []


def test_broker_check_comes_first_and_says_how_to_enable(upgrade_0002):
    section = upgrade_0002
    check = section.index("THROW 50401")
    first_create = section.index("CREATE SCHEMA delay")
    assert check < first_create
    message = section[section.index("is_broker_enabled"):check]
    assert "SET ENABLE_BROKER WITH ROLLBACK IMMEDIATE" in message
    assert "exclusive access" in message and "disconnects" in message
    assert "-x broker=off" in message


def test_broker_off_renders_no_broker_object(upgrade_0002):
    off = d.code_only(render("upgrade", "head", "broker=off"))
    for name in ("DelayServiceQueue", "tabDIYTable12402", "ProcessDelayQueue", "CREATE QUEUE", "MailqDelayService",
                 "delay."):
        assert name in upgrade_0002
        assert name not in off, name
    assert "VALUES ('0001')" in render("upgrade", "head", "broker=off")


def test_default_readers_keep_the_frozen_five(upgrade_0002):
    assert "MAX_QUEUE_READERS = 5" in upgrade_0002
    assert re.search(r"MAX_QUEUE_READERS = (?!5\b)\d+", upgrade_0002) is None


def test_readers_option_alters_the_queue():
    script = render("upgrade", "head", "readers=7")
    alter = script.index("WITH ACTIVATION (MAX_QUEUE_READERS = 7)")
    assert alter > script.index("PROCEDURE_NAME = dbo.ProcessDelayQueue")
    assert "ALTER QUEUE dbo.DelayServiceQueue" in script[alter - 80 : alter]


@pytest.mark.parametrize("value", ["0", "32768", "-1", "abc", "5; DROP TABLE x", "", "2.5"])
def test_invalid_readers_are_refused_clearly(value):
    with pytest.raises(ConfigurationError, match=r"-x readers must be an integer from 1 to 32767"):
        render("upgrade", "head", f"readers={value}")


def test_invalid_broker_option_is_refused():
    with pytest.raises(ConfigurationError, match=r"-x broker must be on or off"):
        render("upgrade", "head", "broker=maybe")


# --------------------------------------------------------------------------
# Downgrade: removes exactly what the broker files created
# --------------------------------------------------------------------------


def created_objects() -> list[tuple[str, d.SqlObject]]:
    files = [rel for rel in d.revision_files(REVISION, ROOT) if rel.startswith(d.BROKER_PREFIX)]
    return [(rel, d.describe(d.frozen_text(REVISION, rel, ROOT))) for rel in files]


def test_downgrade_drops_every_object_it_created(downgrade_0002):
    for rel, obj in created_objects():
        if obj.kind in ("grant", "script"):
            continue
        if rel == "broker/dbo.tabDIYTable12402.sql":
            continue  # checked below: dropped only when created
        assert obj.kind != "script", rel
        drop = d.drop_statement(obj)
        assert drop and drop in downgrade_0002, rel


def test_downgrade_revokes_every_grant(downgrade_0002):
    for rel, obj in created_objects():
        if obj.kind == "grant":
            for revoke in d.revoke_statements(d.frozen_text(REVISION, rel, ROOT)):
                assert revoke in downgrade_0002, revoke


def test_downgrade_switches_activation_off_before_dropping_the_procedure(downgrade_0002):
    activation = downgrade_0002.index("WITH ACTIVATION (DROP)")
    assert activation < downgrade_0002.index("DROP PROCEDURE IF EXISTS dbo.ProcessDelayQueue")
    assert downgrade_0002.index("DROP SERVICE") < downgrade_0002.index("DROP QUEUE")
    assert downgrade_0002.index("DROP QUEUE") < downgrade_0002.index("DROP CONTRACT")
    assert downgrade_0002.index("DROP CONTRACT") < downgrade_0002.index("DROP MESSAGE TYPE")


def test_downgrade_keeps_an_adopted_platform_table(downgrade_0002):
    drops = [m.start() for m in re.finditer(r"DROP TABLE IF EXISTS dbo\.tabDIYTable12402", downgrade_0002)]
    assert len(drops) == 1
    guard = downgrade_0002[: drops[0]]
    guard = guard[guard.rindex("IF OBJECT_ID(N'delay.Installation'") :]
    assert "Detail = N'created'" in guard
    # The record it reads is written by the create-or-adopt file, in both branches.
    platform = code(BROKER / "dbo.tabDIYTable12402.sql")
    assert "N'created'" in platform and "N'adopted'" in platform
    assert "DROP " not in platform.upper().replace("DROP_", "")


def test_downgrade_statements_are_guarded(downgrade_0002):
    """Each batch is a no-op when its object is absent (e.g. after -x broker=off)."""
    batches = [b.strip() for b in downgrade_0002.split("\nGO\n") if b.strip()]
    for batch in batches:
        body = "\n".join(ln for ln in batch.splitlines() if not ln.startswith("--")).strip().rstrip(";")
        if not body or body.startswith(("BEGIN TRANSACTION", "COMMIT", "UPDATE mailq_alembic_version")):
            continue
        # The deployment's own batches (header, revision and option checks,
        # guards, checksums, activation status): mailq_db.deployment.
        if body.startswith((":on error", "SET ", "DECLARE ", "DELETE FROM dbo.mailq_deployment_file",
                            "UPDATE dbo.mailq_alembic_version", "DELETE FROM dbo.mailq_alembic_version",
                            "DROP TABLE IF EXISTS dbo.mailq_deployment", "EXEC sys.sp_set_session_context")):
            continue
        assert body.startswith("IF ") or " IF EXISTS " in body, body


# --------------------------------------------------------------------------
# The SQL text of sql/broker/
# --------------------------------------------------------------------------


def test_no_broker_file_waits_with_delay_or_concatenates_exec():
    for path in BROKER.glob("*.sql"):
        text = code(path).upper()
        for forbidden in FORBIDDEN:
            assert forbidden not in text, (path.name, forbidden)
        assert re.search(r"\bEXEC(UTE)?\s*\(", text) is None, path.name
        for waitfor in re.finditer(r"\bWAITFOR\b\s*(\S+)", text):
            assert waitfor.group(1).startswith("("), path.name  # WAITFOR (RECEIVE ...) only


def test_only_the_activation_procedure_runs_dynamic_sql():
    users = sorted(p.name for p in BROKER.glob("*.sql") if "SP_EXECUTESQL" in code(p).upper())
    assert users == ["dbo.ProcessDelayQueue.sql"]


def test_targets_run_through_sp_executesql_with_parameters():
    text = code(BROKER / "dbo.ProcessDelayQueue.sql")
    calls = re.findall(r"EXEC\s+sys\.sp_executesql\s+(@\w+)\s*,\s*(@\w+)\s*,(.*?);", text, re.S | re.I)
    assert len(calls) == 1
    sql_var, params_var, values = calls[0]
    for name in ("@SPName", "@Param1", "@Param2", "@Param3", "@Param4", "@Param5"):
        assert f"{name} = {name}" in values
    built = re.search(rf"SET {sql_var} = CONCAT\((.*?)\);", text, re.S).group(1)
    # Only catalog names from delay.ResolveTarget, each QUOTENAMEd, reach the text.
    assert re.findall(r"QUOTENAME\((@\w+)\)", built) == ["@SchemaName", "@ProcedureName"]
    # ... and one INT (the lock timeout): CONCAT renders it as digits only.
    assert re.sub(r"N'[^']*'|QUOTENAME\(@\w+\)|ISNULL\(@TargetLockTimeoutMs,\s*-1\)|[\s,]", "", built) == ""
    assert re.search(r"@TargetLockTimeoutMs INT\b", text)
    assert "FROM delay.ResolveTarget(@TargetName)" in text
    assert "DECLARE" in text and params_var == "@ParameterList"


def test_the_trigger_executes_nothing_and_never_waits():
    text = code(BROKER / "dbo.trg_tabDIYTable12402_ScheduleDelay.sql").upper()
    assert "SP_EXECUTESQL" not in text and re.search(r"\bEXEC(UTE)?\b(?! AS OWNER)", text) is None
    assert "WAITFOR" not in text and "RAISERROR" not in text and "THROW" not in text
    assert "BEGIN DIALOG CONVERSATION" in text and "BEGIN CONVERSATION TIMER" in text


def test_receipts_are_set_by_id_never_by_parameter_values():
    for path in BROKER.glob("*.sql"):
        text = code(path)
        for update in re.finditer(r"UPDATE\b.*?(?:;|$)", text, re.S | re.I):
            statement = update.group(0)
            if "F108219" in statement:
                assert not re.search(r"F10821[2-6]\s*=", statement), path.name
                assert re.search(r"ID = @TaskID|p\.ID = n\.TaskID|p\.ID = t\.TaskID", statement), path.name


def test_every_conversation_timer_stays_within_one_day():
    for path in BROKER.glob("*.sql"):
        for timeout in re.findall(r"\bTIMEOUT\s*=\s*(\S+?);", code(path)):
            assert timeout in ("@Timeout", "1"), (path.name, timeout)
    assert "@MaxTimerSeconds INT = 86400" in code(BROKER / "dbo.ProcessDelayQueue.sql")
    assert "@MaxTimerSeconds INT = 86400" in code(BROKER / "dbo.trg_tabDIYTable12402_ScheduleDelay.sql")


def test_every_receive_transaction_commits_before_a_target_runs():
    text = code(BROKER / "dbo.ProcessDelayQueue.sql")
    receive = text.index("WAITFOR (")
    run = text.index("EXEC sys.sp_executesql")
    assert receive < text.index("COMMIT TRANSACTION;", receive) < run


def test_broker_names_agree_between_files():
    text = "\n".join(code(p) for p in BROKER.glob("*.sql"))
    for name in ("MailqDelayRequest", "MailqDelayContract", "MailqDelayService"):
        assert re.search(rf"CREATE (?:MESSAGE TYPE|CONTRACT|SERVICE) {name}\b", text), name
    assert "EXECUTE AS OWNER" in code(BROKER / "dbo.DelayServiceQueue.activation.sql")
    assert "MAX_QUEUE_READERS = 5" in code(BROKER / "dbo.DelayServiceQueue.activation.sql")


def test_delayed_execution_throws_only_its_own_numbers():
    for path in BROKER.glob("*.sql"):
        # The hook dispatcher's broker-only files (mailq.*) are mail-queue
        # objects with mail-queue numbers (hk16: 50290-50298).
        low, high = (50290, 50298) if path.name.startswith("mailq.") else (50300, 50399)
        for number in re.findall(r"\bTHROW\s+(\d+)", code(path)):
            assert low <= int(number) <= high, (path.name, number)


def test_the_caller_role_may_only_execute_initiate_and_cancel():
    grants = d.strip_comments((BROKER / "MailqDelayCaller.grants.sql").read_text(encoding="utf-8"))
    found = re.findall(r"^\s*GRANT\s+(.+?)\s+TO\s+MailqDelayCaller\s*;", grants, re.M)
    assert sorted(found) == [
        "EXECUTE ON OBJECT::dbo.CancelDelayExecution",
        "EXECUTE ON OBJECT::dbo.InitiateDelayExecution",
    ]
    everything = "\n".join(code(p) for p in (ROOT / "sql").rglob("*.sql"))
    assert re.findall(r"\bTO\s+MailqDelayCaller\b", everything) == ["TO MailqDelayCaller"] * 2
