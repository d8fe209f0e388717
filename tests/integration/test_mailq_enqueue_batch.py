"""mailq.EnqueueMailBatch against SQL Server 2022 (issue 16, point 6).

* 10,000 mails in one call: every row gets a mail, IDs follow the row
  ordinals, the rows are what EnqueueMail would have written.
* All-or-nothing: one bad row anywhere raises 50220 naming the row, the field
  and EnqueueMail's rule number, and nothing is written (fingerprint).
* @RejectInvalid = 1: the valid rows are queued and each bad row comes back
  with the rule EnqueueMail raises for it (checked against EnqueueMail itself).
* Idempotency: duplicates inside the batch and against existing mails behave
  as EnqueueMail documents; a batch row and a single call with the same values
  are one mail (same content hash).
* Concurrency: a batch and single EnqueueMail calls racing on the same keys
  create each key's mail once.
* The table-valued parameter path (mailq.MailBatchRow) from T-SQL.
"""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta

import pytest

from mailq_helpers import (
    assert_unchanged,
    connection,
    exec_proc,
    expect_error,
    fingerprint,
    new_account,
    new_app,
    query,
    result_sets,
    run_threads,
    scalar,
)
from mailq_db import procedures
from mailq_db.errors import BatchRowError, DatabaseError

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def account(conn) -> str:
    return new_account(conn, "batch", from_address="noreply@example.org", from_name="Batch")


def mails(account: str, n: int, **extra) -> list[dict]:
    return [dict(to_address=f"r{i}@example.com", subject=f"batch {i} 你好", body=f"body {i}",
                 account_name=account, **extra) for i in range(n)]


def test_ten_thousand_mails_in_one_call(conn, account):
    before = scalar(conn, "SELECT COUNT_BIG(*) FROM mailq.MailQueue;")
    result = procedures.enqueue_mail_batch(conn, mails(account, 10000))
    assert [r.row_no for r in result.enqueued] == list(range(1, 10001))
    assert all(r.created for r in result.enqueued) and result.rejected == []
    ids = result.mail_ids
    assert ids == sorted(ids) and len(set(ids)) == 10000
    assert len({r.message_id for r in result.enqueued}) == 10000
    assert scalar(conn, "SELECT COUNT_BIG(*) FROM mailq.MailQueue;") == before + 10000
    row = query(conn, "SELECT ToAddress, Subject, Status, Priority, AttemptsRemaining, AccountName "
                      "FROM mailq.MailQueue WHERE ID = ?;", ids[9999])[0]
    assert row == ("r9999@example.com", "batch 9999 你好", "UnSent", 5, 5, account)


@pytest.mark.parametrize("bad_row", [1, 5000, 10000])
def test_one_bad_row_anywhere_writes_nothing(conn, account, bad_row):
    batch = mails(account, 10000)
    batch[bad_row - 1]["to_address"] = "no-domain@"
    before = fingerprint(conn)
    error = expect_error(50220, procedures.enqueue_mail_batch, conn, batch, cls=BatchRowError)
    assert (error.row, error.field, error.rule) == (bad_row, "ToAddress", 50102)
    assert_unchanged(before, fingerprint(conn))


def test_error_counts_the_other_bad_rows(conn, account):
    batch = mails(account, 5)
    batch[1]["priority"] = 10
    batch[3]["subject"] = "a\r\nBcc: x@evil.example"
    error = expect_error(50220, procedures.enqueue_mail_batch, conn, batch, cls=BatchRowError)
    assert (error.row, error.field, error.rule) == (2, "Priority", 50109)
    assert "1 other rows are invalid" in error.message


# Each bad mail, with the rule EnqueueMail raises for it (proved by calling it).
BAD = [
    dict(to_address=None),
    dict(subject=None),
    dict(body=None),
    dict(subject="x" * 901),
    dict(from_name="a\nb"),
    dict(cc="a@b@c.example"),
    dict(to_address=";".join(f"r{i}@example.com" for i in range(101))),
    dict(body_format="Markdown"),
    dict(priority=-1),
    dict(max_attempts=21),
    dict(expires_at_utc=datetime(2000, 1, 1)),
    dict(headers={"To": "x@example.com"}),
    dict(headers={"Bad Name": "x"}),
    dict(headers={"X-A": "1\r\n2"}),
    dict(account_name="no-such-account"),
    dict(app_name="no-such-app"),
    dict(attachments=[procedures.Attachment("../etc/passwd", b"x")]),
    dict(attachments=[procedures.Attachment(f"f{i}.txt", b"x") for i in range(11)]),
]


