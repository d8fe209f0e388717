"""Benchmark: claim + batched acknowledgement throughput of the mail queue on SQL Server.

    python bench/claim_ack.py [--url URL] [--database NAME] [--depths 10000,1000000]
                              [--workers 8] [--batch 100] [--seconds 20] [--keep]
                              [--skew 100000] [--app-skew 100000] [--eligible 1000] [--rounds 5]

URL: ``--url`` or ``MAILQ_DB_URL`` (``mssql+pyodbc://sa:...@127.0.0.1:14330/master?TrustServerCertificate=yes``
or an ODBC connection string), naming any database the login can create
databases from.  Without ``--database`` a fresh database ``mailq_bench_<hex>``
is created (READ_COMMITTED_SNAPSHOT on, as the fixtures do), deployed with
``alembic upgrade head -x broker=off`` (the mail queue alone) and dropped at
the end unless ``--keep``; with ``--database`` that database is used as it is
(it must be deployed already).

For each depth (default 10,000 then 1,000,000), the queue is topped up to
that many due UnSent mails with a set-based INSERT (tests/integration/
mailq_helpers.bulk_fill), then ``--workers`` threads, each with its own
connection, claim ``--batch`` mails (mailq.ClaimMail) and acknowledge each
claim with ONE batched mailq.MarkSent, until half the depth is processed or
``--seconds`` pass.  Printed per depth:

* mails/s (claimed and acknowledged);
* p50 / p99 latency of a ClaimMail call, in ms;
* logical reads per ClaimMail execution, from sys.dm_exec_procedure_stats
  (total_logical_reads / execution_count over the run; needs VIEW SERVER STATE);
* commits per mail: every ClaimMail and every MarkSent is one transaction
  (autocommit connections), so (claims + acknowledgements) / mails.

Then the skewed-backlog comparison (issue 10): ``--skew`` (default 100,000)
due priority-9 mails of an account whose daily budget is spent rank ahead of
``--eligible`` (default 1,000) priority-0 mails of an eligible account; the
workers claim for both accounts (``@AccountNames``) until the eligible mails
are sent, ``--rounds`` times (the eligible mails are reset to due between
rounds).  The same runs without the skew (the spent account holds no mail)
come first.  Printed side by side: mails/s, logical reads per claim, p50 /
p99 claim latency, and the skew / no-skew ratios (issue 10's target: within
20 %; revision 0004's claim read every skewed row on every claim).
``--skew 0`` leaves the comparison out.

Then the same comparison for an isolated worker (the third queue reading,
M1): ``--app-skew`` (default 100,000) due priority-9 mails of application X
on the very account whose ``--eligible`` priority-0 mails of application Y
the workers claim with ``@AppName = Y``; against the same runs without X's
backlog.  Before IX_MailQueue_ClaimByApp every such claim read X's whole
due backlog (AppName was a residual predicate of the claim's seek); the
target is the same as above.  ``--app-skew 0`` leaves it out.

Issue 3's targets on a 2-core SQL Server 2022 container: logical reads per
claim that do not grow with depth, and >= 5,000 mails/s with batch 100.  A
benchmark prints figures and asserts nothing.  Without a URL, or when the
server cannot be reached, it says so and exits 0.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time
import uuid
from urllib.parse import urlsplit, urlunsplit

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "src"))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "integration"))

PROC_STATS = (
    "SELECT COALESCE(SUM(total_logical_reads), 0), COALESCE(SUM(execution_count), 0) "
    "FROM sys.dm_exec_procedure_stats "
    "WHERE database_id = DB_ID() AND object_id = OBJECT_ID(N'mailq.ClaimMail');"
)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--url", default=os.environ.get("MAILQ_DB_URL"), help="SQL Server URL (default: MAILQ_DB_URL)")
    p.add_argument("--database", help="use this deployed database instead of creating a fresh one")
    p.add_argument("--depths", default="10000,1000000", help="queue depths, comma-separated (default 10000,1000000)")
    p.add_argument("--workers", type=int, default=8, help="worker threads (default 8)")
    p.add_argument("--batch", type=int, default=100, help="mails per claim (default 100)")
    p.add_argument("--seconds", type=float, default=20.0, help="longest run per depth (default 20)")
    p.add_argument("--keep", action="store_true", help="keep the database this run created")
    p.add_argument("--skew", type=int, default=100_000,
                   help="unclaimable due mails ranked ahead in the skewed scenario (default 100000; 0: skip)")
    p.add_argument("--app-skew", type=int, default=100_000,
                   help="due mails of another application on the isolated workers' account (default 100000; "
                        "0: skip)")
    p.add_argument("--eligible", type=int, default=1_000, help="eligible mails per skew round (default 1000)")
    p.add_argument("--rounds", type=int, default=5, help="rounds of the skew comparison (default 5)")
    return p.parse_args(argv)


def with_database(url: str, database: str) -> str:
    """``url`` pointing at ``database`` (SQLAlchemy-style URL or ODBC connection string)."""
    if "://" in url:
        parts = urlsplit(url)
        return urlunsplit((parts.scheme, parts.netloc, "/" + database, parts.query, parts.fragment))
    items = [kv for kv in url.split(";") if kv.strip() and not kv.strip().upper().startswith("DATABASE=")]
    return ";".join(items + [f"DATABASE={database}"])


def percentile(values: list[float], p: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    k = min(len(ordered) - 1, max(0, round(p / 100 * (len(ordered) - 1))))
    return ordered[k]


def proc_stats(conn) -> tuple[int, int]:
    cursor = conn.cursor()
    try:
        row = cursor.execute(PROC_STATS).fetchone()
        return int(row[0]), int(row[1])
    except Exception:  # noqa: BLE001 - no VIEW SERVER STATE: reads are then not reported
        return -1, -1
    finally:
        cursor.close()


def create_database(server_url: str) -> tuple[str, str]:
    from alembic import command

    from mailq_db.connection import connect
    from mailq_db.deployment import alembic_config

    name = f"mailq_bench_{uuid.uuid4().hex[:10]}"
    master = connect(server_url)
    try:
        cursor = master.cursor()
        cursor.execute(f"CREATE DATABASE [{name}]")
        # The benchmark's own database only (as the test fixtures do); the package never does this.
        cursor.execute(f"ALTER DATABASE [{name}] SET READ_COMMITTED_SNAPSHOT ON WITH ROLLBACK IMMEDIATE")
    finally:
        master.close()
    url = with_database(server_url, name)
    command.upgrade(alembic_config(x_args=[f"url={url}", "broker=off"]), "head")
    return name, url


def drop_database(server_url: str, name: str) -> None:
    from mailq_db.connection import connect

    master = connect(server_url)
    try:
        master.cursor().execute(
            f"IF DB_ID(N'{name}') IS NOT NULL BEGIN "
            f"ALTER DATABASE [{name}] SET SINGLE_USER WITH ROLLBACK IMMEDIATE; DROP DATABASE [{name}]; END")
    finally:
        master.close()


def top_up(conn, account: str, depth: int) -> float:
    """Make the queue hold ``depth`` due UnSent mails; returns the seconds the fill took."""
    from mailq_helpers import bulk_fill, scalar

    have = int(scalar(conn, "SELECT COUNT_BIG(*) FROM mailq.MailQueue WHERE Status = N'UnSent';"))
    started = time.perf_counter()
    if depth > have:
        bulk_fill(conn, account, depth - have)
    conn.cursor().execute("UPDATE STATISTICS mailq.MailQueue;")
    return time.perf_counter() - started


def run_depth(url: str, depth: int, workers: int, batch: int, seconds: float,
              target: int | None = None, account_names: list[str] | None = None,
              app_name: str | None = None) -> dict:
    from mailq_db import procedures
    from mailq_db.connection import connect

    target = target or max(batch, depth // 2)
    lock = threading.Lock()
    stop = threading.Event()
    totals = {"mails": 0, "claims": 0, "acks": 0, "empty": 0}
    latencies: list[float] = []
    errors: list[BaseException] = []
    barrier = threading.Barrier(workers + 1)

    def worker(i: int) -> None:
        mine: list[float] = []
        try:
            conn = connect(url)
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            errors.append(exc)
            barrier.abort()
            return
        try:
            barrier.wait()
            idle = 0
            while not stop.is_set():
                token = uuid.uuid4()
                t = time.perf_counter()
                mails = procedures.claim_mail(conn, batch_size=batch, lock_token=token, lease_seconds=300,
                                              worker_name=f"bench-{i}", account_names=account_names,
                                              app_name=app_name)
                mine.append(time.perf_counter() - t)
                if not mails:
                    with lock:
                        totals["claims"] += 1
                        totals["empty"] += 1
                    idle += 1
                    if idle > 200:
                        break
                    time.sleep(0.005)
                    continue
                idle = 0
                procedures.mark_sent(conn, ids=[m.id for m in mails], lock_token=token, smtp_code=250)
                with lock:
                    totals["claims"] += 1
                    totals["acks"] += 1
                    totals["mails"] += len(mails)
                    if totals["mails"] >= target:
                        stop.set()
        except threading.BrokenBarrierError:
            pass  # another worker could not connect: reported through its error
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            errors.append(exc)
            stop.set()
        finally:
            with lock:
                latencies.extend(mine)
            conn.close()

    probe = connect(url)
    try:
        reads0, execs0 = proc_stats(probe)
        threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(workers)]
        for t in threads:
            t.start()
        try:
            barrier.wait()
        except threading.BrokenBarrierError:
            stop.set()
        started = time.perf_counter()
        stop.wait(seconds)
        stop.set()
        for t in threads:
            t.join(60)
        elapsed = time.perf_counter() - started
        reads1, execs1 = proc_stats(probe)
    finally:
        probe.close()
    if errors:
        raise errors[0]
    if reads0 < 0 or reads1 < 0:
        reads_per_claim = None
    elif execs1 - execs0 == totals["claims"] and execs1 > execs0:
        reads_per_claim = (reads1 - reads0) / (execs1 - execs0)
    else:  # the plan was (re)compiled during the run: average of the current plan
        reads_per_claim = reads1 / execs1 if execs1 else None
    return {
        "depth": depth,
        "elapsed": elapsed,
        "mails": totals["mails"],
        "claims": totals["claims"],
        "acks": totals["acks"],
        "empty": totals["empty"],
        "p50_ms": percentile(latencies, 50) * 1000,
        "p99_ms": percentile(latencies, 99) * 1000,
        "mean_ms": statistics.fmean(latencies) * 1000 if latencies else float("nan"),
        "reads_per_claim": reads_per_claim,
    }


RESET_ELIGIBLE = (
    "UPDATE mailq.MailQueue SET Status = N'UnSent', ThreadLock = NULL, AttemptsRemaining = 5, "
    "VisibleAtUtc = DATEADD(SECOND, -1, SYSUTCDATETIME()), SentAtUtc = NULL, DateProcessed = NULL "
    "WHERE AccountName = ?;"
)


def new_bench_account(conn, prefix: str, **limits) -> str:
    from mailq_db import procedures

    name = f"{prefix}_{uuid.uuid4().hex[:8]}"
    procedures.upsert_sending_account(conn, account_name=name, default_from_address="bench@example.org",
                                      **limits)
    return name


def spend_daily_budget(conn, account: str) -> None:
    """Benchmark-only write: the account's daily budget (limit 1) is spent for today."""
    conn.cursor().execute(
        "UPDATE mailq.RateBudget SET DayStartUtc = CAST(CAST(SYSUTCDATETIME() AS DATE) AS DATETIME2(0)), "
        "DayCount = 1 WHERE AccountName = ?;", account)


