"""Per-recipient outcomes (revision 0008, issue 14 point 1) against SQL Server 2022.

* RecordRecipientOutcomes is fenced by the lease token (LockLeasedMail): a
  stale token writes nothing (50202), a mail not Sending writes nothing (50203);
* Delivered and Refused are final, Deferred is replaced by a later attempt;
* GetRecipientOutcomes returns the rows of mails the token holds, and
  nothing for mails it does not;
* bad input is refused with 50180-50185 before anything is written;
* the rows follow their mail: the view reports them, PurgeMail removes them.
"""

from __future__ import annotations

import uuid

import pytest

from mailq_db import procedures
from mailq_db.errors import InvalidInputError, LeaseLostError

from mailq_helpers import (
    age_finished,
    assert_unchanged,
    claim,
    enqueue,
    expect_error,
    fingerprint,
    make_due_now,
    new_account,
    new_app,
    query,
    scalar,
)


@pytest.fixture(scope="module")
def account(conn) -> str:
    return new_account(conn, "rcpt")


def outcomes(*items):
    return [{"address": a, "outcome": o, "code": c, "text": t} for a, o, c, t in items]


def test_partial_acceptance_is_recorded_and_read_back_by_the_next_attempt(conn, account):
    app = new_app(conn, "rcpt")
    (mail,) = enqueue(conn, account, app, 1, to_address="a@example.com; B@example.com; c@example.com")
    token, (m,) = claim(conn, app)
    procedures.record_recipient_outcomes(conn, mail_id=m.id, lock_token=token, outcomes=outcomes(
        ("a@example.com", "Delivered", 250, "2.0.0 Ok: queued as 1A"),
        ("B@example.com", "Deferred", 450, "4.2.0 Greylisted"),
        ("c@example.com", "Refused", 550, "5.1.1 No such user")))
    assert procedures.get_recipient_outcomes(conn, ids=[m.id], lock_token=token) == {
        m.id: {"a@example.com": "Delivered", "b@example.com": "Deferred", "c@example.com": "Refused"}}
    procedures.mark_failed(conn, ids=[m.id], lock_token=token, disposition="Retry",
                           error="deferred b@example.com", retry_after_seconds=0)
    make_due_now(conn, [m.id])
    token2, (again,) = claim(conn, app)
    assert again.attempt_no == 2
    # the second attempt: b@ delivered now; a@ (Delivered) and c@ (Refused) are final
    procedures.record_recipient_outcomes(conn, mail_id=m.id, lock_token=token2, outcomes=outcomes(
        ("b@example.com", "Delivered", 250, "2.0.0 Ok: queued as 2B"),
        ("a@example.com", "Deferred", 451, "must not replace a final outcome")))
    rows = query(conn, "SELECT Address, Outcome, SmtpCode, AttemptNo FROM mailq.RecipientOutcomes "
                       "WHERE ID = ? ORDER BY Address;", m.id)
    assert [tuple(r) for r in rows] == [("a@example.com", "Delivered", 250, 1),
                                        ("b@example.com", "Delivered", 250, 2),
                                        ("c@example.com", "Refused", 550, 1)]
    assert procedures.get_recipient_outcomes(conn, ids=[m.id], lock_token=uuid.uuid4()) == {}


def test_a_stale_token_writes_nothing(conn, account):
    app = new_app(conn, "rcptstale")
    enqueue(conn, account, app, 1)
    token, (m,) = claim(conn, app)
    before = fingerprint(conn)
    expect_error(50202, procedures.record_recipient_outcomes, conn, mail_id=m.id, lock_token=uuid.uuid4(),
                 outcomes=outcomes(("x@example.com", "Delivered", 250, "ok")), cls=LeaseLostError)
    assert_unchanged(before, fingerprint(conn))
    procedures.mark_sent(conn, ids=[m.id], lock_token=token)
    expect_error(50203, procedures.record_recipient_outcomes, conn, mail_id=m.id, lock_token=token,
                 outcomes=outcomes(("x@example.com", "Delivered", 250, "ok")), cls=LeaseLostError)


@pytest.mark.parametrize("number,items", [
    (50181, "{}"),
    (50181, "[]"),
    (50181, '[{"outcome": "Delivered"}]'),
    (50182, '[{"address": "a@example.com", "outcome": "Sent"}]'),
    (50183, '[{"address": "a@example.com", "outcome": "Refused", "code": 700}]'),
    (50184, '[{"address": "a@example.com", "outcome": "Refused"}, {"address": "A@example.com", "outcome": "Refused"}]'),
])
def test_bad_outcomes_are_refused_before_anything_is_written(conn, account, number, items):
    app = new_app(conn, "rcptbad")
    enqueue(conn, account, app, 1)
    token, (m,) = claim(conn, app)
    before = fingerprint(conn)
    cursor = conn.cursor()
    with pytest.raises(Exception) as info:
        cursor.execute("EXEC mailq.RecordRecipientOutcomes @ID = ?, @LockToken = ?, @Outcomes = ?;",
                       m.id, str(token), items)
    assert str(number) in str(info.value)
    assert_unchanged(before, fingerprint(conn))


def test_missing_id_and_bad_id_list(conn):
    expect_error(50180, procedures.record_recipient_outcomes, conn, mail_id=None, lock_token=uuid.uuid4(),
                 outcomes=outcomes(("a@example.com", "Delivered", 250, "ok")), cls=InvalidInputError)
    cursor = conn.cursor()
    with pytest.raises(Exception) as info:
        cursor.execute("EXEC mailq.GetRecipientOutcomes @IDList = ?, @LockToken = ?;", "[1, \"x\"]",
                       str(uuid.uuid4()))
    assert "50185" in str(info.value)


def test_rows_go_with_their_mail_when_purged(conn, account):
    app = new_app(conn, "rcptpurge")
    enqueue(conn, account, app, 1, to_address="a@example.com; b@example.com")
    token, (m,) = claim(conn, app)
    procedures.record_recipient_outcomes(conn, mail_id=m.id, lock_token=token, outcomes=outcomes(
        ("a@example.com", "Delivered", 250, "ok"), ("b@example.com", "Refused", 550, "no")))
    procedures.mark_sent(conn, ids=[m.id], lock_token=token, smtp_code=250, smtp_text="250 ok; refused b")
    age_finished(conn, [m.id], 40)
    procedures.purge_mail(conn, older_than_days=30)
    assert scalar(conn, "SELECT COUNT(*) FROM mailq.MailRecipientOutcome WHERE MailID = ?;", m.id) == 0
