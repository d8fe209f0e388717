"""Delayed execution, third design (issue 23), against SQL Server 2022 with Service Broker.

delay.Task is the queue; one dispatcher conversation's timer wakes the readers;
targets and hooks run as the user MailqRunner (docs/delayed-execution.md).  The
tests follow the issue's seven points; the section headers name the point.

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
TIMER = "http://schemas.microsoft.com/SQL/ServiceBroker/DialogTimer"


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
    """Short backoff and lease (the smallest allowed, 5 s) so that retries and the sweep show within seconds."""
    before = rows(conn, "SELECT MaxAttempts, RetryBaseSeconds, RetryMaxSeconds, LeaseSeconds FROM delay.Setting")
    rows(conn, "UPDATE delay.Setting SET MaxAttempts = 2, RetryBaseSeconds = 1, RetryMaxSeconds = 2, LeaseSeconds = 5")
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
        "SELECT t.TaskState, t.Receipt, t.Attempts, t.Claims, t.DueAtUtc, t.NextRunAtUtc, t.FirstStartedAtUtc, "
        "t.LeaseUntilUtc, t.LastErrorNumber, t.LastErrorMessage, t.Param1, p.F108219, "
        "DATEDIFF_BIG(MILLISECOND, t.DueAtUtc, t.FirstStartedAtUtc) AS LatenessMs "
        "FROM delay.Task AS t LEFT JOIN dbo.tabDIYTable12402 AS p ON p.ID = t.TaskID WHERE t.TaskID = ?",
        task_id,
    )
    row = cursor.fetchone()
    assert row is not None, f"no delay.Task row for {task_id}"
    return dict(zip([c[0] for c in cursor.description], row))


def wait_final(conn, ids: Iterable[int], timeout: float = 60.0, receipts: bool = True) -> None:
    """Until every task is final and (receipts) its receipt is written."""
    ids = list(ids)
    id_list = ",".join(str(int(i)) for i in ids)

    def done() -> bool:
        left = scalar(conn, f"SELECT COUNT(*) FROM delay.Task WHERE TaskID IN ({id_list}) "
                            "AND TaskState NOT IN ('Done', 'Failed', 'Refused', 'Cancelled')")
        due = scalar(conn, f"SELECT COUNT(*) FROM delay.ReceiptDue WHERE TaskID IN ({id_list})") if receipts else 0
        return left == 0 and due == 0

    wait_until(done, timeout, f"{len(ids)} task(s) to finish")


def wait_state(conn, task_id: int, state: str, timeout: float = 30.0) -> None:
    wait_until(lambda: task(conn, task_id)["TaskState"] == state, timeout, f"task {task_id} {state}")


def runs(conn, probe: str) -> list[tuple]:
    return rows(conn, "SELECT SPName, Param1, Param2, Param3, Param4, Param5 FROM dbo.DelayProbeRun WHERE Probe = ?",
                probe)


def queue_state(conn) -> tuple[int, int]:
    return tuple(rows(conn, "SELECT is_receive_enabled, is_activation_enabled FROM sys.service_queues "
                            "WHERE object_id = OBJECT_ID(N'dbo.DelayServiceQueue')")[0])


def log_events(conn, task_id: int) -> list[tuple[str, int | None]]:
    return rows(conn, "SELECT EventName, ErrorNumber FROM delay.Log WHERE TaskID = ? ORDER BY LogId", task_id)


def findings(conn, **kw) -> dict[str, tuple]:
    """delay.Monitor's findings by name (report only unless apply=1)."""
    apply = kw.get("apply", 0)
    found = rows(conn, "EXEC delay.Monitor @Apply = ?, @Raise = 0, @ScheduleMissing = ?",
                 apply, kw.get("schedule_missing", 0))
    return {f[0]: tuple(f[1:]) for f in found}


def dispatcher_endpoints(conn) -> int:
    return scalar(conn, "SELECT COUNT(*) FROM sys.conversation_endpoints AS e "
                        "INNER JOIN sys.services AS s ON s.service_id = e.service_id "
                        "WHERE s.name = N'MailqDelayService' AND e.state <> 'CD'")


def seconds_to_timer(conn) -> int | None:
    return scalar(conn, "SELECT DATEDIFF(SECOND, SYSUTCDATETIME(), e.dialog_timer) "
                        "FROM delay.Dispatcher AS d INNER JOIN sys.conversation_endpoints AS e "
                        "ON e.conversation_handle = d.ConversationHandle")


@pytest.fixture()
def activation_off(conn):
    """No reader runs while the test looks at tasks before they run."""
    rows(conn, "ALTER QUEUE dbo.DelayServiceQueue WITH ACTIVATION (STATUS = OFF)")
    wait_until(lambda: scalar(conn, "SELECT COUNT(*) FROM sys.dm_broker_activated_tasks "
                                    "WHERE database_id = DB_ID()") == 0, 60, "the readers to leave")
    try:
        yield
    finally:
        rows(conn, "ALTER QUEUE dbo.DelayServiceQueue WITH ACTIVATION (STATUS = ON)")
        rows(conn, "DECLARE @Now DATETIME2(3) = SYSUTCDATETIME(); EXEC delay.ArmDispatcher @DueAtUtc = @Now;")


def alter_target(conn, name: str, body: str = "SELECT 1 AS Changed;") -> None:
    rows(conn, f"""
        ALTER PROCEDURE dbo.{name}
            @SPName NVARCHAR(200) = NULL, @Param1 NVARCHAR(200) = NULL, @Param2 NVARCHAR(200) = NULL,
            @Param3 NVARCHAR(200) = NULL, @Param4 NVARCHAR(200) = NULL, @Param5 NVARCHAR(200) = NULL
        AS BEGIN SET NOCOUNT ON; {body} END""")


