"""Leases by the server's clock, one finalizer at a time, purge by seeks:
SQL Server 2022 (docs/claim.md, docs/finalization.md, docs/guarantees.md).

* ClaimMail's result set 1 and ExtendLease's result end with
  LeaseSecondsRemaining: whole seconds (floor) from the server's clock as the
  rows are returned to LeaseExpiresUtc; an ExtendLease whose fence waited
  returns what is left at return, not the seconds asked for.
* Eight sessions running FinalizeMail in a loop over 20,000 mails that are
  both expired and out of attempts finish every mail and are never chosen
  as deadlock victims (1205); a FinalizeMail that finds the finalizer lock
  held returns at once with Busy = 1 and changes nothing.
* PurgeMail's deletes of attempts, attachments and recipient outcomes are
  Clustered Index Seeks (actual plan), and a purge completes under
  SET LOCK_TIMEOUT while another session holds an X lock on a live mail's
  attempt row (a scan would wait for it: error 1222).
* RecordRecipientOutcomes and GetRecipientOutcomes set READ COMMITTED
  themselves: called inside a SERIALIZABLE transaction, they leave no
  key-range lock on mailq.MailRecipientOutcome.
"""

from __future__ import annotations

import math
import threading
import time

import pytest

from mailq_helpers import (
    age_finished,
    bulk_fill,
    claim,
    connection,
    enqueue,
    execute,
    new_account,
    new_app,
    query,
    result_sets,
    run_threads,
    scalar,
    showplans,
    statement_plans,
    statuses,
)
from mailq_db import procedures
from mailq_db.errors import DatabaseError

pytestmark = pytest.mark.integration

SERVER_NOW = "SELECT SYSUTCDATETIME();"


# -- M5: LeaseSecondsRemaining --------------------------------------------------


def test_claim_and_extend_return_whole_seconds_left_by_the_server_clock(conn):
    app, account = new_app(conn, "lsr"), new_account(conn, "lsr")
    enqueue(conn, account, app, 2)
    before = scalar(conn, SERVER_NOW)
    token, mails = claim(conn, app, batch_size=2, lease_seconds=120)
    after = scalar(conn, SERVER_NOW)
    assert len(mails) == 2
    for mail in mails:
        assert isinstance(mail.lease_seconds_remaining, int)
        # floor of (expiry - a clock reading between `before` and `after`)
        low = math.floor((mail.lease_expires_utc - after).total_seconds())
        high = math.floor((mail.lease_expires_utc - before).total_seconds())
        assert low <= mail.lease_seconds_remaining <= high <= 120, (low, mail.lease_seconds_remaining, high)
    time.sleep(1.2)
    before = scalar(conn, SERVER_NOW)
    ext = procedures.extend_lease(conn, ids=[m.id for m in mails], lock_token=token, lease_seconds=300)
    after = scalar(conn, SERVER_NOW)
    for mail in mails:
        got = ext[mail.id]
        assert math.floor((got.expires_utc - after).total_seconds()) <= got.seconds_remaining
        assert got.seconds_remaining <= math.floor((got.expires_utc - before).total_seconds()) <= 300
    procedures.release_mail(conn, ids=[m.id for m in mails], lock_token=token)


def test_lease_seconds_are_counted_when_the_rows_are_returned(mssql_url, conn):
    """ExtendLease computes the new expiry when it starts; when its fence waits
    3 s for another session's lock on the mail, the seconds it returns are
    what is left at return (about 7 of 10), never the 10 asked for."""
    app, account = new_app(conn, "lsrwait"), new_account(conn, "lsrwait")
    enqueue(conn, account, app, 1)
    token, (mail,) = claim(conn, app, batch_size=1, lease_seconds=60)
    got: dict = {}
    with connection(mssql_url) as holder, connection(mssql_url) as worker:
        cursor = holder.cursor()
        cursor.execute("BEGIN TRANSACTION;")
        cursor.execute("SELECT q.ID FROM mailq.MailQueue AS q WITH (UPDLOCK, ROWLOCK) WHERE q.ID = ?;", mail.id)
        cursor.fetchall()
        extend = threading.Thread(target=lambda: got.update(procedures.extend_lease(
            worker, ids=[mail.id], lock_token=token, lease_seconds=10)))
        extend.start()
        time.sleep(3)
        cursor.execute("ROLLBACK TRANSACTION;")
        cursor.close()
        extend.join(30)
    lease = got[mail.id]
    assert 5 <= lease.seconds_remaining <= 7, lease
    procedures.release_mail(conn, ids=[mail.id], lock_token=token)


