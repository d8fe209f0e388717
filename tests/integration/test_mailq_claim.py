"""mailq.ClaimMail and the simple acknowledgements against SQL Server 2022.

* Order: highest Priority first, then the oldest due time (then ID); batches
  of exactly @BatchSize while enough mail is due (default 10).
* Only due mail is claimed: a mail due in the future waits (the article's
  bug 1 was the inverse), and is claimed once its time has come.
* A claim decrements AttemptsRemaining, counts AttemptCount, sets the token
  and the lease, and opens an attempt row; MarkSent closes it ('Sent' or
  'DryRun', SMTP code and text); ExtendLease moves the lease; ReleaseMail
  gives the mail back with the attempt refunded ('Released').
* App isolation: a worker with @AppName = 'a' gets only 'a' mail; a worker
  with @AppName NULL (competing) gets every application's mail and mail
  without application.
* Expiry: a mail past ExpiresAtUtc is never claimed (it takes no slot of the
  batch); mailq.FinalizeMail turns it Expired (revision 0005).
* @AccountNames: a worker claims only the accounts it has credentials for.
"""

from __future__ import annotations

import time
import uuid
from datetime import timedelta

import pytest

from mailq_helpers import (
    as_uuid,
    attempts,
    claim,
    enqueue,
    exec_proc,
    mail_row,
    new_account,
    new_app,
    quiesce,
    result_sets,
    server_now,
    utc_floor_seconds,
)
from mailq_db import procedures

pytestmark = pytest.mark.integration

TOLERANCE = timedelta(seconds=1)


@pytest.fixture(scope="module")
def account(conn) -> str:
    return new_account(conn, "claim")


def test_claim_order_is_priority_then_oldest_due(conn, account):
    app = new_app(conn, "order")
    now = utc_floor_seconds(server_now(conn))
    spec = {  # enqueued in this order, so ID order differs from claim order
        "A": (5, -30), "B": (9, -10), "C": (5, -60), "D": (0, -100), "E": (9, -20), "F": (9, +3600), "G": (5, -60),
    }
    ids = {}
    for name, (priority, offset) in spec.items():
        (r,) = enqueue(conn, account, app, 1, priority=priority, date_to_process=now + timedelta(seconds=offset))
        ids[name] = r.mail_id
    by_id = {v: k for k, v in ids.items()}

    _, first = claim(conn, app, batch_size=3)
    _, second = claim(conn, app, batch_size=2)
    _, third = claim(conn, app, batch_size=10)
    _, fourth = claim(conn, app, batch_size=10)
    assert {by_id[m.id] for m in first} == {"E", "B", "C"}
    assert {by_id[m.id] for m in second} == {"G", "A"}  # C and G are due together: lower ID first
    assert [by_id[m.id] for m in third] == ["D"]
    assert fourth == [], "a mail due in an hour was claimed"
    # The result set is ordered by Priority DESC, ID (header of mailq.ClaimMail).
    assert [by_id[m.id] for m in first] == ["B", "E", "C"]
    future = mail_row(conn, ids["F"])
    assert future["Status"] == "UnSent" and future["AttemptCount"] == 0 and future["AttemptsRemaining"] == 5


def test_batch_size_is_honoured(conn, account):
    app = new_app(conn, "batch")
    enqueue(conn, account, app, 25)
    sizes = [len(claim(conn, app, batch_size=10)[1]) for _ in range(4)]
    assert sizes == [10, 10, 5, 0]

    enqueue(conn, account, app, 12)
    rows = result_sets(exec_proc(conn, "mailq.ClaimMail", BatchSize=None, LockToken=str(uuid.uuid4()),
                                 LeaseSeconds=None, AppName=app))
    assert len(rows[0]) == 10, "NULL @BatchSize means the default, 10"


def test_only_due_mail_is_claimed_and_future_mail_once_due(conn, account):
    app = new_app(conn, "due")
    now = server_now(conn)
    (later,) = enqueue(conn, account, app, 1, date_to_process=now + timedelta(seconds=2))
    (due,) = enqueue(conn, account, app, 1, date_to_process=now - timedelta(seconds=1))
    _, got = claim(conn, app)
    assert [m.id for m in got] == [due.mail_id]
    time.sleep(2.5)
    _, got = claim(conn, app)
    assert [m.id for m in got] == [later.mail_id]