# --------------------------------------------------------------------------
# Point 1: delay.Task is the queue; one dispatcher conversation; the timer
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
    # Whole-second timers: at most about a second late when idle (delay 0 is an ordinary due row).
    assert -600 <= state["LatenessMs"] <= 2500, state
    assert runs(conn, probe) == [(f"dbo.{probe}", "a", None, None, None, None)]


def test_a_thousand_rows_open_no_dialog_and_run_once_each(conn):
    probe = make_target(conn)
    first = scalar(conn, "SELECT ISNULL(MAX(ID), 0) FROM dbo.tabDIYTable12402")
    rows(conn, f"""
        INSERT INTO dbo.tabDIYTable12402 (F108211, F108218, F108212)
        SELECT TOP (1000) N'dbo.{probe}', n % 3, CAST(n AS NVARCHAR(20))
        FROM (SELECT n = ROW_NUMBER() OVER (ORDER BY (SELECT NULL))
              FROM sys.all_objects AS a CROSS JOIN sys.all_objects AS b) AS numbers""")
    # One self-dialog (its two endpoints), whatever the number of tasks.
    assert dispatcher_endpoints(conn) <= 2
    ids = [r[0] for r in rows(conn, "SELECT ID FROM dbo.tabDIYTable12402 WHERE ID > ? AND F108211 = ?",
                                first, f"dbo.{probe}")]
    assert len(ids) == 1000
    wait_final(conn, ids, timeout=180)
    assert dispatcher_endpoints(conn) <= 2
    assert scalar(conn, f"SELECT COUNT(*) FROM dbo.tabDIYTable12402 WHERE ID > {first} "
                        f"AND F108211 = N'dbo.{probe}' AND F108219 = 1") == 1000
    done = runs(conn, probe)
    assert len(done) == 1000 and len({r[1] for r in done}) == 1000


def test_values_are_copied_when_scheduled(conn):
    """M1: a later UPDATE of the platform's row changes nothing that runs."""
    probe = make_target(conn)
    task_id = initiate(conn, f"dbo.{probe}", 2, "before")
    rows(conn, "UPDATE dbo.tabDIYTable12402 SET F108212 = N'after', F108211 = N'dbo.Other' WHERE ID = ?", task_id)
    wait_final(conn, [task_id])
    assert runs(conn, probe) == [(f"dbo.{probe}", "before", None, None, None, None)]


def test_a_row_due_before_the_timer_moves_it_earlier(conn):
    probe = make_target(conn)
    later = initiate(conn, f"dbo.{probe}", 3600)
    wait_until(lambda: (seconds_to_timer(conn) or 0) > 5, 30, "the timer to settle on the tick")
    started = time.monotonic()
    soon = initiate(conn, f"dbo.{probe}", 1, "soon")
    assert seconds_to_timer(conn) <= 2
    wait_final(conn, [soon], timeout=15)
    assert time.monotonic() - started < 5
    assert task(conn, later)["TaskState"] == "Pending"
    rows(conn, "EXEC dbo.CancelDelayExecution @TaskID = ?", later)


def test_the_safety_tick_bounds_the_timer(conn):
    before = scalar(conn, "SELECT TickSeconds FROM delay.Setting")
    rows(conn, "UPDATE delay.Setting SET TickSeconds = 7")
    try:
        probe = make_target(conn)
        far = initiate(conn, f"dbo.{probe}", 31_536_000)     # the documented maximum is accepted
        wait_final(conn, [initiate(conn, f"dbo.{probe}", 0)])  # a pass: the reader re-arms with the new tick
        wait_until(lambda: (seconds_to_timer(conn) or 99) <= 7, 30, "a timer at most one tick away")
        state = task(conn, far)
        assert state["TaskState"] == "Pending" and state["F108219"] == 0
        assert scalar(conn, "SELECT DATEDIFF(SECOND, CreatedAtUtc, DueAtUtc) FROM delay.Task WHERE TaskID = ?",
                      far) == 31_536_000
        rows(conn, "EXEC dbo.CancelDelayExecution @TaskID = ?", far)
        assert task(conn, far)["F108219"] == 4
    finally:
        rows(conn, "UPDATE delay.Setting SET TickSeconds = ?", before)


def test_delay_outside_the_range_is_refused(conn):
    probe = make_target(conn)
    for delay in (-1, 31_536_001):
        with pytest.raises(Exception, match="50302"):
            initiate(conn, f"dbo.{probe}", delay)


def test_two_inserters_never_wait_on_each_other_for_long(conn, mssql_url):
    """The arm lock is held to the inserting transaction's commit; another inserter
    waits 2 s for it at most, then leaves its row to the armed timer or the tick."""
    probe = make_target(conn)
    holder = connect(mssql_url)
    holder.autocommit = False
    try:
        first = initiate(holder, f"dbo.{probe}", 0, "held open")        # arms, holds the arm lock
        started = time.monotonic()
        second = initiate(conn, f"dbo.{probe}", 0, "autocommit")
        assert time.monotonic() - started < 4
        holder.commit()
    finally:
        holder.close()
    wait_final(conn, [first, second], timeout=30)
    assert sorted(r[1] for r in runs(conn, probe)) == ["autocommit", "held open"]


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


# --------------------------------------------------------------------------
# Point 2: claims, leases, the sweep, the SET line, failures
# --------------------------------------------------------------------------


