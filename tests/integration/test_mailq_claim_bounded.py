"""The claim's cost is bounded by its batch, finalization is off the claim
path, and rate windows never move backwards (issue 10, points 1, 2, 6;
revision 0005).  SQL Server 2022; every test here fails on revision 0004's
claim.

* Skewed backlog: 50,000 due priority-9 mails of each of three accounts that
  cannot send now -- throttled (daily budget spent), blocked
  (BlockedUntilUtc tomorrow), unserved (not in @AccountNames) -- rank ahead
  of 100 priority-0 mails of an eligible account.  A claim of 100 returns
  exactly the 100 eligible mails; the actual plan reads at most 2 x 100 rows
  of IX_MailQueue_ClaimByAccount; logical reads per claim stay within 20 % of
  the same claim on a database without the skew; inside an open transaction
  the claim holds a few hundred key locks, never an object lock on
  mailq.MailQueue, and no lock escalation is counted
  (sys.dm_db_index_operational_stats).  0004's claim reads and U-locks every
  skewed row (and escalates).
* Skewed backlog of another application: one account shared by app X
  (100,000 due priority-9 mails) and app Y (100 due priority-0 mails).  An
  isolated worker of Y (@AppName = Y) claims exactly Y's 100 mails; the pick
  reads IX_MailQueue_ClaimByApp only, by an Index Seek, at most 2 x 100 rows
  and no Sort below the Top, never IX_MailQueue_ClaimByAccount; logical reads
  per claim stay within 20 % of the same claim without X's backlog; in an
  open transaction the claim holds a few hundred key locks, no object lock,
  no escalation.  A competing worker on the same account still takes X's
  priority-9 mail first.  Before the second index, every such claim read
  X's whole due backlog (AppName was a residual predicate).
* Fair share: two accounts split a batch; an account with little mail leaves
  its share to the other in the next pass; within an account, priority order.
* An expired mail, or one out of attempts, never takes a claim slot.
* mailq.FinalizeMail: Expired / Failed in bounded batches, for blocked and
  unserved accounts too; a live lease is left alone; MoreLeft; errors.
* Rate windows: a stored window later than the claimer's is never moved
  back (deterministic), and claimers racing across a real minute boundary
  never charge a minute more than its limit.
"""

from __future__ import annotations

import json
import time
import uuid
from datetime import timedelta

import pytest

from mailq_helpers import (
    attempts,
    bulk_fill,
    claim,
    connection,
    enqueue,
    execute,
    expect_error,
    mail_row,
    new_account,
    new_app,
    query,
    run_threads,
    scalar,
    server_now,
    showplans,
    statement_plans,
    statuses,
)
from mailq_db import procedures

pytestmark = pytest.mark.integration

SKEW = 50_000
APP_SKEW = 100_000
ELIGIBLE = 100
BATCH = 100
INDEX = "IX_MailQueue_ClaimByAccount"
APP_INDEX = "IX_MailQueue_ClaimByApp"
EXPIRY_WAIT = 2.2  # seconds: a 1-second lease has surely expired


@pytest.fixture(scope="module")
def conn2(mssql_url):
    """A second session: another worker."""
    with connection(mssql_url) as c:
        yield c


def set_priority(conn, account: str, priority: int) -> None:
    execute(conn, "UPDATE mailq.MailQueue SET Priority = ? WHERE AccountName = ? AND Status = N'UnSent';",
            priority, account)


def exhaust_daily_budget(conn, account: str) -> None:
    """Test-only write: the account's daily budget is spent (limit 1, one mail charged today)."""
    execute(conn, "UPDATE mailq.RateBudget SET DayStartUtc = CAST(CAST(SYSUTCDATETIME() AS DATE) AS DATETIME2(0)), "
                  "DayCount = 1 WHERE AccountName = ?;", account)


def block_until_tomorrow(conn, account: str) -> None:
    execute(conn, "UPDATE mailq.SendingAccount SET BlockedUntilUtc = DATEADD(DAY, 1, SYSUTCDATETIME()), "
                  "BlockReason = N'test: throttled by the provider' WHERE AccountName = ?;", account)


