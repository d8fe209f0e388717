"""Delayed execution against SQL Server 2022 with Service Broker enabled.

Fixtures from conftest.py: ``mssql_url`` (a fresh database per module, deployed
with ``alembic upgrade head``, broker enabled) and ``fresh_database`` (a factory
for databases deployed otherwise).  Every test makes its own target procedures
(unique names) and looks only at its own tasks, so the tests share the module's
database safely.  Timing tolerances are generous: these tests prove behaviour;
bench/delay_throughput.py measures lateness.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterable

import pytest

from mailq_db.connection import connect

pytestmark = pytest.mark.integration

FINAL = ("Done", "Failed", "Refused", "Cancelled")


# --------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------


def rows(conn, sql: str, *params) -> list[tuple]:
    cursor = conn.cursor()
    cursor.execute(sql, *params)
    result: list[tuple] = []
    while True:
        if cursor.description is not None:
            result.extend(tuple(r) for r in cursor.fetchall())
        if not cursor.nextset():
            break
    return result


def scalar(conn, sql: str, *params):
    found = rows(conn, sql, *params)
    return found[0][0] if found else None


def wait_until(check: Callable[[], bool], timeout: float, what: str, pause: float = 0.2) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(pause)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def unique(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:10]}"


@pytest.fixture(scope="module")
def conn(mssql_url):
    connection = connect(mssql_url)
    rows(connection, """
        IF OBJECT_ID(N'dbo.DelayProbeRun', N'U') IS NULL
            CREATE TABLE dbo.DelayProbeRun (
                RunId BIGINT IDENTITY (1, 1) PRIMARY KEY,
                Probe SYSNAME NOT NULL,
                SPName NVARCHAR(200) NULL,
                Param1 NVARCHAR(200) NULL, Param2 NVARCHAR(200) NULL, Param3 NVARCHAR(200) NULL,
                Param4 NVARCHAR(200) NULL, Param5 NVARCHAR(200) NULL,
                RanAtUtc DATETIME2(3) NOT NULL DEFAULT (SYSUTCDATETIME())
            )""")
    yield connection
    connection.close()


@pytest.fixture()
def fast_retries(conn):
    """Short backoff and lease so that retries and the watchdog show within seconds."""
    before = rows(conn, "SELECT MaxAttempts, RetryBaseSeconds, RetryMaxSeconds, LeaseSeconds FROM delay.Setting")
    rows(conn, "UPDATE delay.Setting SET MaxAttempts = 2, RetryBaseSeconds = 1, RetryMaxSeconds = 2, LeaseSeconds = 3")
    yield
    rows(conn, "UPDATE delay.Setting SET MaxAttempts = ?, RetryBaseSeconds = ?, RetryMaxSeconds = ?, LeaseSeconds = ?",
         *before[0])


def make_target(conn, body: str | None = None, schema: str = "dbo", name: str | None = None,
                allow: bool = True, bare: bool = False) -> str:
    """A target procedure with the contract's parameters; by default it records its run."""
    name = name or unique("DelayProbe")
    body = body or (
        "INSERT INTO dbo.DelayProbeRun (Probe, SPName, Param1, Param2, Param3, Param4, Param5) "
        f"VALUES (N'{name}', @SPName, @Param1, @Param2, @Param3, @Param4, @Param5);"
    )
    rows(conn, f"""
        CREATE OR ALTER PROCEDURE {schema}.{name}
            @SPName NVARCHAR(200) = NULL, @Param1 NVARCHAR(200) = NULL, @Param2 NVARCHAR(200) = NULL,
            @Param3 NVARCHAR(200) = NULL, @Param4 NVARCHAR(200) = NULL, @Param5 NVARCHAR(200) = NULL
        AS
        BEGIN
            SET NOCOUNT ON;
            {body}
        END""")
    if allow:
        rows(conn, "EXEC delay.AllowProcedure @ProcedureName = ?, @AllowBareName = ?", f"{schema}.{name}", int(bare))
    return name


def initiate(conn, target: str, delay: int, *params: str | None) -> int:
    values = list(params) + [None] * (5 - len(params))
    return int(scalar(
        conn,
        "EXEC dbo.InitiateDelayExecution @F108211 = ?, @F108218 = ?, @F108212 = ?, @F108213 = ?, "
        "@F108214 = ?, @F108215 = ?, @F108216 = ?",
        target, delay, *values,
    ))


def task(conn, task_id: int) -> dict:
    cursor = conn.cursor()
    cursor.execute(
        "SELECT t.TaskState, t.Receipt, t.Attempts, t.DueAtUtc, t.FirstStartedAtUtc, t.LastErrorNumber, "
        "t.ConversationHandle, p.F108219, "
        "DATEDIFF_BIG(MILLISECOND, t.DueAtUtc, t.FirstStartedAtUtc) AS LatenessMs "
        "FROM delay.Task AS t LEFT JOIN dbo.tabDIYTable12402 AS p ON p.ID = t.TaskID WHERE t.TaskID = ?",
        task_id,
    )
    row = cursor.fetchone()
    assert row is not None, f"no delay.Task row for {task_id}"
    return dict(zip([c[0] for c in cursor.description], row))


def wait_final(conn, ids: Iterable[int], timeout: float = 60.0) -> None:
    ids = list(ids)
    id_list = ",".join(str(int(i)) for i in ids)

    def done() -> bool:
        left = scalar(conn, f"SELECT COUNT(*) FROM delay.Task WHERE TaskID IN ({id_list}) "
                            "AND TaskState NOT IN ('Done', 'Failed', 'Refused', 'Cancelled')")
        return left == 0

    wait_until(done, timeout, f"{len(ids)} task(s) to finish")


def runs(conn, probe: str) -> list[tuple]:
    return rows(conn, "SELECT SPName, Param1, Param2, Param3, Param4, Param5 FROM dbo.DelayProbeRun WHERE Probe = ?",
                probe)


