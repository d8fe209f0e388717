"""Many sessions at once against SQL Server 2022.

* 8 worker threads, each with its own connection, claim batches of 25 from
  2,000 queued mails and acknowledge each batch with one MarkSent: every mail
  is claimed exactly once overall (no duplicate, none lost), ends Sent with
  one attempt, and is never flagged as a possible duplicate.
* A claimer never waits on another: while one session holds claimed rows (and
  an account's rate budget) in an open transaction, a second session with
  LOCK_TIMEOUT set claims other mail at once, skipping what is held.
* Rate limits hold across sessions: an account with PerMinuteLimit = 5 and 20
  due mails yields exactly 5 to two connections claiming alternately, and at
  most 5 to two threads claiming at the same moment, all within one fixed UTC
  minute (the test waits for a new minute when the server's clock is past :50).
"""

from __future__ import annotations

import threading
import time
import uuid

import pytest

from mailq_helpers import (
    attempts,
    claim,
    connection,
    enqueue,
    query,
    result_sets,
    run_threads,
    scalar,
    new_account,
    new_app,
    wait_out_minute_boundary,
)
from mailq_db import procedures
from mailq_db.errors import DatabaseError

pytestmark = pytest.mark.integration

WORKERS = 8
MAILS = 2000
BATCH = 25


def test_eight_workers_claim_every_mail_exactly_once(mssql_url, conn):
    account = new_account(conn, "many")
    app = new_app(conn, "many")
    expected = {r.mail_id for r in enqueue(conn, account, app, MAILS)}
    assert len(expected) == MAILS

    lock = threading.Lock()
    acked = [0]

    def worker(i: int, barrier: threading.Barrier) -> list[int]:
        claimed: list[int] = []
        with connection(mssql_url) as c:
            barrier.wait()
            deadline = time.monotonic() + 240
            idle = 0
            while time.monotonic() < deadline:
                token, mails = claim(c, app, batch_size=BATCH, lease_seconds=300, worker_name=f"worker-{i}")
                if mails:
                    idle = 0
                    ids = [m.id for m in mails]
                    claimed.extend(ids)
                    acks = procedures.mark_sent(c, ids=ids, lock_token=token, smtp_code=250)
                    assert len(acks) == len(ids)
                    with lock:
                        acked[0] += len(ids)
                    continue
                with lock:
                    if acked[0] >= MAILS:
                        break
                idle += 1
                if idle > 1000:  # 10 s without any mail while some are missing
                    break
                time.sleep(0.01)
        return claimed

    per_worker = run_threads(WORKERS, worker, timeout=300)
    everything = [mail_id for ids in per_worker for mail_id in ids]
    duplicates = len(everything) - len(set(everything))
    assert duplicates == 0, f"{duplicates} mails were claimed twice"
    assert set(everything) == expected, f"{len(expected - set(everything))} mails were never claimed"
    assert sum(1 for ids in per_worker if ids) >= 2, "only one worker ever got mail: no concurrency was tested"

    rows = query(conn, "SELECT Status, AttemptCount, PossibleDuplicate, COUNT_BIG(*) FROM mailq.MailQueue "
                       "WHERE AppName = ? GROUP BY Status, AttemptCount, PossibleDuplicate;", app)
    assert [(r[0], r[1], bool(r[2]), r[3]) for r in rows] == [("Sent", 1, False, MAILS)]
    assert scalar(conn, "SELECT COUNT_BIG(*) FROM mailq.MailAttempt AS t INNER JOIN mailq.MailQueue AS q "
                        "ON t.MailID = q.ID WHERE q.AppName = ? AND t.Outcome = N'Sent';", app) == MAILS
    assert scalar(conn, "SELECT COUNT_BIG(*) FROM mailq.MailAttempt AS t INNER JOIN mailq.MailQueue AS q "
                        "ON t.MailID = q.ID WHERE q.AppName = ? AND t.AttemptNo > 1;", app) == 0


def _claim_in_open_transaction(c, app: str, batch: int) -> tuple[object, set[int]]:
    """BEGIN TRANSACTION, then ClaimMail inside it (the procedure works inside the caller's transaction)."""
    cursor = c.cursor()
    cursor.execute("BEGIN TRANSACTION;")
    cursor.execute("EXEC mailq.ClaimMail @BatchSize = ?, @LockToken = ?, @LeaseSeconds = 300, @AppName = ?;",
                   batch, str(uuid.uuid4()), app)
    sets = result_sets(cursor)
    return cursor, {int(r[0]) for r in sets[0]}