@pytest.fixture(scope="module")
def skewed(conn):
    """(eligible, throttled, blocked, unserved) accounts of the module's database."""
    eligible = new_account(conn, "eligible")
    throttled = new_account(conn, "throttled", per_day=1)
    blocked = new_account(conn, "blocked")
    unserved = new_account(conn, "unserved")
    for acct in (throttled, blocked, unserved):
        bulk_fill(conn, acct, SKEW)
        set_priority(conn, acct, 9)
    bulk_fill(conn, eligible, ELIGIBLE)
    set_priority(conn, eligible, 0)
    exhaust_daily_budget(conn, throttled)
    block_until_tomorrow(conn, blocked)
    execute(conn, "UPDATE STATISTICS mailq.MailQueue WITH FULLSCAN;")
    return eligible, throttled, blocked, unserved


def reset_eligible(conn, account: str) -> None:
    """Test-only write: the eligible account's mails are due and unleased again."""
    execute(conn, "UPDATE mailq.MailQueue SET Status = N'UnSent', ThreadLock = NULL, "
                  "VisibleAtUtc = DATEADD(SECOND, -1, SYSUTCDATETIME()), AttemptsRemaining = 5 "
                  "WHERE AccountName = ? AND Status IN (N'UnSent', N'Sending');", account)
    execute(conn, "UPDATE mailq.MailAttempt SET EndedAtUtc = SYSUTCDATETIME(), Outcome = N'Released' "
                  "WHERE EndedAtUtc IS NULL AND MailID IN (SELECT ID FROM mailq.MailQueue WHERE AccountName = ?);",
            account)


def claim_sql(accounts: list[str]) -> tuple[str, list]:
    return ("EXEC mailq.ClaimMail @BatchSize = ?, @LockToken = ?, @LeaseSeconds = ?, @AccountNames = ?;",
            [BATCH, str(uuid.uuid4()), 300, json.dumps(accounts)])


def reads_per_claim(url: str, accounts: list[str], reset) -> float:
    """Logical reads of one ClaimMail execution (sys.dm_exec_procedure_stats delta, warm plan)."""
    stats = ("SELECT total_logical_reads, execution_count FROM sys.dm_exec_procedure_stats "
             "WHERE database_id = DB_ID() AND object_id = OBJECT_ID(N'mailq.ClaimMail');")
    with connection(url) as c:
        total, runs = 0, 0
        for i in range(4):
            reset(c)
            before = query(c, stats)
            got = procedures.claim_mail(c, batch_size=BATCH, lock_token=uuid.uuid4(), lease_seconds=300,
                                        account_names=accounts)
            after = query(c, stats)
            assert len(got) == ELIGIBLE
            if i == 0 or not before or after[0][1] != before[0][1] + 1:
                continue  # the first run compiles; a recompile resets the counters
            total += after[0][0] - before[0][0]
            runs += 1
    assert runs, "no warm execution measured"
    return total / runs


def test_skewed_backlog_claim_returns_the_eligible_mail_and_reads_only_them(conn, skewed):
    eligible, throttled, blocked, unserved = skewed
    reset_eligible(conn, eligible)
    cursor = conn.cursor()
    cursor.execute("SET STATISTICS XML ON;")
    sql, params = claim_sql([eligible, throttled, blocked])
    cursor.execute(sql, params)
    plans, others = showplans(cursor)
    cursor.execute("SET STATISTICS XML OFF;")
    cursor.close()
    mails = others[0]
    assert len(mails) == ELIGIBLE
    assert {m[2] for m in mails} == {eligible}, "mail of an account that cannot send now was claimed"
    updates = [s for s in statement_plans(plans, INDEX) if s.statement_type.upper() == "INSERT"]  # the pick
    assert updates, f"no pick reads {INDEX}"
    rows_read = sum((r.actual_rows_read or r.actual_rows or 0) for s in updates for r in s.reads)
    assert rows_read <= 2 * BATCH, f"the claim read {rows_read} rows of {INDEX} for {BATCH} mails"
    for stmt in updates:
        for read in stmt.reads:
            assert read.physical_op == "Index Seek"
            below = read.ops_below_top() or []
            assert not [op for op in below if op[0] == "Sort"], f"a Sort below the per-account Top: {below}"