def queue_state(conn) -> tuple[int, int]:
    return tuple(rows(conn, "SELECT is_receive_enabled, is_activation_enabled FROM sys.service_queues "
                            "WHERE object_id = OBJECT_ID(N'dbo.DelayServiceQueue')")[0])


def log_events(conn, task_id: int) -> list[tuple[str, int | None]]:
    return rows(conn, "SELECT EventName, ErrorNumber FROM delay.Log WHERE TaskID = ? ORDER BY LogId", task_id)


def open_endpoints(conn, conversation_ids: list[str]) -> int:
    if not conversation_ids:
        return 0
    marks = ",".join("?" * len(conversation_ids))
    return scalar(conn, f"SELECT COUNT(*) FROM sys.conversation_endpoints WHERE conversation_id IN ({marks}) "
                        "AND state <> 'CD'", *conversation_ids)


def conversation_ids(conn, task_ids: list[int]) -> list[str]:
    id_list = ",".join(str(int(i)) for i in task_ids)
    return [str(r[0]) for r in rows(
        conn, "SELECT ce.conversation_id FROM sys.conversation_endpoints AS ce "
              f"INNER JOIN delay.Task AS t ON t.ConversationHandle = ce.conversation_handle WHERE t.TaskID IN ({id_list})")]


# --------------------------------------------------------------------------
# Timing
# --------------------------------------------------------------------------


@pytest.mark.parametrize("delay", [0, 1, 5])
def test_delays_fire_within_tolerance(conn, delay):
    probe = make_target(conn)
    started = time.monotonic()
    task_id = initiate(conn, f"dbo.{probe}", delay, "a")
    wait_final(conn, [task_id], timeout=delay + 30)
    state = task(conn, task_id)
    assert state["TaskState"] == "Done" and state["Receipt"] == 1 and state["F108219"] == 1
    assert time.monotonic() - started >= delay - 0.6
    # Timers have whole-second resolution; a 0-second task is a message, not a timer.
    assert -600 <= state["LatenessMs"] <= 3000, state
    assert runs(conn, probe) == [(f"dbo.{probe}", "a", None, None, None, None)]


def test_seven_day_delay_is_accepted_and_its_timer_exists(conn):
    probe = make_target(conn)
    task_id = initiate(conn, f"dbo.{probe}", 604_800)
    state = task(conn, task_id)
    assert state["TaskState"] == "Scheduled" and state["F108219"] == 0
    # Timers are chained by day: the first fires in 86,400 s, then the rest is re-armed.
    seconds_to_timer = scalar(
        conn, "SELECT DATEDIFF(SECOND, SYSUTCDATETIME(), dialog_timer) FROM sys.conversation_endpoints "
              "WHERE conversation_handle = ?", state["ConversationHandle"])
    assert seconds_to_timer is not None and abs(seconds_to_timer - 86_400) < 600
    assert scalar(conn, "SELECT DATEDIFF(SECOND, CreatedAtUtc, DueAtUtc) FROM delay.Task WHERE TaskID = ?",
                  task_id) == 604_800
    rows(conn, "EXEC dbo.CancelDelayExecution @TaskID = ?", task_id)
    state = task(conn, task_id)
    assert state["TaskState"] == "Cancelled" and state["F108219"] == 4
    assert scalar(conn, "SELECT COUNT(*) FROM sys.conversation_endpoints WHERE conversation_handle = ? "
                        "AND state <> 'CD'", state["ConversationHandle"]) == 0


def test_delay_outside_the_range_is_refused(conn):
    probe = make_target(conn)
    for delay in (-1, 31_536_001):
        with pytest.raises(Exception, match="50302"):
            initiate(conn, f"dbo.{probe}", delay)


# --------------------------------------------------------------------------
# The trigger
# --------------------------------------------------------------------------


def test_thousand_rows_in_one_statement_run_a_thousand_times(conn):
    probe = make_target(conn)
    first = scalar(conn, "SELECT ISNULL(MAX(ID), 0) FROM dbo.tabDIYTable12402")
    rows(conn, f"""
        INSERT INTO dbo.tabDIYTable12402 (F108211, F108218, F108212)
        SELECT TOP (1000) N'dbo.{probe}', n % 3,
            CAST(n AS NVARCHAR(20))
        FROM (SELECT n = ROW_NUMBER() OVER (ORDER BY (SELECT NULL))
              FROM sys.all_objects AS a CROSS JOIN sys.all_objects AS b) AS numbers""")
    ids = [r[0] for r in rows(conn, "SELECT ID FROM dbo.tabDIYTable12402 WHERE ID > ? AND F108211 = ?",
                                first, f"dbo.{probe}")]
    assert len(ids) == 1000
    handles = scalar(conn, f"SELECT COUNT(DISTINCT ConversationHandle) FROM delay.Task WHERE TaskID > {first} "
                           f"AND TargetName = N'dbo.{probe}'")
    assert handles == 1000
    wait_final(conn, ids, timeout=180)
    assert scalar(conn, f"SELECT COUNT(*) FROM dbo.tabDIYTable12402 WHERE ID > {first} "
                        f"AND F108211 = N'dbo.{probe}' AND F108219 = 1") == 1000
    done = runs(conn, probe)
    assert len(done) == 1000 and len({r[1] for r in done}) == 1000