def test_rejected_rows_carry_enqueuemails_own_rule(conn, account):
    batch = mails(account, len(BAD) + 1)
    for i, change in enumerate(BAD):
        batch[i].update(change)
    expected = {}
    for i, change in enumerate(BAD):
        with pytest.raises(DatabaseError) as info:
            procedures.enqueue_mail(conn, **batch[i])
        expected[i + 1] = info.value.number
    result = procedures.enqueue_mail_batch(conn, batch, reject_invalid=True)
    assert {r.row_no: r.error_number for r in result.rejected} == expected
    assert [r.row_no for r in result.enqueued] == [len(BAD) + 1]


def test_json_field_of_the_wrong_type_or_name_is_rule_50223(conn, account):
    cursor = exec_proc(conn, "mailq.EnqueueMailBatch", RejectInvalid=1, Mails=(
        '[{"ToAddress": "a@example.com", "Subject": "s", "Body": "b", "Priority": "high"},'
        ' {"ToAddress": "a@example.com", "Subject": "s", "Body": "b", "Subjekt": "typo"},'
        ' {"ToAddress": "a@example.com", "Subject": 42, "Body": "b"}]'))
    accepted, rejected = result_sets(cursor)
    assert accepted == []
    assert [(r[0], r[1], r[2]) for r in rejected] == [(1, "Priority", 50223), (2, "Subjekt", 50223),
                                                      (3, "Subject", 50223)]


@pytest.mark.parametrize("params, number", [
    (dict(), 50221),
    (dict(Mails="{}"), 50221),
    (dict(Mails="[1]"), 50221),
    (dict(Mails="[]"), 50222),
])
def test_bad_shapes_are_refused(conn, params, number):
    before = fingerprint(conn)
    expect_error(number, exec_proc, conn, "mailq.EnqueueMailBatch", **params)
    assert_unchanged(before, fingerprint(conn))


def test_more_than_ten_thousand_is_refused(conn, account):
    expect_error(50222, exec_proc, conn, "mailq.EnqueueMailBatch",
                 Mails=procedures.batch_json(mails(account, 10001)))


def test_keys_inside_the_batch_and_against_existing_mails(conn, account):
    key_a, key_b = f"a-{uuid.uuid4()}", f"b-{uuid.uuid4()}"
    existing = procedures.enqueue_mail(conn, **mails(account, 1)[0], idempotency_key=key_b)
    batch = mails(account, 4)
    batch[0]["idempotency_key"] = key_a
    batch[1] = dict(batch[0])                       # same key, same content: same mail
    batch[2].update(**mails(account, 1)[0], idempotency_key=key_b)  # a single call's mail again
    batch[3].update(idempotency_key=key_a)          # same key, other content: 50116
    result = procedures.enqueue_mail_batch(conn, batch, reject_invalid=True)
    by_row = {r.row_no: r for r in result.enqueued}
    assert by_row[1].created and not by_row[2].created and by_row[2].mail_id == by_row[1].mail_id
    assert not by_row[3].created and by_row[3].mail_id == existing.mail_id
    assert [(r.row_no, r.field, r.error_number) for r in result.rejected] == [(4, "IdempotencyKey", 50116)]
    # and a single call with row 1's values returns row 1's mail (same content hash)
    again = procedures.enqueue_mail(conn, **batch[0])
    assert (again.mail_id, again.created) == (by_row[1].mail_id, False)


def test_key_reused_with_other_content_is_all_or_nothing_by_default(conn, account):
    key = f"k-{uuid.uuid4()}"
    procedures.enqueue_mail(conn, **mails(account, 1)[0], idempotency_key=key)
    batch = mails(account, 3)
    batch[2].update(subject="other", idempotency_key=key)
    before = fingerprint(conn)
    error = expect_error(50220, procedures.enqueue_mail_batch, conn, batch, cls=BatchRowError)
    assert (error.row, error.field, error.rule) == (3, "IdempotencyKey", 50116)
    assert_unchanged(before, fingerprint(conn))


