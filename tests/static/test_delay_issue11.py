"""Issue 11 (delayed execution, second reading): what the SQL text can show.

Each test names the requirement it covers; every one of them fails on the
code before issue 11 (tests/static/samples/delay-0004/ keeps that text, and
``test_the_checks_fail_on_revision_0004`` runs the text checks against it).
Behaviour is covered by tests/integration/test_delay_execution.py (SQL Server
2022) and the spin model (tests/models, delay-*).
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


def code_of(text: str) -> str:
    return d.strip_comments(text)


def current(name: str) -> str:
    return code_of((BROKER / name).read_text(encoding="utf-8"))


SAMPLES = ROOT / "tests" / "static" / "samples" / "delay-0004"


def at_0004(name: str) -> str:
    """The text before issue 11 (a negative sample: the checks must fail on it)."""
    path = SAMPLES / name
    return code_of(path.read_text(encoding="utf-8")) if path.is_file() else ""


def header(name: str) -> str:
    text = (BROKER / name).read_text(encoding="utf-8")
    return text[: text.index("*/")]


def block(text: str, start: str, end: str) -> str:
    i = text.index(start)
    return text[i : text.index(end, i + len(start))]


# --------------------------------------------------------------------------
# Checks as functions of the procedure text, so they run on 0004's text too.
# --------------------------------------------------------------------------


def recovery_is_minimal(pdq: str) -> bool:
    """Point 1: RECEIVE ... WHERE conversation_handle, a row-count check, only
    delay.Incident and END CONVERSATION inside that transaction."""
    m = re.search(r"RECEIVE TOP \(1\)(?:\s+@\w+ = \w+,)*\s+@\w+ = message_body\s+FROM dbo\.DelayServiceQueue\s+"
                  r"WHERE conversation_handle = @Handle;(.*?)COMMIT TRANSACTION;", pdq, re.S)
    if not m:
        return False
    tran = m.group(1)
    return (
        "@@ROWCOUNT" in tran
        and "INSERT INTO delay.Incident" in tran
        and "END CONVERSATION @Handle" in tran
        and "delay.FinishTask" not in tran
        and "tabDIYTable12402" not in tran
        and "delay.Task" not in tran
        and "delay.Log" not in tran
    )


def run_lock_released_once(pdq: str) -> bool:
    """Point 1: one sp_releaseapplock, guarded by a flag that is cleared first."""
    calls = re.findall(r"sp_releaseapplock", pdq)
    guarded = re.search(r"IF @LockHeld = 1\s+BEGIN\s+SET @LockHeld = 0;\s+EXEC sys\.sp_releaseapplock", pdq)
    return len(calls) == 1 and guarded is not None


def failing_recovery_is_logged(pdq: str) -> bool:
    try:
        rec = block(pdq, "WHERE conversation_handle = @Handle;", "IF @Run = 1")
    except ValueError:
        return False
    catch = rec[rec.index("BEGIN CATCH"):] if "BEGIN CATCH" in rec else ""
    return "RAISERROR" in catch and "@Stop = 1" in catch


def deadlock_gets_one_redelivery(pdq: str) -> bool:
    return re.search(r"@ErrorNumber IN \(1205, 50350\) AND \(@RedeliveredHandle IS NULL", pdq) is not None


def no_receive_transaction_writes_the_platform_table(pdq: str) -> bool:
    """Point 1: every FinishTask of step 1 passes @SetReceipt = 0."""
    step1 = block(pdq, "WAITFOR (", "END CATCH;")
    calls = re.findall(r"EXEC delay\.FinishTask\s+(.*?);", step1, re.S)
    return bool(calls) and all("@SetReceipt = 0" in c for c in calls) and "UPDATE dbo.tabDIYTable12402" not in step1


def targets_run_at_normal_settings(pdq: str) -> bool:
    """Point 2: the target's batch sets NORMAL, XACT_ABORT OFF, LOCK_TIMEOUT;
    the reader's own settings are re-asserted before step 3."""
    built = re.search(r"SET @Sql = CONCAT\((.*?)\);", pdq, re.S)
    if not built:
        return False
    text = built.group(1)
    after = pdq[pdq.index("EXEC sys.sp_executesql"):]
    after = after[: after.index("STEP 3") if "STEP 3" in after else len(after)]
    return (
        "SET DEADLOCK_PRIORITY NORMAL" in text
        and "SET XACT_ABORT OFF" in text
        and "SET LOCK_TIMEOUT" in text
        and "SET XACT_ABORT ON;" in after
        and "SET DEADLOCK_PRIORITY HIGH;" in after
    )