def test_null_and_equal_parameters_never_mark_each_other(conn):
    probe = make_target(conn)
    now_null = initiate(conn, f"dbo.{probe}", 0)
    later_null = initiate(conn, f"dbo.{probe}", 3600)
    now_same = initiate(conn, f"dbo.{probe}", 0, "x", "y", "z", "u", "v")
    later_same = initiate(conn, f"dbo.{probe}", 3600, "x", "y", "z", "u", "v")
    wait_final(conn, [now_null, now_same])
    assert task(conn, now_null)["F108219"] == 1 and task(conn, now_same)["F108219"] == 1
    assert task(conn, later_null)["F108219"] == 0 and task(conn, later_same)["F108219"] == 0
    for task_id in (later_null, later_same):
        rows(conn, "EXEC dbo.CancelDelayExecution @TaskID = ?", task_id)
    assert len(runs(conn, probe)) == 2


def test_rows_with_receipt_or_without_name_are_ignored(conn):
    probe = make_target(conn)
    first = scalar(conn, "SELECT ISNULL(MAX(ID), 0) FROM dbo.tabDIYTable12402")
    rows(conn, f"INSERT INTO dbo.tabDIYTable12402 (F108211, F108218, F108219) VALUES "
               f"(N'dbo.{probe}', 0, 1), (NULL, 0, 0), (N'dbo.{probe}', 0, 3)")
    time.sleep(3)
    assert scalar(conn, f"SELECT COUNT(*) FROM delay.Task WHERE TaskID > {first}") == 0
    assert runs(conn, probe) == []


def test_a_bad_row_never_fails_the_insert(conn):
    probe = make_target(conn)
    first = scalar(conn, "SELECT ISNULL(MAX(ID), 0) FROM dbo.tabDIYTable12402")
    rows(conn, f"INSERT INTO dbo.tabDIYTable12402 (F108211, F108218) VALUES "
               f"(N'dbo.{probe}', 0), (N'dbo.NoSuchProcedure', 0), (N'dbo.{probe}', -5)")
    ids = [r[0] for r in rows(conn, f"SELECT ID FROM dbo.tabDIYTable12402 WHERE ID > {first} ORDER BY ID")]
    wait_final(conn, ids)
    assert [task(conn, i)["F108219"] for i in ids] == [1, 2, 2]
    assert [task(conn, i)["LastErrorNumber"] for i in ids[1:]] == [50306, 50302]


def test_rolled_back_insert_schedules_nothing(conn, mssql_url):
    probe = make_target(conn)
    other = connect(mssql_url)
    other.autocommit = False
    try:
        task_id = initiate(other, f"dbo.{probe}", 0, "rolled back")
        other.rollback()
    finally:
        other.close()
    time.sleep(3)
    assert scalar(conn, "SELECT COUNT(*) FROM delay.Task WHERE TaskID = ?", task_id) == 0
    assert runs(conn, probe) == []
    assert scalar(conn, "SELECT COUNT(*) FROM sys.transmission_queue") == 0


# --------------------------------------------------------------------------
# Failing targets: the queue stays enabled
# --------------------------------------------------------------------------


FAILING = {
    "raises": ("THROW 51000, N'target raised', 1;", 51000, 2),
    "dooms": ("SET XACT_ABORT ON; DECLARE @i INT = CAST(N'x' AS INT);", 245, 2),
    "rolls_back": ("ROLLBACK TRANSACTION;", 266, 1),
    "commits": ("COMMIT TRANSACTION;", 266, 1),
}


def test_failing_targets_are_recorded_and_never_disable_the_queue(conn, fast_retries):
    ids = {}
    for kind, (body, _, _) in FAILING.items():
        ids[kind] = initiate(conn, f"dbo.{make_target(conn, body)}", 0)
    slow = make_target(conn, """
        DECLARE @Until DATETIME2(3) = DATEADD(SECOND, 12, SYSUTCDATETIME()), @Spin BIGINT = 0;
        WHILE SYSUTCDATETIME() < @Until SET @Spin += 1;
        INSERT INTO dbo.DelayProbeRun (Probe) VALUES (OBJECT_NAME(@@PROCID));""")
    ids["slow"] = initiate(conn, f"dbo.{slow}", 0)
    wait_final(conn, ids.values(), timeout=90)

    for kind, (_, number, attempts) in FAILING.items():
        state = task(conn, ids[kind])
        assert state["TaskState"] == "Failed" and state["F108219"] == 3, (kind, state)
        assert state["LastErrorNumber"] == number and state["Attempts"] == attempts, (kind, state)
        assert ("GaveUp", number) in log_events(conn, ids[kind]), kind
    state = task(conn, ids["slow"])
    assert state["TaskState"] == "Done" and state["Attempts"] == 1
    assert ("Slow", None) in log_events(conn, ids["slow"])
    assert len(runs(conn, slow)) == 1

    assert queue_state(conn) == (1, 1)
    probe = make_target(conn)
    after = initiate(conn, f"dbo.{probe}", 0)
    wait_final(conn, [after])
    assert task(conn, after)["TaskState"] == "Done"


# --------------------------------------------------------------------------
# Names: the allow-list and injection
# --------------------------------------------------------------------------


