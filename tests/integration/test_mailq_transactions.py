"""Issue 10, points 3, 4 and 5 against SQL Server 2022: the caller's
transaction and isolation level, and idempotent enqueue without range locks.

The outbox pattern (mail enqueued inside the application's own transaction):
* a caller's transaction that rolls back leaves no mail (nor attachment);
* one that commits leaves exactly one mail;
* an error inside mailq.EnqueueMail inside the caller's transaction reaches
  the caller as the THROW number, dooms the transaction (XACT_STATE() = -1 in
  the caller's CATCH, @@TRANCOUNT as before the call: no error 266), and once
  the caller rolls back nothing of the transaction remains; without a CATCH
  (XACT_ABORT ON) the transaction is already rolled back when the error
  reaches the client.
Isolation levels: every mail-queue procedure is called from a SERIALIZABLE
session and from a SNAPSHOT session (and the enqueue + claim pair inside an
explicit SNAPSHOT transaction): no error 650 (READPAST refused), no update
conflict 3960, and the session's level is the caller's again afterwards.
The module runs on a READ_COMMITTED_SNAPSHOT ON database by default and on a
locking one with MAILQ_TEST_RCSI=off (.ci/run does both).
Idempotency keys: compared as binary text ('ABC' and 'abc' are two mails,
trailing spaces are ignored); a caller holding key k1 in an open transaction
does not block an enqueue of a neighbouring key k2 even with LOCK_TIMEOUT 0
(no key-range lock), while the same key k1 waits for the applock and gets
50162 once its 10 s are out.
"""

from __future__ import annotations

import uuid

import pytest

from mailq_helpers import (
    connection,
    enqueue,
    expect_error,
    mail_row,
    new_account,
    new_app,
    query,
    scalar,
)
from mailq_db import procedures
from mailq_db.errors import DatabaseError

pytestmark = pytest.mark.integration

#: sys.dm_exec_sessions.transaction_isolation_level
LEVEL = {"READ COMMITTED": 2, "REPEATABLE READ": 3, "SERIALIZABLE": 4, "SNAPSHOT": 5}


def session_level(conn) -> int:
    return scalar(conn, "SELECT transaction_isolation_level FROM sys.dm_exec_sessions WHERE session_id = @@SPID;")


def trancount(conn) -> int:
    return scalar(conn, "SELECT @@TRANCOUNT;")


def count_subject(conn, subject: str) -> int:
    return scalar(conn, "SELECT COUNT(*) FROM mailq.MailQueue WHERE Subject = ?;", subject)


ENQUEUE_BATCH = """
EXEC mailq.EnqueueMail @ToAddress = N'outbox@example.com', @Subject = ?, @Body = N'b',
    @AccountName = ?, @AppName = ?, @Attachments = ?;
"""
ATTACHMENT = '[{"FileName": "a.txt", "ContentBase64": "aGVsbG8="}]'


@pytest.fixture(scope="module")
def account(conn) -> str:
    return new_account(conn, "tx")


@pytest.fixture(scope="module")
def app(conn, account) -> str:
    return new_app(conn, "tx")


# -- the outbox pattern ---------------------------------------------------------


def test_enqueue_in_a_caller_transaction_that_rolls_back_leaves_nothing(mssql_url, account, app):
    subject = f"rollback {uuid.uuid4()}"
    with connection(mssql_url) as c:
        cur = c.cursor()
        cur.execute("BEGIN TRANSACTION;")
        cur.execute(ENQUEUE_BATCH, subject, account, app, ATTACHMENT)
        assert trancount(c) == 1
        assert count_subject(c, subject) == 1          # visible to the caller itself
        cur.execute("ROLLBACK TRANSACTION;")
        assert count_subject(c, subject) == 0
        assert scalar(c, "SELECT COUNT(*) FROM mailq.MailAttachment AS a JOIN mailq.MailQueue AS q "
                         "ON q.ID = a.MailID WHERE q.Subject = ?;", subject) == 0


def test_enqueue_in_a_caller_transaction_that_commits_leaves_exactly_one_mail(mssql_url, account, app):
    subject = f"commit {uuid.uuid4()}"
    with connection(mssql_url) as c:
        cur = c.cursor()
        cur.execute("BEGIN TRANSACTION;")
        cur.execute(ENQUEUE_BATCH, subject, account, app, None)
        cur.execute("COMMIT TRANSACTION;")
        assert trancount(c) == 0
        assert count_subject(c, subject) == 1