def test_batch_and_single_calls_racing_on_keys_create_each_mail_once(mssql_url, conn, account):
    keys = [f"race-{uuid.uuid4()}" for _ in range(50)]
    batch = [dict(m, idempotency_key=k) for m, k in zip(mails(account, 50), keys)]

    def run(i, barrier):
        with connection(mssql_url) as c:
            barrier.wait()
            if i == 0:
                return procedures.enqueue_mail_batch(c, batch).mail_ids
            return [procedures.enqueue_mail(c, **m).mail_id for m in reversed(batch)]

    batch_ids, single_ids = run_threads(2, run)
    assert sorted(batch_ids) == sorted(single_ids)
    placeholders = ",".join("?" * len(keys))
    assert scalar(conn, f"SELECT COUNT(*) FROM mailq.MailQueue WHERE IdempotencyKey IN ({placeholders});",
                  *keys) == 50


def test_inside_the_callers_transaction_nothing_exists_until_commit(mssql_url, account):
    with connection(mssql_url) as c:
        c.autocommit = False
        result = procedures.enqueue_mail_batch(c, mails(account, 3))
        c.rollback()
        ids = result.mail_ids
        c.autocommit = True
        placeholders = ",".join("?" * len(ids))
        assert scalar(c, f"SELECT COUNT(*) FROM mailq.MailQueue WHERE ID IN ({placeholders});", *ids) == 0


def test_table_valued_parameter_from_tsql(conn, account):
    rows = query(conn, f"""
        SET NOCOUNT ON;
        DECLARE @Rows mailq.MailBatchRow;
        INSERT INTO @Rows (RowNo, ToAddress, Subject, Body, AccountName, Priority, DateToProcess)
        VALUES (10, N'a@example.com', N'tvp 1', N'one', N'{account}', 9, NULL),
               (20, N'b@example.com', N'tvp 2', N'two', N'{account}', NULL, DATEADD(HOUR, 1, SYSUTCDATETIME()));
        EXEC mailq.EnqueueMailBatch @MailRows = @Rows;""")
    assert [r[0] for r in rows] == [10, 20] and all(r[3] for r in rows)
    assert query(conn, "SELECT Priority FROM mailq.MailQueue WHERE ID = ?;", rows[0][1]) == [(9,)]


def test_application_bindings_apply_per_row(conn, account):
    app = new_app(conn, "unbound_batch")
    batch = mails(account, 2)
    batch[1]["app_name"] = app
    result = procedures.enqueue_mail_batch(conn, batch, reject_invalid=True)
    assert [r.row_no for r in result.enqueued] == [1]
    assert [(r.row_no, r.error_number) for r in result.rejected] == [(2, 50160)]


def test_attachments_are_stored_per_mail(conn, account):
    batch = mails(account, 2)
    batch[0]["attachments"] = [procedures.Attachment("a.txt", b"alpha", "text/plain")]
    batch[1]["attachments"] = [procedures.Attachment("b.bin", bytes(range(256)))]
    ids = procedures.enqueue_mail_batch(conn, batch).mail_ids
    got = query(conn, "SELECT MailID, FileName, Content FROM mailq.MailAttachment WHERE MailID IN (?, ?) "
                      "ORDER BY MailID;", *ids)
    assert got == [(ids[0], "a.txt", b"alpha"), (ids[1], "b.bin", bytes(range(256)))]


def test_due_time_and_expiry(conn, account):
    due = datetime.utcnow().replace(microsecond=0) + timedelta(days=1)
    batch = mails(account, 1, date_to_process=due, expires_at_utc=due + timedelta(hours=2))
    mail_id = procedures.enqueue_mail_batch(conn, batch).mail_ids[0]
    assert query(conn, "SELECT DateToProcess, VisibleAtUtc, ExpiresAtUtc FROM mailq.MailQueue WHERE ID = ?;",
                 mail_id) == [(due, due, due + timedelta(hours=2))]


# --- revision 0018: input hardening and lock escalation ---------------------