def test_targets_run_with_the_documented_set_line(conn):
    rows(conn, "IF OBJECT_ID(N'dbo.DelaySettingsSeen', N'U') IS NULL CREATE TABLE dbo.DelaySettingsSeen "
               "(Probe SYSNAME, Options INT, DeadlockPriority INT, LockTimeout INT, TranCount INT)")
    before = scalar(conn, "SELECT TargetLockTimeoutMs FROM delay.Setting")
    rows(conn, "UPDATE delay.Setting SET TargetLockTimeoutMs = 4321")
    try:
        probe = make_target(conn, """
            INSERT INTO dbo.DelaySettingsSeen (Probe, Options, DeadlockPriority, LockTimeout, TranCount)
            SELECT OBJECT_NAME(@@PROCID), @@OPTIONS, s.deadlock_priority, @@LOCK_TIMEOUT, @@TRANCOUNT
            FROM sys.dm_exec_sessions AS s WHERE s.session_id = @@SPID;""")
        wait_final(conn, [initiate(conn, f"dbo.{probe}", 0)])
    finally:
        rows(conn, "UPDATE delay.Setting SET TargetLockTimeoutMs = ?", before)
    [(options, priority, lock_timeout, trancount)] = rows(
        conn, "SELECT Options, DeadlockPriority, LockTimeout, TranCount FROM dbo.DelaySettingsSeen WHERE Probe = ?",
        probe)
    on = {"ANSI_WARNINGS": 8, "ANSI_PADDING": 16, "ANSI_NULLS": 32, "ARITHABORT": 64,
          "QUOTED_IDENTIFIER": 256, "CONCAT_NULL_YIELDS_NULL": 4096}
    off = {"NUMERIC_ROUNDABORT": 8192, "XACT_ABORT": 16384}
    assert all(options & bit for bit in on.values()), options
    assert not any(options & bit for bit in off.values()), options
    assert (priority, lock_timeout, trancount) == (0, 4321, 1)   # NORMAL, finite, its own transaction


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
    # More than five failing runs: none of them is in a RECEIVE transaction.
    many = make_target(conn, "THROW 51001, N'always', 1;")
    ids.update({f"many{i}": initiate(conn, f"dbo.{many}", 0) for i in range(6)})
    wait_final(conn, ids.values(), timeout=90)
    for kind, (_, number, attempts) in FAILING.items():
        state = task(conn, ids[kind])
        assert state["TaskState"] == "Failed" and state["F108219"] == 3, (kind, state)
        assert state["LastErrorNumber"] == number and state["Attempts"] == attempts, (kind, state)
        assert ("GaveUp", number) in log_events(conn, ids[kind]), kind
    assert queue_state(conn) == (1, 1)
    probe = make_target(conn)
    after = initiate(conn, f"dbo.{probe}", 0)
    wait_final(conn, [after])
    assert task(conn, after)["TaskState"] == "Done"


def test_a_slow_target_outlives_its_lease_and_runs_once(conn, fast_retries):
    """LeaseSeconds = 5; the target takes 8 s: the sweep passes its held row by."""
    slow = make_target(conn, """
        WAITFOR DELAY '00:00:08';
        INSERT INTO dbo.DelayProbeRun (Probe) VALUES (OBJECT_NAME(@@PROCID));""")
    task_id = initiate(conn, f"dbo.{slow}", 0)
    wait_state(conn, task_id, "Claimed")
    wait_until(lambda: scalar(conn, "SELECT LeaseUntilUtc FROM delay.Task WITH (NOLOCK) WHERE TaskID = ?",
                              task_id).year == 9999, 10, "the run's mark")
    wait_final(conn, [task_id], timeout=40)
    time.sleep(4)
    state = task(conn, task_id)
    assert state["TaskState"] == "Done" and state["Attempts"] == 1 and state["Claims"] == 1
    assert len(runs(conn, slow)) == 1


def test_a_slow_target_holds_at_most_its_own_readers(conn):
    """MaxReaders = 1: two slow tasks run one after the other while fast ones pass."""
    rows(conn, "IF OBJECT_ID(N'dbo.DelaySpan', N'U') IS NULL CREATE TABLE dbo.DelaySpan "
               "(Probe SYSNAME, StartedAt DATETIME2(3), EndedAt DATETIME2(3))")
    slow = make_target(conn, """
        DECLARE @At DATETIME2(3) = SYSUTCDATETIME();
        WAITFOR DELAY '00:00:04';
        INSERT INTO dbo.DelaySpan VALUES (OBJECT_NAME(@@PROCID), @At, SYSUTCDATETIME());""", allow=False)
    rows(conn, "EXEC delay.AllowProcedure @ProcedureName = ?, @MaxReaders = 1", f"dbo.{slow}")
    fast = make_target(conn)
    slow_ids = [initiate(conn, f"dbo.{slow}", 0) for _ in range(2)]
    wait_until(lambda: scalar(conn, "SELECT COUNT(*) FROM delay.Task WITH (NOLOCK) WHERE TaskID IN (?, ?) "
                                    "AND LeaseUntilUtc = '9999-12-31'", *slow_ids) == 1, 10, "a slow run")
    fast_ids = [initiate(conn, f"dbo.{fast}", 0, str(i)) for i in range(20)]
    wait_final(conn, fast_ids, timeout=12)                 # another reader: not behind the slow one
    wait_final(conn, slow_ids, timeout=60)
    spans = rows(conn, "SELECT StartedAt, EndedAt FROM dbo.DelaySpan WHERE Probe = ? ORDER BY StartedAt", slow)
    assert len(spans) == 2 and spans[0][1] <= spans[1][0]  # never at once


def test_a_dead_readers_claim_is_swept_and_run_once(conn, activation_off):
    """At least once: a claim whose reader ended is claimed again after its lease."""
    probe = make_target(conn)
    task_id = initiate(conn, f"dbo.{probe}", 0, "swept")
    rows(conn, "UPDATE delay.Task SET TaskState = N'Claimed', ClaimToken = NEWID(), Claims = 1, "
               "LeaseUntilUtc = DATEADD(SECOND, -1, SYSUTCDATETIME()) WHERE TaskID = ?", task_id)
    rows(conn, "EXEC dbo.ProcessDelayQueue")                # a reader by hand: one pass
    state = task(conn, task_id)
    assert state["TaskState"] == "Done" and state["Claims"] == 2
    assert runs(conn, probe) == [(f"dbo.{probe}", "swept", None, None, None, None)]