def test_a_claimer_never_waits_on_another(mssql_url, conn):
    free = new_account(conn, "free")
    limited = new_account(conn, "held", per_minute=100)
    app = new_app(conn, "nowait")
    wait_out_minute_boundary(conn)
    free_ids = {r.mail_id for r in enqueue(conn, free, app, 10)}
    limited_ids = {r.mail_id for r in enqueue(conn, limited, app, 3)}

    with connection(mssql_url) as holder, connection(mssql_url) as other:
        cursor, held = _claim_in_open_transaction(holder, app, 8)
        try:
            assert len(held) == 8
            other_cursor = other.cursor()
            other_cursor.execute("SET LOCK_TIMEOUT 3000;")
            started = time.monotonic()
            try:
                _, got = claim(other, app, batch_size=100)
            except DatabaseError as exc:
                if exc.number == 1222:  # lock request time out period exceeded
                    pytest.fail("mailq.ClaimMail waited on another claimer's open transaction "
                                f"(LOCK_TIMEOUT 3000 ms): {exc.message}")
                raise
            elapsed = time.monotonic() - started
            got_ids = {m.id for m in got}
            assert elapsed < 2.5, f"the second claimer waited {elapsed:.1f} s"
            assert not got_ids & held, "a mail held by an open claim was claimed again"
            # The open claim also holds the budget row of every rate-limited account
            # (UPDLOCK until its transaction ends): the second claimer skips that
            # account's mail (READPAST) instead of waiting, and takes the free rest.
            # (Since 0005 the batch is shared between the two accounts.)
            assert held <= free_ids | limited_ids and held & limited_ids
            assert got_ids == free_ids - held
        finally:
            cursor.execute("IF @@TRANCOUNT > 0 ROLLBACK TRANSACTION;")
            cursor.close()
    # Rolled back: the held mails are claimable again.
    _, rest = claim(conn, app, batch_size=100)
    assert {m.id for m in rest} == (free_ids | limited_ids) - got_ids


def budget(conn, account: str) -> tuple[int, int, int]:
    ((minute, hour, day),) = query(
        conn, "SELECT MinuteCount, HourCount, DayCount FROM mailq.RateBudget WHERE AccountName = ?;", account)
    return minute, hour, day


def test_rate_limit_is_shared_by_two_connections_claiming_alternately(mssql_url, conn):
    account = new_account(conn, "rate", per_minute=5)
    app = new_app(conn, "rate")
    enqueue(conn, account, app, 20)
    wait_out_minute_boundary(conn)
    counts = []
    with connection(mssql_url) as one, connection(mssql_url) as two:
        for round_no in range(8):
            c = one if round_no % 2 == 0 else two
            token, mails = claim(c, app, batch_size=3)
            counts.append(len(mails))
            if mails:
                procedures.mark_sent(c, ids=[m.id for m in mails], lock_token=token)
    assert sum(counts) == 5, f"claims per round: {counts} (limit 5 per minute)"
    assert counts[:2] == [3, 2] and set(counts[2:]) == {0}
    assert budget(conn, account) == (5, 5, 5)
    assert scalar(conn, "SELECT COUNT_BIG(*) FROM mailq.MailQueue WHERE AccountName = ? AND Status = N'UnSent';",
                  account) == 15


def test_rate_limit_holds_when_two_sessions_claim_at_the_same_moment(mssql_url, conn):
    account = new_account(conn, "ratec", per_minute=5)
    app = new_app(conn, "ratec")
    enqueue(conn, account, app, 20)
    wait_out_minute_boundary(conn)

    def worker(i, barrier):
        total = 0
        with connection(mssql_url) as c:
            barrier.wait()
            for _ in range(10):
                _, mails = claim(c, app, batch_size=2)
                total += len(mails)
        return total

    totals = run_threads(2, worker)
    assert 0 < sum(totals) <= 5, f"claimed {totals} with a limit of 5 per minute"
    # Sequential claims in the same minute take exactly what is left of the budget.
    _, more = claim(conn, app, batch_size=20)
    assert sum(totals) + len(more) == 5
    assert budget(conn, account)[0] == 5


def test_hour_and_day_limits(conn):
    account = new_account(conn, "hourday", per_hour=3, per_day=4)
    app = new_app(conn, "hourday")
    enqueue(conn, account, app, 10)
    wait_out_minute_boundary(conn)
    _, first = claim(conn, app, batch_size=10)
    _, second = claim(conn, app, batch_size=10)
    assert (len(first), len(second)) == (3, 0), "the smallest remaining window is the budget"
    mail_id = first[0].id
    assert len(attempts(conn, mail_id)) == 1