def test_a_time_with_an_offset_is_converted_to_utc(conn, account):
    """"+02:00" is two hours ahead of UTC: the mail is due at 08:00 UTC, not
    at 10:00 (a direct DATETIME2 conversion would drop the offset)."""
    cursor = exec_proc(conn, "mailq.EnqueueMailBatch", Mails=(
        '[{"ToAddress": "a@example.com", "Subject": "s", "Body": "b", "AccountName": "%s",'
        ' "DateToProcess": "2031-05-01T10:00:00+02:00", "ExpiresAtUtc": "2031-05-02T08:00:00Z"},'
        ' {"ToAddress": "a@example.com", "Subject": "s", "Body": "b2", "AccountName": "%s",'
        ' "DateToProcess": "2031-05-01T08:00:00"}]' % (account, account)))
    accepted, _ = result_sets(cursor)
    ids = [r[1] for r in accepted]
    rows = query(conn, "SELECT DateToProcess, ExpiresAtUtc FROM mailq.MailQueue WHERE ID IN (?, ?) ORDER BY ID;",
                 *ids)
    assert rows == [(datetime(2031, 5, 1, 8), datetime(2031, 5, 2, 8)), (datetime(2031, 5, 1, 8), None)]


def test_integers_must_be_json_numbers(conn, account):
    cursor = exec_proc(conn, "mailq.EnqueueMailBatch", RejectInvalid=1, Mails=(
        '[{"ToAddress": "a@example.com", "Subject": "s", "Body": "b", "AccountName": "%s", "Priority": "5"},'
        ' {"ToAddress": "a@example.com", "Subject": "s", "Body": "b", "AccountName": "%s", "Priority": 5}]'
        % (account, account)))
    accepted, rejected = result_sets(cursor)
    assert [(r[0], r[1], r[2]) for r in rejected] == [(1, "Priority", 50223)]
    assert [r[0] for r in accepted] == [2]


def test_json_white_space_may_precede_the_array(conn, account):
    text = "\r\n\t " + procedures.batch_json(mails(account, 2))
    cursor = exec_proc(conn, "mailq.EnqueueMailBatch", Mails=text)
    accepted, rejected = result_sets(cursor)
    assert len(accepted) == 2 and rejected == []


def test_lock_escalation_is_disabled_on_the_tables_a_batch_writes(conn):
    rows = query(conn, "SELECT name, lock_escalation_desc FROM sys.tables "
                       "WHERE schema_id = SCHEMA_ID(N'mailq') AND name IN "
                       "(N'MailQueue', N'MailAttachment', N'MailEvent') ORDER BY name;")
    assert rows == [("MailAttachment", "DISABLE"), ("MailEvent", "DISABLE"), ("MailQueue", "DISABLE")]


def test_a_ten_thousand_mail_batch_does_not_block_a_claim(mssql_url, conn, account):
    """With the batch's transaction still open, another session claims and
    enqueues: row locks on new rows only (no table lock from escalation)."""
    import pyodbc

    writer = pyodbc.connect(mssql_url, autocommit=False)
    try:
        procedures.enqueue_mail_batch(writer, mails(account, 10000))
        other = pyodbc.connect(mssql_url, autocommit=True)
        try:
            other.execute("SET LOCK_TIMEOUT 5000;")
            exec_proc(other, "mailq.ClaimMail", BatchSize=1, LockToken=str(uuid.uuid4()),
                      AccountNames=f'["{account}"]').fetchall()
            mail_id = procedures.enqueue_mail(other, to_address="x@example.com", subject="s", body="b",
                                              account_name=account)
            assert mail_id.mail_id
        finally:
            other.close()
    finally:
        writer.rollback()
        writer.close()


def test_a_time_at_the_end_of_the_range_is_a_row_error_not_a_batch_error(conn, account):
    cursor = exec_proc(conn, "mailq.EnqueueMailBatch", RejectInvalid=1, Mails=(
        '[{"ToAddress": "a@example.com", "Subject": "s", "Body": "b", "AccountName": "%s",'
        ' "DateToProcess": "9999-12-31T23:00:00-02:00"},'
        ' {"ToAddress": "a@example.com", "Subject": "s", "Body": "b", "AccountName": "%s"}]' % (account, account)))
    accepted, rejected = result_sets(cursor)
    assert [(r[0], r[1], r[2]) for r in rejected] == [(1, "DateToProcess", 50223)]
    assert [r[0] for r in accepted] == [2]