def test_a_claimed_task_cannot_be_cancelled(conn, activation_off):
    probe = make_target(conn)
    task_id = initiate(conn, f"dbo.{probe}", 0)
    rows(conn, "UPDATE delay.Task SET TaskState = N'Claimed', ClaimToken = NEWID(), "
               "LeaseUntilUtc = DATEADD(SECOND, 60, SYSUTCDATETIME()) WHERE TaskID = ?", task_id)
    with pytest.raises(Exception, match="50321"):
        rows(conn, "EXEC dbo.CancelDelayExecution @TaskID = ?", task_id)
    rows(conn, "UPDATE delay.Task SET TaskState = N'Pending', ClaimToken = NULL, LeaseUntilUtc = NULL "
               "WHERE TaskID = ?", task_id)
    rows(conn, "EXEC dbo.CancelDelayExecution @TaskID = ?", task_id)
    assert task(conn, task_id)["TaskState"] == "Cancelled"


def test_cancel_never_waits_for_a_run_that_holds_the_task_row(conn, mssql_url, activation_off):
    """A run keeps its task's row X-locked until its target ends: cancel answers 50321 after its
    2 s lock timeout instead of waiting (the canceller's statement timeout, 30 s, would end a
    wait: the run here never ends by itself), and the caller's own LOCK_TIMEOUT is left as it was.
    pyodbc puts the native error number after the message: '... stayed locked 2 s ... (50321)'."""
    probe = make_target(conn)
    task_id = initiate(conn, f"dbo.{probe}", 0)
    run, canceller = connect(mssql_url), connect(mssql_url, query_timeout=30)
    run.autocommit = False
    try:
        rows(run, "UPDATE delay.Task SET TaskState = N'Claimed' WHERE TaskID = ?", task_id)  # the run lock
        with pytest.raises(Exception, match=r"stayed locked 2 s.*\(50321\)"):
            rows(canceller, "EXEC dbo.CancelDelayExecution @TaskID = ?", task_id)
        assert scalar(canceller, "SELECT @@LOCK_TIMEOUT") == -1
    finally:
        run.rollback()
        run.close()
        canceller.close()
    rows(conn, "EXEC dbo.CancelDelayExecution @TaskID = ?", task_id)
    assert task(conn, task_id)["TaskState"] == "Cancelled"


def test_a_lock_on_the_platform_row_is_a_retryable_1222_not_a_refusal(conn, mssql_url, activation_off):
    """Once the cancel holds the task's row, a lock it meets on the platform row is not a run:
    the lock timeout comes back as 1222 (transient: retried), never as 50321 ('a reader runs
    it'), the task stays Pending, and the cancel succeeds once the lock is gone."""
    probe = make_target(conn)
    task_id = initiate(conn, f"dbo.{probe}", 3600)
    holder, canceller = connect(mssql_url), connect(mssql_url, query_timeout=30)
    holder.autocommit = False
    try:
        rows(holder, "SELECT p.ID FROM dbo.tabDIYTable12402 AS p WITH (XLOCK, ROWLOCK, HOLDLOCK) WHERE p.ID = ?",
             task_id)
        with pytest.raises(Exception, match=r"\(1222\)") as raised:
            rows(canceller, "EXEC dbo.CancelDelayExecution @TaskID = ?", task_id)
        assert "50321" not in str(raised.value)
    finally:
        holder.rollback()
        holder.close()
        canceller.close()
    assert task(conn, task_id)["TaskState"] == "Pending"
    rows(conn, "EXEC dbo.CancelDelayExecution @TaskID = ?", task_id)
    assert task(conn, task_id)["TaskState"] == "Cancelled"


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


# --------------------------------------------------------------------------
# Point 3: least privilege (MailqRunner), the check and the call
# --------------------------------------------------------------------------


def test_targets_run_as_mailqrunner_not_dbo(conn):
    rows(conn, "IF OBJECT_ID(N'dbo.DelayWho', N'U') IS NULL CREATE TABLE dbo.DelayWho "
               "(Probe SYSNAME, UserName SYSNAME, IsDbOwner INT, CanReadSetting INT)")
    probe = make_target(conn, """
        INSERT INTO dbo.DelayWho VALUES (OBJECT_NAME(@@PROCID), USER_NAME(), IS_MEMBER(N'db_owner'),
            HAS_PERMS_BY_NAME(N'delay.Setting', N'OBJECT', N'SELECT'));""")
    wait_final(conn, [initiate(conn, f"dbo.{probe}", 0)])
    assert rows(conn, "SELECT UserName, IsDbOwner, CanReadSetting FROM dbo.DelayWho WHERE Probe = ?",
                probe) == [("MailqRunner", 0, 0)]
    # Ownership chaining lets the reviewed target's own statements reach dbo's tables;
    # dynamic SQL (a chain breaker) is checked against MailqRunner, which may not.
    nosy = make_target(conn, "EXEC (N'SELECT * FROM delay.Setting');")
    nosy_id = initiate(conn, f"dbo.{nosy}", 0)
    wait_final(conn, [nosy_id], timeout=120)
    assert task(conn, nosy_id)["LastErrorNumber"] == 229   # permission denied


def test_the_allow_list_is_the_runners_grant(conn):
    probe = make_target(conn)
    has = ("SELECT COUNT(*) FROM sys.database_permissions AS p WHERE p.grantee_principal_id = "
           "DATABASE_PRINCIPAL_ID(N'MailqRunner') AND p.major_id = OBJECT_ID(?) AND p.permission_name = N'EXECUTE' "
           "AND p.state = 'G'")
    assert scalar(conn, has, f"dbo.{probe}") == 1
    refused = scalar(conn, "EXEC delay.DisallowProcedure @ProcedureName = ?", f"dbo.{probe}")
    assert refused == 0 and scalar(conn, has, f"dbo.{probe}") == 0
    assert scalar(conn, "SELECT COUNT(*) FROM sys.database_principals WHERE name = N'MailqRunner' "
                        "AND type = 'S' AND authentication_type = 0") == 1   # WITHOUT LOGIN