def test_skewed_backlog_logical_reads_stay_within_20_percent_of_no_skew(skewed, mssql_url, fresh_database):
    eligible, throttled, blocked, _ = skewed
    plain_url = fresh_database()
    with connection(plain_url) as c:
        plain_eligible = new_account(c, "eligible")
        bulk_fill(c, plain_eligible, ELIGIBLE)
        set_priority(c, plain_eligible, 0)
        execute(c, "UPDATE STATISTICS mailq.MailQueue WITH FULLSCAN;")
    plain = reads_per_claim(plain_url, [plain_eligible], lambda c: reset_eligible(c, plain_eligible))
    skew = reads_per_claim(mssql_url, [eligible, throttled, blocked], lambda c: reset_eligible(c, eligible))
    print(f"logical reads per claim of {BATCH}: {plain:.0f} without skew, {skew:.0f} with "
          f"{3 * SKEW} unclaimable due mails ranked ahead")
    assert skew <= 1.2 * plain + 20, f"reads grow with the unclaimable backlog: {plain:.0f} -> {skew:.0f}"


def test_skewed_backlog_claim_takes_few_locks_and_never_escalates(skewed, mssql_url):
    eligible, throttled, blocked, _ = skewed
    escalations = ("SELECT COALESCE(SUM(index_lock_promotion_count), 0) "
                   "FROM sys.dm_db_index_operational_stats(DB_ID(), OBJECT_ID(N'mailq.MailQueue'), NULL, NULL);")
    locks = ("SELECT resource_type, request_mode, COUNT(*) FROM sys.dm_tran_locks "
             "WHERE request_session_id = @@SPID AND resource_database_id = DB_ID() "
             "GROUP BY resource_type, request_mode;")
    with connection(mssql_url) as c:
        reset_eligible(c, eligible)
        before = scalar(c, escalations)
        cursor = c.cursor()
        cursor.execute("BEGIN TRANSACTION;")  # the claim's locks stay until we look at them
        try:
            sql, params = claim_sql([eligible, throttled, blocked])
            cursor.execute(sql, params)
            while cursor.nextset():
                pass
            held = query(c, locks)
            queue_object_locks = query(
                c, "SELECT request_mode FROM sys.dm_tran_locks WHERE request_session_id = @@SPID "
                   "AND resource_type = N'OBJECT' AND resource_associated_entity_id = OBJECT_ID(N'mailq.MailQueue');")
        finally:
            cursor.execute("IF @@TRANCOUNT > 0 ROLLBACK TRANSACTION;")
            cursor.close()
        after = scalar(c, escalations)
    total = sum(n for _, _, n in held)
    keys = sum(n for kind, _, n in held if kind == "KEY")
    print(f"locks held after a claim of {BATCH}: {total} ({keys} key locks): {held}")
    assert keys <= 8 * BATCH, f"{keys} key locks for a claim of {BATCH}: it locks the backlog"
    assert total < 5000 / 2
    assert {m for (m,) in queue_object_locks} <= {"IX"}, f"object lock on mailq.MailQueue: {queue_object_locks}"
    assert after == before, "lock escalation happened on mailq.MailQueue"


# -- an isolated worker beside another application's backlog -------------------------


def set_app_priority(conn, account: str, app: str, priority: int) -> None:
    execute(conn, "UPDATE mailq.MailQueue SET Priority = ? WHERE AccountName = ? AND AppName = ? "
                  "AND Status = N'UnSent';", priority, account, app)


def reset_app(conn, account: str, app: str) -> None:
    """Test-only write: app's mails on the account are due and unleased again."""
    execute(conn, "UPDATE mailq.MailQueue SET Status = N'UnSent', ThreadLock = NULL, "
                  "VisibleAtUtc = DATEADD(SECOND, -1, SYSUTCDATETIME()), AttemptsRemaining = 5 "
                  "WHERE AccountName = ? AND AppName = ? AND Status IN (N'UnSent', N'Sending');", account, app)
    execute(conn, "UPDATE mailq.MailAttempt SET EndedAtUtc = SYSUTCDATETIME(), Outcome = N'Released' "
                  "WHERE EndedAtUtc IS NULL AND MailID IN (SELECT ID FROM mailq.MailQueue "
                  "WHERE AccountName = ? AND AppName = ?);", account, app)