def test_injected_and_unlisted_names_are_refused_and_never_run(conn):
    listed = make_target(conn)
    rows(conn, "IF OBJECT_ID(N'dbo.DelaySentinel', N'U') IS NULL CREATE TABLE dbo.DelaySentinel (Id INT)")
    database = scalar(conn, "SELECT DB_NAME()")
    any_refusal = (50304, 50305, 50306, 50307)
    names = {
        "x];DROP TABLE dbo.DelaySentinel;--": any_refusal,
        f"dbo.{listed}; DROP TABLE dbo.DelaySentinel;--": any_refusal,
        "dbo.p; EXEC xp_cmdshell 'x'": any_refusal,
        f"dbo.[{listed}]; EXEC xp_cmdshell 'x'": any_refusal,
        "sys.sp_configure": (50306,),
        f"{database}.dbo.{listed}": (50305,),
        f"srv.{database}.dbo.{listed}": (50305,),
        f"[dbo].[{listed}]]": any_refusal,
        "a" * 200: (50304,),
    }
    first = scalar(conn, "SELECT ISNULL(MAX(ID), 0) FROM dbo.tabDIYTable12402")
    for name, numbers in names.items():
        with pytest.raises(Exception) as raised:
            initiate(conn, name, 0)
        assert any(str(n) in str(raised.value) for n in numbers), (name, raised.value)
        rows(conn, "INSERT INTO dbo.tabDIYTable12402 (F108211, F108218) VALUES (?, 0)", name[:400])
    refused = rows(conn, f"SELECT TaskID, RefusalNumber FROM delay.RefusedTasks WHERE TaskID > {first}")
    assert len(refused) == len(names)
    assert all(n in range(50304, 50308) for _, n in refused)
    assert scalar(conn, f"SELECT COUNT(*) FROM dbo.tabDIYTable12402 WHERE ID > {first} AND F108219 = 2") == len(names)
    assert scalar(conn, f"SELECT COUNT(*) FROM delay.Log WHERE TaskID > {first} AND EventName = N'Refused'") == len(names)
    assert runs(conn, listed) == []
    assert scalar(conn, "SELECT OBJECT_ID(N'dbo.DelaySentinel', N'U')") is not None
    with pytest.raises(Exception, match="5031[01]"):
        rows(conn, "EXEC delay.AllowProcedure @ProcedureName = N'sys.sp_configure'")


def test_a_listed_procedure_recreated_elsewhere_is_refused(conn):
    name = make_target(conn, bare=True)
    schema = unique("moved")
    rows(conn, f"DROP PROCEDURE dbo.{name}")
    rows(conn, f"CREATE SCHEMA {schema} AUTHORIZATION dbo")
    make_target(conn, schema=schema, name=name, allow=False)
    for requested, number in ((f"dbo.{name}", "50307"), (name, "50307"), (f"{schema}.{name}", "50306")):
        with pytest.raises(Exception, match=number):
            initiate(conn, requested, 0)
    assert runs(conn, name) == []


def test_a_procedure_dropped_after_scheduling_is_refused_when_due(conn):
    name = make_target(conn)
    task_id = initiate(conn, f"dbo.{name}", 2)
    rows(conn, f"DROP PROCEDURE dbo.{name}")
    make_target(conn, name=name, allow=False)  # same name, new object_id
    wait_final(conn, [task_id])
    # Since 0006 the receipt is written just after step 1's COMMIT (never
    # inside a RECEIVE transaction): wait for it too.
    wait_until(lambda: task(conn, task_id)["F108219"] == 2, 10, "the receipt")
    state = task(conn, task_id)
    assert state["TaskState"] == "Refused" and state["LastErrorNumber"] == 50307 and state["F108219"] == 2
    assert runs(conn, name) == []


def test_bare_names_resolve_only_when_listed_so(conn):
    plain = make_target(conn)
    with pytest.raises(Exception, match="50306"):
        initiate(conn, plain, 0)
    bare = make_target(conn, bare=True)
    task_id = initiate(conn, bare, 0, "bare")
    wait_final(conn, [task_id])
    assert task(conn, task_id)["TaskState"] == "Done"
    assert runs(conn, bare) == [(bare, "bare", None, None, None, None)]


# --------------------------------------------------------------------------
# Conversations and readers
# --------------------------------------------------------------------------


def test_no_conversation_endpoint_remains_once_tasks_end(conn, fast_retries):
    probe = make_target(conn)
    failing = make_target(conn, "THROW 51000, N'no', 1;")
    ids = [initiate(conn, f"dbo.{probe}", d) for d in (0, 0, 1, 2)]
    ids += [initiate(conn, f"dbo.{failing}", 0), initiate(conn, f"dbo.{probe}", 3600)]
    conversations = conversation_ids(conn, ids)
    assert conversations  # at least the pending ones are still open here
    rows(conn, "EXEC dbo.CancelDelayExecution @TaskID = ?", ids[-1])
    wait_final(conn, ids)
    # Both sides of a delay-0 dialog end: the target side on the EndDialog message.
    wait_until(lambda: open_endpoints(conn, conversations) == 0, 30, "conversation endpoints to close")


def test_five_readers_run_every_task_exactly_once(conn):
    assert scalar(conn, "SELECT max_readers FROM sys.service_queues "
                        "WHERE object_id = OBJECT_ID(N'dbo.DelayServiceQueue')") == 5
    probe = make_target(conn)
    first = scalar(conn, "SELECT ISNULL(MAX(ID), 0) FROM dbo.tabDIYTable12402")
    rows(conn, f"""
        INSERT INTO dbo.tabDIYTable12402 (F108211, F108218, F108212)
        SELECT TOP (2000) N'dbo.{probe}', n % 4, CAST(n AS NVARCHAR(20))
        FROM (SELECT n = ROW_NUMBER() OVER (ORDER BY (SELECT NULL))
              FROM sys.all_objects AS a CROSS JOIN sys.all_objects AS b) AS numbers""")
    ids = [r[0] for r in rows(conn, f"SELECT ID FROM dbo.tabDIYTable12402 WHERE ID > {first} "
                                    f"AND F108211 = N'dbo.{probe}'")]
    readers = 0

    def finished() -> bool:
        nonlocal readers
        readers = max(readers, scalar(conn, "SELECT COUNT(*) FROM sys.dm_broker_activated_tasks "
                                            "WHERE database_id = DB_ID()"))
        return scalar(conn, f"SELECT COUNT(*) FROM delay.Task WHERE TaskID > {first} "
                            "AND TaskState NOT IN ('Done', 'Failed', 'Refused', 'Cancelled')") == 0

    wait_until(finished, 240, "2,000 tasks to finish")
    assert 1 <= readers <= 5
    per_task = rows(conn, "SELECT Param1, COUNT(*) FROM dbo.DelayProbeRun WHERE Probe = ? GROUP BY Param1", probe)
    assert len(per_task) == 2000 and {count for _, count in per_task} == {1}
    assert len(ids) == 2000