def test_a_target_altered_while_it_runs_is_rolled_back_and_held(conn):
    probe = make_target(conn, """
        INSERT INTO dbo.DelayProbeRun (Probe, Param1) VALUES (OBJECT_NAME(@@PROCID), @Param1);
        WAITFOR DELAY '00:00:04';""")
    task_id = initiate(conn, f"dbo.{probe}", 0, "first")
    wait_state(conn, task_id, "Claimed")
    time.sleep(1)
    alter_target(conn, probe, "INSERT INTO dbo.DelayProbeRun (Probe, Param1) VALUES (OBJECT_NAME(@@PROCID), N'v2');")
    wait_state(conn, task_id, "Held", timeout=30)
    state = task(conn, task_id)
    assert state["LastErrorNumber"] == 50540
    assert runs(conn, probe) == []                          # its work rolled back
    rows(conn, "EXEC delay.AllowProcedure @ProcedureName = ?", f"dbo.{probe}")
    wait_final(conn, [task_id])
    assert task(conn, task_id)["TaskState"] == "Done" and [r[1] for r in runs(conn, probe)] == ["v2"]


def test_doctor_and_health_report_trustworthy_and_chaining(fresh_database):
    from mailq_db.commands import doctor

    url = fresh_database()
    with connect(url) as other:
        assert rows(other, "SELECT IsTrustworthy, IsDbChaining FROM delay.Health") == [(False, False)]
        rows(other, "ALTER DATABASE CURRENT SET TRUSTWORTHY ON; ALTER DATABASE CURRENT SET DB_CHAINING ON;")
        assert rows(other, "SELECT IsTrustworthy, IsDbChaining FROM delay.Health") == [(True, True)]
        checks = {c.name: c for c in doctor.delay_checks(other)}
    assert checks["TRUSTWORTHY"].status == "WARN"
    assert checks["Cross-database ownership chaining"].status == "WARN"


# --------------------------------------------------------------------------
# Point 4: a changed target is held, not refused (B1)
# --------------------------------------------------------------------------


def test_an_altered_target_is_held_then_runs_once_listed_again(conn):
    probe = make_target(conn)
    task_id = initiate(conn, f"dbo.{probe}", 1, "held")
    alter_target(conn, probe, "INSERT INTO dbo.DelayProbeRun (Probe, Param1) VALUES (OBJECT_NAME(@@PROCID), @Param1);")
    wait_state(conn, task_id, "Held")
    state = task(conn, task_id)
    assert state["LastErrorNumber"] == 50340 and state["F108219"] == 0
    assert scalar(conn, "SELECT HeldReason FROM delay.PendingTasks WHERE TaskID = ?", task_id)
    assert scalar(conn, "SELECT HeldTasks FROM delay.Health") >= 1
    assert "HeldTasks" in findings(conn)
    assert rows(conn, "EXEC delay.GetTaskMetrics")[0][2] >= 1
    allowed = rows(conn, "EXEC delay.AllowProcedure @ProcedureName = ?", f"dbo.{probe}")
    assert allowed[0][-1] == 1                              # Released
    wait_final(conn, [task_id])
    assert task(conn, task_id)["TaskState"] == "Done"
    assert ("Released", None) in [(e, None) for e, _ in log_events(conn, task_id)]
    assert [r[1] for r in runs(conn, probe)] == ["held"]


def test_a_dropped_and_recreated_target_is_held(conn):
    name = make_target(conn)
    task_id = initiate(conn, f"dbo.{name}", 1)
    rows(conn, f"DROP PROCEDURE dbo.{name}")
    make_target(conn, name=name, allow=False)               # same name, new object_id
    wait_state(conn, task_id, "Held")
    assert task(conn, task_id)["LastErrorNumber"] == 50307
    rows(conn, "EXEC delay.AllowProcedure @ProcedureName = ?", f"dbo.{name}")
    wait_final(conn, [task_id])
    assert task(conn, task_id)["TaskState"] == "Done" and len(runs(conn, name)) == 1


def test_refused_is_final_for_a_target_never_listed_or_disallowed(conn):
    probe = make_target(conn)
    held = initiate(conn, f"dbo.{probe}", 3600)
    assert scalar(conn, "EXEC delay.DisallowProcedure @ProcedureName = ?", f"dbo.{probe}") == 1
    wait_final(conn, [held])
    state = task(conn, held)
    assert state["TaskState"] == "Refused" and state["LastErrorNumber"] == 50306 and state["F108219"] == 2
    with pytest.raises(Exception, match="50306"):
        initiate(conn, f"dbo.{probe}", 0)                   # never listed again: refused at once
    rows(conn, "EXEC delay.AllowProcedure @ProcedureName = ?", f"dbo.{probe}")
    assert task(conn, held)["TaskState"] == "Refused"       # listing again revives nothing refused