def requests_are_bound_to_their_conversation(pdq: str) -> bool:
    """Point 7: the initiator handle of the same conversation_id, compared."""
    return (
        re.search(r"t\.conversation_id = i\.conversation_id AND i\.is_initiator = 1", pdq) is not None
        and "@BoundHandle <> @InitiatorHandle" in pdq
    )


def delay0_locks_the_group_before_the_row(pdq: str) -> bool:
    """Point 8: for a DelayRequest, BEGIN CONVERSATION TIMER on the task's
    handle comes before the first UPDLOCK read of delay.Task."""
    try:
        timer = pdq.index("BEGIN CONVERSATION TIMER (@BoundHandle)")
    except ValueError:
        return False
    return timer < pdq.index("FROM delay.Task AS t WITH (UPDLOCK, ROWLOCK)")


CHECKS = {
    "recovery_is_minimal": recovery_is_minimal,
    "run_lock_released_once": run_lock_released_once,
    "failing_recovery_is_logged": failing_recovery_is_logged,
    "deadlock_gets_one_redelivery": deadlock_gets_one_redelivery,
    "no_receive_transaction_writes_the_platform_table": no_receive_transaction_writes_the_platform_table,
    "targets_run_at_normal_settings": targets_run_at_normal_settings,
    "requests_are_bound_to_their_conversation": requests_are_bound_to_their_conversation,
    "delay0_locks_the_group_before_the_row": delay0_locks_the_group_before_the_row,
}


@pytest.mark.parametrize("name", sorted(CHECKS))
def test_the_activation_procedure(name):
    assert CHECKS[name](current("dbo.ProcessDelayQueue.sql")), name


@pytest.mark.parametrize("name", sorted(CHECKS))
def test_the_checks_fail_on_revision_0004(name):
    """Each check can fail: 0004's procedure (frozen) does not pass it."""
    assert not CHECKS[name](at_0004("dbo.ProcessDelayQueue.sql")), name


# --------------------------------------------------------------------------
# Point 1: the side table, the monitor
# --------------------------------------------------------------------------


def test_the_incident_table_has_nothing_that_can_refuse_a_row():
    text = current("delay.Incident.sql")
    assert "CREATE TABLE delay.Incident" in text
    assert "CHECK" not in text and "FOREIGN KEY" not in text and "REFERENCES" not in text
    assert not any(p.name.startswith("delay.Incident.") and p.name != "delay.Incident.sql"
               for p in BROKER.glob("*.sql"))  # no trigger, no index file
    assert re.search(r"\bTRIGGER\b[^;]*ON delay\.Incident", "\n".join(current(p.name) for p in BROKER.glob("*.sql"))) is None


def test_a_disabled_queue_is_monitored():
    """Point 1: delay.Reconcile (Agent job) raises when the queue is disabled; the docs say so."""
    text = current("delay.Reconcile.sql")
    assert "is_receive_enabled = 0" in text and "RAISERROR" in text
    docs = (ROOT / "docs" / "delayed-execution.md").read_text(encoding="utf-8")
    assert "BROKER_QUEUE_DISABLED" in docs and "delay.Reconcile" in docs


# --------------------------------------------------------------------------
# Point 6: no savepoints, one CATCH pattern, documented contract
# --------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["dbo.InitiateDelayExecution.sql", "delay.CancelTask.sql", "delay.AllowProcedure.sql"])
def test_no_savepoint_and_the_own_tran_pattern(name):
    text = current(name)
    assert "SAVE TRANSACTION" not in text and "ROLLBACK TRANSACTION " not in text.replace(
        "ROLLBACK TRANSACTION;", "")
    assert "DECLARE @OwnTran BIT = IIF(@@TRANCOUNT = 0, 1, 0);" in text
    assert "IF @OwnTran = 1 AND XACT_STATE() <> 0" in text
    assert "SAVE TRANSACTION" in at_0004(name) or name == "delay.CancelTask.sql"


def test_no_savepoint_anywhere_in_delayed_execution():
    for path in BROKER.glob("*.sql"):
        assert "SAVE TRANSACTION" not in current(path.name), path.name


@pytest.mark.parametrize("name", ["dbo.InitiateDelayExecution.sql", "dbo.CancelDelayExecution.sql"])
def test_the_transaction_contract_is_written_down(name):
    h = header(name)
    assert "dooms the caller's transaction" in h and "must roll back" in h and "MSDTC" in h


# --------------------------------------------------------------------------
# Point 8: one lock order, stated in each header
# --------------------------------------------------------------------------


@pytest.mark.parametrize("name", [
    "dbo.ProcessDelayQueue.sql", "dbo.CancelDelayExecution.sql", "delay.Reconcile.sql",
])
def test_each_header_states_the_lock_order(name):
    h = header(name)
    assert "Lock order:" in h
    assert "conversation group" in h