@pytest.fixture(scope="module")
def app_skewed(conn):
    """(shared account, the bulk application X, the isolated application Y)."""
    shared = new_account(conn, "shared")
    bulk, isolated = new_app(conn, "bulkx"), new_app(conn, "isoly")
    bulk_fill(conn, shared, APP_SKEW, app=bulk)
    set_app_priority(conn, shared, bulk, 9)
    bulk_fill(conn, shared, ELIGIBLE, app=isolated)
    set_app_priority(conn, shared, isolated, 0)
    execute(conn, "UPDATE STATISTICS mailq.MailQueue WITH FULLSCAN;")
    return shared, bulk, isolated


def isolated_claim_sql(account: str, app: str) -> tuple[str, list]:
    return ("EXEC mailq.ClaimMail @BatchSize = ?, @LockToken = ?, @LeaseSeconds = ?, @AppName = ?, "
            "@AccountNames = ?;", [BATCH, str(uuid.uuid4()), 300, app, json.dumps([account])])


def isolated_reads_per_claim(url: str, account: str, app: str) -> float:
    """Logical reads of one isolated ClaimMail (sys.dm_exec_procedure_stats delta, warm plan)."""
    stats = ("SELECT total_logical_reads, execution_count FROM sys.dm_exec_procedure_stats "
             "WHERE database_id = DB_ID() AND object_id = OBJECT_ID(N'mailq.ClaimMail');")
    with connection(url) as c:
        total, runs = 0, 0
        for i in range(4):
            reset_app(c, account, app)
            before = query(c, stats)
            got = procedures.claim_mail(c, batch_size=BATCH, lock_token=uuid.uuid4(), lease_seconds=300,
                                        app_name=app, account_names=[account])
            after = query(c, stats)
            assert len(got) == ELIGIBLE and {m.app_name for m in got} == {app}
            if i == 0 or not before or after[0][1] != before[0][1] + 1:
                continue  # the first run compiles; a recompile resets the counters
            total += after[0][0] - before[0][0]
            runs += 1
    assert runs, "no warm execution measured"
    return total / runs


def test_isolated_claim_reads_only_its_applications_keys(conn, app_skewed):
    shared, bulk, isolated = app_skewed
    reset_app(conn, shared, isolated)
    cursor = conn.cursor()
    cursor.execute("SET STATISTICS XML ON;")
    sql, params = isolated_claim_sql(shared, isolated)
    cursor.execute(sql, params)
    plans, others = showplans(cursor)
    cursor.execute("SET STATISTICS XML OFF;")
    cursor.close()
    mails = others[0]
    assert len(mails) == ELIGIBLE
    assert {m[3] for m in mails} == {isolated}, "another application's mail was claimed"  # column AppName
    assert not statement_plans(plans, INDEX), f"an isolated claim read {INDEX}"
    picks = [s for s in statement_plans(plans, APP_INDEX) if s.statement_type.upper() == "INSERT"]
    assert picks, f"no pick reads {APP_INDEX}"
    rows_read = sum((r.actual_rows_read or r.actual_rows or 0) for s in picks for r in s.reads)
    print(f"rows of {APP_INDEX} read by an isolated claim of {BATCH} beside {APP_SKEW} due mails of "
          f"another application: {rows_read}")
    assert rows_read <= 2 * BATCH, f"the isolated claim read {rows_read} rows for {BATCH} mails"
    for stmt in picks:
        for read in stmt.reads:
            assert read.physical_op == "Index Seek"
            below = read.ops_below_top() or []
            assert not [op for op in below if op[0] == "Sort"], f"a Sort below the per-pair Top: {below}"


def test_isolated_claim_reads_stay_within_20_percent_of_no_other_application(app_skewed, mssql_url,
                                                                             fresh_database):
    shared, _, isolated = app_skewed
    plain_url = fresh_database()
    with connection(plain_url) as c:
        plain_account, plain_app = new_account(c, "shared"), new_app(c, "isoly")
        bulk_fill(c, plain_account, ELIGIBLE, app=plain_app)
        set_app_priority(c, plain_account, plain_app, 0)
        execute(c, "UPDATE STATISTICS mailq.MailQueue WITH FULLSCAN;")
    plain = isolated_reads_per_claim(plain_url, plain_account, plain_app)
    skew = isolated_reads_per_claim(mssql_url, shared, isolated)
    print(f"logical reads per isolated claim of {BATCH}: {plain:.0f} alone, {skew:.0f} beside {APP_SKEW} "
          "due mails of another application on the same account")
    assert skew <= 1.2 * plain + 20, f"reads grow with another application's backlog: {plain:.0f} -> {skew:.0f}"