def test_injected_and_unlisted_names_are_refused_and_never_run(conn):
    listed = make_target(conn)
    rows(conn, "IF OBJECT_ID(N'dbo.DelaySentinel', N'U') IS NULL CREATE TABLE dbo.DelaySentinel (Id INT)")
    database = scalar(conn, "SELECT DB_NAME()")
    any_refusal = (50304, 50305, 50306)
    names = {
        "x];DROP TABLE dbo.DelaySentinel;--": any_refusal,
        f"dbo.{listed}; DROP TABLE dbo.DelaySentinel;--": any_refusal,
        "dbo.p; EXEC xp_cmdshell 'x'": any_refusal,
        "sys.sp_configure": (50306,),
        f"{database}.dbo.{listed}": (50305,),
        f"[dbo].[{listed}]]": any_refusal,
        "a" * 200: (50304,),
    }
    first = scalar(conn, "SELECT ISNULL(MAX(ID), 0) FROM dbo.tabDIYTable12402")
    for name, numbers in names.items():
        with pytest.raises(Exception) as raised:
            initiate(conn, name, 0)
        assert any(str(n) in str(raised.value) for n in numbers), (name, raised.value)
        rows(conn, "INSERT INTO dbo.tabDIYTable12402 (F108211, F108218) VALUES (?, 0)", name[:400])
    refused = rows(conn, f"SELECT TaskID, LastErrorNumber FROM delay.FinishedTasks WHERE TaskID > {first} "
                         "AND TaskState = N'Refused'")
    assert len(refused) == len(names) and all(n in range(50304, 50307) for _, n in refused)
    assert runs(conn, listed) == []
    assert scalar(conn, "SELECT OBJECT_ID(N'dbo.DelaySentinel', N'U')") is not None
    with pytest.raises(Exception, match="5031[01]"):
        rows(conn, "EXEC delay.AllowProcedure @ProcedureName = N'sys.sp_configure'")


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
# Point 5: operations -- the monitor, copies, purge
# --------------------------------------------------------------------------


def test_metrics_have_the_shape_monitoring_reads(conn):
    cursor = conn.cursor()
    cursor.execute("EXEC delay.GetTaskMetrics")
    assert [c[0] for c in cursor.description] == ["PendingTasks", "OverdueTasks", "HeldTasks", "FailedTasks",
                                                  "QueueReceiveEnabled", "BrokerEnabled"]
    assert len(cursor.fetchall()) == 1
    health = rows(conn, "SELECT PendingTasks, OverdueTasks, HeldTasks, FailedTasks FROM delay.Health")
    assert len(health) == 1


def test_the_monitor_reports_a_disabled_queue_and_activation(conn):
    rows(conn, "ALTER QUEUE dbo.DelayServiceQueue WITH STATUS = OFF")
    try:
        assert "QueueDisabled" in findings(conn)
        with pytest.raises(Exception, match="50545"):
            rows(conn, "EXEC delay.Monitor @Apply = 0, @Raise = 1")
    finally:
        rows(conn, "ALTER QUEUE dbo.DelayServiceQueue WITH STATUS = ON")
    rows(conn, "ALTER QUEUE dbo.DelayServiceQueue WITH ACTIVATION (STATUS = OFF)")
    try:
        assert "ActivationOff" in findings(conn)
    finally:
        rows(conn, "ALTER QUEUE dbo.DelayServiceQueue WITH ACTIVATION (STATUS = ON)")
    assert not {"QueueDisabled", "ActivationOff"} & set(findings(conn))


def test_the_monitor_reports_overdue_tasks_and_failing_activation(conn, activation_off):
    before = scalar(conn, "SELECT OverdueSeconds FROM delay.Setting")
    rows(conn, "UPDATE delay.Setting SET OverdueSeconds = 1")
    try:
        probe = make_target(conn)
        task_id = initiate(conn, f"dbo.{probe}", 0)
        rows(conn, "UPDATE delay.Dispatcher SET ArmedForUtc = DATEADD(SECOND, -30, SYSUTCDATETIME()), "
                   "LastWokenAtUtc = DATEADD(SECOND, -60, SYSUTCDATETIME())")
        time.sleep(2.5)
        found = findings(conn)
        assert "OverdueTasks" in found and "ActivationFailing" in found
        assert scalar(conn, "SELECT OverdueTasks FROM delay.Health") >= 1
    finally:
        rows(conn, "UPDATE delay.Setting SET OverdueSeconds = ?", before)
    rows(conn, "ALTER QUEUE dbo.DelayServiceQueue WITH ACTIVATION (STATUS = ON)")
    rows(conn, "DECLARE @Now DATETIME2(3) = SYSUTCDATETIME(); EXEC delay.ArmDispatcher @DueAtUtc = @Now;")
    wait_final(conn, [task_id])


def test_error_broker_conversations_is_survived_and_reported(fresh_database):
    """H5: every conversation errored; the dispatcher's is begun again."""
    url = fresh_database()
    with connect(url) as other:
        rows(other, "IF OBJECT_ID(N'dbo.DelayProbeRun', N'U') IS NULL CREATE TABLE dbo.DelayProbeRun ("
                    "RunId BIGINT IDENTITY PRIMARY KEY, Probe SYSNAME NOT NULL, SPName NVARCHAR(200), "
                    "Param1 NVARCHAR(200), Param2 NVARCHAR(200), Param3 NVARCHAR(200), Param4 NVARCHAR(200), "
                    "Param5 NVARCHAR(200), RanAtUtc DATETIME2(3) DEFAULT SYSUTCDATETIME())")
        probe = make_target(other)
        wait_final(other, [initiate(other, f"dbo.{probe}", 0)])
        rows(other, "ALTER DATABASE CURRENT SET ERROR_BROKER_CONVERSATIONS WITH ROLLBACK IMMEDIATE")
        # The broker identity stays: no copy.  The errored dispatcher is begun again, by
        # a reader that got its Error message or by the monitor (DispatcherLost).
        found = findings(other, apply=1)
        assert "CopyNotEnabled" not in found
        task_id = initiate(other, f"dbo.{probe}", 1)
        wait_final(other, [task_id], timeout=60)
        assert task(other, task_id)["TaskState"] == "Done"
        assert scalar(other, "SELECT COUNT(*) FROM delay.Log WHERE EventName = N'Dispatcher'") >= 2