@pytest.mark.parametrize("failing, number", [
    ("EXEC mailq.EnqueueMail @ToAddress = N'', @Subject = N's', @Body = N'b', @AccountName = ?, @AppName = ?;",
     50101),                                    # validation, before the procedure's TRY
    ("EXEC mailq.EnqueueMail @ToAddress = N'x@example.com', @Subject = N'other', @Body = N'b', "
     "@AccountName = ?, @AppName = ?, @IdempotencyKey = N'tx-key-{k}';", 50116),   # inside its TRY
])
def test_an_error_inside_enqueue_dooms_the_caller_transaction_cleanly(mssql_url, account, app, failing, number):
    key = uuid.uuid4().hex
    subject = f"doomed {key}"
    with connection(mssql_url) as c:
        # the key exists already (committed) for the 50116 case
        procedures.enqueue_mail(c, to_address="x@example.com", subject="first", body="b", account_name=account,
                                app_name=app, idempotency_key=f"tx-key-{key}")
        batch = f"""
SET XACT_ABORT OFF;  -- the caller's own setting; the procedure sets XACT_ABORT ON for itself
BEGIN TRANSACTION;
EXEC mailq.EnqueueMail @ToAddress = N'ok@example.com', @Subject = ?, @Body = N'b',
    @AccountName = ?, @AppName = ?;
BEGIN TRY
    {failing.format(k=key)}
END TRY
BEGIN CATCH
    SELECT ERROR_NUMBER() AS Number, XACT_STATE() AS XactState, @@TRANCOUNT AS TranCount;
    IF XACT_STATE() <> 0 ROLLBACK TRANSACTION;
END CATCH;
"""
        cur = c.cursor()
        cur.execute(batch, subject, account, app, account, app)
        rows = None
        while True:
            if cur.description:
                rows = cur.fetchall()
            if not cur.nextset():
                break
        assert rows is not None, "the caller's CATCH did not run"
        got_number, xact_state, tran_count = rows[0][0], rows[0][1], rows[0][2]
        assert got_number == number
        # Doomed and still open (the documented outcome), never committable:
        # the caller can only roll back, and @@TRANCOUNT is what it was.
        assert (xact_state, tran_count) == (-1, 1)
        assert trancount(c) == 0
        assert count_subject(c, subject) == 0       # the caller's earlier enqueue is gone too


def test_an_error_without_a_caller_catch_rolls_the_caller_back(mssql_url, account, app):
    subject = f"aborted {uuid.uuid4()}"
    with connection(mssql_url) as c:
        cur = c.cursor()
        cur.execute("BEGIN TRANSACTION;")
        cur.execute(ENQUEUE_BATCH, subject, account, app, None)
        expect_error(50101, lambda: procedures.enqueue_mail(c, to_address="", subject="s", body="b",
                                                            account_name=account, app_name=app))
        assert trancount(c) == 0                    # XACT_ABORT ON rolled the whole transaction back
        assert count_subject(c, subject) == 0


# -- every procedure under SERIALIZABLE and SNAPSHOT --------------------------------


def exercise_every_procedure(c, account: str, app: str) -> None:
    """Call each public mail-queue procedure once (autocommit: each in its own transaction)."""
    mails = enqueue(c, account, app, 5, idempotency_key=None)
    ids = [m.mail_id for m in mails]
    procedures.enqueue_mail(c, to_address="k@example.com", subject="k", body="b", account_name=account,
                            app_name=app, idempotency_key=f"iso-{uuid.uuid4()}")
    token = uuid.uuid4()
    claimed = procedures.claim_mail(c, batch_size=10, lock_token=token, lease_seconds=300, app_name=app)
    got = [m.id for m in claimed]
    assert set(ids) <= set(got) and len(got) == 6
    procedures.extend_lease(c, ids=got, lock_token=token, lease_seconds=300)
    procedures.mark_sent(c, ids=got[:1], lock_token=token, smtp_code=250)
    procedures.mark_failed(c, ids=got[1:2], lock_token=token, disposition="Stop", error="550 no such user")
    procedures.mark_failed(c, ids=got[2:3], lock_token=token, disposition="Wait", error="421 slow down",
                           retry_after_seconds=600)
    procedures.release_mail(c, ids=got[3:], lock_token=token)
    procedures.requeue_mail(c, mail_id=got[1])
    procedures.cancel_mail(c, mail_id=got[1])
    procedures.unblock_sending_account(c, account_name=account)
    procedures.upsert_sending_account(c, account_name=account, default_from_address="noreply@example.org")
    procedures.upsert_application(c, app_name=app, description="again")
    procedures.bind_application(c, app_name=app, account_name=account, from_address="@example.org")
    procedures.unbind_application(c, app_name=app, from_address="@nothing.example")
    procedures.get_queue_stats(c)
    procedures.get_installation_health(c)
    procedures.purge_mail(c, older_than_days=36500)


@pytest.mark.parametrize("level", ["SERIALIZABLE", "SNAPSHOT", "REPEATABLE READ"])
def test_every_procedure_runs_from_a_session_at(mssql_url, conn, level):
    account = new_account(conn, "iso")
    app = new_app(conn, "iso")
    with connection(mssql_url) as c:
        c.cursor().execute(f"SET TRANSACTION ISOLATION LEVEL {level};")
        exercise_every_procedure(c, account, app)       # no 650, no 3960
        assert session_level(c) == LEVEL[level]         # each procedure's level reverted on return