def test_cancel_locks_the_group_before_the_row():
    text = current("delay.CancelTask.sql")
    assert text.index("BEGIN CONVERSATION TIMER (@Handle)") < text.index("WITH (UPDLOCK, ROWLOCK)")
    # ... after the task's cancel lock, which a delay-0 request takes before the group too
    pdq = current("dbo.ProcessDelayQueue.sql")
    for body in (text, pdq):
        assert body.index("CONCAT(N'mailq-db/delay/cancel/', @TaskID)") < body.index("BEGIN CONVERSATION TIMER (@")


# --------------------------------------------------------------------------
# Point 5: pinned definitions
# --------------------------------------------------------------------------


def test_listed_procedures_are_pinned_by_their_definition():
    resolve = current("delay.ResolveTarget.sql")
    assert "HASHBYTES('SHA2_256', OBJECT_DEFINITION(o.object_id))" in resolve
    assert "THEN 50340" in resolve and "DefinitionHash" not in at_0004("delay.ResolveTarget.sql")
    allow = current("delay.AllowProcedure.sql")
    assert "HASHBYTES('SHA2_256', OBJECT_DEFINITION(@ObjectId))" in allow and "THROW 50341" in allow
    assert "DefinitionHash VARBINARY(32) NULL" in current("delay.AllowedProcedure.sql")


def test_cross_database_access_is_documented_as_module_signing():
    docs = (ROOT / "docs" / "delayed-execution.md").read_text(encoding="utf-8")
    assert "module signing" in docs.lower() or "ADD SIGNATURE" in docs


# --------------------------------------------------------------------------
# Point 3: reconciliation, a missing endpoint
# --------------------------------------------------------------------------


def test_reconcile_repairs_orphans_missing_tasks_and_receipts():
    text = current("delay.Reconcile.sql")
    assert "sys.conversation_endpoints" in text
    assert "BEGIN DIALOG CONVERSATION" in text and "BEGIN CONVERSATION TIMER (@NewHandle)" in text
    assert "NOT EXISTS (SELECT 1 FROM delay.Task AS t WHERE t.TaskID = p.ID)" in text
    assert "APPLOCK_TEST" in text and "delay.Incident" in text


def test_cancel_and_finish_handle_a_missing_endpoint():
    cancel = current("delay.CancelTask.sql")
    assert re.search(r"SELECT @EndpointState = e\.state\s+FROM sys\.conversation_endpoints", cancel)
    assert "IF @EndpointState IS NULL OR @EndpointState IN ('CD', 'DO')" in cancel
    assert "THROW 50343" in cancel
    finish = current("delay.FinishTask.sql")
    assert re.search(r"IF @Handle IS NOT NULL AND EXISTS \(\s*SELECT 1 FROM sys\.conversation_endpoints", finish)
    assert "sys.conversation_endpoints" not in at_0004("delay.FinishTask.sql")


# --------------------------------------------------------------------------
# Point 10: roles, lengths
# --------------------------------------------------------------------------


def test_callers_may_cancel_only_their_own_tasks():
    cancel = current("dbo.CancelDelayExecution.sql")
    assert "EXECUTE AS OWNER" not in cancel  # roles are read in the caller's context
    assert "IS_MEMBER(N'MailqAdmin')" in cancel and "ORIGINAL_LOGIN()" in cancel
    task = current("delay.CancelTask.sql")
    assert "THROW 50342" in task and "@CreatedBy <> @CallerLogin" in task
    trigger = current("dbo.trg_tabDIYTable12402_ScheduleDelay.sql")
    assert "CreatedBy" in trigger and "ORIGINAL_LOGIN()" in trigger


def test_initiate_refuses_values_longer_than_their_column():
    text = current("dbo.InitiateDelayExecution.sql")
    params = re.search(r"CREATE OR ALTER PROCEDURE dbo\.InitiateDelayExecution(.*?)\bAS\b", text, re.S).group(1)
    declared = re.findall(r"(@\w+)\s+NVARCHAR\((\w+)\)", params)
    assert declared and all(size == "MAX" for _, size in declared), declared
    assert "THROW 50344" in text and "THROW 50345" in text
    assert "LEN(@F108212 + N'.') - 1" in text  # trailing blanks count
    assert "NVARCHAR(50)" in at_0004("dbo.InitiateDelayExecution.sql")


def test_the_activation_procedure_refuses_rather_than_cuts():
    text = current("dbo.ProcessDelayQueue.sql")
    assert "@TooLong = 1" in text and "@Refusal = 50303" in text