def test_a_copy_with_a_new_broker_identity_runs_nothing_until_enabled(fresh_database):
    """M3: a restored copy (NEW_BROKER) never runs production's tasks by itself."""
    url = fresh_database()
    with connect(url) as other:
        rows(other, "CREATE TABLE dbo.DelayProbeRun (RunId BIGINT IDENTITY PRIMARY KEY, Probe SYSNAME NOT NULL, "
                    "SPName NVARCHAR(200), Param1 NVARCHAR(200), Param2 NVARCHAR(200), Param3 NVARCHAR(200), "
                    "Param4 NVARCHAR(200), Param5 NVARCHAR(200), RanAtUtc DATETIME2(3) DEFAULT SYSUTCDATETIME())")
        probe = make_target(other)
        wait_final(other, [initiate(other, f"dbo.{probe}", 0)])     # records the identity
        waiting = initiate(other, f"dbo.{probe}", 2, "production's")
        rows(other, "ALTER DATABASE CURRENT SET NEW_BROKER WITH ROLLBACK IMMEDIATE")   # what a copy gets
        time.sleep(6)
        assert task(other, waiting)["TaskState"] == "Pending"
        assert "CopyNotEnabled" in findings(other)
        assert rows(other, "SELECT IsEnabledHere FROM delay.Health") == [(False,)]
        with pytest.raises(Exception, match="50544"):
            rows(other, "EXEC delay.EnableThisDatabase")
        rows(other, "EXEC delay.EnableThisDatabase @Confirm = 1")
        wait_final(other, [waiting], timeout=60)
        assert [r[1] for r in runs(other, probe) if r[1]] == ["production's"]


def test_orphaned_runs_and_rows_without_a_task_are_repaired(conn, activation_off):
    probe = make_target(conn)
    orphan = initiate(conn, f"dbo.{probe}", 3600)
    rows(conn, "UPDATE delay.Task SET TaskState = N'Claimed', ClaimToken = NEWID(), LeaseUntilUtc = '9999-12-31' "
               "WHERE TaskID = ?", orphan)
    assert "OrphanedRuns" in findings(conn)
    findings(conn, apply=1)
    state = task(conn, orphan)
    assert state["TaskState"] == "Failed" and state["LastErrorNumber"] == 50546
    rows(conn, "DISABLE TRIGGER dbo.trg_tabDIYTable12402_ScheduleDelay ON dbo.tabDIYTable12402")
    try:
        missing = int(scalar(conn, "INSERT INTO dbo.tabDIYTable12402 (F108211, F108218, F108212) "
                                   "OUTPUT inserted.ID VALUES (?, 0, N'backfill')", f"dbo.{probe}"))
    finally:
        rows(conn, "ENABLE TRIGGER dbo.trg_tabDIYTable12402_ScheduleDelay ON dbo.tabDIYTable12402")
    assert "NoTask" in findings(conn, apply=1, schedule_missing=1)
    assert task(conn, missing)["TaskState"] == "Pending"


def test_history_is_purged_in_bounded_batches(conn):
    probe = make_target(conn)
    ids = [initiate(conn, f"dbo.{probe}", 0, str(i)) for i in range(5)]
    wait_final(conn, ids)
    id_list = ",".join(map(str, ids))
    rows(conn, f"UPDATE delay.Task SET FinishedAtUtc = DATEADD(DAY, -400, SYSUTCDATETIME()) WHERE TaskID IN ({id_list})")
    with pytest.raises(Exception, match="50543"):
        rows(conn, "EXEC delay.PurgeHistory @OlderThanDays = 0")
    first = rows(conn, "EXEC delay.PurgeHistory @OlderThanDays = 365, @BatchSize = 2, @MaxBatches = 1")
    assert first[0][0] == 2 and first[0][2] in (0, False)
    while not rows(conn, "EXEC delay.PurgeHistory @OlderThanDays = 365, @BatchSize = 2, @MaxBatches = 1")[0][2]:
        pass
    assert scalar(conn, f"SELECT COUNT(*) FROM delay.Task WHERE TaskID IN ({id_list})") == 0
    assert scalar(conn, f"SELECT COUNT(*) FROM dbo.tabDIYTable12402 WHERE ID IN ({id_list}) AND F108219 = 1") == 5


# --------------------------------------------------------------------------
# Kept: deployment, roles, the caller's contract
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
        assert scalar(other, "SELECT OBJECT_ID(N'mailq.RunApplicationHooks')") is not None
        assert scalar(other, "SELECT OBJECT_ID(N'mailq.HookDispatcher')") is None


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
    command.downgrade(alembic_config(x_args=[f"url={url}"]), "0001")
    with connect(url) as other:
        assert scalar(other, "SELECT COUNT(*) FROM dbo.tabDIYTable12402 WHERE Extra = N'keep'") == 1
        assert scalar(other, "SELECT OBJECT_ID(N'dbo.DelayServiceQueue')") is None
        assert scalar(other, "SELECT SCHEMA_ID(N'delay')") is None
        assert scalar(other, "SELECT DATABASE_PRINCIPAL_ID(N'MailqRunner')") is None
        assert scalar(other, "SELECT COUNT(*) FROM sys.triggers WHERE parent_id = OBJECT_ID(N'dbo.tabDIYTable12402')") == 0


def test_downgrade_removes_a_created_platform_table(fresh_database):
    from alembic import command
    from mailq_db.deployment import alembic_config

    url = fresh_database()
    command.downgrade(alembic_config(x_args=[f"url={url}"]), "0001")
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
                              f"EXEC dbo.{probe}", "EXEC delay.AllowProcedure @ProcedureName = N'dbo.x'",
                              "EXEC delay.ArmDispatcher", "EXEC delay.RunDueTasks"):
                with pytest.raises(Exception, match="(?i)permission"):
                    rows(conn, statement)
        finally:
            rows(conn, "REVERT;")
    finally:
        rows(conn, f"ALTER ROLE MailqDelayCaller DROP MEMBER {user}; DROP USER {user};")
    assert task(conn, task_id)["TaskState"] == "Cancelled"


