"""Benchmark of delayed execution (prints figures; never a timed test).

    python bench/delay_throughput.py [URL] [--rate 1000] [--seconds 60] [--delay 5]
                                     [--target-ms 0] [--keep]

URL (or MAILQ_DB_URL) names a database deployed with `alembic upgrade head` and
Service Broker enabled; the benchmark needs db_owner there (it creates and
allow-lists a probe procedure).  Without a URL, or when the server cannot be
reached, it prints one line that starts "delay_throughput: needs a SQL Server"
and exits 0 (nothing can be measured without one).

The load of issues 11 and 23: RATE tasks every second for SECONDS seconds
(default 1,000/s for 60 s = 60,000 tasks), each inserted into
dbo.tabDIYTable12402 (the platform's path, one INSERT ... SELECT per second)
with a delay of DELAY seconds, so that tasks fall due at a sustained 1,000/s.
Reported, each beside its reference:
  * lateness p50 / p99 / max: FirstStartedAtUtc - DueAtUtc (both written by
    SQL Server, so client clocks do not matter);
  * the target's own duration p50 / p99 / max, measured inside the probe
    (it records its start and end; --target-ms makes it work that long);
  * the sustained rate at which tasks finished, and tasks not Done;
  * log flushes per task: the database's "Log Flushes/sec" counter (cumulative)
    before and after, over the tasks (inserts included; needs VIEW SERVER STATE).
Goal: p99 lateness < 1 s at 1,000 tasks/s, at most 1.5 log flushes per task
(docs/delayed-execution.md, "Throughput": on paper 1 + 4/BatchSize, 1.08 at 50).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

PROBE = "dbo.DelayBenchProbe"
NEEDS_SERVER = ("delay_throughput: needs a SQL Server 2019+ (or Azure SQL Managed Instance) "
                "with Service Broker enabled and mailq-db deployed; ")
GOAL_P99_S = 1.0      # issue 11 point 11: p99 lateness < 1 s ...
GOAL_RATE = 1000      # ... at 1,000 tasks/s sustained (60,000 tasks over 60 s)
GOAL_FLUSHES_PER_TASK = 1.5  # issue 23 point 7, at delay.Setting.BatchSize 50
FLUSHES_SQL = ("SELECT cntr_value FROM sys.dm_os_performance_counters "
               "WHERE counter_name = N'Log Flushes/sec' AND instance_name = DB_NAME()")
BATCH = 1000


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    index = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return ordered[index]


def prepare(conn, target_ms: int) -> None:
    cursor = conn.cursor()
    cursor.execute("""
        IF OBJECT_ID(N'dbo.DelayBenchRun', N'U') IS NULL
            CREATE TABLE dbo.DelayBenchRun (
                TaskKey NVARCHAR(200) NOT NULL,
                StartedAtUtc DATETIME2(3) NOT NULL,
                EndedAtUtc DATETIME2(3) NOT NULL
            )""")
    # The probe's own duration; --target-ms > 0 makes it wait that long.
    wait_clause = (
        f"WAITFOR DELAY '00:00:{target_ms // 1000:02d}.{target_ms % 1000:03d}';" if target_ms > 0 else ""
    )
    cursor.execute(f"""
        CREATE OR ALTER PROCEDURE dbo.DelayBenchProbe
            @SPName NVARCHAR(200) = NULL, @Param1 NVARCHAR(200) = NULL, @Param2 NVARCHAR(200) = NULL,
            @Param3 NVARCHAR(200) = NULL, @Param4 NVARCHAR(200) = NULL, @Param5 NVARCHAR(200) = NULL
        AS
        BEGIN
            SET NOCOUNT ON;
            DECLARE @Started DATETIME2(3) = SYSUTCDATETIME();
            {wait_clause}
            INSERT INTO dbo.DelayBenchRun (TaskKey, StartedAtUtc, EndedAtUtc)
            VALUES (@Param1, @Started, SYSUTCDATETIME());
        END""")
    # Listing pins the definition just created (delay.AllowProcedure).
    cursor.execute("EXEC delay.AllowProcedure @ProcedureName = ?", PROBE)
    while cursor.nextset():
        pass


def schedule(conn, rate: int, seconds: int, delay: int) -> tuple[int, int, float]:
    """Insert ``rate`` rows a second for ``seconds`` seconds, each due ``delay``
    seconds later.  Returns the ID range and the seconds the inserts lagged
    behind their schedule at most (a client that cannot keep up shows here)."""
    cursor = conn.cursor()
    first = cursor.execute("SELECT ISNULL(MAX(ID), 0) FROM dbo.tabDIYTable12402").fetchval()
    start = time.monotonic()
    worst_lag = 0.0
    for second in range(seconds):
        target = start + second
        now = time.monotonic()
        if now < target:
            time.sleep(target - now)
        worst_lag = max(worst_lag, time.monotonic() - target)
        cursor.execute(
            """
            INSERT INTO dbo.tabDIYTable12402 (F108210, F108211, F108218, F108212)
            SELECT TOP (?) N'bench', ?, ?, CONCAT(?, N'-', n)
            FROM (SELECT n = ROW_NUMBER() OVER (ORDER BY (SELECT NULL))
                  FROM sys.all_objects AS a CROSS JOIN sys.all_objects AS b) AS numbers
            """,
            rate, PROBE, delay, second,
        )
        while cursor.nextset():
            pass
    last = cursor.execute("SELECT ISNULL(MAX(ID), 0) FROM dbo.tabDIYTable12402").fetchval()
    return first + 1, last, worst_lag


def wait(conn, first: int, last: int, timeout: float) -> bool:
    cursor = conn.cursor()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        left = cursor.execute(
            "SELECT COUNT(*) FROM delay.Task WHERE TaskID BETWEEN ? AND ? "
            "AND TaskState NOT IN (N'Done', N'Failed', N'Refused', N'Cancelled')",
            first, last,
        ).fetchval()
        if left == 0:
            return True
        time.sleep(0.5)
    return False


def measure(conn, first: int, last: int) -> dict:
    """Lateness and target durations in seconds, the finishing rate, failures."""
    cursor = conn.cursor()
    late = [
        row[0] / 1000.0
        for row in cursor.execute(
            "SELECT DATEDIFF_BIG(MILLISECOND, DueAtUtc, FirstStartedAtUtc) FROM delay.Task "
            "WHERE TaskID BETWEEN ? AND ? AND FirstStartedAtUtc IS NOT NULL",
            first, last,
        ).fetchall()
    ]
    durations = [
        row[0] / 1000.0
        for row in cursor.execute(
            "SELECT DATEDIFF_BIG(MILLISECOND, r.StartedAtUtc, r.EndedAtUtc) "
            "FROM dbo.DelayBenchRun AS r "
            "INNER JOIN dbo.tabDIYTable12402 AS p ON p.F108212 = r.TaskKey "
            "WHERE p.ID BETWEEN ? AND ?",
            first, last,
        ).fetchall()
    ]
    span_ms = cursor.execute(
        "SELECT DATEDIFF_BIG(MILLISECOND, MIN(FirstStartedAtUtc), MAX(FinishedAtUtc)) FROM delay.Task "
        "WHERE TaskID BETWEEN ? AND ?",
        first, last,
    ).fetchval()
    not_done = cursor.execute(
        "SELECT COUNT(*) FROM delay.Task WHERE TaskID BETWEEN ? AND ? AND TaskState <> N'Done'",
        first, last,
    ).fetchval()
    return {"late": late, "durations": durations, "span": (span_ms or 0) / 1000.0, "not_done": not_done}


def log_flushes(conn) -> int | None:
    """The database's cumulative log flush count, or None without VIEW SERVER STATE."""
    try:
        value = conn.cursor().execute(FLUSHES_SQL).fetchval()
    except Exception:  # noqa: BLE001 - a missing permission only leaves the figure out
        return None
    return None if value is None else int(value)


