"""Static checks of delayed execution (sql/broker/), no server needed.

Parse, lint and reference checks over every file of sql/ are generic harness
tests; these check what is particular to the Service Broker half: the rendered
scripts, the -x options, the downgrade, the seed-design checks, and the rules of
the third design (issue 23) that a reader would otherwise have to trust: the
task table is the queue, one dispatcher timer, RECEIVE alone in its
transaction, targets and hooks as MailqRunner, checked before and after the
call, held instead of refused, the copy check, bounded purges, the size.
Behaviour is tested against SQL Server by tests/integration/test_delay_execution.py
(skipped here) and the protocol by models/delayexec.pml (tests/models).
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
def upgrade_head() -> str:
    """The fresh install (the baseline holds delayed execution)."""
    return render("upgrade", "head")


@pytest.fixture(scope="module")
def downgrade_head() -> str:
    return render("downgrade", "head:base")


# --------------------------------------------------------------------------
# Rendered scripts
# --------------------------------------------------------------------------


@pytest.mark.parametrize("text", ("WAITFOR DELAY", "NOLOCK", "END;;"))
def test_full_scripts_render_without_forbidden_text(text):
    assert text not in render("upgrade", "head").upper()
    assert text not in render("downgrade", "head:base").upper()


def test_full_scripts_never_set_trustworthy():
    """TRUSTWORTHY appears only in texts that report it (delay.Health, the monitor's
    messages), never in a statement."""
    for script in (render("upgrade", "head"), render("downgrade", "head:base")):
        code_only = re.sub(r"N?'(?:[^']|'')*'", "''", d.strip_comments(script))
        assert re.search(r"\bSET\s+TRUSTWORTHY\b", code_only, re.I) is None


def test_full_scripts_never_alter_the_database():
    """No ALTER DATABASE statement in either full script (messages may name it)."""
    for script in (render("upgrade", "head"), render("downgrade", "head:base")):
        statements = re.findall(r"^\s*ALTER\s+DATABASE\b", d.strip_comments(script), re.I | re.M)
        assert statements == []


def test_broker_check_comes_first_and_says_how_to_enable(upgrade_head):
    section = upgrade_head
    check = section.index("THROW 50401")
    first_create = section.index("CREATE SCHEMA delay")
    assert check < first_create
    message = section[section.index("is_broker_enabled"):check]
    assert "SET ENABLE_BROKER WITH ROLLBACK IMMEDIATE" in message
    assert "exclusive access" in message and "disconnects" in message
    assert "-x broker=off" in message


def test_broker_off_renders_no_broker_object(upgrade_head):
    off = d.code_only(render("upgrade", "head", "broker=off"))
    for name in ("DelayServiceQueue", "tabDIYTable12402", "ProcessDelayQueue", "CREATE QUEUE", "MailqDelayService",
                 "delay."):
        assert name in upgrade_head
        assert name not in off, name
    assert "VALUES ('0001')" in render("upgrade", "head", "broker=off")


def test_default_readers_keep_the_frozen_five(upgrade_head):
    assert "MAX_QUEUE_READERS = 5" in upgrade_head
    assert re.search(r"MAX_QUEUE_READERS = (?!5\b)\d+", upgrade_head) is None


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


def test_downgrade_drops_every_object_it_created(downgrade_head):
    for rel, obj in created_objects():
        if obj.kind in ("grant", "script"):
            continue
        if rel == "broker/dbo.tabDIYTable12402.sql":
            continue  # checked below: dropped only when created
        assert obj.kind != "script", rel
        drop = d.drop_statement(obj)
        assert drop and drop in downgrade_head, rel


def test_downgrade_revokes_every_grant(downgrade_head):
    for rel, obj in created_objects():
        if obj.kind == "grant":
            for revoke in d.revoke_statements(d.frozen_text(REVISION, rel, ROOT)):
                assert revoke in downgrade_head, revoke


def test_downgrade_switches_activation_off_before_dropping_the_procedure(downgrade_head):
    activation = downgrade_head.index("WITH ACTIVATION (DROP)")
    assert activation < downgrade_head.index("DROP PROCEDURE IF EXISTS dbo.ProcessDelayQueue")
    assert downgrade_head.index("DROP SERVICE") < downgrade_head.index("DROP QUEUE")
    assert downgrade_head.index("DROP QUEUE") < downgrade_head.index("DROP CONTRACT")
    assert downgrade_head.index("DROP CONTRACT") < downgrade_head.index("DROP MESSAGE TYPE")


def test_downgrade_keeps_an_adopted_platform_table(downgrade_head):
    drops = [m.start() for m in re.finditer(r"DROP TABLE IF EXISTS dbo\.tabDIYTable12402", downgrade_head)]
    assert len(drops) == 1
    guard = downgrade_head[: drops[0]]
    guard = guard[guard.rindex("IF OBJECT_ID(N'delay.Installation'") :]
    assert "Detail = N'created'" in guard
    # The record it reads is written by the create-or-adopt file, in both branches.
    platform = code(BROKER / "dbo.tabDIYTable12402.sql")
    assert "N'created'" in platform and "N'adopted'" in platform
    assert "DROP " not in platform.upper().replace("DROP_", "")


def test_downgrade_statements_are_guarded(downgrade_head):
    """Each batch is a no-op when its object is absent (e.g. after -x broker=off)."""
    batches = [b.strip() for b in downgrade_head.split("\nGO\n") if b.strip()]
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
# The SQL text of sql/broker/: the third design
# --------------------------------------------------------------------------

PROCESS = "dbo.ProcessDelayQueue.sql"
RUN_TASK = "delay.RunTask.sql"
TRIGGER = "dbo.trg_tabDIYTable12402_ScheduleDelay.sql"
ARM = "delay.ArmDispatcher.sql"


def current(name: str) -> str:
    return code(BROKER / name)


def header(path: Path) -> str:
    text = path.read_text(encoding="utf-8")
    return text[: text.index("*/")]


def without_strings(text: str) -> str:
    return re.sub(r"N?'(?:[^']|'')*'", "''", text)


def test_the_broker_half_is_at_most_half_its_former_size():
    """Issue 23 point 6: sql/broker/ was 3,816 lines; the activation procedure 999."""
    lines = {p.name: p.read_text(encoding="utf-8").count("\n") for p in BROKER.glob("*.sql")}
    assert sum(lines.values()) <= 1908, sum(lines.values())
    assert lines[PROCESS] <= 150


def test_module_headers_are_contracts_of_at_most_30_lines():
    for path in BROKER.glob("*.sql"):
        if d.describe(path.read_text(encoding="utf-8")).kind in ("procedure", "function", "view", "trigger"):
            assert 5 <= header(path).count("\n") <= 30, path.name


def test_no_broker_file_waits_with_delay_or_concatenates_exec():
    for path in BROKER.glob("*.sql"):
        text = without_strings(code(path)).upper()
        for forbidden in (r"WAITFOR\s+DELAY", r"\bNOLOCK\b", r"\bTRUSTWORTHY\b", r"\bGETDATE\b", r"SAVE\s+TRAN"):
            assert re.search(forbidden, text) is None, (path.name, forbidden)
        assert re.search(r"^\s*ALTER\s+DATABASE\b", text, re.M) is None, path.name
        assert re.search(r"\bEXEC(UTE)?\s*\(", text) is None, path.name
        for waitfor in re.finditer(r"\bWAITFOR\b\s*(\S+)", text):
            assert waitfor.group(1).startswith("("), path.name  # WAITFOR (RECEIVE ...) only


def test_dynamic_sql_only_calls_targets_and_grants_with_quotenamed_catalog_names():
    users = sorted(p.name for p in BROKER.glob("*.sql") if "SP_EXECUTESQL" in code(p).upper())
    assert users == ["delay.AllowProcedure.sql", "delay.DisallowProcedure.sql", "delay.Log.sql", RUN_TASK,
                     "delay.Task.sql"]
    for name, var in (("delay.AllowProcedure.sql", "@Grant"), ("delay.DisallowProcedure.sql", "@Revoke")):
        built = re.search(rf"SET {var} = CONCAT\((.*?)\);", current(name), re.S).group(1)
        assert re.findall(r"QUOTENAME\((@\w+)\)", built) == ["@SchemaName", "@Name"]
        assert re.sub(r"N'[^']*'|QUOTENAME\(@\w+\)|[\s,]", "", built) == ""
    for name in ("delay.Task.sql", "delay.Log.sql"):  # a constant statement (DacFx models no ALTER TABLE SET)
        assert re.search(r"EXEC sys\.sp_executesql N'ALTER TABLE delay\.\w+ SET \(LOCK_ESCALATION = DISABLE\);'",
                         current(name))


def test_targets_run_as_mailqrunner_through_sp_executesql_with_parameters():
    text = current(RUN_TASK)
    calls = re.findall(r"EXEC sys\.sp_executesql @Sql,\s*N'([^']*)',\s*(.*?);", text, re.S)
    assert len(calls) == 1
    declared, values = calls[0]
    for name in ("@SPName", "@P1", "@P2", "@P3", "@P4", "@P5"):
        assert f"{name} NVARCHAR(200)" in declared and f"{name} = {name}" in values
    built = re.search(r"SET @Sql = CONCAT\((.*?)\);", text, re.S).group(1)
    assert re.findall(r"QUOTENAME\((@\w+)\)", built) == ["@SchemaName", "@ProcedureName"]
    # ... and one INT (the lock timeout) besides literals: CONCAT renders it as digits only.
    assert re.sub(r"N'[^']*'|QUOTENAME\(@\w+\)|@LockTimeoutMs|[\s,]", "", built) == ""
    assert "@LockTimeoutMs INT" in text
    # EXECUTE AS USER right around the call, REVERT right after its CATCH.
    call = text.index("EXEC sys.sp_executesql @Sql")
    execute_as = text.rindex("EXECUTE AS USER = N'MailqRunner';", 0, call)
    assert re.fullmatch(r"\s*BEGIN TRY\s*", text[execute_as + len("EXECUTE AS USER = N'MailqRunner';"):
                                                  text.index("EXEC sys.sp_executesql", execute_as)])
    catch_end = text.index("END CATCH;", call)
    assert re.match(r"\s*REVERT;", text[catch_end + len("END CATCH;"):])
    assert text.count("EXECUTE AS USER") == 1 and text.count("REVERT;") == 1
    # no "WITH COOKIE": "The COOKIE INTO option can only be used at the adhoc level" (EXECUTE AS)
    assert "COOKIE" not in text


def test_each_target_gets_the_full_set_line():
    built = re.search(r"SET @Sql = CONCAT\((.*?)\);", current(RUN_TASK), re.S).group(1)
    line = " ".join(re.findall(r"N'([^']*)'", built))
    assert re.search(r"SET ANSI_NULLS, ANSI_WARNINGS, ANSI_PADDING, QUOTED_IDENTIFIER, ARITHABORT, "
                     r"CONCAT_NULL_YIELDS_NULL\s+ON;", line)
    for option in ("SET NUMERIC_ROUNDABORT OFF;", "SET XACT_ABORT OFF;", "SET DEADLOCK_PRIORITY NORMAL;",
                   "SET LOCK_TIMEOUT"):
        assert option in line, option
    # a finite default, never -1 (wait for ever)
    setting = current("delay.Setting.sql")
    assert "TargetLockTimeoutMs INT NOT NULL CONSTRAINT DF_Setting_TargetLockTimeoutMs DEFAULT (30000)" in setting
    assert "TargetLockTimeoutMs BETWEEN 1 AND 3600000" in setting
    # and the reader's own session too (activation starts it with the database defaults)
    assert "SET ANSI_WARNINGS, ANSI_PADDING, ARITHABORT, CONCAT_NULL_YIELDS_NULL ON;" in current(PROCESS)


def test_the_target_is_checked_before_and_after_the_call_in_its_transaction():
    text = current(RUN_TASK)
    begin = text.index("BEGIN TRANSACTION;")
    before = text.index("FROM delay.CheckTarget(@SchemaName, @ProcedureName)")
    call = text.index("EXEC sys.sp_executesql @Sql")
    after = text.index("FROM delay.CheckTarget(@SchemaName, @ProcedureName)", call)
    assert begin < before < call < after
    check = text[after:text.index(")", after + 60)]
    for same in ("c.ObjectId = @ObjectId", "c.ModifyDate = @Modified", "c.DefinitionHash = @Hash"):
        assert same in text[after - 200:after + 300], same
    assert "@Error = 50540" in text and check
    # no COMMIT between the call and the Done update: the outcome commits with the target's work
    done = text.index("t.TaskState = @State", call)
    assert "COMMIT" not in text[call:done]
    assert text.count("COMMIT TRANSACTION") == 1


def test_a_changed_target_is_held_and_released_by_listing_it_again():
    check = current("delay.CheckTarget.sql")
    assert re.search(r"WHEN a\.ObjectId IS NULL THEN N'Refused'", check)
    assert re.search(r"THEN N'Held'", check) and "50307" in check and "50340" in check
    allow = current("delay.AllowProcedure.sql")
    release = re.search(r"SET t\.TaskState = N'Pending'.*?WHERE t\.TaskState = N'Held'", allow, re.S)
    assert release and "EXEC delay.ArmDispatcher @DueAtUtc = @Now;" in allow[release.end():]
    disallow = current("delay.DisallowProcedure.sql")
    assert re.search(r"t\.TaskState = N'Refused'.*?WHERE t\.TaskState IN \(N'Pending', N'Held'\)", disallow, re.S)
    assert "50340" not in current("dbo.InitiateDelayExecution.sql")  # a new call is accepted, held when due


def test_the_allow_list_is_a_grant_to_mailqrunner():
    assert "N' TO MailqRunner;'" in current("delay.AllowProcedure.sql")
    assert "N' FROM MailqRunner;'" in current("delay.DisallowProcedure.sql")
    user = code(ROOT / "sql" / "security" / "MailqRunner.user.sql")
    assert "CREATE USER MailqRunner WITHOUT LOGIN;" in user
    assert d.build_order(ROOT).index("security/MailqRunner.user.sql") < d.build_order(ROOT).index(
        "procedures/mailq.RunApplicationHooks.sql")
    everything = "\n".join(code(p) for p in (ROOT / "sql").rglob("*.sql"))
    assert re.findall(r"^\s*GRANT\b.*\bTO MailqRunner\b", everything, re.M) == []  # only the dynamic grants


def test_no_receive_transaction_does_anything_but_receive():
    text = current(PROCESS)
    begin = text.index("BEGIN TRANSACTION;")
    commit = text.index("COMMIT TRANSACTION;", begin)
    body = text[begin + len("BEGIN TRANSACTION;"):commit]
    statements = [s.strip() for s in re.split(r";", body) if s.strip()]
    assert statements[0].startswith("WAITFOR (") and "RECEIVE TOP (1)" in statements[0]
    allowed = ("IF @Handle IS NOT NULL", "WAITFOR (", "SET XACT_ABORT", "BEGIN TRY", "END TRY",
               "IF XACT_STATE() = -1 ROLLBACK TRANSACTION", "END CATCH", "IF @@TRANCOUNT > 0")
    assert all(s.startswith(allowed) for s in statements), statements
    assert "END CONVERSATION @Handle" in body
    # The safety tick is re-armed with the RECEIVE (models/delayexec.pml NO_SAFETY_REARM),
    # as a statement error only: XACT_ABORT OFF around it, so the RECEIVE still commits.
    rearm = body.index("BEGIN CONVERSATION TIMER (@Handle) TIMEOUT = @Tick")
    assert body.rindex("SET XACT_ABORT OFF", 0, rearm) < body.index("BEGIN TRY") < rearm
    assert rearm < body.index("SET XACT_ABORT ON", rearm)
    assert text.count("BEGIN TRANSACTION") == 1  # every other transaction is another procedure's
    for path in BROKER.glob("*.sql"):
        if path.name != PROCESS:
            assert not re.search(r"\bRECEIVE\b", code(path)), path.name


def test_no_dialog_per_task():
    for path in BROKER.glob("*.sql"):
        text = code(path)
        if "BEGIN DIALOG" in text:
            assert path.name == ARM, path.name
        if "BEGIN CONVERSATION TIMER" in text:
            assert path.name in (ARM, PROCESS), path.name
    # the reader re-arms only the conversation whose timer it received (the safety tick)
    assert current(PROCESS).count("BEGIN CONVERSATION TIMER") == 1
    trigger = current(TRIGGER)
    assert "SEND" not in trigger and "DIALOG" not in trigger and "sp_executesql" not in trigger
    assert re.findall(r"\bEXEC(?:UTE)?\s+(\S+)", trigger) == ["delay.ArmDispatcher"]
    assert "WAITFOR" not in trigger and "THROW" not in trigger and "RAISERROR" not in trigger


def test_values_are_copied_when_scheduled_and_read_from_the_task():
    trigger = current(TRIGGER)
    assert re.search(r"INSERT INTO delay\.Task \(.*?Param1, Param2, Param3, Param4, Param5", trigger, re.S)
    assert "c.Param1, c.Param2, c.Param3, c.Param4" in trigger
    run = current(RUN_TASK)
    assert "@P1 = t.Param1" in run and "tabDIYTable12402" not in run


def test_readers_claim_due_rows_in_batches_with_a_lease_and_sweep_expired_claims():
    text = current("delay.RunDueTasks.sql")
    hints = re.findall(r"FROM delay\.Task AS t WITH \(([^)]*\)?)\)", text)
    assert hints == ["READPAST, UPDLOCK, ROWLOCK, INDEX (IX_Task_Due)"] * 2
    sweep = text.index("WHERE t.TaskState = N'Claimed' AND t.LeaseUntilUtc < @Now")
    claim = text.index("WHERE t.TaskState = N'Pending' AND t.NextRunAtUtc <= @Now")
    assert sweep < claim and "ORDER BY t.NextRunAtUtc" in text[claim:]
    assert len(re.findall(r"(?<![@\w])(?:t\.)?ClaimToken = @Token", text)) == 2
    assert text.count("DATEADD(SECOND, @LeaseSeconds, @Now)") == 2
    # the run holds its row (the sweep reads past it) and checks its own claim
    run = current(RUN_TASK)
    assert "WHERE t.TaskID = @TaskID AND t.ClaimToken = @ClaimToken AND t.TaskState = N'Claimed';" in run
    assert "t.LeaseUntilUtc = '9999-12-31'" in run
    # ... and a session lock, which a target that ends the transaction opened for it
    # cannot release: the sweep tests it (models/delayexec.pml NO_SESSION_LOCK)
    name = "CONCAT(N'mailq-db/delay/run/', @TaskID)"
    assert name in run and "@LockOwner = N'Session', @LockTimeout = 0;" in run
    take, call = run.index("@LockOwner = N'Session', @LockTimeout = 0;"), run.index("EXEC sys.sp_executesql @Sql")
    release = run.index("EXEC sys.sp_releaseapplock @Resource = @LockName, @LockOwner = N'Session';")
    assert take < call < run.index("REVERT;") < release
    assert "APPLOCK_TEST(N'public', CONCAT(N'mailq-db/delay/run/', t.TaskID), N'Exclusive', N'Session') = 1" in (
        text[sweep:claim])


def test_a_slow_target_holds_at_most_its_own_readers():
    run = current(RUN_TASK)
    assert re.search(r"WHILE @Verdict = N'Run' AND @Lock < 0 AND @Slot < @Cap", run)
    assert "CONCAT(N'mailq-db/delay/slot/', @ObjectId, N'/', @Slot)" in run and "@LockTimeout = 0" in run
    assert "NULLIF(q.max_readers - 1, 0)" in run  # by default one reader is always left for others


def test_the_timer_protocol_write_then_read():
    """models/delayexec.pml: the reader writes delay.Dispatcher, then reads the due
    index with locks; the inserter inserts, then reads delay.Dispatcher with locks."""
    arm = current(ARM)
    write = arm.index("UPDATE d SET d.LastWokenAtUtc = @Now FROM delay.Dispatcher")
    read = arm.index("WITH (READCOMMITTEDLOCK, INDEX (IX_Task_Due))")
    assert write < read < arm.index("BEGIN CONVERSATION TIMER (@Handle) TIMEOUT = @Timeout;")
    assert "SET LOCK_TIMEOUT 200;" in arm and "SET DEADLOCK_PRIORITY LOW;" in arm
    assert "SET XACT_ABORT OFF;" in arm  # an inserter's arm never fails its INSERT
    trigger = current(TRIGGER)
    assert trigger.index("INSERT INTO delay.Task (") < trigger.index(
        "FROM delay.Dispatcher AS d WITH (READCOMMITTEDLOCK)")
    assert "IF @ArmedFor IS NULL OR @FirstDue < DATEADD(SECOND, -1, @ArmedFor)" in trigger
    # whole seconds, 1 s to 1 day
    assert "WHEN @Fire <= @Now THEN 1" in arm and "WHEN @Fire >= DATEADD(SECOND, 86400, @Now) THEN 86400" in arm


def test_a_lost_dispatcher_conversation_is_begun_again():
    arm = current(ARM)
    assert "e.state IN ('SO', 'SI', 'CO')" in arm and "BEGIN DIALOG CONVERSATION @Handle" in arm
    process = current(PROCESS)
    assert "END CONVERSATION @Handle" in process and "ServiceBroker/DialogTimer" in process


def test_a_copy_runs_nothing_until_enabled():
    run = current("delay.RunDueTasks.sql")
    check = run.index("d.BrokerGuid = db.service_broker_guid")
    assert check < run.index("EXEC mailq.RunApplicationHooks") < run.index("UPDATE TOP (@Batch) t")
    assert "d.BrokerGuid = @Current" in current("delay.EnableThisDatabase.sql")
    assert "CopyNotEnabled" in current("delay.Monitor.sql")


def test_the_monitor_reports_what_stops_delayed_execution():
    monitor = current("delay.Monitor.sql")
    for finding in ("BrokerDisabled", "QueueDisabled", "ActivationOff", "ActivationFailing", "OverdueTasks",
                    "CopyNotEnabled", "DispatcherLost", "HeldTasks", "OrphanedRuns", "RunnerMissing", "NoTask"):
        assert f"N'{finding}'" in monitor, finding
    assert "THROW 50545" in monitor


def test_history_is_purged_in_bounded_batches():
    purge = current("delay.PurgeHistory.sql")
    assert "DELETE TOP (@BatchSize) t" in purge and "SELECT TOP (@BatchSize) l.LogId" in purge
    assert "WHILE @Batches < @MaxBatches" in purge and "IF @@TRANCOUNT > 0" in purge
    assert "NOT EXISTS (SELECT 1 FROM delay.ReceiptDue" in purge


def test_task_metrics_have_exactly_the_four_counts():
    # the four counts of issue 23 (branch i27's reader), then the queue's and the broker's state
    metrics = current("delay.GetTaskMetrics.sql")
    assert ("h.PendingTasks, h.OverdueTasks, h.HeldTasks, h.FailedTasks,\n"
            "        QueueReceiveEnabled = CAST(h.IsReceiveEnabled AS INT), BrokerEnabled = CAST(h.IsBrokerEnabled AS INT)\n"
            "    FROM delay.Health AS h;") in metrics
    order = d.build_order(ROOT)
    assert order.index("broker/delay.Health.sql") < order.index("broker/delay.GetTaskMetrics.sql")
    health = current("delay.Health.sql")
    for column in ("PendingTasks", "OverdueTasks", "HeldTasks", "FailedTasks", "IsEnabledHere", "IsTrustworthy"):
        assert f"{column} =" in health or f"q.{column}" in health, column
    assert "dm_broker_activated_tasks" not in health  # no server permission needed


def test_delay_task_writes_depend_on_no_session_option():
    """The trigger writes delay.Task in the platform's session: no filtered index,
    no index on a computed column (both need the ANSI options for DML)."""
    for path in BROKER.glob("delay.Task*.sql"):
        text = code(path)
        for create in re.findall(r"CREATE\s+(?:UNIQUE\s+)?NONCLUSTERED\s+INDEX[^;]*", text):
            assert "WHERE" not in create and "Receipt" not in create, path.name


def test_receipts_are_set_by_id_never_by_parameter_values():
    for path in BROKER.glob("*.sql"):
        text = code(path)
        for update in re.finditer(r"UPDATE\b.*?(?:;|$)", text, re.S | re.I):
            statement = update.group(0)
            if "F108219" in statement:
                assert not re.search(r"F10821[2-6]\s*=", statement), path.name
                assert re.search(r"p\.ID = @TaskID|p\.ID = n\.TaskID|p\.ID = d\.TaskID", statement), path.name


def test_receipts_are_written_as_mailqrunner():
    receipts = current("delay.WriteReceipts.sql")
    execute_as = receipts.index("EXECUTE AS USER = N'MailqRunner';")
    assert execute_as < receipts.index("SET p.F108219 = t.Receipt") < receipts.index("REVERT;")


def test_who_runs_as_whom():
    for name in ("dbo.InitiateDelayExecution.sql", "dbo.CancelDelayExecution.sql", TRIGGER):
        assert "EXECUTE AS OWNER" not in current(name), name  # the caller's rights, and its triggers'
    for name in (ARM, "delay.Monitor.sql"):
        assert "WITH EXECUTE AS OWNER" in current(name), name
    everything = "\n".join(code(p) for p in (ROOT / "sql").rglob("*.sql"))
    assert not re.search(r"GRANT\s+EXECUTE\s+ON\s+OBJECT::delay\.(ArmDispatcher|RunTask|RunDueTasks)", everything)
    activation = current("dbo.DelayServiceQueue.activation.sql")
    assert "EXECUTE AS OWNER" in activation and "MAX_QUEUE_READERS = 5" in activation


def test_broker_names_agree_between_files():
    text = "\n".join(code(p) for p in BROKER.glob("*.sql"))
    for name in ("MailqDelayRequest", "MailqDelayContract", "MailqDelayService"):
        assert re.search(rf"CREATE (?:MESSAGE TYPE|CONTRACT|SERVICE) {name}\b", text), name


def test_delayed_execution_throws_only_its_own_numbers():
    for path in BROKER.glob("*.sql"):
        for number in (int(n) for n in re.findall(r"\bTHROW\s+(\d+)", code(path))):
            if path.name.startswith("mailq."):
                assert 50290 <= number <= 50298, (path.name, number)
            else:
                assert 50300 <= number <= 50399 or 50540 <= number <= 50579, (path.name, number)


def test_the_caller_role_may_only_execute_initiate_and_cancel():
    grants = d.strip_comments((BROKER / "MailqDelayCaller.grants.sql").read_text(encoding="utf-8"))
    found = re.findall(r"^\s*GRANT\s+(.+?)\s+TO\s+MailqDelayCaller\s*;", grants, re.M)
    assert sorted(found) == [
        "EXECUTE ON OBJECT::dbo.CancelDelayExecution",
        "EXECUTE ON OBJECT::dbo.InitiateDelayExecution",
    ]
    everything = "\n".join(code(p) for p in (ROOT / "sql").rglob("*.sql"))
    assert re.findall(r"\bTO\s+MailqDelayCaller\b", everything) == ["TO MailqDelayCaller"] * 2


def test_initiate_refuses_values_longer_than_their_column_and_takes_a_key():
    text = current("dbo.InitiateDelayExecution.sql")
    params = re.search(r"CREATE OR ALTER PROCEDURE dbo\.InitiateDelayExecution(.*?)\bAS\b", text, re.S).group(1)
    declared = re.findall(r"(@\w+)\s+NVARCHAR\((\w+)\)", params)
    assert declared and all(size == "MAX" for _, size in declared), declared
    assert "THROW 50344" in text and "THROW 50345" in text and "LEN(@F108212 + N'.') - 1" in text
    # the key's lock follows the lookup's comparison (binary collation, trailing blanks padded)
    assert "HASHBYTES('SHA2_256', RTRIM(@IdempotencyKey))" in text
    assert "WHERE k.IdempotencyKey = @IdempotencyKey" in text
    assert "COLLATE Latin1_General_100_BIN2" in current("delay.TaskKey.sql")


def test_callers_may_cancel_only_their_own_tasks():
    cancel = current("dbo.CancelDelayExecution.sql")
    assert "IS_MEMBER(N'MailqAdmin')" in cancel and "ORIGINAL_LOGIN()" in cancel and "THROW 50342" in cancel
    assert "@TaskState NOT IN (N'Pending', N'Held')" in cancel
    assert "ORIGINAL_LOGIN()" in current(TRIGGER)


def test_cancel_never_waits_for_a_running_task():
    """A run holds its task's row X-locked until its target ends: both reads of the cancel are
    under a lock timeout set before them (a SET in a procedure reverts on return), and a timeout
    (1222), caught with the reads, is answered 50321 like any task that is not Pending or Held."""
    cancel = current("dbo.CancelDelayExecution.sql")
    timeout = cancel.index("SET LOCK_TIMEOUT 2000;")
    first_read = cancel.index("FROM delay.Task AS t WHERE t.TaskID = @TaskID")
    assert timeout < cancel.index("BEGIN TRY") < first_read < cancel.index("WITH (UPDLOCK, ROWLOCK)")
    catch = cancel[cancel.index("BEGIN CATCH"):]
    assert catch.index("ROLLBACK TRANSACTION") < catch.index("IF ERROR_NUMBER() <> 1222 OR @Locked = 1 THROW;") \
        < catch.index("THROW 50321, @Msg, 1;")


def test_cancel_answers_50321_only_for_a_lock_timeout_of_its_reads():
    """Once the task's row is held (the UPDLOCK read returned), a lock timeout on delay.Log or
    the platform row (another session's lock, or the platform's triggers under our 2 s) is not a
    run: it is re-raised as 1222, which callers retry, never answered 'a reader runs it' (50321),
    which tells the caller the task cannot be cancelled while it is still Pending."""
    cancel = current("dbo.CancelDelayExecution.sql")
    body = cancel[cancel.index("BEGIN TRY"):cancel.index("END TRY")]
    assert re.search(r"@Locked BIT = 0\b", cancel)
    locked = re.search(r"SELECT @TaskState = t\.TaskState, @Locked = 1\s+FROM delay\.Task AS t WITH \(UPDLOCK, ROWLOCK\)",
                       body)
    assert locked, "the UPDLOCK read marks the row held"
    assert body.count("@Locked = 1") == 1
    assert locked.start() < body.index("UPDATE t") < body.index("INSERT INTO delay.Log") \
        < body.index("dbo.tabDIYTable12402")
    catch = cancel[cancel.index("BEGIN CATCH"):]
    assert re.search(r"IF ERROR_NUMBER\(\) <> 1222 OR @Locked = 1 THROW;", catch)


@pytest.mark.parametrize("name", ["dbo.InitiateDelayExecution.sql", "dbo.CancelDelayExecution.sql",
                                  "delay.AllowProcedure.sql", "delay.DisallowProcedure.sql"])
def test_the_one_catch_pattern_and_the_written_contract(name):
    text = current(name)
    assert "@OwnTran BIT = IIF(@@TRANCOUNT = 0, 1, 0)" in text
    assert "IF @OwnTran = 1 AND XACT_STATE() <> 0" in text
    h = header(BROKER / name)
    assert "Transaction:" in h and "Lock order:" in h


# --------------------------------------------------------------------------
# The seed design: checked after the broker files, in the same transaction
# --------------------------------------------------------------------------


def test_upgrade_checks_for_the_seed_design(upgrade_head):
    for number in ("THROW 50370", "THROW 50371", "THROW 50372"):
        assert number in upgrade_head
    # after the broker objects it inspects exist, before the version row is written
    assert upgrade_head.index("CREATE SCHEMA delay") < upgrade_head.index("THROW 50370")
    assert upgrade_head.index("THROW 50372") < upgrade_head.index("INSERT INTO dbo.mailq_alembic_version")
    assert "DECLARE @Disable BIT = 0;" in upgrade_head
    # the seed check counts only the message types of delayed execution as its own
    assert "N'MailqDelayRequest'" in upgrade_head and "N'MailqDelayRequest'" in current("mt.DelayRequest.sql")


def test_seed_option_disables_or_skips():
    assert "DECLARE @Disable BIT = 1;" in render("upgrade", "head", "seed=disable-triggers")
    assert "THROW 50370" not in render("upgrade", "head", "seed=ignore")
    with pytest.raises(ConfigurationError, match="-x seed must be one of"):
        render("upgrade", "head", "seed=drop")


# --------------------------------------------------------------------------
# The benchmark's load, and "no server" here
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
    assert "default=1000" in source and "default=60" in source  # 60,000 tasks over 60 s
    assert bench.GOAL_P99_S == 1.0 and bench.GOAL_RATE == 1000 and bench.GOAL_FLUSHES_PER_TASK == 1.5
    assert "| reference: p99 < " in source and "| reference: <= " in source


def test_the_benchmark_says_it_needs_a_server_when_it_cannot_connect(monkeypatch, capsys):
    bench = _bench()
    import mailq_db.connection as connection

    def refuse(url):
        raise OSError("connection refused")

    monkeypatch.setattr(connection, "connect", refuse)
    assert bench.main(["mssql://nowhere/db"]) == 0
    out = capsys.readouterr().out
    assert out.count("\n") == 1 and out.startswith("delay_throughput: needs a SQL Server")


def test_every_public_delay_procedure_has_a_wrapper():
    source = (ROOT / "src" / "mailq_db" / "procedures.py").read_text(encoding="utf-8")
    section = source[source.index("# Delayed execution"):]
    for procedure in ("dbo.InitiateDelayExecution", "dbo.CancelDelayExecution", "delay.AllowProcedure",
                      "delay.DisallowProcedure", "delay.Monitor", "delay.EnableThisDatabase", "delay.PurgeHistory",
                      "delay.GetTaskMetrics"):
        assert f"EXEC {procedure} " in section or f"EXEC {procedure};" in section, procedure


# --------------------------------------------------------------------------
# A Service Broker reader's second reading (r23b)
# --------------------------------------------------------------------------


def test_a_copy_reader_leaves_without_arming_or_polling():
    """A copy not enabled here has overdue Pending rows: arming to them and waiting
    1 ms for them would spin the reader (and a log flush per turn) forever."""
    run = current("delay.RunDueTasks.sql")
    copy_check = run.index("IF NOT EXISTS (")
    assert run.index("SET @Claimed = -1;") < copy_check < run.index("SET @Claimed = 0;")
    process = current(PROCESS)
    assert "IF @Claimed >= 0 EXEC delay.ArmDispatcher @Armed = @Armed OUTPUT" in process
    leave = process.index("IF @Claimed < 0 BREAK;")
    assert process.index("SET @UntilDueMs =") < leave < process.index("SET @WaitMs = IIF(@UntilDueMs < 1, 1")
    # ... so the heartbeat stays old there: ActivationFailing is not reported on a copy
    assert "AND @Guid = db.service_broker_guid, N'ActivationFailing'" in current("delay.Monitor.sql")


def test_a_run_records_its_outcome_only_for_its_own_claim():
    """After a failed target's rollback the row is Claimed, unlocked, its lease maybe
    passed: a sweep may claim and run it before the outcome; that outcome must not
    overwrite the sweeper's (a Done task made Pending runs again)."""
    run = current(RUN_TASK)
    outcome = run.index("t.TaskState = @State, t.Attempts = t.Attempts + @Ran")
    where = run.index("WHERE t.TaskID = @TaskID AND t.ClaimToken = @ClaimToken;", outcome)
    skip = run.index("IF @@ROWCOUNT = 0 SELECT @State = NULL, @Event = NULL;", where)
    assert skip < run.index("INSERT INTO delay.ReceiptDue", skip) < run.index("INSERT INTO delay.Log", skip)