def test_claim_leases_decrements_attempts_and_opens_an_attempt(conn, account):
    app = new_app(conn, "lease")
    (mail,) = enqueue(conn, account, app, 1, max_attempts=3)
    t0 = server_now(conn)
    token, (got,) = claim(conn, app, lease_seconds=120, worker_name="host1/7")
    t1 = server_now(conn)
    assert got.id == mail.mail_id
    assert got.attempt_no == 1 and got.attempts_remaining == 2 and got.possible_duplicate is False
    assert t0 + timedelta(seconds=120) - TOLERANCE <= got.lease_expires_utc <= t1 + timedelta(seconds=120) + TOLERANCE

    row = mail_row(conn, mail.mail_id)
    assert row["Status"] == "Sending" and as_uuid(row["ThreadLock"]) == token
    assert row["AttemptCount"] == 1 and row["AttemptsRemaining"] == 2
    assert row["VisibleAtUtc"] == got.lease_expires_utc
    (attempt,) = attempts(conn, mail.mail_id)
    assert attempt["AttemptNo"] == 1 and as_uuid(attempt["LockToken"]) == token
    assert attempt["WorkerName"] == "host1/7"
    assert t0 - TOLERANCE <= attempt["StartedAtUtc"] <= t1 + TOLERANCE
    assert attempt["EndedAtUtc"] is None and attempt["Outcome"] is None

    acks = procedures.mark_sent(conn, ids=[mail.mail_id], lock_token=token, smtp_code=250,
                                smtp_text="250 2.0.0 Ok: queued as 4F2")
    assert [(a.mail_id, a.status, a.next_attempt_utc) for a in acks] == [(mail.mail_id, "Sent", None)]
    row = mail_row(conn, mail.mail_id)
    assert row["Status"] == "Sent" and row["ThreadLock"] is None and row["LastError"] is None
    assert row["SentAtUtc"] is not None and row["DateProcessed"] == row["SentAtUtc"]
    assert row["DryRun"] in (False, 0) and row["AttemptsRemaining"] == 2
    (attempt,) = attempts(conn, mail.mail_id)
    assert attempt["Outcome"] == "Sent" and attempt["SmtpCode"] == 250
    assert attempt["ErrorText"] == "250 2.0.0 Ok: queued as 4F2" and attempt["EndedAtUtc"] is not None


def test_dry_run_acknowledgement_records_that_nothing_was_sent(conn, account):
    app = new_app(conn, "dry")
    (mail,) = enqueue(conn, account, app, 1)
    token, _ = claim(conn, app)
    procedures.mark_sent(conn, ids=[mail.mail_id], lock_token=token, dry_run=True)
    row = mail_row(conn, mail.mail_id)
    assert row["Status"] == "Sent" and row["DryRun"] in (True, 1)
    assert attempts(conn, mail.mail_id)[0]["Outcome"] == "DryRun"


def test_extend_lease_moves_the_lease(conn, account):
    app = new_app(conn, "extend")
    (mail,) = enqueue(conn, account, app, 1)
    token, (got,) = claim(conn, app, lease_seconds=60)
    t0 = server_now(conn)
    new = procedures.extend_lease(conn, ids=[mail.mail_id], lock_token=token, lease_seconds=600)
    t1 = server_now(conn)
    assert set(new) == {mail.mail_id}
    expires = new[mail.mail_id].expires_utc
    assert t0 + timedelta(seconds=600) - TOLERANCE <= expires <= t1 + timedelta(seconds=600) + TOLERANCE
    assert 598 <= new[mail.mail_id].seconds_remaining <= 600
    row = mail_row(conn, mail.mail_id)
    assert row["VisibleAtUtc"] == expires and row["Status"] == "Sending"
    assert row["AttemptCount"] == 1 and len(attempts(conn, mail.mail_id)) == 1