# -- L2: one finalizer at a time ------------------------------------------------------


def make_dead_and_expired(conn, n: int) -> str:
    """n mails of a new account that are both out of attempts and past their expiry."""
    account = new_account(conn, "fin")
    bulk_fill(conn, account, n)
    execute(conn, "UPDATE mailq.MailQueue SET AttemptsRemaining = 0, "
                  "ExpiresAtUtc = DATEADD(MINUTE, -1, SYSUTCDATETIME()) WHERE AccountName = ?;", account)
    return account


def test_concurrent_finalizers_never_deadlock(mssql_url, conn):
    n = 20_000
    account = make_dead_and_expired(conn, n)
    deadlocks, busy, done = [], [], []
    lock = threading.Lock()

    def finalizer(i, barrier):
        with connection(mssql_url) as c:
            barrier.wait()
            for _ in range(200):
                try:
                    result = procedures.finalize_mail(c, batch_size=200, max_batches=5)
                except DatabaseError as exc:
                    if exc.number == 1205:
                        with lock:
                            deadlocks.append(i)
                        continue
                    raise
                with lock:
                    done.append(result.failed + result.expired)
                    busy.append(result.busy)
                if not result.more_left and not result.busy:
                    return

    run_threads(8, finalizer)
    left = scalar(conn, "SELECT COUNT(*) FROM mailq.MailQueue WHERE AccountName = ? "
                        "AND Status IN (N'UnSent', N'Sending');", account)
    print(f"8 finalizers over {n} mails: {sum(done)} finalized, {sum(busy)} calls found the lock held, "
          f"{len(deadlocks)} deadlock victims")
    assert deadlocks == [], f"finalizers were chosen as deadlock victims {len(deadlocks)} times"
    assert left == 0 and sum(done) >= n


def test_a_finalizer_that_finds_the_lock_held_stops_at_once_and_says_busy(mssql_url, conn):
    account = make_dead_and_expired(conn, 10)
    with connection(mssql_url) as holder:
        cursor = holder.cursor()
        cursor.execute("BEGIN TRANSACTION;")
        try:
            code = scalar(holder, "DECLARE @r INT; EXEC @r = sys.sp_getapplock @Resource = N'mailq.FinalizeMail', "
                                  "@LockMode = N'Exclusive', @LockOwner = N'Transaction', @LockTimeout = 0; "
                                  "SELECT @r;")
            assert code >= 0
            started = time.monotonic()
            result = procedures.finalize_mail(conn, batch_size=200, max_batches=10)
            assert time.monotonic() - started < 5, "FinalizeMail waited for the lock"
            assert result.busy and result.failed == 0 and result.expired == 0
            ids = [r[0] for r in query(conn, "SELECT ID FROM mailq.MailQueue WHERE AccountName = ?;", account)]
            assert set(statuses(conn, ids).values()) == {"UnSent"}
        finally:
            cursor.execute("IF @@TRANCOUNT > 0 ROLLBACK TRANSACTION;")
            cursor.close()
    result = procedures.finalize_mail(conn, batch_size=200, max_batches=10)
    assert not result.busy and result.failed >= 10


# -- L5: PurgeMail's deletes are seeks -----------------------------------------------