# --------------------------------------------------------------------------
# Deployment
# --------------------------------------------------------------------------


def broker_disabled_database(fresh_database) -> str:
    """A fresh, undeployed database whose broker is certainly off (test databases only)."""
    url = fresh_database(deploy=False, broker=False)
    with connect(url) as other:
        rows(other, "ALTER DATABASE CURRENT SET DISABLE_BROKER WITH ROLLBACK IMMEDIATE")
        assert scalar(other, "SELECT is_broker_enabled FROM sys.databases WHERE database_id = DB_ID()") == 0
    return url


def test_deployment_stops_when_the_broker_is_disabled(fresh_database):
    from alembic import command

    from mailq_db.deployment import alembic_config

    url = broker_disabled_database(fresh_database)
    with pytest.raises(Exception, match="50401") as raised:
        command.upgrade(alembic_config(x_args=[f"url={url}"]), "head")
    assert "SET ENABLE_BROKER WITH ROLLBACK IMMEDIATE" in str(raised.value)
    with connect(url) as other:
        assert scalar(other, "SELECT SCHEMA_ID(N'delay')") is None  # stopped before creating anything


def test_broker_off_deploys_the_mail_queue_alone(fresh_database):
    from alembic import command

    from mailq_db.deployment import alembic_config

    url = broker_disabled_database(fresh_database)
    command.upgrade(alembic_config(x_args=[f"url={url}", "broker=off"]), "head")
    with connect(url) as other:
        assert scalar(other, "SELECT OBJECT_ID(N'dbo.DelayServiceQueue')") is None
        assert scalar(other, "SELECT SCHEMA_ID(N'delay')") is None
        assert scalar(other, "SELECT SCHEMA_ID(N'mailq')") is not None


def test_readers_option_sets_max_queue_readers(fresh_database):
    url = fresh_database(x_args=("readers=7",))
    with connect(url) as other:
        assert scalar(other, "SELECT max_readers FROM sys.service_queues "
                             "WHERE object_id = OBJECT_ID(N'dbo.DelayServiceQueue')") == 7


def test_an_existing_platform_table_is_adopted_and_kept(fresh_database):
    from alembic import command

    from mailq_db.deployment import alembic_config

    url = fresh_database(deploy=False)
    with connect(url) as other:
        rows(other, "CREATE TABLE dbo.tabDIYTable12402 (ID INT IDENTITY PRIMARY KEY, F108211 NVARCHAR(20), "
                    "F108212 NVARCHAR(20), F108218 INT, F108219 INT, Extra NVARCHAR(10))")
        rows(other, "INSERT INTO dbo.tabDIYTable12402 (F108211, F108218, F108219, Extra) VALUES (N'old', 0, 1, N'keep')")
    command.upgrade(alembic_config(x_args=[f"url={url}"]), "head")
    with connect(url) as other:
        assert scalar(other, "SELECT Detail FROM delay.Installation WHERE Item = N'dbo.tabDIYTable12402'") == "adopted"
        assert scalar(other, "SELECT COUNT(*) FROM dbo.tabDIYTable12402 WHERE Extra = N'keep'") == 1
        assert scalar(other, "SELECT COL_LENGTH(N'dbo.tabDIYTable12402', N'F108216')") is not None
        assert scalar(other, "SELECT COUNT(*) FROM delay.Task") == 0  # the old row was not scheduled
    # The adopted table's rows are the platform's: they neither block the
    # downgrade (no 50420 without drop_data) nor go with it.
    command.downgrade(alembic_config(x_args=[f"url={url}"]), "base")
    with connect(url) as other:
        assert scalar(other, "SELECT COUNT(*) FROM dbo.tabDIYTable12402 WHERE Extra = N'keep'") == 1
        assert scalar(other, "SELECT OBJECT_ID(N'dbo.DelayServiceQueue')") is None
        assert scalar(other, "SELECT SCHEMA_ID(N'delay')") is None
        assert scalar(other, "SELECT COUNT(*) FROM sys.triggers WHERE parent_id = OBJECT_ID(N'dbo.tabDIYTable12402')") == 0


def test_downgrade_removes_a_created_platform_table(fresh_database):
    from alembic import command

    from mailq_db.deployment import alembic_config

    url = fresh_database()
    command.downgrade(alembic_config(x_args=[f"url={url}"]), "base")  # no rows anywhere: no drop_data needed
    with connect(url) as other:
        assert scalar(other, "SELECT OBJECT_ID(N'dbo.tabDIYTable12402')") is None
        assert scalar(other, "SELECT COUNT(*) FROM sys.services WHERE name = N'MailqDelayService'") == 0


def test_caller_role_may_only_initiate_and_cancel(conn):
    user = unique("delay_caller")
    rows(conn, f"CREATE USER {user} WITHOUT LOGIN; ALTER ROLE MailqDelayCaller ADD MEMBER {user};")
    probe = make_target(conn)
    try:
        rows(conn, f"EXECUTE AS USER = N'{user}';")
        try:
            task_id = initiate(conn, f"dbo.{probe}", 3600)
            rows(conn, "EXEC dbo.CancelDelayExecution @TaskID = ?", task_id)
            for statement in ("SELECT COUNT(*) FROM dbo.tabDIYTable12402", "SELECT COUNT(*) FROM delay.Task",
                              f"EXEC dbo.{probe}", "EXEC delay.AllowProcedure @ProcedureName = N'dbo.x'"):
                with pytest.raises(Exception, match="(?i)permission"):
                    rows(conn, statement)
        finally:
            rows(conn, "REVERT;")
    finally:
        rows(conn, f"ALTER ROLE MailqDelayCaller DROP MEMBER {user}; DROP USER {user};")
    assert task(conn, task_id)["TaskState"] == "Cancelled"



