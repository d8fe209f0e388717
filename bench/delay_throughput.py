"""Benchmark of delayed execution (prints figures; never a timed test).

    python bench/delay_throughput.py [URL] [--tasks N] [--spread SECONDS] [--keep]

URL (or MAILQ_DB_URL) names a database deployed with `alembic upgrade head` and
Service Broker enabled; the benchmark needs db_owner there (it creates and
allow-lists a probe procedure).  Without a URL, or when the server cannot be
reached, it says so and exits 0.

Two runs, each inserted into dbo.tabDIYTable12402 with INSERT ... SELECT of
1,000 rows per statement, the platform's path:
  1. N tasks with delay 0: tasks/s from the first insert to the last finish,
     and the largest lateness (first start - due time).
  2. N tasks with delays spread evenly over 1..SPREAD seconds: lateness p50,
     p99 and max.
Target on a 2-core SQL Server 2022 container: p99 lateness under 1 s at
1,000 tasks/s.  Lateness comes from delay.Task (FirstStartedAtUtc - DueAtUtc,
both written by SQL Server), so client clocks do not matter.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

PROBE = "dbo.DelayBenchProbe"
BATCH = 1000


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    index = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return ordered[index]


def prepare(conn) -> None:
    cursor = conn.cursor()
    cursor.execute("""
        CREATE OR ALTER PROCEDURE dbo.DelayBenchProbe
            @SPName NVARCHAR(200) = NULL, @Param1 NVARCHAR(200) = NULL, @Param2 NVARCHAR(200) = NULL,
            @Param3 NVARCHAR(200) = NULL, @Param4 NVARCHAR(200) = NULL, @Param5 NVARCHAR(200) = NULL
        AS
        BEGIN
            SET NOCOUNT ON;
        END""")
    cursor.execute("EXEC delay.AllowProcedure @ProcedureName = ?", PROBE)
    while cursor.nextset():
        pass


def schedule(conn, count: int, spread: int) -> tuple[int, int]:
    """Insert ``count`` rows; delay 0 when spread is 0, else 1..spread seconds. Returns the ID range."""
    cursor = conn.cursor()
    first = cursor.execute("SELECT ISNULL(MAX(ID), 0) FROM dbo.tabDIYTable12402").fetchval()
    done = 0
    while done < count:
        size = min(BATCH, count - done)
        cursor.execute(
            """
            INSERT INTO dbo.tabDIYTable12402 (F108210, F108211, F108218, F108212)
            SELECT TOP (?) N'bench', ?, IIF(? = 0, 0, 1 + (n + ?) % ?), CAST(n + ? AS NVARCHAR(20))
            FROM (SELECT n = ROW_NUMBER() OVER (ORDER BY (SELECT NULL))
                  FROM sys.all_objects AS a CROSS JOIN sys.all_objects AS b) AS numbers
            """,
            size, PROBE, spread, done, max(spread, 1), done,
        )
        done += size
    last = cursor.execute("SELECT ISNULL(MAX(ID), 0) FROM dbo.tabDIYTable12402").fetchval()
    return first + 1, last


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


def lateness(conn, first: int, last: int) -> tuple[list[float], float, int]:
    """Lateness in seconds of every finished task, the run's span in seconds, and failures."""
    cursor = conn.cursor()
    values = [
        row[0] / 1000.0
        for row in cursor.execute(
            "SELECT DATEDIFF_BIG(MILLISECOND, DueAtUtc, FirstStartedAtUtc) FROM delay.Task "
            "WHERE TaskID BETWEEN ? AND ? AND FirstStartedAtUtc IS NOT NULL",
            first, last,
        ).fetchall()
    ]
    span_ms = cursor.execute(
        "SELECT DATEDIFF_BIG(MILLISECOND, MIN(CreatedAtUtc), MAX(FinishedAtUtc)) FROM delay.Task "
        "WHERE TaskID BETWEEN ? AND ?",
        first, last,
    ).fetchval()
    failed = cursor.execute(
        "SELECT COUNT(*) FROM delay.Task WHERE TaskID BETWEEN ? AND ? AND TaskState <> N'Done'",
        first, last,
    ).fetchval()
    return values, (span_ms or 0) / 1000.0, failed


def cleanup(conn, first: int, last: int) -> None:
    cursor = conn.cursor()
    cursor.execute("DELETE FROM delay.Log WHERE TaskID BETWEEN ? AND ?", first, last)
    cursor.execute("DELETE FROM delay.Task WHERE TaskID BETWEEN ? AND ?", first, last)
    cursor.execute("DELETE FROM dbo.tabDIYTable12402 WHERE ID BETWEEN ? AND ?", first, last)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("url", nargs="?", default=os.environ.get("MAILQ_DB_URL"))
    parser.add_argument("--tasks", type=int, default=10_000)
    parser.add_argument("--spread", type=int, default=60, help="largest delay of run 2, seconds")
    parser.add_argument("--keep", action="store_true", help="keep the benchmark's rows")
    args = parser.parse_args(argv)

    if not args.url:
        print("delay_throughput: no server (pass a URL or set MAILQ_DB_URL); nothing measured.")
        return 0
    try:
        from mailq_db.connection import connect

        conn = connect(args.url)
        prepare(conn)
    except Exception as exc:  # noqa: BLE001 - any failure to reach the server ends the run politely
        print(f"delay_throughput: cannot use the server: {exc}; nothing measured.")
        return 0

    readers = conn.cursor().execute(
        "SELECT max_readers FROM sys.service_queues WHERE object_id = OBJECT_ID(N'dbo.DelayServiceQueue')"
    ).fetchval()
    print(f"dbo.DelayServiceQueue MAX_QUEUE_READERS = {readers}")

    for label, spread in (("delay 0", 0), (f"delays 1..{args.spread} s", args.spread)):
        started = time.monotonic()
        first, last = schedule(conn, args.tasks, spread)
        inserted = time.monotonic() - started
        finished = wait(conn, first, last, timeout=spread + 600)
        values, span, failed = lateness(conn, first, last)
        print(f"\n{label}: {last - first + 1} tasks, inserted in {inserted:.1f} s "
              f"({(last - first + 1) / max(inserted, 1e-9):.0f} rows/s)")
        if not finished:
            print("  not all tasks finished within the time limit")
        if spread == 0:
            print(f"  throughput {len(values) / max(span, 1e-9):.0f} tasks/s over {span:.1f} s; "
                  f"largest lateness {max(values, default=float('nan')):.3f} s")
        else:
            print(f"  lateness p50 {percentile(values, 0.50):.3f} s, p99 {percentile(values, 0.99):.3f} s, "
                  f"max {max(values, default=float('nan')):.3f} s")
        print(f"  not done: {failed}")
        if not args.keep:
            cleanup(conn, first, last)
    conn.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