def test_isolated_claim_takes_few_locks_and_never_escalates(app_skewed, mssql_url):
    shared, _, isolated = app_skewed
    escalations = ("SELECT COALESCE(SUM(index_lock_promotion_count), 0) "
                   "FROM sys.dm_db_index_operational_stats(DB_ID(), OBJECT_ID(N'mailq.MailQueue'), NULL, NULL);")
    keys_held = ("SELECT COUNT(*) FROM sys.dm_tran_locks WHERE request_session_id = @@SPID "
                 "AND resource_database_id = DB_ID() AND resource_type = N'KEY';")
    object_locks = ("SELECT request_mode FROM sys.dm_tran_locks WHERE request_session_id = @@SPID "
                    "AND resource_type = N'OBJECT' AND resource_associated_entity_id = OBJECT_ID(N'mailq.MailQueue');")
    with connection(mssql_url) as c:
        reset_app(c, shared, isolated)
        before = scalar(c, escalations)
        cursor = c.cursor()
        cursor.execute("BEGIN TRANSACTION;")
        try:
            sql, params = isolated_claim_sql(shared, isolated)
            cursor.execute(sql, params)
            while cursor.nextset():
                pass
            keys = scalar(c, keys_held)
            modes = {m for (m,) in query(c, object_locks)}
        finally:
            cursor.execute("IF @@TRANCOUNT > 0 ROLLBACK TRANSACTION;")
            cursor.close()
        after = scalar(c, escalations)
    print(f"key locks held after an isolated claim of {BATCH}: {keys}")
    assert keys <= 8 * BATCH, f"{keys} key locks: the isolated claim locks another application's backlog"
    assert modes <= {"IX"}, modes
    assert after == before, "lock escalation happened on mailq.MailQueue"


def test_a_competing_claim_on_the_shared_account_keeps_the_priority_order(conn, app_skewed):
    shared, bulk, _ = app_skewed
    token = uuid.uuid4()
    mails = procedures.claim_mail(conn, batch_size=10, lock_token=token, lease_seconds=300,
                                  account_names=[shared])
    assert len(mails) == 10 and {m.app_name for m in mails} == {bulk} and {m.priority for m in mails} == {9}
    procedures.release_mail(conn, ids=[m.id for m in mails], lock_token=token)


def test_batch_is_shared_fairly_between_accounts(conn):
    app = new_app(conn, "fair")
    a, b, small = new_account(conn, "fa"), new_account(conn, "fb"), new_account(conn, "fsmall")
    a_ids = [r.mail_id for r in enqueue(conn, a, app, 12, priority=9)]
    b_ids = [r.mail_id for r in enqueue(conn, b, app, 12, priority=1)]
    # Priority of a does not starve b: each gets half of the batch.
    mails = procedures.claim_mail(conn, batch_size=10, lock_token=uuid.uuid4(), lease_seconds=300,
                                  app_name=app, account_names=[a, b])
    got = [m.account_name for m in mails]
    assert got.count(a) == 5 and got.count(b) == 5, got
    # Within an account: the oldest due of its highest priority first.
    assert sorted(m.id for m in mails if m.account_name == a) == a_ids[:5]
    assert sorted(m.id for m in mails if m.account_name == b) == b_ids[:5]
    # An account with less than its share leaves the rest to the others (second pass).
    small_ids = {r.mail_id for r in enqueue(conn, small, app, 2)}
    mails = procedures.claim_mail(conn, batch_size=10, lock_token=uuid.uuid4(), lease_seconds=300,
                                  app_name=app, account_names=[a, small])
    assert {m.id for m in mails if m.account_name == small} == small_ids
    assert sum(1 for m in mails if m.account_name == a) == 7  # all a has left
    # And a rate budget caps an account's share.
    limited = new_account(conn, "flimit", per_minute=3)
    enqueue(conn, limited, app, 10)
    mails = procedures.claim_mail(conn, batch_size=10, lock_token=uuid.uuid4(), lease_seconds=300,
                                  app_name=app, account_names=[limited, b])
    got = [m.account_name for m in mails]
    assert got.count(limited) <= 3 and got.count(b) == 7, got