def test_guarantees_no_longer_list_the_race_0004_fixed():
    text = (ROOT / "docs" / "guarantees.md").read_text(encoding="utf-8")
    section = text[text.index("## Delayed execution"):]
    assert "stalled for a whole lease between committing" not in section


# --------------------------------------------------------------------------
# Point 9: idempotency key; wrappers
# --------------------------------------------------------------------------


def test_initiate_takes_an_idempotency_key():
    text = current("dbo.InitiateDelayExecution.sql")
    assert "@IdempotencyKey NVARCHAR(MAX) = NULL" in text
    assert "@LockOwner = N'Transaction'" in text and "WHERE t.IdempotencyKey = @IdempotencyKey" in text
    assert "UX_Task_IdempotencyKey" in current("delay.Task.UX_Task_IdempotencyKey.sql")


@pytest.mark.parametrize("procedure", [
    "dbo.InitiateDelayExecution", "dbo.CancelDelayExecution", "delay.AllowProcedure",
    "delay.DisallowProcedure", "delay.Reconcile",
])
def test_every_public_delay_procedure_has_a_wrapper(procedure):
    source = (ROOT / "src" / "mailq_db" / "procedures.py").read_text(encoding="utf-8")
    section = source[source.index("# Delayed execution"):]
    assert f"EXEC {procedure} " in section


# --------------------------------------------------------------------------
# Point 4: the seed checks, in the baseline's transaction
# --------------------------------------------------------------------------


def render(direction: str, target: str, *x_args: str) -> str:
    from alembic import command

    out = io.StringIO()
    cfg = d.alembic_config(ROOT, x_args=x_args)
    cfg.output_buffer = out
    getattr(command, direction)(cfg, target, sql=True)
    return out.getvalue()


@pytest.fixture(scope="module")
def upgrade() -> str:
    return render("upgrade", "head")


def test_upgrade_checks_for_the_seed_design_after_the_broker_files(upgrade):
    for number in ("THROW 50370", "THROW 50371", "THROW 50372"):
        assert number in upgrade
    assert upgrade.index("CREATE QUEUE dbo.DelayServiceQueue") < upgrade.index("THROW 50370")
    assert upgrade.index("THROW 50372") < upgrade.index("INSERT INTO dbo.mailq_deployment_file")
    assert "DECLARE @Disable BIT = 0;" in upgrade


def test_seed_option_disables_or_skips():
    assert "DECLARE @Disable BIT = 1;" in render("upgrade", "head", "seed=disable-triggers")
    assert "THROW 50370" not in render("upgrade", "head", "seed=ignore")
    with pytest.raises(ConfigurationError, match="-x seed must be one of"):
        render("upgrade", "head", "seed=drop")


def test_seed_option_applies_to_a_broker_added_later():
    assert "THROW 50370" in render("upgrade", "head", "broker=add")
    assert "THROW 50370" not in render("upgrade", "head", "broker=add", "seed=ignore")


def test_delay_tables_are_created_in_their_final_shape(upgrade):
    code = d.code_only(upgrade)
    assert "ALTER TABLE delay." not in code
    for column in ("CreatedBy NVARCHAR(128) NULL", "IdempotencyKey NVARCHAR(100) NULL",
                   "DefinitionHash VARBINARY(32) NULL", "TargetLockTimeoutMs INT NULL"):
        assert column in upgrade, column


def test_downgrade_enables_the_disabled_triggers_before_the_tables_go():
    down = render("downgrade", "head:base")
    assert down.index("ENABLE TRIGGER") < down.index("DROP TABLE IF EXISTS delay.Installation")


def test_broker_off_renders_no_seed_check():
    section = render("upgrade", "head", "broker=off")
    assert "CREATE TABLE delay." not in section and "THROW 5037" not in section
    down = render("downgrade", "head:base", "broker=off")
    assert "ENABLE TRIGGER" not in down and "delay.Reconcile" not in down


# --------------------------------------------------------------------------
# Point 11: the benchmark's load, and "no server" here
# --------------------------------------------------------------------------


def _bench():
    import importlib.util

    spec = importlib.util.spec_from_file_location("delay_throughput", ROOT / "bench" / "delay_throughput.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_benchmark_runs_the_goal_load_and_says_no_server(monkeypatch, capsys):
    bench = _bench()
    monkeypatch.delenv("MAILQ_DB_URL", raising=False)
    assert bench.main([]) == 0
    out = capsys.readouterr().out
    assert out.count("\n") == 1 and out.startswith("delay_throughput: needs a SQL Server")
    source = (ROOT / "bench" / "delay_throughput.py").read_text(encoding="utf-8")
    assert 'default=1000' in source and 'default=60' in source  # 60,000 tasks over 60 s
    assert "p99" in source and "target duration" in source