# --------------------------------------------------------------------------
# Issue 11 (revision 0006).  Each of these fails on revision 0004.
# --------------------------------------------------------------------------


def test_a_platform_table_that_refuses_receipts_never_disables_the_queue(conn):
    """Point 1: step 1 used to write the receipt inside its RECEIVE transaction;
    a trigger of the platform's that refuses that write rolled every reader
    back until the queue was disabled.  Now the receipt fails alone, logged,
    and delay.Reconcile repairs it once the trigger is gone."""
    marker = unique("poison")
    trigger = unique("trg_RefuseReceipt")
    rows(conn, f"""
        CREATE TRIGGER dbo.{trigger} ON dbo.tabDIYTable12402 AFTER UPDATE AS
        BEGIN
            IF EXISTS (SELECT 1 FROM inserted WHERE F108212 = N'{marker}' AND F108219 <> 0)
                THROW 51999, N'the platform refuses this receipt', 1;
        END""")
    try:
        ids = []
        for _ in range(6):  # more than five rollbacks' worth under 0004
            name = make_target(conn)
            ids.append(initiate(conn, f"dbo.{name}", 1, marker))
            rows(conn, f"DROP PROCEDURE dbo.{name}")  # refused (50307) when due: a final state in step 1
        wait_final(conn, ids)
        assert queue_state(conn) == (1, 1)
        for task_id in ids:
            state = task(conn, task_id)
            assert state["TaskState"] == "Refused" and state["F108219"] == 0, state
    finally:
        rows(conn, f"DROP TRIGGER IF EXISTS dbo.{trigger}")
    findings = rows(conn, "EXEC delay.Reconcile")
    repaired = {f[1] for f in findings if f[0] == "Receipt" and f[2] == "Repaired"}
    assert set(ids) <= repaired
    assert {task(conn, i)["F108219"] for i in ids} == {2}


def test_targets_run_at_normal_priority_without_xact_abort_and_with_the_lock_timeout(conn):
    """Point 2: the reader's DEADLOCK_PRIORITY HIGH and XACT_ABORT ON no longer leak."""
    rows(conn, "IF OBJECT_ID(N'dbo.DelaySettingsSeen', N'U') IS NULL "
               "CREATE TABLE dbo.DelaySettingsSeen (Probe SYSNAME, XactAbort INT, DeadlockPriority INT, LockTimeout INT)")
    before = scalar(conn, "SELECT TargetLockTimeoutMs FROM delay.Setting")
    rows(conn, "UPDATE delay.Setting SET TargetLockTimeoutMs = 4321")
    try:
        probe = make_target(conn, """
            INSERT INTO dbo.DelaySettingsSeen (Probe, XactAbort, DeadlockPriority, LockTimeout)
            SELECT OBJECT_NAME(@@PROCID), IIF(@@OPTIONS & 16384 = 0, 0, 1), s.deadlock_priority, @@LOCK_TIMEOUT
            FROM sys.dm_exec_sessions AS s WHERE s.session_id = @@SPID;""")
        wait_final(conn, [initiate(conn, f"dbo.{probe}", 0)])
    finally:
        rows(conn, "UPDATE delay.Setting SET TargetLockTimeoutMs = ?", before)
    seen = rows(conn, "SELECT XactAbort, DeadlockPriority, LockTimeout FROM dbo.DelaySettingsSeen WHERE Probe = ?",
                probe)
    assert seen == [(0, 0, 4321)]


def test_initiate_and_cancel_use_no_savepoint_and_doom_the_callers_transaction(conn, mssql_url):
    """Point 6: the documented contract, with the caller's transaction open."""
    probe = make_target(conn)
    other = connect(mssql_url)
    other.autocommit = False
    try:
        with pytest.raises(Exception, match="50306"):
            initiate(other, "dbo.NotListedAnywhere", 0)
        assert scalar(other, "SELECT XACT_STATE()") in (0, -1)  # doomed or rolled back, never 1
        other.rollback()
        task_id = initiate(other, f"dbo.{probe}", 3600)
        rows(other, "EXEC dbo.CancelDelayExecution @TaskID = ?", task_id)
        other.commit()
    finally:
        other.close()
    assert task(conn, task_id)["TaskState"] == "Cancelled"


def test_a_request_runs_only_on_the_conversation_its_task_is_bound_to(conn):
    """Point 7: a DelayRequest carrying the ID of a task bound to another
    conversation (what an ID reused after a truncate looks like) never runs it."""
    probe = make_target(conn)
    task_id = initiate(conn, f"dbo.{probe}", 3600)
    rows(conn, """
        DECLARE @Handle UNIQUEIDENTIFIER, @Body VARBINARY(8) = CAST(CAST(? AS BIGINT) AS BINARY(8));
        BEGIN DIALOG CONVERSATION @Handle
            FROM SERVICE MailqDelayService TO SERVICE N'MailqDelayService', N'CURRENT DATABASE'
            ON CONTRACT MailqDelayContract WITH ENCRYPTION = OFF;
        SEND ON CONVERSATION @Handle MESSAGE TYPE MailqDelayRequest (@Body);""", task_id)
    wait_until(lambda: ("BrokerError", 50347) in log_events(conn, task_id), 30, "the unbound request to be refused")
    assert task(conn, task_id)["TaskState"] == "Scheduled"
    assert runs(conn, probe) == []
    rows(conn, "EXEC dbo.CancelDelayExecution @TaskID = ?", task_id)


