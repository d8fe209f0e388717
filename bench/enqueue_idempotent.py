"""Benchmark: idempotent enqueue without key-range locks (issue 10, point 5).

    python bench/enqueue_idempotent.py [--url URL] [--workers 8] [--keys 4000] [--repeat 0.1] [--keep]

URL: ``--url`` or ``MAILQ_DB_URL``, as for bench/claim_ack.py (a fresh
database ``mailq_bench_<hex>`` is created, deployed with ``alembic upgrade
head -x broker=off`` and dropped unless ``--keep``).

Three ways to insert a row unless its key exists, each in a scratch table
``dbo.bench_idem`` (same shape as the key part of mailq.MailQueue: BIGINT
identity, NVARCHAR(200) binary key under a filtered unique index), run by
``--workers`` threads that each insert ``--keys`` / workers keys, the keys of
all threads interleaved (k000001 by thread 1, k000002 by thread 2...) so that
neighbouring keys are inserted at the same moment, and a ``--repeat``
fraction of calls repeating a key another thread already used:

* ``updlock-holdlock``  the code before revision 0007: look the key up WITH
  (UPDLOCK, HOLDLOCK), insert when absent (key-range locks on the gap);
* ``applock``           what mailq.EnqueueMail does since 0007: sp_getapplock
  on the key (transaction-owned, Exclusive), plain lookup, insert when absent;
* ``insert-first``      INSERT, and on error 2601/2627 roll back and read the
  existing row.  Fine in autocommit; inside a caller's transaction under
  XACT_ABORT ON the duplicate-key error dooms that transaction, so the
  outbox case could not get the existing mail back: rejected for
  EnqueueMail (docs/guarantees.md), measured here for the comparison.

Then ``mailq.EnqueueMail`` itself with idempotency keys, the same way.
Printed per variant: calls/s, deadlocks (1205), other errors, rows inserted
(must equal the distinct keys).  A benchmark prints figures and asserts
nothing.  Without a URL, or when the server cannot be reached, it says so and
exits 0.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
import uuid

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "src"))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "integration"))
sys.path.insert(0, HERE)

SETUP = """
IF OBJECT_ID(N'dbo.bench_idem', N'U') IS NOT NULL DROP TABLE dbo.bench_idem;
CREATE TABLE dbo.bench_idem (
    ID BIGINT IDENTITY (1, 1) NOT NULL CONSTRAINT PK_bench_idem PRIMARY KEY CLUSTERED,
    IdemKey NVARCHAR(200) COLLATE Latin1_General_100_BIN2 NULL,
    Payload NVARCHAR(100) NOT NULL
);
CREATE UNIQUE NONCLUSTERED INDEX UX_bench_idem ON dbo.bench_idem (IdemKey) WHERE IdemKey IS NOT NULL;
"""

VARIANTS = {
    "updlock-holdlock": """
SET NOCOUNT, XACT_ABORT ON;
DECLARE @Key NVARCHAR(200) = ?, @ID BIGINT;
BEGIN TRANSACTION;
SELECT @ID = t.ID FROM dbo.bench_idem AS t WITH (UPDLOCK, HOLDLOCK)
WHERE t.IdemKey = @Key AND t.IdemKey IS NOT NULL;
IF @ID IS NULL INSERT INTO dbo.bench_idem (IdemKey, Payload) VALUES (@Key, N'p');
COMMIT TRANSACTION;
""",
    "applock": """
SET NOCOUNT, XACT_ABORT ON;
DECLARE @Key NVARCHAR(200) = ?, @ID BIGINT, @R INT;
DECLARE @Resource NVARCHAR(255) = CONCAT(N'bench.IdemKey:', RTRIM(@Key));
BEGIN TRANSACTION;
EXEC @R = sys.sp_getapplock @Resource = @Resource, @LockMode = N'Exclusive',
    @LockOwner = N'Transaction', @LockTimeout = 10000;
IF @R < 0 THROW 50162, N'applock not granted', 1;
SELECT @ID = t.ID FROM dbo.bench_idem AS t WHERE t.IdemKey = @Key AND t.IdemKey IS NOT NULL;
IF @ID IS NULL INSERT INTO dbo.bench_idem (IdemKey, Payload) VALUES (@Key, N'p');
COMMIT TRANSACTION;
""",
    "insert-first": """
SET NOCOUNT, XACT_ABORT ON;
DECLARE @Key NVARCHAR(200) = ?, @ID BIGINT;
BEGIN TRY
    BEGIN TRANSACTION;
    INSERT INTO dbo.bench_idem (IdemKey, Payload) VALUES (@Key, N'p');
    COMMIT TRANSACTION;
END TRY
BEGIN CATCH
    IF XACT_STATE() <> 0 ROLLBACK TRANSACTION;
    IF ERROR_NUMBER() NOT IN (2601, 2627) THROW;
    SELECT @ID = t.ID FROM dbo.bench_idem AS t WHERE t.IdemKey = @Key AND t.IdemKey IS NOT NULL;
