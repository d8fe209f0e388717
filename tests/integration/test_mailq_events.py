"""The event stream, mailq.GetMailEvents and mailq.StopMail against SQL Server 2022
(issue 16, point 1; docs/events.md).

* Every state change writes one event in its transaction: a mail's life
  (Enqueued, Claimed, RetryScheduled, AccountWaiting, Released, Sent) reads back
  in order with status, attempt count, SMTP code and text; DryRun, Cancelled,
  Requeued, Failed and Expired (FinalizeMail) too.
* A rolled-back change leaves no event; an enqueue inside a caller's open
  transaction is invisible to readers (and holds back the bound) until it
  commits, and then appears ABOVE the cursor a reader already holds
  (commit-safe cursor: the scenario an IDENTITY gets wrong).
* Paging with @AfterEventID / @MaxEvents returns every event once, in order.
* StopMail: UnSent -> Stopped; Sending -> Stopped, the worker's MarkSent and
  MarkFailed are then refused (50203) and the mail stays Stopped; a final mail is 50260 and
  nothing changes; bad input 50170-50175 changes nothing; Stopped can be
  requeued; the sysmail view calls it failed.
* PurgeMail deletes the events with the mail (Stopped mails included).
"""

from __future__ import annotations


import pytest

from mailq_helpers import (
    age_finished,
    claim,
    connection,
    enqueue,
    execute,
    expect_error,
    mail_row,
    new_account,
    new_app,
    query,
    scalar,
)
from mailq_db import procedures
from mailq_db.errors import InvalidInputError, MailFinalError, MailStateError

pytestmark = pytest.mark.integration

EVENTS_SQL = ("SELECT CAST(EventSeq AS BIGINT), MailID, EventType, Status FROM mailq.MailEvent "
              "ORDER BY EventSeq;")


@pytest.fixture(scope="module")
def account(conn) -> str:
    return new_account(conn, "events")


def kinds(conn, mail_id: int) -> list[tuple[str, str, int]]:
    return [(e.event_type, e.status, e.attempt_count)
            for e in procedures.get_mail_events(conn, mail_id=mail_id)]


def test_a_mail_s_life_reads_back_in_order(conn, account):
    app = new_app(conn, "life")
    (mail,) = enqueue(conn, account, app)
    token, _ = claim(conn, app)
    procedures.mark_failed(conn, ids=[mail.mail_id], lock_token=token, disposition="Retry",
                           error="451 4.3.0 later", retry_after_seconds=0, smtp_code=451)
    token, _ = claim(conn, app)
    procedures.mark_failed(conn, ids=[mail.mail_id], lock_token=token, disposition="Wait",
                           error="421 too many logins", retry_after_seconds=0, smtp_code=421)
    procedures.unblock_sending_account(conn, account_name=account)
    token, _ = claim(conn, app)
    procedures.release_mail(conn, ids=[mail.mail_id], lock_token=token)
    token, _ = claim(conn, app)
    procedures.mark_sent(conn, ids=[mail.mail_id], lock_token=token, smtp_code=250, smtp_text="2.0.0 queued")
    procedures.mark_sent(conn, ids=[mail.mail_id], lock_token=token, smtp_code=250)   # repeated: no 2nd event

    assert kinds(conn, mail.mail_id) == [
        ("Enqueued", "UnSent", 0), ("Claimed", "Sending", 1), ("RetryScheduled", "UnSent", 1),
        ("Claimed", "Sending", 2), ("AccountWaiting", "UnSent", 2), ("Claimed", "Sending", 3),
        ("Released", "UnSent", 3), ("Claimed", "Sending", 4), ("Sent", "Sent", 4),
    ]
    events = procedures.get_mail_events(conn, app_name=app)
    assert [e.event_id for e in events] == sorted(e.event_id for e in events)
    assert len({e.event_id for e in events}) == len(events) == 9
    sent = events[-1]
    assert (sent.smtp_code, sent.detail, sent.terminal) == (250, "2.0.0 queued", True)
    assert events[2].smtp_code == 451 and events[2].detail == "451 4.3.0 later"


def test_dry_run_cancel_requeue_failed_and_expired(conn, account):
    app = new_app(conn, "ends")
    dry, cancelled, stop = enqueue(conn, account, app, 3)
    token, mails = claim(conn, app, batch_size=2)
    leased = sorted(m.id for m in mails)
    procedures.mark_sent(conn, ids=[leased[0]], lock_token=token, dry_run=True)
    procedures.mark_failed(conn, ids=[leased[1]], lock_token=token, disposition="Stop",
                           error="550 5.1.1 no such user", smtp_code=550)
    waiting = ({dry.mail_id, cancelled.mail_id, stop.mail_id} - set(leased)).pop()
    procedures.cancel_mail(conn, mail_id=waiting)
    procedures.requeue_mail(conn, mail_id=waiting)
    # test setup (fast-forward): the requeued mail's expiry has passed
    execute(conn, "UPDATE mailq.MailQueue SET DateToProcess = DATEADD(DAY, -1, SYSUTCDATETIME()), "
                  "ExpiresAtUtc = DATEADD(SECOND, -1, SYSUTCDATETIME()) WHERE ID = ?;", waiting)
    procedures.finalize_mail(conn)
    assert [k[0] for k in kinds(conn, leased[0])][-1] == "DryRun"
    assert [k[0] for k in kinds(conn, leased[1])][-1] == "Failed"
    assert [k[0] for k in kinds(conn, waiting)] == ["Enqueued", "Cancelled", "Requeued", "Expired"]


