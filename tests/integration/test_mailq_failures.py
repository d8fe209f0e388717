"""mailq.MarkFailed dispositions against SQL Server 2022 (TinyMail's Retry / Wait / Stop).

* Retry: the attempt is consumed; without @RetryAfterSeconds the mail is due
  again after 30 s * 2^(attempt-1) * a jitter of 0.8-1.2 (so 24-36 s after the
  first attempt, 48-72 s after the second, 96-144 s after the third), each
  mail its own jitter; with @RetryAfterSeconds exactly that; with no attempt
  left the mail is Failed.  Between attempts the tests move the due time to
  now (``make_due_now``) instead of waiting out the backoff.
* Wait: the account is blocked until the retry time (never shortened by a
  later, shorter Wait), the attempt is refunded, that account's other mail is
  not claimed meanwhile while other accounts' mail is; unblocking ends it.
* Stop: Failed at once, whatever attempts are left.
* @PossibleDuplicate = 1 (no reply after the final dot): the mail keeps the flag
  through the Retry and the next claim; without it the flag is left as it was.
"""

from __future__ import annotations

from datetime import timedelta

import pytest

from mailq_helpers import (
    attempts,
    claim,
    enqueue,
    mail_row,
    make_due_now,
    new_account,
    new_app,
    query,
    server_now,
)
from mailq_db import procedures

pytestmark = pytest.mark.integration

EPS = timedelta(milliseconds=50)


@pytest.fixture(scope="module")
def account(conn) -> str:
    return new_account(conn, "fail")


def retry(conn, mail_id, token, **kwargs):
    """MarkFailed Retry; returns (server time before, the ack, server time after)."""
    t0 = server_now(conn)
    (ack,) = procedures.mark_failed(conn, ids=[mail_id], lock_token=token, disposition="Retry",
                                    error="451 4.3.0 temporary failure", smtp_code=451, **kwargs)
    return t0, ack, server_now(conn)


def test_retry_backs_off_exponentially_with_jitter(conn, account):
    app = new_app(conn, "backoff")
    (mail,) = enqueue(conn, account, app, 1, max_attempts=5)
    for attempt_no, base in ((1, 30), (2, 60), (3, 120)):
        token, (got,) = claim(conn, app)
        assert got.id == mail.mail_id and got.attempt_no == attempt_no
        t0, ack, t1 = retry(conn, mail.mail_id, token)
        assert ack.status == "UnSent"
        low, high = timedelta(seconds=base * 0.8), timedelta(seconds=base * 1.2)
        assert t0 + low - EPS <= ack.next_attempt_utc <= t1 + high + EPS, (attempt_no, t0, ack.next_attempt_utc)
        row = mail_row(conn, mail.mail_id)
        assert row["Status"] == "UnSent" and row["VisibleAtUtc"] == ack.next_attempt_utc
        assert row["ThreadLock"] is None and row["AttemptsRemaining"] == 5 - attempt_no
        assert row["LastError"] == "451 4.3.0 temporary failure"
        last = attempts(conn, mail.mail_id)[-1]
        assert last["Outcome"] == "Retry" and last["SmtpCode"] == 451 and last["EndedAtUtc"] is not None
        # Not claimable before its time...
        assert claim(conn, app)[1] == []
        # ...and fast-forwarded for the next round.
        make_due_now(conn, [mail.mail_id])


def test_each_mail_gets_its_own_jitter(conn, account):
    app = new_app(conn, "jitter")
    ids = [r.mail_id for r in enqueue(conn, account, app, 20)]
    token, got = claim(conn, app, batch_size=20)
    assert len(got) == 20
    t0 = server_now(conn)
    acks = procedures.mark_failed(conn, ids=ids, lock_token=token, disposition="Retry", error="421 busy")
    t1 = server_now(conn)
    assert len(acks) == 20
    times = [a.next_attempt_utc for a in acks]
    assert all(t0 + timedelta(seconds=24) - EPS <= t <= t1 + timedelta(seconds=36) + EPS for t in times)
    assert len(set(times)) > 1, "twenty mails got the same retry time: no jitter"


def test_explicit_retry_after_is_honoured(conn, account):
    app = new_app(conn, "after")
    (mail,) = enqueue(conn, account, app, 1)
    token, _ = claim(conn, app)
    t0, ack, t1 = retry(conn, mail.mail_id, token, retry_after_seconds=120)
    assert t0 + timedelta(seconds=120) - EPS <= ack.next_attempt_utc <= t1 + timedelta(seconds=120) + EPS

    (now_mail,) = enqueue(conn, account, app, 1)
    token, got = claim(conn, app)
    assert [m.id for m in got] == [now_mail.mail_id]
    retry(conn, now_mail.mail_id, token, retry_after_seconds=0)
    _, got = claim(conn, app)
    assert [m.id for m in got] == [now_mail.mail_id], "@RetryAfterSeconds = 0 means due at once"


def test_an_outcome_unknown_retry_flags_the_mail_possible_duplicate(conn, account):
    app = new_app(conn, "unknown")
    flagged, plain = enqueue(conn, account, app, 2)
    token, _ = claim(conn, app)
    retry(conn, flagged.mail_id, token, retry_after_seconds=0, possible_duplicate=True)
    retry(conn, plain.mail_id, token, retry_after_seconds=0)
    assert mail_row(conn, flagged.mail_id)["PossibleDuplicate"] is True
    assert mail_row(conn, plain.mail_id)["PossibleDuplicate"] is False
    _, got = claim(conn, app)
    assert {m.id: m.possible_duplicate for m in got} == {flagged.mail_id: True, plain.mail_id: False}


