"""Leases, reclaim and token fencing against SQL Server 2022.

Leases of one second (``@LeaseSeconds = 1``) and short sleeps make real
expiries happen:

* an expired lease is reclaimed by the next claim: the mail comes back with
  PossibleDuplicate = 1 and the next attempt number, the old attempt row is
  closed 'Abandoned', every acknowledgement under the old token is refused
  with 50202 and changes nothing, and the new owner's acknowledgement works;
* a reclaimed mail with no attempt left becomes Failed (not returned), one
  past its expiry becomes Expired;
* batched acknowledgements: one MarkSent for many mails; all or nothing when
  one of them is stale (50202) or already acknowledged (50203, MarkFailed);
  MarkSent and MarkFailed repeated under their own token are accepted and
  change nothing; under another token they are still 50203.
"""

from __future__ import annotations

import time
import uuid
from datetime import timedelta

import pytest

from mailq_helpers import (
    as_uuid,
    assert_unchanged,
    attempts,
    claim,
    connection,
    enqueue,
    expect_error,
    fingerprint,
    mail_row,
    new_account,
    new_app,
    server_now,
    statuses,
)
from mailq_db import procedures
from mailq_db.errors import LeaseLostError

pytestmark = pytest.mark.integration

EXPIRY_WAIT = 2.2  # seconds: a 1-second lease has surely expired (DATETIME2(3) times, one clock)


@pytest.fixture(scope="module")
def conn2(mssql_url):
    """A second session: the worker that reclaims."""
    with connection(mssql_url) as c:
        yield c


@pytest.fixture(scope="module")
def account(conn) -> str:
    return new_account(conn, "lease")


def refused_with_state_kept(conn, number, call):
    before = fingerprint(conn)
    expect_error(number, call, cls=LeaseLostError)
    assert_unchanged(before, fingerprint(conn))


def test_expired_lease_is_reclaimed_flagged_and_the_old_token_fenced(conn, conn2, account):
    app = new_app(conn, "reclaim")
    (mail,) = enqueue(conn, account, app, 1, max_attempts=5)
    old, (first,) = claim(conn, app, lease_seconds=1, worker_name="old-worker")
    assert first.possible_duplicate is False and first.attempt_no == 1
    time.sleep(EXPIRY_WAIT)

    new, (second,) = claim(conn2, app, lease_seconds=300, worker_name="new-worker")
    assert second.id == mail.mail_id
    assert second.possible_duplicate is True
    assert second.attempt_no == 2 and second.attempts_remaining == 3
    assert second.message_id == first.message_id

    row = mail_row(conn, mail.mail_id)
    assert row["Status"] == "Sending" and as_uuid(row["ThreadLock"]) == new
    assert row["PossibleDuplicate"] in (True, 1)
    abandoned, current = attempts(conn, mail.mail_id)
    assert as_uuid(abandoned["LockToken"]) == old and abandoned["Outcome"] == "Abandoned"
    assert abandoned["EndedAtUtc"] is not None and abandoned["ErrorText"].startswith("Lease expired")
    assert as_uuid(current["LockToken"]) == new and current["WorkerName"] == "new-worker"
    assert current["AttemptNo"] == 2 and current["Outcome"] is None and current["EndedAtUtc"] is None

    # The first worker wakes up: every acknowledgement under its token is refused.
    ids = [mail.mail_id]
    refused_with_state_kept(conn, 50202, lambda: procedures.mark_sent(conn, ids=ids, lock_token=old, smtp_code=250))
    refused_with_state_kept(conn, 50202, lambda: procedures.mark_failed(
        conn, ids=ids, lock_token=old, disposition="Stop", error="550 5.1.1 unknown user"))
    refused_with_state_kept(conn, 50202, lambda: procedures.extend_lease(conn, ids=ids, lock_token=old,
                                                                         lease_seconds=300))
    refused_with_state_kept(conn, 50202, lambda: procedures.release_mail(conn, ids=ids, lock_token=old))

    # The new owner's acknowledgement works.
    acks = procedures.mark_sent(conn2, ids=ids, lock_token=new, smtp_code=250)
    assert [(a.mail_id, a.status) for a in acks] == [(mail.mail_id, "Sent")]
    row = mail_row(conn, mail.mail_id)
    assert row["Status"] == "Sent" and row["PossibleDuplicate"] in (True, 1)
    assert [a["Outcome"] for a in attempts(conn, mail.mail_id)] == ["Abandoned", "Sent"]

    # And the old token, now facing a finished mail, is told it is no longer Sending.
    refused_with_state_kept(conn, 50203, lambda: procedures.mark_sent(conn, ids=ids, lock_token=old))