def test_rolled_back_change_leaves_no_event(conn, account):
    app = new_app(conn, "rollback")
    before = query(conn, EVENTS_SQL)
    conn.autocommit = False
    try:
        enqueue(conn, account, app)
        conn.rollback()
    finally:
        conn.autocommit = True
    assert query(conn, EVENTS_SQL) == before


def test_cursor_is_commit_safe(mssql_url, conn, account):
    """A transaction takes its event's ID first and commits LAST; a reader that
    read past later events meanwhile still gets it, above its cursor."""
    app = new_app(conn, "commitsafe")
    with connection(mssql_url) as slow:
        slow.autocommit = False
        (late,) = enqueue(slow, account, app)                  # stamped first, not committed
        (early,) = enqueue(conn, account, app)                 # stamped later, committed
        # The read must neither return nor wait for the open transaction's row
        # (its key lies beyond the seek's end): a wait would hang this test.
        execute(conn, "SET LOCK_TIMEOUT 10000;")
        try:
            seen = procedures.get_mail_events(conn, app_name=app)
        finally:
            execute(conn, "SET LOCK_TIMEOUT -1;")
        assert [e.mail_id for e in seen] == [], "an event above an open transaction's was returned"
        slow.commit()
    seen = procedures.get_mail_events(conn, app_name=app)
    assert {e.mail_id for e in seen} == {late.mail_id, early.mail_id}
    cursor = seen[-1].event_id
    (third,) = enqueue(conn, account, app)
    more = procedures.get_mail_events(conn, app_name=app, after_event_id=cursor)
    assert [e.mail_id for e in more] == [third.mail_id]


def test_paging_returns_every_event_once(conn, account):
    app = new_app(conn, "paging")
    mails = enqueue(conn, account, app, 7)
    got, cursor = [], 0
    while True:
        page = procedures.get_mail_events(conn, app_name=app, after_event_id=cursor, max_events=3)
        got += page
        if len(page) < 3:
            break
        cursor = page[-1].event_id
    assert [e.mail_id for e in got] == [m.mail_id for m in mails]


def test_bad_input_is_refused(conn):
    for number, kwargs in [
        (50170, {}), (50170, {"app_name": "x", "mail_id": 1}), (50171, {"app_name": "x", "after_event_id": -1}),
        (50172, {"app_name": "x", "max_events": 0}), (50172, {"app_name": "x", "max_events": 5001}),
    ]:
        expect_error(number, procedures.get_mail_events, conn, cls=InvalidInputError, **kwargs)
    expect_error(50174, procedures.stop_mail, conn, mail_id=None, reason="r", cls=InvalidInputError)
    expect_error(50175, procedures.stop_mail, conn, mail_id=1, reason="  ", cls=InvalidInputError)
    expect_error(50201, procedures.stop_mail, conn, mail_id=2**62, reason="r", cls=MailStateError)


def test_stop_unsent_and_leased_mail(conn, account):
    app = new_app(conn, "stop")
    (leased,) = enqueue(conn, account, app)
    token, _ = claim(conn, app)
    (waiting,) = enqueue(conn, account, app)

    acks = procedures.stop_mail(conn, mail_id=waiting.mail_id, reason="customer left")
    assert [(a.mail_id, a.status) for a in acks] == [(waiting.mail_id, "Stopped")]
    procedures.stop_mail(conn, mail_id=leased.mail_id, reason="template broken")
    row = mail_row(conn, leased.mail_id)
    assert (row["Status"], row["ThreadLock"], row["LastError"]) == ("Stopped", None, "template broken")
    # it may be in an SMTP transaction already: a later requeue resends it flagged
    assert row["PossibleDuplicate"] is True
    assert mail_row(conn, waiting.mail_id)["PossibleDuplicate"] is False
    # the worker's acknowledgement is fenced out and does not resurrect it
    expect_error(50203, procedures.mark_sent, conn, ids=[leased.mail_id], lock_token=token, cls=MailStateError)
    # its attempt ended 'Stop' as a MarkFailed's does, yet it is no repeat of one: refused too
    expect_error(50203, procedures.mark_failed, conn, ids=[leased.mail_id], lock_token=token,
                 disposition="Retry", error="451 later", cls=MailStateError)
    assert mail_row(conn, leased.mail_id)["Status"] == "Stopped"
    assert kinds(conn, leased.mail_id)[-1] == ("Stopped", "Stopped", 1)
    assert claim(conn, app)[1] == []

    before = query(conn, EVENTS_SQL)
    expect_error(50260, procedures.stop_mail, conn, mail_id=waiting.mail_id, reason="again", cls=MailFinalError)
    assert query(conn, EVENTS_SQL) == before
    assert scalar(conn, "SELECT sent_status FROM mailq.sysmail_allitems WHERE mailitem_id = ?;",
                  waiting.mail_id) == "failed"

    procedures.requeue_mail(conn, mail_id=waiting.mail_id)
    assert [m.id for m in claim(conn, app)[1]] == [waiting.mail_id]


def test_purge_deletes_events_with_the_mail(conn, account):
    app = new_app(conn, "purge")
    (mail,) = enqueue(conn, account, app)
    procedures.stop_mail(conn, mail_id=mail.mail_id, reason="old")
    age_finished(conn, [mail.mail_id], 40)
    procedures.purge_mail(conn, older_than_days=30)
    assert mail_row(conn, mail.mail_id) is None
    assert scalar(conn, "SELECT COUNT(*) FROM mailq.MailEvent WHERE MailID = ?;", mail.mail_id) == 0