def test_retry_with_no_attempt_left_fails_the_mail(conn, account):
    app = new_app(conn, "lastretry")
    (mail,) = enqueue(conn, account, app, 1, max_attempts=1)
    token, (got,) = claim(conn, app)
    assert got.attempts_remaining == 0
    _, ack, _ = retry(conn, mail.mail_id, token)
    assert (ack.status, ack.next_attempt_utc) == ("Failed", None)
    row = mail_row(conn, mail.mail_id)
    assert row["Status"] == "Failed" and row["DateProcessed"] is not None and row["ThreadLock"] is None
    assert row["LastError"] == "451 4.3.0 temporary failure"
    assert [a["Outcome"] for a in attempts(conn, mail.mail_id)] == ["Retry"]
    assert claim(conn, app)[1] == []


def test_wait_blocks_the_account_and_refunds_the_attempt(conn, account):
    app = new_app(conn, "wait")
    throttled = new_account(conn, "throttled")
    first, extra = enqueue(conn, throttled, app, 2, max_attempts=3)
    token, got = claim(conn, app)
    assert {m.id for m in got} == {first.mail_id, extra.mail_id}
    assert {m.attempts_remaining for m in got} == {2}
    t0 = server_now(conn)
    (ack,) = procedures.mark_failed(conn, ids=[first.mail_id], lock_token=token, disposition="Wait",
                                    error="421 4.7.0 too many messages, slow down", retry_after_seconds=90,
                                    smtp_code=421)
    t1 = server_now(conn)
    assert ack.status == "UnSent"
    assert t0 + timedelta(seconds=90) - EPS <= ack.next_attempt_utc <= t1 + timedelta(seconds=90) + EPS

    row = mail_row(conn, first.mail_id)
    assert row["AttemptsRemaining"] == 3, "a Wait must not charge the attempt"
    assert row["AttemptCount"] == 1 and row["Status"] == "UnSent" and row["ThreadLock"] is None
    assert attempts(conn, first.mail_id)[0]["Outcome"] == "Wait"
    ((blocked_until, reason),) = query(
        conn, "SELECT BlockedUntilUtc, BlockReason FROM mailq.SendingAccount WHERE AccountName = ?;", throttled)
    assert blocked_until == ack.next_attempt_utc
    assert reason == "421 4.7.0 too many messages, slow down"

    # A later, shorter Wait (the other mail of the same batch) never shortens the block.
    (short,) = procedures.mark_failed(conn, ids=[extra.mail_id], lock_token=token, disposition="Wait",
                                      error="421 later", retry_after_seconds=10)
    assert short.next_attempt_utc < blocked_until
    assert mail_row(conn, extra.mail_id)["AttemptsRemaining"] == 3
    assert query(conn, "SELECT BlockedUntilUtc FROM mailq.SendingAccount WHERE AccountName = ?;",
                 throttled)[0][0] == blocked_until

    # The throttled account's other mail waits; another account's mail does not.
    (second,) = enqueue(conn, throttled, app, 1)
    (other,) = enqueue(conn, account, app, 1)
    _, got = claim(conn, app, batch_size=10)
    assert [m.id for m in got] == [other.mail_id]

    # Unblocked: the account's due mail is claimed again.
    procedures.unblock_sending_account(conn, account_name=throttled)
    assert query(conn, "SELECT BlockedUntilUtc FROM mailq.SendingAccount WHERE AccountName = ?;",
                 throttled)[0][0] is None
    _, got = claim(conn, app)
    assert second.mail_id in {m.id for m in got}
    assert first.mail_id not in {m.id for m in got}, "the waited mail itself is due only at its retry time"


def test_wait_without_retry_after_blocks_for_60_seconds(conn):
    app = new_app(conn, "wait60")
    throttled = new_account(conn, "throttled60")
    (mail,) = enqueue(conn, throttled, app, 1)
    token, _ = claim(conn, app)
    t0 = server_now(conn)
    (ack,) = procedures.mark_failed(conn, ids=[mail.mail_id], lock_token=token, disposition="Wait",
                                    error="454 4.7.0 temporary authentication failure")
    t1 = server_now(conn)
    assert t0 + timedelta(seconds=60) - EPS <= ack.next_attempt_utc <= t1 + timedelta(seconds=60) + EPS


def test_stop_fails_at_once(conn, account):
    app = new_app(conn, "stop")
    (mail,) = enqueue(conn, account, app, 1, max_attempts=5)
    token, _ = claim(conn, app)
    (ack,) = procedures.mark_failed(conn, ids=[mail.mail_id], lock_token=token, disposition="Stop",
                                    error="550 5.1.1 user unknown", smtp_code=550, retry_after_seconds=10)
    assert (ack.status, ack.next_attempt_utc) == ("Failed", None)
    row = mail_row(conn, mail.mail_id)
    assert row["Status"] == "Failed" and row["AttemptsRemaining"] == 4 and row["ThreadLock"] is None
    assert row["LastError"] == "550 5.1.1 user unknown" and row["DateProcessed"] is not None
    (attempt,) = attempts(conn, mail.mail_id)
    assert (attempt["Outcome"], attempt["SmtpCode"], attempt["ErrorText"]) == ("Stop", 550, "550 5.1.1 user unknown")
    assert claim(conn, app)[1] == []