def finished_with_children(conn, n: int) -> list[int]:
    """n Sent mails, 40 days old, each with an attempt, an attachment and a recipient outcome."""
    app, account = new_app(conn, "purge"), new_account(conn, "purge")
    ids = [r.mail_id for r in enqueue(conn, account, app, n, attachments=[
        procedures.Attachment("a.txt", b"hello", "text/plain")])]
    token, mails = claim(conn, app, batch_size=n)
    assert len(mails) == n
    for mail in mails:
        procedures.record_recipient_outcomes(conn, mail_id=mail.id, lock_token=token, outcomes=[
            {"address": mail.to_address, "outcome": "Delivered", "code": 250}])
    procedures.mark_sent(conn, ids=ids, lock_token=token, smtp_code=250)
    age_finished(conn, ids, 40)
    return ids


def test_purge_deletes_children_by_clustered_seeks(conn):
    finished_with_children(conn, 20)
    cursor = conn.cursor()
    cursor.execute("SET STATISTICS XML ON;")
    cursor.execute("EXEC mailq.PurgeMail @OlderThanDays = 30, @BatchSize = 10;")
    plans, others = showplans(cursor)
    cursor.execute("SET STATISTICS XML OFF;")
    cursor.close()
    assert others and others[-1][0][0] >= 20
    for table, index in (("MailAttempt", "PK_MailAttempt"), ("MailAttachment", "PK_MailAttachment"),
                         ("MailRecipientOutcome", "PK_MailRecipientOutcome")):
        deletes = [s for s in statement_plans(plans, index, table=table) if s.statement_type.upper() == "DELETE"]
        assert deletes, f"no DELETE reads {index}"
        for stmt in deletes:
            assert {r.physical_op for r in stmt.reads} == {"Clustered Index Seek"}, (table, stmt.reads)


def test_purge_never_waits_on_a_live_mails_attempt(mssql_url, conn):
    finished_with_children(conn, 5)
    app, account = new_app(conn, "live"), new_account(conn, "live")
    enqueue(conn, account, app, 1)
    token, (live,) = claim(conn, app, batch_size=1)
    with connection(mssql_url) as worker:
        cursor = worker.cursor()
        cursor.execute("BEGIN TRANSACTION;")
        try:
            cursor.execute("UPDATE mailq.MailAttempt SET ErrorText = ErrorText WHERE MailID = ?;", live.id)
            purge = conn.cursor()
            try:
                purge.execute("SET LOCK_TIMEOUT 5000; EXEC mailq.PurgeMail @OlderThanDays = 30;")
                (purged,) = result_sets(purge)[-1]
            finally:
                purge.execute("SET LOCK_TIMEOUT -1;")
                purge.close()
            assert purged[0] >= 5
        finally:
            cursor.execute("IF @@TRANCOUNT > 0 ROLLBACK TRANSACTION;")
            cursor.close()
    procedures.release_mail(conn, ids=[live.id], lock_token=token)


# -- L6: the recipient procedures set READ COMMITTED themselves ---------------------


def test_recipient_procedures_take_no_range_locks_under_a_serializable_caller(conn):
    app, account = new_app(conn, "rcser"), new_account(conn, "rcser")
    enqueue(conn, account, app, 1, cc="c@example.com")
    token, (mail,) = claim(conn, app, batch_size=1)
    ranges = ("SELECT COUNT(*) FROM sys.dm_tran_locks WHERE request_session_id = @@SPID "
              "AND resource_database_id = DB_ID() AND request_mode LIKE N'Range%';")
    cursor = conn.cursor()
    cursor.execute("SET TRANSACTION ISOLATION LEVEL SERIALIZABLE; BEGIN TRANSACTION;")
    try:
        procedures.record_recipient_outcomes(conn, mail_id=mail.id, lock_token=token, outcomes=[
            {"address": "c@example.com", "outcome": "Refused", "code": 550}])
        procedures.get_recipient_outcomes(conn, ids=[mail.id], lock_token=token)
        assert scalar(conn, ranges) == 0, "a key-range lock is kept: the caller's SERIALIZABLE level applied"
    finally:
        cursor.execute("IF @@TRANCOUNT > 0 ROLLBACK TRANSACTION; SET TRANSACTION ISOLATION LEVEL READ COMMITTED;")
        cursor.close()
    procedures.release_mail(conn, ids=[mail.id], lock_token=token)
