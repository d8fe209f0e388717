"""Bounces, complaints, unsubscribes and suppression (docs/bounces.md) against SQL Server 2022.

* RecordBounce records once per (report, recipient), writes the mail's event
  and Refused outcome, and suppresses a hard bounce at the limit, a complaint
  at once, a soft bounce only with a limit;
* EnqueueMail and EnqueueMailBatch refuse a mail whose every recipient is
  suppressed (50600) and drop suppressed recipients of the others with a
  RecipientSuppressed event; an application's unsubscribe does not bind
  another application;
* the suppression sweep: queued mail loses the address or is Stopped, a mail
  a worker holds gets a Refused outcome its next attempt honours;
* RecordUnsubscribe, Add/Remove/ListSuppressions, GetSuppressionStats,
  PurgeBounceReports and their errors; the MailqBounceReader role.
"""

from __future__ import annotations

import hashlib

import pytest
from mailq_helpers import (
    claim,
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
from mailq_db.errors import (
    InvalidInputError,
    SuppressedRecipientError,
    UnknownUnsubscribeError,
)


def key(text: str) -> bytes:
    return hashlib.sha256(text.encode()).digest()


def events(conn, mail_id: int) -> list[tuple[str, str]]:
    return [(r[0], r[1] or "") for r in query(
        conn, "SELECT EventType, Detail FROM mailq.MailEvent WHERE MailID = ? ORDER BY EventSeq;", mail_id)]


@pytest.fixture(scope="module")
def account(conn) -> str:
    return new_account(conn, "bounce")


def test_hard_bounce_is_recorded_once_suppresses_and_refuses_the_next_enqueue(conn, account):
    app = new_app(conn, "bounce")
    (mail,) = enqueue(conn, account, app, 1, to_address="gone@example.com")
    rows = procedures.record_bounce(conn, report_key=key("r1"), source="it", mail_id=mail.mail_id, recipient_no=1,
                                    recipients=[{"kind": "Hard", "status": "5.1.1", "code": 550,
                                                 "detail": "smtp; 550 5.1.1 user unknown"}])
    assert [(r.address, r.recorded, r.suppressed) for r in rows] == [("gone@example.com", True, True)]
    again = procedures.record_bounce(conn, report_key=key("r1"), source="it", mail_id=mail.mail_id,
                                     recipients=[{"address": "gone@example.com", "kind": "Hard"}])
    assert [(r.recorded, r.suppressed) for r in again] == [(False, False)]
    assert [e for e, _ in events(conn, mail.mail_id)].count("Bounced") == 1
    assert query(conn, "SELECT Outcome, SmtpCode FROM mailq.MailRecipientOutcome WHERE MailID = ?;",
                 mail.mail_id) == [("Refused", 550)]
    with pytest.raises(SuppressedRecipientError) as err:
        enqueue(conn, account, app, 1, to_address="Gone <GONE@example.com>")
    assert err.value.number == 50600
    (other,) = enqueue(conn, account, app, 1, to_address="gone@example.com; kept@example.com", cc="gone@example.com")
    row = query(conn, "SELECT ToAddress, CC FROM mailq.MailQueue WHERE ID = ?;", other.mail_id)[0]
    assert row == ("kept@example.com", None)
    assert ("RecipientSuppressed", "not sent to (suppressed): gone@example.com") in events(conn, other.mail_id)


def test_limits_complaints_and_delays(conn, account):
    (mail,) = enqueue(conn, account, None, 1, to_address="soft@example.com; late@example.com; spam@example.com")
    common = dict(source="it", mail_id=mail.mail_id)
    procedures.record_bounce(conn, report_key=key("s1"), soft_bounce_limit=2, recipients=[
        {"address": "soft@example.com", "kind": "Soft", "status": "5.2.2"},
        {"address": "late@example.com", "kind": "Delayed", "status": "4.4.1"},
        {"address": "spam@example.com", "kind": "Complaint"}], **common)
    active = {(r["Address"], r["Reason"]) for r in procedures.list_suppressions(conn, account_name=account)}
    assert ("spam@example.com", "Complaint") in active and not {a for a, _ in active} & {"soft@example.com",
                                                                                         "late@example.com"}
    procedures.record_bounce(conn, report_key=key("s2"), soft_bounce_limit=2,
                             recipients=[{"address": "soft@example.com", "kind": "Soft"}], **common)
    assert procedures.list_suppressions(conn, account_name=account, address="soft@example.com")[0]["Reason"] \
        == "SoftBounce"
    types = [e for e, _ in events(conn, mail.mail_id)]
    assert {"BounceDelayed", "Complained", "Bounced"} <= set(types)


def test_two_reports_of_one_bounce_count_once_against_the_limit(conn, account):
    # A DSN and the relay's own notification (SES by SNS) about one failed delivery.
    first, second = enqueue(conn, account, None, 2, to_address="twice@example.com")
    common = dict(source="it", hard_bounce_limit=2, recipients=[{"address": "twice@example.com", "kind": "Hard"}])
    for report, mail in (("t1", first), ("t2", first), ("t3", second)):
        rows = procedures.record_bounce(conn, report_key=key(report), mail_id=mail.mail_id, **common)
        assert rows[0].suppressed == (report == "t3"), report


def test_the_sweep_rewrites_queued_mail_stops_the_empty_and_refuses_for_held_mail(conn, account):
    app = new_app(conn, "sweep")
    a, b = enqueue(conn, account, app, 2, to_address="x@example.com; y@example.com")
    (c,) = enqueue(conn, account, app, 1, to_address="x@example.com")
    token, held = claim(conn, app, batch_size=1)  # a is Sending now
    assert [m.id for m in held] == [a.mail_id]
    row = procedures.add_suppression(conn, account_name=account, address="X@example.com", source="it:dba")
    assert (row["SweptMails"], row["StoppedMails"]) == (3, 1)
    assert query(conn, "SELECT ToAddress FROM mailq.MailQueue WHERE ID = ?;", b.mail_id) == [("y@example.com",)]
    assert mail_row(conn, c.mail_id)["Status"] == "Stopped"
    assert procedures.get_recipient_outcomes(conn, ids=[a.mail_id], lock_token=token) == {
        a.mail_id: {"x@example.com": "Refused"}}
    # Requeueing a finished mail (the sweep passes it by) leaves the suppressed address out too.
    expect_error(50600, procedures.requeue_mail, conn, mail_id=c.mail_id, cls=SuppressedRecipientError)
    (d,) = enqueue(conn, account, app, 1, to_address="z@example.com", cc="w@example.com")
    execute(conn, "EXEC mailq.StopMail @MailID = ?, @Reason = N'it';", d.mail_id)
    procedures.add_suppression(conn, account_name=account, address="w@example.com", source="it:dba")
    procedures.requeue_mail(conn, mail_id=d.mail_id)
    assert query(conn, "SELECT ToAddress, CC FROM mailq.MailQueue WHERE ID = ?;", d.mail_id) == [("z@example.com", None)]
    assert ("RecipientSuppressed", "not sent to (suppressed): w@example.com") in events(conn, d.mail_id)
    assert procedures.remove_suppression(conn, account_name=account, address="x@example.com", source="it") == 1
    assert procedures.remove_suppression(conn, account_name=account, address="x@example.com", source="it") == 0
    history = query(conn, "SELECT Action FROM mailq.SuppressionHistory WHERE AccountName = ? AND Address = ? "
                          "ORDER BY HistoryID;", account, "x@example.com")
    assert [h[0] for h in history] == ["Added", "Removed"]


def test_unsubscribe_binds_the_application_only_and_is_idempotent(conn, account):
    news, shop = new_app(conn, "news"), new_app(conn, "shop")
    for app in (news, shop):
        procedures.bind_application(conn, app_name=app, account_name=account)
    (mail,) = enqueue(conn, account, news, 1, to_address="reader@example.com")
    first = procedures.record_unsubscribe(conn, mail_id=mail.mail_id, recipient_no=1, source="unsubscribe-url")
    second = procedures.record_unsubscribe(conn, mail_id=mail.mail_id, recipient_no=1, source="unsubscribe-url")
    assert (first["Recorded"], second["Recorded"], first["Address"]) == (True, False, "reader@example.com")
    with pytest.raises(SuppressedRecipientError):
        enqueue(conn, account, news, 1, to_address="reader@example.com")
    assert enqueue(conn, account, shop, 1, to_address="reader@example.com")[0].created
    expect_error(50612, procedures.record_unsubscribe, conn, mail_id=mail.mail_id, recipient_no=2, source="x",
                 cls=UnknownUnsubscribeError)
    expect_error(50611, procedures.record_unsubscribe, conn, mail_id=-1, recipient_no=1, source="x",
                 cls=UnknownUnsubscribeError)


def test_batch_enqueue_applies_the_same_rule(conn, account):
    procedures.add_suppression(conn, account_name=account, address="batch-gone@example.com", source="it")
    result = procedures.enqueue_mail_batch(conn, [
        {"to_address": "batch-gone@example.com", "subject": "s", "body": "b", "account_name": account},
        {"to_address": "batch-gone@example.com; ok@example.com", "subject": "s", "body": "b", "account_name": account},
    ], reject_invalid=True)
    assert [(r.row_no, r.error_number) for r in result.rejected] == [(1, 50600)]
    (queued,) = result.enqueued
    assert query(conn, "SELECT ToAddress FROM mailq.MailQueue WHERE ID = ?;", queued.mail_id) == [("ok@example.com",)]


def test_the_core_checks_suppressions_last_and_under_the_key_lock(conn, account):
    """The check lives in mailq.EnqueueMailRows: a retried key returns its mail
    although its recipient was suppressed since; a batch without @RejectInvalid
    names rule 50600 in 50220; the RecipientSuppressed event follows Enqueued."""
    app = new_app(conn, "core")
    (first,) = enqueue(conn, account, app, 1, to_address="later-gone@example.com", idempotency_key=f"k-{app}")
    procedures.add_suppression(conn, account_name=account, address="later-gone@example.com", source="it")
    (again,) = enqueue(conn, account, app, 1, to_address="later-gone@example.com", idempotency_key=f"k-{app}")
    assert (again.mail_id, again.created) == (first.mail_id, False)
    err = expect_error(50220, procedures.enqueue_mail_batch, conn, [
        {"to_address": "ok@example.com", "subject": "s", "body": "b", "account_name": account, "app_name": app},
        {"to_address": "later-gone@example.com", "subject": "s", "body": "b", "account_name": account,
         "app_name": app}], cls=InvalidInputError)
    assert "Row 2, field ToAddress, rule 50600" in str(err)
    (mixed,) = enqueue(conn, account, app, 1, to_address="kept@example.com", bcc="later-gone@example.com")
    assert [e for e, _ in events(conn, mixed.mail_id)] == ["Enqueued", "RecipientSuppressed"]
    assert query(conn, "SELECT ToAddress, BCC FROM mailq.MailQueue WHERE ID = ?;", mixed.mail_id) == [
        ("kept@example.com", None)]
    # a Cc-only mail whose Cc is suppressed has nobody left: 50600, not 50101
    expect_error(50600, enqueue, conn, account, app, 1, to_address=None, cc="later-gone@example.com",
                 cls=SuppressedRecipientError)
    (cc_left,) = enqueue(conn, account, app, 1, to_address="later-gone@example.com", cc="kept@example.com")
    assert query(conn, "SELECT ToAddress, CC FROM mailq.MailQueue WHERE ID = ?;", cc_left.mail_id) == [
        ("", "kept@example.com")]


def test_queue_metrics_count_the_suppressions_in_force(conn):
    other = new_account(conn, "metrics")
    for address, reason in (("h1@example.com", "HardBounce"), ("h2@example.com", "HardBounce"),
                            ("c1@example.com", "Complaint")):
        procedures.add_suppression(conn, account_name=other, address=address, source="it", reason=reason)
    execute(conn, "UPDATE mailq.Suppression SET ExpiresAtUtc = DATEADD(SECOND, -1, SYSUTCDATETIME()) "
                  "WHERE AccountName = ? AND Address = ?;", other, "h2@example.com")
    m = procedures.get_queue_metrics(conn)
    assert m.suppressions is not None
    assert {r["Reason"]: r["Suppressed"] for r in m.suppressions if r["AccountName"] == other} == {
        "HardBounce": 1, "Complaint": 1}


@pytest.mark.parametrize("kwargs,number", [
    (dict(account_name="nope", address="a@example.com", source="x"), 50601),
    (dict(address="not-an-address", source="x"), 50602),
    (dict(address="a@example.com", source="x", reason="Spam"), 50603),
    (dict(address="a@example.com", source=" "), 50604),
])
def test_add_suppression_refuses_bad_input(conn, account, kwargs, number):
    expect_error(number, procedures.add_suppression, conn, cls=InvalidInputError, **{"account_name": account, **kwargs})


def test_record_bounce_refuses_bad_input(conn, account):
    expect_error(50607, procedures.record_bounce, conn, report_key=b"short", source="x", account_name=account,
                 recipients=[{"address": "a@example.com", "kind": "Hard"}], cls=InvalidInputError)
    expect_error(50608, procedures.record_bounce, conn, report_key=key("k"), source="x", account_name=account,
                 recipients=[{"address": "a@example.com", "kind": "Bounce"}], cls=InvalidInputError)
    expect_error(50601, procedures.record_bounce, conn, report_key=key("k"), source="x", account_name="nope",
                 recipients=[{"address": "a@example.com", "kind": "Hard"}], cls=InvalidInputError)
    expect_error(50610, procedures.record_bounce, conn, report_key=key("k"), source="x", account_name=account,
                 hard_bounce_limit=0, recipients=[{"address": "a@example.com", "kind": "Hard"}],
                 cls=InvalidInputError)


def test_stats_and_purge(conn, account):
    stats = procedures.get_suppression_stats(conn, days=1)
    assert any(r["AccountName"] == account for r in stats.suppressed)
    assert any(r["AccountName"] == account and r["Kind"] == "Hard" for r in stats.reports)
    assert procedures.purge_bounce_reports(conn, older_than_days=1) >= 0
    assert scalar(conn, "SELECT COUNT(*) FROM mailq.BounceReport WHERE AccountName = ?;", account) > 0


def test_bounce_reader_role_can_record_and_nothing_else(conn):
    grants = {r[0] for r in query(conn, """
        SELECT o.name FROM sys.database_permissions AS p
        INNER JOIN sys.objects AS o ON p.major_id = o.object_id
        WHERE p.grantee_principal_id = DATABASE_PRINCIPAL_ID(N'MailqBounceReader') AND p.state = 'G';""")}
    assert grants == {"RecordBounce", "RecordUnsubscribe"}