def test_expired_or_exhausted_mail_never_takes_a_claim_slot(conn, conn2):
    app = new_app(conn, "slots")
    account = new_account(conn, "slots")
    now = server_now(conn)
    expired = [r.mail_id for r in enqueue(conn, account, app, 5, priority=9,
                                          date_to_process=now - timedelta(seconds=10),
                                          expires_at_utc=now - timedelta(seconds=5))]
    (last,) = enqueue(conn, account, app, 1, priority=9, max_attempts=1)
    _, (leased,) = claim(conn, app, batch_size=1, lease_seconds=1)
    assert leased.id == last.mail_id and leased.attempts_remaining == 0
    live = [r.mail_id for r in enqueue(conn, account, app, 5, priority=0)]
    time.sleep(EXPIRY_WAIT)
    _, got = claim(conn2, app, batch_size=5)
    assert sorted(m.id for m in got) == sorted(live), "expired/exhausted mail took slots of the batch"
    assert set(statuses(conn, expired).values()) == {"UnSent"}
    assert mail_row(conn, last.mail_id)["Status"] == "Sending"


def test_finalize_mail(conn, conn2):
    app = new_app(conn, "final")
    served, blocked, nobody = new_account(conn, "fserved"), new_account(conn, "fblocked"), new_account(conn, "fnobody")
    block_until_tomorrow(conn, blocked)
    now = server_now(conn)
    past = dict(date_to_process=now - timedelta(seconds=10), expires_at_utc=now - timedelta(seconds=5))
    expired = [r.mail_id for acct in (served, blocked, nobody) for r in enqueue(conn, acct, app, 1, **past)]
    # Not yet due, already expired: expires too (it would never be sent in time).
    (early,) = enqueue(conn, served, app, 1, date_to_process=now + timedelta(hours=1),
                       expires_at_utc=now + timedelta(hours=1, seconds=1))
    execute(conn, "UPDATE mailq.MailQueue SET ExpiresAtUtc = DATEADD(SECOND, -1, SYSUTCDATETIME()) WHERE ID = ?;",
            early.mail_id)
    # Dead last attempt -> Failed; a live lease on an expired mail is left to its worker.
    (dead,) = enqueue(conn, served, app, 1, max_attempts=1)
    dead_token, _ = claim(conn, app, batch_size=1, lease_seconds=1)
    (live,) = enqueue(conn, served, app, 1, expires_at_utc=server_now(conn) + timedelta(seconds=2))
    live_token, (live_mail,) = claim(conn, app, batch_size=1, lease_seconds=300)
    assert live_mail.id == live.mail_id
    time.sleep(EXPIRY_WAIT + 0.5)

    result = procedures.finalize_mail(conn2, batch_size=1000, max_batches=10)
    assert result.expired >= 4 and result.failed >= 1 and result.more_left is False
    assert set(statuses(conn, expired + [early.mail_id]).values()) == {"Expired"}
    row = mail_row(conn, dead.mail_id)
    assert row["Status"] == "Failed" and row["ThreadLock"] is None and row["PossibleDuplicate"] in (True, 1)
    assert row["LastError"].startswith("No attempt left")
    (attempt,) = attempts(conn, dead.mail_id)
    assert attempt["Outcome"] == "Abandoned" and str(attempt["LockToken"]).lower() == str(dead_token).lower()
    assert mail_row(conn, live.mail_id)["Status"] == "Sending", "a live lease was finalized"
    procedures.mark_sent(conn, ids=[live.mail_id], lock_token=live_token)

    # Bounded batches: MoreLeft says to call again.
    more = [r.mail_id for r in enqueue(conn, nobody, app, 3, **past)]
    first = procedures.finalize_mail(conn2, batch_size=2, max_batches=1)
    assert first.expired == 2 and first.more_left is True
    second = procedures.finalize_mail(conn2, batch_size=2, max_batches=1)
    assert second.expired >= 1 and second.more_left is False
    assert set(statuses(conn, more).values()) == {"Expired"}