def test_cancel_and_a_delay0_task_never_deadlock(conn, mssql_url):
    """Point 8: both take the task's conversation group before its row."""
    import threading

    probe = make_target(conn)
    errors: list[str] = []
    outcomes: dict[str, int] = {"cancelled": 0, "too_late": 0}

    def cancel_all(task_ids: list[int]) -> None:
        c = connect(mssql_url)
        try:
            for task_id in task_ids:
                try:
                    rows(c, "EXEC dbo.CancelDelayExecution @TaskID = ?", task_id)
                    outcomes["cancelled"] += 1
                except Exception as exc:  # noqa: BLE001 - classified below
                    if "50321" in str(exc):
                        outcomes["too_late"] += 1
                    else:
                        errors.append(str(exc))
        finally:
            c.close()

    for _ in range(5):
        ids = [initiate(conn, f"dbo.{probe}", 0, str(i)) for i in range(100)]
        worker = threading.Thread(target=cancel_all, args=(ids,))
        worker.start()
        worker.join(120)
        wait_final(conn, ids)
        assert errors == [], errors[:3]
        id_list = ",".join(map(str, ids))
        assert scalar(conn, f"SELECT COUNT(*) FROM delay.Log WHERE TaskID IN ({id_list}) "
                            "AND (ErrorNumber = 1205 OR ErrorMessage LIKE N'%deadlock%')") == 0
        assert scalar(conn, "SELECT COUNT(*) FROM delay.Incident WHERE TaskID IN (" + id_list + ")") == 0
    assert outcomes["cancelled"] + outcomes["too_late"] == 500


def test_a_task_whose_conversation_is_gone_is_reconciled(conn):
    """Point 3: what NEW_BROKER does to every conversation, done to one."""
    probe = make_target(conn)
    task_id = initiate(conn, f"dbo.{probe}", 2)
    handle = task(conn, task_id)["ConversationHandle"]
    rows(conn, "END CONVERSATION ? WITH CLEANUP", handle)
    with pytest.raises(Exception, match="50343"):
        rows(conn, "EXEC dbo.CancelDelayExecution @TaskID = ?", task_id)
    findings = rows(conn, "EXEC delay.Reconcile")
    assert ("Orphaned", task_id, "Rearmed") in [tuple(f[:3]) for f in findings]
    wait_final(conn, [task_id])
    assert task(conn, task_id)["TaskState"] == "Done" and len(runs(conn, probe)) == 1


def test_rows_inserted_without_the_trigger_are_reported_then_scheduled(conn):
    """Point 3 and point 4's backfill."""
    probe = make_target(conn)
    rows(conn, "DISABLE TRIGGER dbo.trg_tabDIYTable12402_ScheduleDelay ON dbo.tabDIYTable12402")
    try:
        task_id = int(scalar(conn, "INSERT INTO dbo.tabDIYTable12402 (F108211, F108218, F108212) "
                                   "OUTPUT inserted.ID VALUES (?, 0, N'backfill')", f"dbo.{probe}"))
    finally:
        rows(conn, "ENABLE TRIGGER dbo.trg_tabDIYTable12402_ScheduleDelay ON dbo.tabDIYTable12402")
    report = rows(conn, "EXEC delay.Reconcile @Apply = 0")
    assert ("NoTask", task_id, "Reported") in [tuple(f[:3]) for f in report]
    rows(conn, "EXEC delay.Reconcile @ScheduleMissing = 1")
    wait_final(conn, [task_id])
    assert task(conn, task_id)["TaskState"] == "Done"
    assert runs(conn, probe) == [(probe, "backfill", None, None, None, None)]


def test_an_altered_listed_procedure_is_refused_until_listed_again(conn):
    """Point 5: ALTER PROCEDURE keeps the object_id; the pinned definition does not match."""
    probe = make_target(conn)
    rows(conn, f"""
        ALTER PROCEDURE dbo.{probe}
            @SPName NVARCHAR(200) = NULL, @Param1 NVARCHAR(200) = NULL, @Param2 NVARCHAR(200) = NULL,
            @Param3 NVARCHAR(200) = NULL, @Param4 NVARCHAR(200) = NULL, @Param5 NVARCHAR(200) = NULL
        AS SELECT 1 AS Escalated;""")
    with pytest.raises(Exception, match="50340"):
        initiate(conn, f"dbo.{probe}", 0)
    rows(conn, "EXEC delay.AllowProcedure @ProcedureName = ?", f"dbo.{probe}")
    wait_final(conn, [initiate(conn, f"dbo.{probe}", 0)])


def test_values_longer_than_their_declared_size_are_refused(conn):
    """Point 10: never cut."""
    probe = make_target(conn)
    with pytest.raises(Exception, match="50344"):
        rows(conn, "EXEC dbo.InitiateDelayExecution @F108211 = ?, @F108218 = 0, @F108210 = ?",
             f"dbo.{probe}", "d" * 51)
    with pytest.raises(Exception, match="50303"):
        initiate(conn, f"dbo.{probe}", 0, "x" * 199 + "  ")  # trailing blanks count
    assert runs(conn, probe) == []


def test_an_idempotency_key_returns_the_first_task(conn):
    """Point 9."""
    probe = make_target(conn)
    key = unique("key")
    sql = ("EXEC dbo.InitiateDelayExecution @F108211 = ?, @F108218 = 3600, @F108212 = N'once', "
           "@IdempotencyKey = ?")
    first = int(scalar(conn, sql, f"dbo.{probe}", key))
    again = int(scalar(conn, sql, f"dbo.{probe}", key))
    assert first == again
    assert scalar(conn, "SELECT COUNT(*) FROM delay.Task WHERE IdempotencyKey = ?", key) == 1
    rows(conn, "EXEC dbo.CancelDelayExecution @TaskID = ?", first)