def test_mail_with_no_attempt_left_is_not_reclaimed_and_finalize_fails_it(conn, conn2, account):
    app = new_app(conn, "noattempt")
    (mail,) = enqueue(conn, account, app, 1, max_attempts=1)
    old, (got,) = claim(conn, app, lease_seconds=1)
    assert got.attempts_remaining == 0
    time.sleep(EXPIRY_WAIT)

    _, reclaimed = claim(conn2, app)
    assert reclaimed == [], "a mail without attempts left was handed out again"
    assert mail_row(conn, mail.mail_id)["Status"] == "Sending", "the claim finalized (0004 behaviour)"
    procedures.finalize_mail(conn2)
    row = mail_row(conn, mail.mail_id)
    assert row["Status"] == "Failed" and row["ThreadLock"] is None
    assert row["LastError"].startswith("No attempt left") and row["DateProcessed"] is not None
    assert row["PossibleDuplicate"] in (True, 1) and row["AttemptsRemaining"] == 0
    (attempt,) = attempts(conn, mail.mail_id)
    assert attempt["Outcome"] == "Abandoned" and as_uuid(attempt["LockToken"]) == old
    refused_with_state_kept(conn, 50203, lambda: procedures.mark_sent(conn, ids=[mail.mail_id], lock_token=old))


def test_mail_that_expires_while_leased_is_not_reclaimed_and_finalize_expires_it(conn, conn2, account):
    app = new_app(conn, "leasexp")
    (mail,) = enqueue(conn, account, app, 1, expires_at_utc=server_now(conn) + timedelta(seconds=2))
    _, _ = claim(conn, app, lease_seconds=1)
    time.sleep(EXPIRY_WAIT + 0.5)
    _, reclaimed = claim(conn2, app)
    assert reclaimed == []
    procedures.finalize_mail(conn2)
    row = mail_row(conn, mail.mail_id)
    assert row["Status"] == "Expired" and row["PossibleDuplicate"] in (True, 1)
    assert [a["Outcome"] for a in attempts(conn, mail.mail_id)] == ["Abandoned"]


def test_a_live_lease_is_not_reclaimed(conn, conn2, account):
    app = new_app(conn, "live")
    enqueue(conn, account, app, 3)
    token, got = claim(conn, app, lease_seconds=30)
    assert len(got) == 3
    _, other = claim(conn2, app)
    assert other == [], "a live lease was taken over (the article's bug 2)"


def test_batched_mark_sent_acknowledges_many_mails_in_one_call(conn, account):
    app = new_app(conn, "batchack")
    ids = [r.mail_id for r in enqueue(conn, account, app, 60)]
    token, got = claim(conn, app, batch_size=60)
    assert {m.id for m in got} == set(ids)
    acks = procedures.mark_sent(conn, ids=ids, lock_token=token, smtp_code=250)
    assert sorted(a.mail_id for a in acks) == sorted(ids)
    assert {a.status for a in acks} == {"Sent"}
    assert set(statuses(conn, ids).values()) == {"Sent"}
    for mail_id in ids[:5]:
        assert [a["Outcome"] for a in attempts(conn, mail_id)] == ["Sent"]


def test_batched_acknowledgements_are_all_or_nothing(conn, conn2, account):
    app = new_app(conn, "allornothing")
    ids = [r.mail_id for r in enqueue(conn, account, app, 10)]
    token, got = claim(conn, app, batch_size=10, lease_seconds=1)
    assert len(got) == 10
    time.sleep(EXPIRY_WAIT)
    thief, (stolen,) = claim(conn2, app, batch_size=1)  # reclaims exactly one of the ten
    assert stolen.id in ids and stolen.possible_duplicate is True

    for call in (
        lambda: procedures.mark_sent(conn, ids=ids, lock_token=token, smtp_code=250),
        lambda: procedures.mark_failed(conn, ids=ids, lock_token=token, disposition="Retry", error="451 later"),
        lambda: procedures.extend_lease(conn, ids=ids, lock_token=token, lease_seconds=300),
        lambda: procedures.release_mail(conn, ids=ids, lock_token=token),
    ):
        refused_with_state_kept(conn, 50202, call)
    assert list(statuses(conn, ids).values()).count("Sending") == 10

    # Without the stolen one, the batch goes through (fencing is by token, not by clock).
    mine = [i for i in ids if i != stolen.id]
    procedures.extend_lease(conn, ids=mine, lock_token=token, lease_seconds=300)
    sent_one = mine.pop()
    procedures.mark_sent(conn, ids=[sent_one], lock_token=token)
    sent_at = mail_row(conn, sent_one)["SentAtUtc"]
    # One already acknowledged in a MarkFailed batch: 50203, and again nothing changes.
    refused_with_state_kept(conn, 50203, lambda: procedures.mark_failed(
        conn, ids=mine + [sent_one], lock_token=token, disposition="Retry", error="451 later"))
    assert list(statuses(conn, mine).values()).count("Sending") == len(mine)
    # MarkSent is repeatable by its token: the one already Sent is accepted unchanged.
    acks = procedures.mark_sent(conn, ids=mine + [sent_one], lock_token=token)
    assert sorted(a.mail_id for a in acks) == sorted(mine + [sent_one])
    assert mail_row(conn, sent_one)["SentAtUtc"] == sent_at
    assert [a["Outcome"] for a in attempts(conn, sent_one)] == ["Sent"]
    procedures.mark_sent(conn2, ids=[stolen.id], lock_token=thief)
    assert set(statuses(conn, ids).values()) == {"Sent"}