def skew_scenario(conn, url: str, args, skewed: bool) -> dict:
    """``args.rounds`` rounds of ``args.eligible`` eligible mails, with or without
    ``args.skew`` due mails of a budget-exhausted account ranked ahead."""
    from mailq_helpers import bulk_fill

    eligible = new_bench_account(conn, "eligible")
    spent = new_bench_account(conn, "spent", per_day_limit=1)
    bulk_fill(conn, eligible, args.eligible)
    cursor = conn.cursor()
    cursor.execute("UPDATE mailq.MailQueue SET Priority = 0 WHERE AccountName = ?;", eligible)
    if skewed:
        bulk_fill(conn, spent, args.skew)
        cursor.execute("UPDATE mailq.MailQueue SET Priority = 9 WHERE AccountName = ?;", spent)
    spend_daily_budget(conn, spent)
    cursor.execute("UPDATE STATISTICS mailq.MailQueue;")
    runs = []
    for _ in range(max(1, args.rounds)):
        cursor.execute(RESET_ELIGIBLE, eligible)
        runs.append(run_depth(url, args.eligible, args.workers, args.batch, args.seconds,
                              target=args.eligible, account_names=[eligible, spent]))
    cursor.close()
    return summarize(runs)


RESET_APP = (
    "UPDATE mailq.MailQueue SET Status = N'UnSent', ThreadLock = NULL, AttemptsRemaining = 5, "
    "VisibleAtUtc = DATEADD(SECOND, -1, SYSUTCDATETIME()), SentAtUtc = NULL, DateProcessed = NULL "
    "WHERE AccountName = ? AND AppName = ?;"
)