def test_a_caller_may_not_cancel_another_logins_task(conn, mssql_url):
    """Point 10: as DESIGN.md and the DBA guide say."""
    from sqlalchemy.engine import make_url

    probe = make_target(conn)
    theirs = initiate(conn, f"dbo.{probe}", 3600)  # initiated by the test's own login
    login, password = unique("delay_login"), "Str0ng!" + uuid.uuid4().hex
    rows(conn, f"CREATE LOGIN {login} WITH PASSWORD = N'{password}', CHECK_POLICY = OFF; "
               f"CREATE USER {login} FOR LOGIN {login}; ALTER ROLE MailqDelayCaller ADD MEMBER {login};")
    try:
        url = make_url(mssql_url).set(username=login, password=password)
        caller = connect(url.render_as_string(hide_password=False))
        try:
            with pytest.raises(Exception, match="50342"):
                rows(caller, "EXEC dbo.CancelDelayExecution @TaskID = ?", theirs)
            mine = initiate(caller, f"dbo.{probe}", 3600)
            rows(caller, "EXEC dbo.CancelDelayExecution @TaskID = ?", mine)
        finally:
            caller.close()
    finally:
        rows(conn, f"DROP USER IF EXISTS {login}; DROP LOGIN {login};")
    assert task(conn, mine)["TaskState"] == "Cancelled"
    rows(conn, "EXEC dbo.CancelDelayExecution @TaskID = ?", theirs)  # the admin may


# --------------------------------------------------------------------------
# Revision 0010: what a fresh reader still found (docs/delayed-execution.md,
# "Third reading")
# --------------------------------------------------------------------------


def test_a_conversation_its_other_side_ended_is_left_to_the_reader(conn):
    """DI is not gone: Reconcile reports it (Ending, Left), Cancel refuses it
    with 50321, and the reader fails the task when it gets the EndDialog."""
    probe = make_target(conn)
    rows(conn, "ALTER QUEUE dbo.DelayServiceQueue WITH ACTIVATION (STATUS = OFF)")
    try:
        task_id = initiate(conn, f"dbo.{probe}", 0)   # delay 0: a request SENT, so a target side exists
        handle = task(conn, task_id)["ConversationHandle"]
        target = scalar(conn, """
            SELECT t.conversation_handle FROM sys.conversation_endpoints AS i
            INNER JOIN sys.conversation_endpoints AS t
                ON t.conversation_id = i.conversation_id AND t.is_initiator = 0
            WHERE i.conversation_handle = ?""", handle)
        rows(conn, "END CONVERSATION ?", target)      # the other side ends: the initiator goes DI
        wait_until(lambda: scalar(conn, "SELECT state FROM sys.conversation_endpoints "
                                        "WHERE conversation_handle = ?", handle) == "DI",
                   30, "the task's endpoint in state DI")
        findings = [tuple(f[:3]) for f in rows(conn, "EXEC delay.Reconcile @Apply = 0")]
        assert ("Ending", task_id, "Left") in findings
        assert not any(f[1] == task_id and f[0] in ("Orphaned", "RunnerGone") for f in findings)
        with pytest.raises(Exception, match="50321"):
            rows(conn, "EXEC dbo.CancelDelayExecution @TaskID = ?", task_id)
        assert task(conn, task_id)["TaskState"] == "Scheduled"
    finally:
        rows(conn, "ALTER QUEUE dbo.DelayServiceQueue WITH ACTIVATION (STATUS = ON)")
    wait_final(conn, [task_id])
    state = task(conn, task_id)
    assert state["TaskState"] == "Failed" and state["LastErrorNumber"] == 50333
    assert runs(conn, probe) == []


def test_cancel_racing_the_timer_raises_only_numbered_errors(conn, mssql_url):
    """A cancel that meets a task finishing on its timer gets 50321 (or 50343),
    never Service Broker's own error."""
    import threading

    probe = make_target(conn)
    errors: list[str] = []
    outcomes = {"cancelled": 0, "numbered": 0}

    def cancel_all(task_ids: list[int]) -> None:
        c = connect(mssql_url)
        try:
            for task_id in task_ids:
                try:
                    rows(c, "EXEC dbo.CancelDelayExecution @TaskID = ?", task_id)
                    outcomes["cancelled"] += 1
                except Exception as exc:  # noqa: BLE001 - classified below
                    if "50321" in str(exc) or "50343" in str(exc):
                        outcomes["numbered"] += 1
                    else:
                        errors.append(str(exc))
        finally:
            c.close()

    for _ in range(5):
        ids = [initiate(conn, f"dbo.{probe}", 1, str(i)) for i in range(200)]
        # Due in about a second: cancels start while timers fire.
        wait_until(lambda: scalar(conn, "SELECT COUNT(*) FROM delay.Task WHERE TaskID BETWEEN ? AND ? "
                                        "AND TaskState <> N'Scheduled'", min(ids), max(ids)) > 0,
                   30, "the first timers")
        worker = threading.Thread(target=cancel_all, args=(ids,))
        worker.start()
        worker.join(120)
        wait_final(conn, ids)
        assert errors == [], errors[:3]
    assert outcomes["cancelled"] + outcomes["numbered"] == 1000


def test_a_conversation_this_side_ended_is_reconciled(conn):
    """DO/CD: ended by this side while the task was still Scheduled (what an
    interrupted recovery follow-up leaves): gone, so Reconcile repairs it."""
    probe = make_target(conn)
    task_id = initiate(conn, f"dbo.{probe}", 3600)
    handle = task(conn, task_id)["ConversationHandle"]
    rows(conn, "END CONVERSATION ?", handle)
    findings = [tuple(f[:3]) for f in rows(conn, "EXEC delay.Reconcile @Apply = 0")]
    assert ("Orphaned", task_id, "Rearmed") in findings
    rows(conn, "EXEC delay.Reconcile")
    assert task(conn, task_id)["ConversationHandle"] != handle
    rows(conn, "EXEC dbo.CancelDelayExecution @TaskID = ?", task_id)   # cancellable again
    assert task(conn, task_id)["TaskState"] == "Cancelled" and runs(conn, probe) == []