def test_finalize_mail_refuses_bad_input_and_a_caller_transaction(conn):
    expect_error(50150, procedures.finalize_mail, conn, batch_size=0)
    expect_error(50151, procedures.finalize_mail, conn, max_batches=1001)
    cursor = conn.cursor()
    cursor.execute("BEGIN TRANSACTION;")
    try:
        expect_error(50152, procedures.finalize_mail, conn)
    finally:
        cursor.execute("IF @@TRANCOUNT > 0 ROLLBACK TRANSACTION;")
        cursor.close()


def test_a_window_later_than_the_claimers_clock_is_never_moved_back(conn):
    """What a claimer that read the clock just before a minute boundary did in
    0001-0004 after a faster claimer charged the new minute: it saw another
    window start, counted 0, claimed a full budget again and wrote the old
    minute back.  Staged deterministically: the stored window is the next
    minute, already spent."""
    app = new_app(conn, "backwards")
    account = new_account(conn, "backwards", per_minute=3)
    enqueue(conn, account, app, 6)
    execute(conn, "UPDATE mailq.RateBudget SET MinuteStartUtc = DATEADD(MINUTE, DATEDIFF(MINUTE, '20000101', "
                  "SYSUTCDATETIME()) + 1, '20000101'), MinuteCount = 3 WHERE AccountName = ?;", account)
    stored = scalar(conn, "SELECT MinuteStartUtc FROM mailq.RateBudget WHERE AccountName = ?;", account)
    _, got = claim(conn, app, batch_size=6)
    assert got == [], "a spent window was reopened by a clock reading from before it"
    assert scalar(conn, "SELECT MinuteStartUtc FROM mailq.RateBudget WHERE AccountName = ?;", account) == stored


def test_claimers_racing_across_a_minute_boundary_never_exceed_the_limit(mssql_url, conn):
    limit = 4
    app = new_app(conn, "boundary")
    account = new_account(conn, "boundary", per_minute=limit)
    enqueue(conn, account, app, 60)
    now = server_now(conn)
    if now.second < 57:  # start about two seconds before the next minute
        time.sleep(57 - now.second - now.microsecond / 1e6)

    def worker(i, barrier):
        with connection(mssql_url) as c:
            barrier.wait()
            start = time.monotonic()
            n = 0
            while time.monotonic() - start < 5:
                _, mails = claim(c, app, batch_size=2)
                n += len(mails)
            return n

    run_threads(4, worker)
    per_minute = query(conn, "SELECT DATEADD(MINUTE, DATEDIFF(MINUTE, '20000101', t.StartedAtUtc), '20000101'), "
                             "COUNT(*) FROM mailq.MailAttempt AS t INNER JOIN mailq.MailQueue AS q ON q.ID = t.MailID "
                             "WHERE q.AccountName = ? GROUP BY DATEADD(MINUTE, DATEDIFF(MINUTE, '20000101', "
                             "t.StartedAtUtc), '20000101');", account)
    print(f"claims per minute (limit {limit}): {per_minute}")
    assert all(n <= limit for _, n in per_minute), f"a minute was charged over its limit: {per_minute}"
    assert len(per_minute) == 2, f"the run did not cross a minute boundary: {per_minute}"


def test_more_accounts_than_slots_never_returns_a_short_batch_while_mail_is_due(conn):
    """With more accounts than slots, only accounts with claimable mail are drawn:
    idle accounts never take a slot (a short batch would make the worker back off)."""
    app = new_app(conn, "many")
    busy = [new_account(conn, f"busy{i}") for i in range(4)]
    idle = [new_account(conn, f"idle{i}") for i in range(8)]
    for acct in busy:
        enqueue(conn, acct, app, 2)
    for _ in range(4):
        mails = procedures.claim_mail(conn, batch_size=2, lock_token=uuid.uuid4(), lease_seconds=300,
                                      app_name=app, account_names=busy + idle)
        assert len(mails) == 2, "a batch came back short while mail of other accounts was due"
        assert {m.account_name for m in mails} <= set(busy)
    assert procedures.claim_mail(conn, batch_size=2, lock_token=uuid.uuid4(), lease_seconds=300,
                                 app_name=app, account_names=busy + idle) == []