def test_a_target_without_a_free_slot_does_not_use_up_its_claims():
    """Claims > MaxAttempts + 3 fails a task (50541); a task put back for want of a
    slot of its target (MaxReaders), or held before its call, was claimed without a
    run and must not count (else a capped target's backlog, or a target held and
    listed again a few times, is failed without running)."""
    run = current(RUN_TASK)
    assert "IIF(@Claims > @MaxAttempts + 3, N'Failed', c.Verdict)" in run
    assert "t.Claims = t.Claims - IIF(@Ran = 0 AND @State IN (N'Pending', N'Held'), 1, 0)" in run


def test_the_monitor_never_fails_a_run_whose_reader_still_holds_it():
    """A target that committed T keeps running as its reader's session lock says:
    OrphanedRuns tests that lock, as the sweep does."""
    monitor = current("delay.Monitor.sql")
    test = "APPLOCK_TEST(N'public', CONCAT(N'mailq-db/delay/run/', t.TaskID), N'Exclusive', N'Session') = 1"
    orphaned = monitor[monitor.index("WHERE t.TaskState = N'Claimed' AND t.LeaseUntilUtc = '9999-12-31'"):]
    assert orphaned.count(test) == 2 and orphaned.index(test) < orphaned.index("N'OrphanedRuns'")