def test_release_gives_the_mail_back_and_refunds_the_attempt(conn, account):
    app = new_app(conn, "release")
    (mail,) = enqueue(conn, account, app, 1)
    token, _ = claim(conn, app)
    acks = procedures.release_mail(conn, ids=[mail.mail_id], lock_token=token)
    assert [(a.mail_id, a.status) for a in acks] == [(mail.mail_id, "UnSent")]
    row = mail_row(conn, mail.mail_id)
    assert row["Status"] == "UnSent" and row["ThreadLock"] is None
    assert row["AttemptsRemaining"] == 5 and row["AttemptCount"] == 1
    assert row["VisibleAtUtc"] <= server_now(conn)
    (attempt,) = attempts(conn, mail.mail_id)
    assert attempt["Outcome"] == "Released" and attempt["EndedAtUtc"] is not None

    _, (again,) = claim(conn, app)
    assert again.id == mail.mail_id and again.attempt_no == 2 and again.attempts_remaining == 4


def test_app_isolation(conn, account):
    quiesce(conn)  # this test claims with @AppName NULL
    a, b = new_app(conn, "iso_a"), new_app(conn, "iso_b")
    a_ids = {r.mail_id for r in enqueue(conn, account, a, 2)}
    b_ids = {r.mail_id for r in enqueue(conn, account, b, 2)}
    none_ids = {r.mail_id for r in enqueue(conn, account, None, 2)}

    _, isolated = claim(conn, a, batch_size=100)
    assert {m.id for m in isolated} == a_ids
    assert all(m.app_name == a for m in isolated)
    _, again = claim(conn, a, batch_size=100)
    assert again == [], "an isolated worker got another application's mail or mail without application"

    _, competing = claim(conn, None, batch_size=100)
    assert {m.id for m in competing} == b_ids | none_ids

    # A competing worker takes every application's mail, isolated ones included.
    fresh = {r.mail_id for r in enqueue(conn, account, a, 1) + enqueue(conn, account, b, 1)
             + enqueue(conn, account, None, 1)}
    _, everything = claim(conn, None, batch_size=100)
    assert {m.id for m in everything} == fresh


def test_expired_mail_is_never_claimed_and_finalize_makes_it_expired(conn, account):
    app = new_app(conn, "expiry")
    now = server_now(conn)
    (stale,) = enqueue(conn, account, app, 1, date_to_process=now - timedelta(seconds=10),
                       expires_at_utc=now - timedelta(seconds=5), priority=9)
    (fresh,) = enqueue(conn, account, app, 1, expires_at_utc=now + timedelta(hours=1), priority=0)
    # Batch of one: the expired mail ranks first but must not take the slot.
    _, got = claim(conn, app, batch_size=1)
    assert [m.id for m in got] == [fresh.mail_id]
    assert mail_row(conn, stale.mail_id)["Status"] == "UnSent", "the claim finalized (0004 behaviour)"
    procedures.finalize_mail(conn)
    row = mail_row(conn, stale.mail_id)
    assert row["Status"] == "Expired" and row["ThreadLock"] is None
    assert row["LastError"].startswith("Expired") and row["DateProcessed"] is not None
    assert row["AttemptsRemaining"] == 5 and row["AttemptCount"] == 0
    assert attempts(conn, stale.mail_id) == [], "an expired mail got an attempt"
    _, got = claim(conn, app)
    assert got == []


def test_a_worker_claims_only_the_accounts_it_can_send_for(conn):
    app = new_app(conn, "accounts")
    mine, other = new_account(conn, "mine"), new_account(conn, "notmine")
    mine_ids = {r.mail_id for r in enqueue(conn, mine, app, 3)}
    other_ids = {r.mail_id for r in enqueue(conn, other, app, 2)}
    mails = procedures.claim_mail(conn, batch_size=100, lock_token=uuid.uuid4(), lease_seconds=300,
                                  app_name=app, account_names=[mine])
    assert {m.id for m in mails} == mine_ids
    assert all(m.account_name == mine for m in mails)
    assert {mail_row(conn, i)["Status"] for i in other_ids} == {"UnSent"}
    mails = procedures.claim_mail(conn, batch_size=100, lock_token=uuid.uuid4(), lease_seconds=300,
                                  app_name=app, account_names=[])
    assert mails == [], "an empty account list claims nothing"
    mails = procedures.claim_mail(conn, batch_size=100, lock_token=uuid.uuid4(), lease_seconds=300,
                                  app_name=app, account_names=None)
    assert {m.id for m in mails} == other_ids