END CATCH;
""",
}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--url", default=os.environ.get("MAILQ_DB_URL"), help="SQL Server URL (default: MAILQ_DB_URL)")
    p.add_argument("--workers", type=int, default=8)
    p.add_argument("--keys", type=int, default=4000, help="distinct keys per variant (default 4000)")
    p.add_argument("--repeat", type=float, default=0.1, help="fraction of calls repeating a key (default 0.1)")
    p.add_argument("--keep", action="store_true")
    return p.parse_args(argv)


def plan(workers: int, keys: int, repeat: float, prefix: str) -> list[list[str]]:
    """Per thread, the keys it sends: interleaved neighbours, plus repeats of another thread's keys."""
    per = [[f"{prefix}{n:07d}" for n in range(i, keys, workers)] for i in range(workers)]
    every = max(1, int(round(1 / repeat))) if repeat > 0 else 0
    out = []
    for i, mine in enumerate(per):
        other = per[(i + 1) % workers]
        calls = []
        for j, key in enumerate(mine):
            calls.append(key)
            if every and j % every == 0 and j < len(other):
                calls.append(other[j])
        out.append(calls)
    return out


def run(url: str, calls: list[list[str]], send) -> dict:
    from mailq_db.connection import connect

    stats = {"calls": 0, "deadlocks": 0, "errors": 0}
    lock = threading.Lock()
    barrier = threading.Barrier(len(calls))

    def worker(keys):
        conn = connect(url)
        try:
            barrier.wait()
            for key in keys:
                try:
                    send(conn, key)
                    outcome = "calls"
                except Exception as exc:  # noqa: BLE001 - counted and printed
                    outcome = "deadlocks" if "1205" in str(exc) else "errors"
                with lock:
                    stats[outcome] += 1
        finally:
            conn.close()

    threads = [threading.Thread(target=worker, args=(k,)) for k in calls]
    started = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    stats["elapsed"] = time.perf_counter() - started
    return stats


def main(argv=None) -> int:
    args = parse_args(argv)
    if not args.url:
        print("enqueue_idempotent: no SQL Server given (pass --url or set MAILQ_DB_URL); nothing measured.")
        return 0
    try:
        from mailq_db.connection import connect

        connect(args.url, timeout=10).close()
    except Exception as exc:  # noqa: BLE001 - any failure: no server to measure
        print(f"enqueue_idempotent: cannot connect to SQL Server ({type(exc).__name__}: {exc}); nothing measured.")
        return 0

    from claim_ack import create_database, drop_database
    from mailq_db import procedures
    from mailq_db.connection import connect

    created, url = create_database(args.url)
    print(f"database {created} created and deployed; {args.workers} workers, {args.keys:,} keys, "
          f"repeat {args.repeat:.0%}")
    try:
        conn = connect(url)
        try:
            results = []
            for name, sql in VARIANTS.items():
                cur = conn.cursor()
                cur.execute(SETUP)
                cur.close()

                def send(c, key, sql=sql):
                    cur = c.cursor()
                    cur.execute(sql, key)
                    while cur.nextset():
                        pass
                    cur.close()

                r = run(url, plan(args.workers, args.keys, args.repeat, "k"), send)
                r["rows"] = conn.cursor().execute("SELECT COUNT(*) FROM dbo.bench_idem;").fetchone()[0]
                results.append((name, r))

            account = f"bench_{uuid.uuid4().hex[:8]}"
            procedures.upsert_sending_account(conn, account_name=account, default_from_address="bench@example.org")
            # a new installation refuses an unmapped user (50500): map this one (docs/enqueue.md)
            from enqueue_batch import map_bench_user

            map_bench_user(conn, account)

            def enqueue(c, key):
                procedures.enqueue_mail(c, to_address="r@example.com", subject="bench", body="b",
                                        account_name=account, idempotency_key=key)

            r = run(url, plan(args.workers, args.keys, args.repeat, f"{account}-"), enqueue)
            r["rows"] = conn.cursor().execute("SELECT COUNT(*) FROM mailq.MailQueue WHERE AccountName = ?;",
                                              account).fetchone()[0]
            results.append(("mailq.EnqueueMail (applock)", r))
            conn.cursor().execute("DROP TABLE IF EXISTS dbo.bench_idem;")
        finally:
            conn.close()
        print(f"{'variant':30} {'calls/s':>10} {'deadlocks':>10} {'errors':>8} {'rows':>8} (distinct keys "
              f"{args.keys:,})")
        for name, r in results:
            rate = r["calls"] / r["elapsed"] if r["elapsed"] else float("nan")
            print(f"{name:30} {rate:10,.0f} {r['deadlocks']:10,} {r['errors']:8,} {r['rows']:8,}")
    finally:
        if not args.keep:
            drop_database(args.url, created)
            print(f"database {created} dropped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