def test_implicit_transaction_sessions_get_real_transactions():
    """Under IMPLICIT_TRANSACTIONS ON (pyodbc, JDBC with autocommit off) the first
    read of a table opens a transaction: the purge's check would always refuse
    (50543), and a reader run by hand would nest every transaction in one."""
    purge = current("delay.PurgeHistory.sql")
    assert purge.index("SET IMPLICIT_TRANSACTIONS OFF;") < purge.index("FROM delay.Setting")
    process = current(PROCESS)
    assert process.index("IMPLICIT_TRANSACTIONS OFF;") < process.index("BEGIN TRANSACTION;")


def test_the_fan_out_never_waits_for_an_inserters_commit():
    """An inserter that moved the timer holds the dispatcher's conversation group to
    its commit; SEND on that conversation waits for it: a bounded wait, then reset."""
    run = current("delay.RunDueTasks.sql")
    send = run.index("SEND ON CONVERSATION @Handle MESSAGE TYPE MailqDelayRequest;")
    assert run.rindex("SET LOCK_TIMEOUT 200;", 0, send) < send < run.index("SET LOCK_TIMEOUT -1;", send)
    assert run.index("SET LOCK_TIMEOUT -1;", send) < run.index("EXEC delay.RunTask")


def test_receipts_are_written_before_each_claim_also_when_nothing_is_due():
    """Receipts made due outside a batch (disallowed, orphaned, refused by the monitor)
    are written by the next pass even when it claims nothing."""
    run = current("delay.RunDueTasks.sql")
    loop = run.index("WHILE 1 = 1")
    assert loop < run.index("EXEC delay.WriteReceipts;") < run.index("UPDATE TOP (@Batch) t")
    assert run.count("EXEC delay.WriteReceipts;") == 1


def test_only_a_receipt_the_platform_refused_is_dropped():
    """A failure that is not the platform's UPDATE (EXECUTE AS when MailqRunner is
    missing, our own tables) leaves the receipts due instead of dropping each one."""
    receipts = current("delay.WriteReceipts.sql")
    catch = receipts[receipts.index("BEGIN CATCH"):]
    assert "IF @Alone = 1 AND @Runner = 1" in catch
    assert catch.index("IF @Alone = 1 AND @Runner = 1") < catch.index("IF @Runner = 0 RETURN;") < catch.index(
        "SELECT @Alone = 1, @Runner = 0;")
