"""Benchmark: batch enqueue (mailq.EnqueueMailBatch) against single enqueues (issue 16, point 6).

    python bench/enqueue_batch.py [--url URL] [--mails 10000] [--singles 2000] [--keys] [--rounds 3] [--keep]

URL: ``--url`` or ``MAILQ_DB_URL``, as for bench/claim_ack.py (a fresh
database ``mailq_bench_<hex>`` is created, deployed with ``alembic upgrade
head -x broker=off`` and dropped unless ``--keep``).

In one run, on one connection (autocommit, as an application's), printed side
by side:

* ``batch JSON``   ``--mails`` mails in ONE call of mailq.EnqueueMailBatch
                   (procedures.enqueue_mail_batch: JSON in @Mails);
* ``batch TVP``    the same through the table-valued parameter (@MailRows),
                   when the driver binds it (pyodbc >= 4.0.32 with Microsoft's
                   ODBC driver); "n/a" with the driver's error otherwise;
* ``single``       ``--singles`` mails, one mailq.EnqueueMail call each (one
                   round trip and one transaction per mail), as an
                   application without the batch would send them;
* ``single, one transaction``  the same calls inside one transaction
                   (one commit), to separate round trips from commits.

Every mail has a recipient, subject, body and the bench account; with
``--keys`` every mail also carries a unique idempotency key (the batch then
takes one application lock per key: see the procedure's header).  Each
variant runs ``--rounds`` times; printed: mails/s (best and median round),
ms per mail, and the batch/single ratio.  A benchmark prints figures and
asserts nothing.  Without a URL, or when the server cannot be reached, it
prints one line saying that it needs a SQL Server and exits 0.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import uuid

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "src"))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "integration"))
sys.path.insert(0, HERE)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--url", default=os.environ.get("MAILQ_DB_URL"), help="SQL Server URL (default: MAILQ_DB_URL)")
    p.add_argument("--mails", type=int, default=10000, help="mails per batch call (1-10000, default 10000)")
    p.add_argument("--singles", type=int, default=2000, help="mails sent one call each (default 2000)")
    p.add_argument("--keys", action="store_true", help="give every mail a unique idempotency key")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--keep", action="store_true")
    args = p.parse_args(argv)
    if not 1 <= args.mails <= 10000:
        p.error("--mails must be 1-10000")
    return args


def make_mails(n: int, account: str, keys: bool) -> list[dict]:
    tag = uuid.uuid4().hex[:8]
    out = []
    for i in range(n):
        mail = dict(to_address=f"r{i}@example.com", subject=f"bench {i}", body=f"body {i} " + "x" * 200,
                    account_name=account)
        if keys:
            mail["idempotency_key"] = f"bench-{tag}-{i}"
        out.append(mail)
    return out


def map_bench_user(conn, account: str) -> str:
    """A new installation refuses a user mapped to no application (50500,
    docs/enqueue.md): bind an application to the account and map the bench's
    own database user to it, as an application's login would be.  Every mail
    then goes through the binding checks, as it does in production."""
    from mailq_db import procedures

    app = f"bench_{uuid.uuid4().hex[:8]}"
    procedures.upsert_application(conn, app_name=app)
    procedures.bind_application(conn, app_name=app, account_name=account, from_address="bench@example.org")
    user = conn.cursor().execute("SELECT USER_NAME();").fetchone()[0]
    procedures.bind_application(conn, app_name=app, principal_name=user)
    return app


def timed(fn) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def summary(name: str, mails: int, seconds: list[float]) -> tuple[str, float | None, str]:
    if not seconds:
        return name, None, ""
    rates = [mails / s for s in seconds if s > 0]
    best, median = max(rates), statistics.median(rates)
    ms = 1000 * min(seconds) / mails
    return name, median, f"{best:12,.0f} {median:12,.0f} {ms:10.3f}"


def main(argv=None) -> int:
    args = parse_args(argv)
    needs = "enqueue_batch: needs a SQL Server"
    if not args.url:
        print(f"{needs} (pass --url or set MAILQ_DB_URL); nothing measured.")
        return 0
    try:
        from mailq_db.connection import connect

        connect(args.url, timeout=10).close()
    except Exception as exc:  # noqa: BLE001 - any failure: no server to measure
        print(f"{needs}: cannot connect ({type(exc).__name__}: {exc}); nothing measured.")
        return 0

    from claim_ack import create_database, drop_database
    from mailq_db import procedures
    from mailq_db.connection import connect

    created, url = create_database(args.url)
    print(f"database {created} created and deployed; batch {args.mails:,} mails, singles {args.singles:,}, "
          f"keys {'on' if args.keys else 'off'}, {args.rounds} rounds")
    try:
        conn = connect(url)
        try:
            account = f"bench_{uuid.uuid4().hex[:8]}"
            procedures.upsert_sending_account(conn, account_name=account, default_from_address="bench@example.org")
            map_bench_user(conn, account)
            times: dict[str, list[float]] = {"batch JSON": [], "batch TVP": [], "single": [],
                                             "single, one transaction": []}
            tvp_error = None
            for _ in range(args.rounds):
                batch = make_mails(args.mails, account, args.keys)
                times["batch JSON"].append(timed(lambda b=batch: procedures.enqueue_mail_batch(conn, b)))
                if tvp_error is None:
                    batch = make_mails(args.mails, account, args.keys)
                    try:
                        times["batch TVP"].append(
                            timed(lambda b=batch: procedures.enqueue_mail_batch(conn, b, use_tvp=True)))
                    except Exception as exc:  # noqa: BLE001 - reported as n/a
                        tvp_error = f"{type(exc).__name__}: {str(exc)[:120]}"
                singles = make_mails(args.singles, account, args.keys)
                times["single"].append(timed(lambda s=singles: [procedures.enqueue_mail(conn, **m) for m in s]))
                singles = make_mails(args.singles, account, args.keys)

                def one_transaction(s=singles):
                    conn.autocommit = False
                    try:
                        for m in s:
                            procedures.enqueue_mail(conn, **m)
                        conn.commit()
                    finally:
                        conn.autocommit = True

                times["single, one transaction"].append(timed(one_transaction))
        finally:
            conn.close()

        print(f"{'variant':26} {'mails/call':>10} {'best m/s':>12} {'median m/s':>12} {'ms/mail':>10}")
        rows = {}
        for name, seconds in times.items():
            per_call = args.mails if name.startswith("batch") else 1
            mails = args.mails if name.startswith("batch") else args.singles
            label, median, text = summary(name, mails, seconds)
            rows[name] = median
            print(f"{label:26} {per_call:10,} {text}" if text else f"{label:26} {per_call:10,} n/a ({tvp_error})")
        if rows.get("single"):
            for name in ("batch JSON", "batch TVP"):
                if rows.get(name):
                    print(f"{name} / single (median mails/s): {rows[name] / rows['single']:.1f}x")
    finally:
        if not args.keep:
            drop_database(args.url, created)
            print(f"database {created} dropped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