def cleanup(conn, first: int, last: int) -> None:
    cursor = conn.cursor()
    cursor.execute("DELETE FROM delay.ReceiptDue WHERE TaskID BETWEEN ? AND ?", first, last)
    cursor.execute("DELETE FROM delay.Log WHERE TaskID BETWEEN ? AND ?", first, last)
    cursor.execute("DELETE FROM delay.Task WHERE TaskID BETWEEN ? AND ?", first, last)
    cursor.execute("DELETE FROM dbo.tabDIYTable12402 WHERE ID BETWEEN ? AND ?", first, last)
    cursor.execute("DELETE FROM dbo.DelayBenchRun")


def describe(values: list[float]) -> str:
    if not values:
        return "none measured"
    return (f"p50 {percentile(values, 0.50):.3f} s, p99 {percentile(values, 0.99):.3f} s, "
            f"max {max(values):.3f} s")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("url", nargs="?", default=os.environ.get("MAILQ_DB_URL"))
    parser.add_argument("--rate", type=int, default=1000, help="tasks per second (default 1000)")
    parser.add_argument("--seconds", type=int, default=60, help="seconds of load (default 60)")
    parser.add_argument("--delay", type=int, default=5, help="each task's delay, seconds (default 5)")
    parser.add_argument("--target-ms", type=int, default=0, help="how long the probe works, ms (default 0)")
    parser.add_argument("--keep", action="store_true", help="keep the benchmark's rows")
    args = parser.parse_args(argv)

    if not args.url:
        print(NEEDS_SERVER + "no server given (pass a URL or set MAILQ_DB_URL); nothing measured.")
        return 0
    try:
        from mailq_db.connection import connect

        conn = connect(args.url)
        conn.autocommit = True
        prepare(conn, args.target_ms)
    except Exception as exc:  # noqa: BLE001 - any failure to reach the server ends the run politely
        print(NEEDS_SERVER + f"cannot use {args.url!r}: {exc}; nothing measured.")
        return 0

    readers = conn.cursor().execute(
        "SELECT max_readers FROM sys.service_queues WHERE object_id = OBJECT_ID(N'dbo.DelayServiceQueue')"
    ).fetchval()
    batch = conn.cursor().execute("SELECT BatchSize FROM delay.Setting").fetchval()
    total = args.rate * args.seconds
    print(f"dbo.DelayServiceQueue MAX_QUEUE_READERS = {readers}, delay.Setting.BatchSize = {batch}; "
          f"load: {args.rate} tasks/s for "
          f"{args.seconds} s = {total} tasks, delay {args.delay} s, target {args.target_ms} ms")

    flushes_before = log_flushes(conn)
    first, last, lag = schedule(conn, args.rate, args.seconds, args.delay)
    print(f"inserted {last - first + 1} rows; the inserts lagged their schedule by at most {lag:.2f} s")
    finished = wait(conn, first, last, timeout=args.delay + args.seconds + 900)
    figures = measure(conn, first, last)
    flushes_after = log_flushes(conn)
    if not finished:
        print("not all tasks finished within the time limit")
    print(f"lateness (first start - due): {describe(figures['late'])}   "
          f"| reference: p99 < {GOAL_P99_S:.0f} s at {GOAL_RATE} tasks/s")
    print(f"target duration (inside the probe): {describe(figures['durations'])}   "
          f"| reference: --target-ms {args.target_ms}")
    print(f"finishing rate: {len(figures['late']) / max(figures['span'], 1e-9):.0f} tasks/s "
          f"over {figures['span']:.1f} s; not Done: {figures['not_done']}")
    if flushes_before is None or flushes_after is None:
        print(f"log flushes per task: not measured (needs VIEW SERVER STATE)   "
              f"| reference: <= {GOAL_FLUSHES_PER_TASK} at BatchSize 50")
    else:
        per_task = (flushes_after - flushes_before) / max(last - first + 1, 1)
        print(f"log flushes per task: {per_task:.2f} (inserts and receipts included)   "
              f"| reference: <= {GOAL_FLUSHES_PER_TASK} at BatchSize 50")
    p99 = percentile(figures["late"], 0.99) if figures["late"] else float("inf")
    print(f"goal p99 lateness < {GOAL_P99_S:.0f} s at {args.rate} tasks/s "
          f"(the goal's rate is {GOAL_RATE}): {'met' if p99 < GOAL_P99_S else 'NOT met'} (p99 {p99:.3f} s)")
    if not args.keep:
        cleanup(conn, first, last)
    conn.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