def test_mark_sent_repeated_with_its_token_changes_nothing(conn, account):
    """A worker whose connection dropped before MarkSent's reply calls again: accepted, nothing changes;
    the same call under another token is still refused (50203)."""
    app = new_app(conn, "repeat")
    ids = [r.mail_id for r in enqueue(conn, account, app, 3)]
    token, _ = claim(conn, app)
    first = procedures.mark_sent(conn, ids=ids, lock_token=token, smtp_code=250)
    before = fingerprint(conn)
    again = procedures.mark_sent(conn, ids=ids, lock_token=token, smtp_code=250)
    assert [(a.mail_id, a.status) for a in again] == [(a.mail_id, a.status) for a in first]
    assert_unchanged(before, fingerprint(conn))
    refused_with_state_kept(conn, 50203, lambda: procedures.mark_sent(conn, ids=ids, lock_token=uuid.uuid4()))
    refused_with_state_kept(conn, 50203, lambda: procedures.release_mail(conn, ids=ids, lock_token=token))


def test_mark_failed_repeated_with_its_token_changes_nothing(conn, account):
    """The worker resends a MarkFailed whose reply was lost with the connection after it
    committed: accepted, nothing changes, no row returned; under another token, 50203."""
    app = new_app(conn, "repeatfail")
    ids = [r.mail_id for r in enqueue(conn, account, app, 2)]
    token, _ = claim(conn, app)
    first = procedures.mark_failed(conn, ids=ids, lock_token=token, disposition="Retry", error="451 later")
    assert sorted(a.mail_id for a in first) == sorted(ids)
    before = fingerprint(conn)
    assert procedures.mark_failed(conn, ids=ids, lock_token=token, disposition="Retry", error="451 later") == []
    assert_unchanged(before, fingerprint(conn))
    refused_with_state_kept(conn, 50203, lambda: procedures.mark_failed(
        conn, ids=ids, lock_token=uuid.uuid4(), disposition="Retry", error="451 later"))


def test_mark_failed_repeated_after_the_mail_was_reclaimed_changes_nothing(conn, conn2, account):
    """The repeat comes after the retry came due and another worker claimed the mail:
    the first call committed, so no 50202 ('lease lost'), and the new lease is untouched."""
    app = new_app(conn, "repeatreclaim")
    (mail,) = enqueue(conn, account, app, 1, max_attempts=5)
    token, _ = claim(conn, app)
    procedures.mark_failed(conn, ids=[mail.mail_id], lock_token=token, disposition="Retry",
                           error="451 later", retry_after_seconds=0)
    other, (again,) = claim(conn2, app)
    assert again.id == mail.mail_id
    before = fingerprint(conn)
    assert procedures.mark_failed(conn, ids=[mail.mail_id], lock_token=token, disposition="Retry",
                                  error="451 later", retry_after_seconds=0) == []
    assert_unchanged(before, fingerprint(conn))
    assert as_uuid(mail_row(conn, mail.mail_id)["ThreadLock"]) == other


def test_an_unknown_token_never_matches(conn, account):
    app = new_app(conn, "token")
    (mail,) = enqueue(conn, account, app, 1)
    claim(conn, app)
    refused_with_state_kept(conn, 50202, lambda: procedures.mark_sent(conn, ids=[mail.mail_id],
                                                                      lock_token=uuid.uuid4()))