@pytest.mark.parametrize("level", ["SERIALIZABLE", "SNAPSHOT"])
def test_enqueue_and_claim_inside_an_explicit_transaction_at(mssql_url, conn, level):
    account = new_account(conn, "isotx")
    app = new_app(conn, "isotx")
    with connection(mssql_url) as c:
        cur = c.cursor()
        cur.execute(f"SET TRANSACTION ISOLATION LEVEL {level};")
        cur.execute("BEGIN TRANSACTION;")
        # A SNAPSHOT transaction starts at its first data access: touch data
        # first, as an application would (docs/guarantees.md).
        assert scalar(c, "SELECT COUNT(*) FROM mailq.Application WHERE AppName = ?;", app) == 1
        enqueue(c, account, app, 3)
        token = uuid.uuid4()
        mails = procedures.claim_mail(c, batch_size=10, lock_token=token, lease_seconds=300, app_name=app)
        procedures.mark_sent(c, ids=[m.id for m in mails], lock_token=token)
        cur.execute("COMMIT TRANSACTION;")
        assert len(mails) == 3
        assert session_level(c) == LEVEL[level]
    assert {mail_row(conn, m.id)["Status"] for m in mails} == {"Sent"}


# -- idempotency keys ---------------------------------------------------------------


def test_keys_compare_as_binary_text(conn, account, app):
    base = uuid.uuid4().hex
    upper = procedures.enqueue_mail(conn, to_address="a@example.com", subject="s", body="b", account_name=account,
                                    app_name=app, idempotency_key=f"KEY-{base}")
    lower = procedures.enqueue_mail(conn, to_address="a@example.com", subject="s", body="b", account_name=account,
                                    app_name=app, idempotency_key=f"key-{base}")
    assert upper.created and lower.created and upper.mail_id != lower.mail_id
    # SQL Server ignores trailing spaces in every comparison; the applock
    # resource is built from the key without them, so both agree.
    padded = procedures.enqueue_mail(conn, to_address="a@example.com", subject="s", body="b",
                                     account_name=account, app_name=app, idempotency_key=f"key-{base}  ")
    assert padded.mail_id == lower.mail_id or not padded.created
    collation = scalar(conn, "SELECT collation_name FROM sys.columns WHERE object_id = OBJECT_ID(N'mailq.MailQueue') "
                             "AND name = N'IdempotencyKey';")
    assert collation == "Latin1_General_100_BIN2"


def test_a_neighbouring_key_never_waits_and_the_same_key_waits_for_the_applock(mssql_url, account, app):
    base = uuid.uuid4().hex
    with connection(mssql_url) as holder, connection(mssql_url) as other:
        cur = holder.cursor()
        cur.execute("BEGIN TRANSACTION;")
        procedures.enqueue_mail(holder, to_address="a@example.com", subject="s", body="b", account_name=account,
                                app_name=app, idempotency_key=f"{base}-k1")
        # LOCK_TIMEOUT 0: any lock wait on the key range would fail with 1222 at once.
        other.cursor().execute("SET LOCK_TIMEOUT 0;")
        neighbour = procedures.enqueue_mail(other, to_address="a@example.com", subject="s", body="b",
                                            account_name=account, app_name=app, idempotency_key=f"{base}-k2")
        assert neighbour.created
        other.cursor().execute("SET LOCK_TIMEOUT -1;")
        expect_error(50162, lambda: procedures.enqueue_mail(
            other, to_address="a@example.com", subject="s", body="b", account_name=account, app_name=app,
            idempotency_key=f"{base}-k1"))
        cur.execute("COMMIT TRANSACTION;")
        again = procedures.enqueue_mail(other, to_address="a@example.com", subject="s", body="b",
                                        account_name=account, app_name=app, idempotency_key=f"{base}-k1")
        assert not again.created


def test_idempotency_lookup_takes_no_range_lock(mssql_url, account, app):
    """While a caller's transaction holds a key, the locks it holds on
    UX_MailQueue_IdempotencyKey are key locks, never RangeS-U / RangeX-X."""
    with connection(mssql_url) as c:
        cur = c.cursor()
        cur.execute("SET TRANSACTION ISOLATION LEVEL SERIALIZABLE; BEGIN TRANSACTION;")
        procedures.enqueue_mail(c, to_address="a@example.com", subject="s", body="b", account_name=account,
                                app_name=app, idempotency_key=f"range-{uuid.uuid4()}")
        modes = {r[0] for r in query(c, """
            SELECT l.request_mode
            FROM sys.dm_tran_locks AS l
            JOIN sys.partitions AS p ON p.hobt_id = l.resource_associated_entity_id
            JOIN sys.indexes AS i ON i.object_id = p.object_id AND i.index_id = p.index_id
            WHERE l.request_session_id = @@SPID AND l.resource_type = N'KEY'
              AND i.name = N'UX_MailQueue_IdempotencyKey';""")}
        cur.execute("ROLLBACK TRANSACTION; SET TRANSACTION ISOLATION LEVEL READ COMMITTED;")
    assert not any(m.startswith("Range") for m in modes), modes