def app_skew_scenario(conn, url: str, args, skewed: bool) -> dict:
    """``args.rounds`` rounds in which isolated workers of application Y claim
    ``args.eligible`` mails of Y from an account that, when ``skewed``, also
    holds ``args.app_skew`` due mails of application X ranked ahead."""
    from mailq_db import procedures
    from mailq_helpers import bulk_fill

    shared = new_bench_account(conn, "shared")
    bulk_app, isolated = f"benchx_{uuid.uuid4().hex[:8]}", f"benchy_{uuid.uuid4().hex[:8]}"
    for app in (bulk_app, isolated):
        procedures.upsert_application(conn, app_name=app, description="bench/claim_ack.py")
    bulk_fill(conn, shared, args.eligible, app=isolated)
    cursor = conn.cursor()
    cursor.execute("UPDATE mailq.MailQueue SET Priority = 0 WHERE AccountName = ? AND AppName = ?;",
                   shared, isolated)
    if skewed:
        bulk_fill(conn, shared, args.app_skew, app=bulk_app)
        cursor.execute("UPDATE mailq.MailQueue SET Priority = 9 WHERE AccountName = ? AND AppName = ?;",
                       shared, bulk_app)
    cursor.execute("UPDATE STATISTICS mailq.MailQueue;")
    runs = []
    for _ in range(max(1, args.rounds)):
        cursor.execute(RESET_APP, shared, isolated)
        runs.append(run_depth(url, args.eligible, args.workers, args.batch, args.seconds,
                              target=args.eligible, account_names=[shared], app_name=isolated))
    cursor.close()
    return summarize(runs)