def test_initiate_and_cancel_use_no_savepoint_and_doom_the_callers_transaction(conn, mssql_url):
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


def test_values_longer_than_their_declared_size_are_refused(conn):
    probe = make_target(conn)
    with pytest.raises(Exception, match="50344"):
        rows(conn, "EXEC dbo.InitiateDelayExecution @F108211 = ?, @F108218 = 0, @F108210 = ?",
             f"dbo.{probe}", "d" * 51)
    with pytest.raises(Exception, match="50303"):
        initiate(conn, f"dbo.{probe}", 0, "x" * 199 + "  ")  # trailing blanks count
    assert runs(conn, probe) == []


def test_an_idempotency_key_returns_the_first_task(conn):
    probe = make_target(conn)
    key = unique("key")
    sql = ("EXEC dbo.InitiateDelayExecution @F108211 = ?, @F108218 = 3600, @F108212 = N'once', "
           "@IdempotencyKey = ?")
    first = int(scalar(conn, sql, f"dbo.{probe}", key))
    again = int(scalar(conn, sql, f"dbo.{probe}", key))
    assert first == again
    rows(conn, "EXEC dbo.CancelDelayExecution @TaskID = ?", first)


def test_a_caller_may_not_cancel_another_logins_task(conn, mssql_url):
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


def test_a_platform_table_that_refuses_receipts_never_disables_the_queue(conn):
    """The receipt is written as MailqRunner after the run; a refusal is logged (50548)."""
    marker = unique("poison")
    trigger = unique("trg_RefuseReceipt")
    rows(conn, f"""
        CREATE TRIGGER dbo.{trigger} ON dbo.tabDIYTable12402 AFTER UPDATE AS
        BEGIN
            IF EXISTS (SELECT 1 FROM inserted WHERE F108212 = N'{marker}' AND F108219 <> 0)
                THROW 51999, N'the platform refuses this receipt', 1;
        END""")
    try:
        probe = make_target(conn)
        ids = [initiate(conn, f"dbo.{probe}", 0, marker) for _ in range(6)]
        wait_final(conn, ids)
        assert queue_state(conn) == (1, 1)
        for task_id in ids:
            state = task(conn, task_id)
            assert state["TaskState"] == "Done" and state["F108219"] == 0, state
            assert ("Receipt", 50548) in log_events(conn, task_id)
    finally:
        rows(conn, f"DROP TRIGGER IF EXISTS dbo.{trigger}")


# --------------------------------------------------------------------------
# A Service Broker reader's second reading (r23b)
# --------------------------------------------------------------------------


def test_a_capped_targets_backlog_waits_for_its_slot_and_is_never_failed(conn):
    """MaxReaders = 1, 5 s a run, four tasks due at once: the ones without a slot go back
    every 2 s; those returns are no claims, so none reaches 50541 ("claimed too often")."""
    slow = make_target(conn, """
        WAITFOR DELAY '00:00:05';
        INSERT INTO dbo.DelayProbeRun (Probe) VALUES (OBJECT_NAME(@@PROCID));""", allow=False)
    rows(conn, "EXEC delay.AllowProcedure @ProcedureName = ?, @MaxReaders = 1", f"dbo.{slow}")
    ids = [initiate(conn, f"dbo.{slow}", 0) for _ in range(4)]
    wait_final(conn, ids, timeout=90)
    assert [task(conn, i)["TaskState"] for i in ids] == ["Done"] * 4
    assert all(task(conn, i)["Attempts"] == 1 for i in ids) and len(runs(conn, slow)) == 4


def test_a_copy_reader_leaves_at_once_and_keeps_only_the_safety_tick(fresh_database):
    """A copy (new broker identity) with an overdue task: a woken reader runs nothing and
    leaves; it neither arms the timer to the overdue task nor polls for it."""
    url = fresh_database()
    with connect(url) as other:
        rows(other, "CREATE TABLE dbo.DelayProbeRun (RunId BIGINT IDENTITY PRIMARY KEY, Probe SYSNAME NOT NULL, "
                    "SPName NVARCHAR(200), Param1 NVARCHAR(200), Param2 NVARCHAR(200), Param3 NVARCHAR(200), "
                    "Param4 NVARCHAR(200), Param5 NVARCHAR(200), RanAtUtc DATETIME2(3) DEFAULT SYSUTCDATETIME())")
        probe = make_target(other)
        wait_final(other, [initiate(other, f"dbo.{probe}", 0)])     # records the identity
        rows(other, "ALTER DATABASE CURRENT SET NEW_BROKER WITH ROLLBACK IMMEDIATE")
        overdue = initiate(other, f"dbo.{probe}", 0)                 # its trigger begins a dispatcher: a reader wakes
        time.sleep(8)                                               # timer 1 s, one pass, leave
        assert scalar(other, "SELECT COUNT(*) FROM sys.dm_broker_activated_tasks WHERE database_id = DB_ID()") == 0
        assert task(other, overdue)["TaskState"] == "Pending"
        assert seconds_to_timer(other) is None or seconds_to_timer(other) > 5   # the tick, not 1 s


def test_purge_works_in_an_implicit_transaction_session(conn):
    """pyodbc and JDBC with autocommit off run IMPLICIT_TRANSACTIONS ON: the purge's own
    first read must not open the transaction it then refuses (50543)."""
    result = rows(conn, "SET IMPLICIT_TRANSACTIONS ON; "
                        "EXEC delay.PurgeHistory @OlderThanDays = 3650, @BatchSize = 10, @MaxBatches = 1; "
                        "IF @@TRANCOUNT > 0 COMMIT; SET IMPLICIT_TRANSACTIONS OFF;")
    assert len(result) == 1 and scalar(conn, "SELECT @@TRANCOUNT") == 0