def summarize(runs: list[dict]) -> dict:
    mails = sum(r["mails"] for r in runs)
    elapsed = sum(r["elapsed"] for r in runs)
    reads = [r["reads_per_claim"] for r in runs if r["reads_per_claim"] is not None]
    return {
        "mails_per_s": mails / elapsed if elapsed > 0 else float("nan"),
        "reads_per_claim": statistics.fmean(reads) if reads else None,
        "p50_ms": statistics.median(r["p50_ms"] for r in runs),
        "p99_ms": max(r["p99_ms"] for r in runs),
        "claims": sum(r["claims"] for r in runs),
    }


def print_skew(plain: dict, skew: dict, args, *, title: str | None = None, label: str | None = None) -> None:
    def fmt(v, spec):
        return format(v, spec) if v is not None else "n/a"

    print(title or (f"skewed backlog: {args.skew:,} due mails of a budget-exhausted account ranked ahead of "
                    f"{args.eligible:,} eligible ({args.rounds} rounds, workers {args.workers}, "
                    f"batch {args.batch})"))
    print(f"{'':24}{'mails/s':>12}{'reads/claim':>14}{'p50 ms':>10}{'p99 ms':>10}")
    for name, r in (("no skew", plain), (label or f"skew {args.skew:,} ahead", skew)):
        print(f"{name:24}{fmt(r['mails_per_s'], ',.0f'):>12}{fmt(r['reads_per_claim'], ',.0f'):>14}"
              f"{r['p50_ms']:>10.1f}{r['p99_ms']:>10.1f}")
    rate = skew["mails_per_s"] / plain["mails_per_s"] if plain["mails_per_s"] else float("nan")
    if plain["reads_per_claim"] and skew["reads_per_claim"] is not None:
        reads = f"{skew['reads_per_claim'] / plain['reads_per_claim']:.2f}"
    else:
        reads = "n/a"
    print(f"{'skew / no skew':24}{rate:>12.2f}{reads:>14}   (target: mails/s >= 0.80, reads <= 1.20)")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not args.url:
        print("claim_ack: no server (pass --url or set MAILQ_DB_URL); nothing measured.")
        return 0
    try:
        depths = [int(d.replace("_", "")) for d in args.depths.split(",") if d.strip()]
    except ValueError:
        print(f"claim_ack: --depths must be integers separated by commas; got {args.depths!r}")
        return 2

    try:
        from mailq_db.connection import connect

        connect(args.url, timeout=10).close()
    except Exception as exc:  # noqa: BLE001 - any failure: no server to measure
        print(f"claim_ack: no server: cannot connect ({type(exc).__name__}: {exc}); nothing measured.")
        return 0

    from mailq_db import procedures
    from mailq_db.connection import connect

    created = None
    if args.database:
        url = with_database(args.url, args.database)
    else:
        created, url = create_database(args.url)
        print(f"database {created} created and deployed (alembic upgrade head -x broker=off)")
    try:
        conn = connect(url)
        try:
            account = f"bench_{uuid.uuid4().hex[:8]}"
            procedures.upsert_sending_account(conn, account_name=account,
                                              default_from_address="bench@example.org")
            print(f"workers {args.workers}, batch {args.batch}, one batched MarkSent per claim")
            results = []
            for depth in depths:
                fill = top_up(conn, account, depth)
                print(f"depth {depth:,}: queue filled in {fill:.1f} s; measuring...", flush=True)
                r = run_depth(url, depth, args.workers, args.batch, args.seconds)
                results.append(r)
                rate = r["mails"] / r["elapsed"] if r["elapsed"] > 0 else float("nan")
                commits = (r["claims"] + r["acks"]) / r["mails"] if r["mails"] else float("nan")
                reads = f"{r['reads_per_claim']:.0f}" if r["reads_per_claim"] is not None else "n/a"
                print(
                    f"depth {depth:,}: {r['mails']:,} mails in {r['elapsed']:.2f} s = {rate:,.0f} mails/s; "
                    f"claim latency p50 {r['p50_ms']:.1f} ms, p99 {r['p99_ms']:.1f} ms; "
                    f"logical reads per claim {reads}; commits per mail {commits:.3f} "
                    f"({r['claims']:,} claims, {r['empty']:,} empty, {r['acks']:,} acks)",
                    flush=True,
                )
            if args.skew > 0:
                print("skew comparison: filling...", flush=True)
                plain = skew_scenario(conn, url, args, skewed=False)
                skew = skew_scenario(conn, url, args, skewed=True)
                print_skew(plain, skew, args)
            if args.app_skew > 0:
                print("isolated-worker comparison: filling...", flush=True)
                plain = app_skew_scenario(conn, url, args, skewed=False)
                skew = app_skew_scenario(conn, url, args, skewed=True)
                print_skew(plain, skew, args, label=f"other app {args.app_skew:,}", title=(
                    f"isolated workers (@AppName): {args.app_skew:,} due mails of another application on the "
                    f"same account ranked ahead of {args.eligible:,} of theirs ({args.rounds} rounds, "
                    f"workers {args.workers}, batch {args.batch})"))
            with_reads = [r for r in results if r["reads_per_claim"]]
            if len(with_reads) >= 2:
                first, last = with_reads[0], with_reads[-1]
                print(f"reads per claim at {last['depth']:,} / at {first['depth']:,}: "
                      f"{last['reads_per_claim'] / first['reads_per_claim']:.2f} (target: about 1, flat)")
        finally:
            conn.close()
    finally:
        if created and not args.keep:
            drop_database(args.url, created)
            print(f"database {created} dropped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
