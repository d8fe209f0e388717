"""Administration and reporting against SQL Server 2022.

* CancelMail: UnSent -> Cancelled; a Sending mail is refused with 50204 (and
  kept as it was); a finished one too.
* RequeueMail: Failed, Cancelled and Expired -> UnSent with fresh attempts
  (claimable again, history and PossibleDuplicate kept, a past expiry
  cleared); UnSent, Sending and Sent are refused with 50205.
* PurgeMail: finished mail older than the cutoff is deleted with its
  attachments and attempts, in batches, and counted; recent finished mail and
  unfinished mail (however old) stay.  "Old" is made by moving DateProcessed
  back (``age_finished``).
* Views and GetQueueStats: counts by status and account, oldest due mail,
  throughput per hour, recent failures, for a known set of mails.
* GetInstallationHealth: every row's Status is OK, WARN or FAIL; the Revision
  row names the deployed Alembic revision; a blocked account shows as WARN.
"""

from __future__ import annotations

import os

from datetime import timedelta

import pytest

from mailq_helpers import (
    age_finished,
    assert_unchanged,
    attempts,
    claim,
    enqueue,
    expect_error,
    fingerprint,
    mail_row,
    new_account,
    new_app,
    query,
    scalar,
    server_now,
)
from mailq_db import procedures
from mailq_db.errors import MailStateError

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def account(conn) -> str:
    return new_account(conn, "admin")


def refused(conn, number, call):
    before = fingerprint(conn)
    expect_error(number, call, cls=MailStateError)
    assert_unchanged(before, fingerprint(conn))


def test_cancel_unsent_mail_and_refuse_sending_mail(conn, account):
    app = new_app(conn, "cancel")
    (leased,) = enqueue(conn, account, app, 1)
    token, _ = claim(conn, app)
    (waiting,) = enqueue(conn, account, app, 1)

    acks = procedures.cancel_mail(conn, mail_id=waiting.mail_id)
    assert [(a.mail_id, a.status, a.next_attempt_utc) for a in acks] == [(waiting.mail_id, "Cancelled", None)]
    row = mail_row(conn, waiting.mail_id)
    assert row["Status"] == "Cancelled" and row["DateProcessed"] is not None
    assert claim(conn, app)[1] == [], "a cancelled mail was claimed"

    refused(conn, 50204, lambda: procedures.cancel_mail(conn, mail_id=leased.mail_id))
    assert mail_row(conn, leased.mail_id)["Status"] == "Sending"
    refused(conn, 50204, lambda: procedures.cancel_mail(conn, mail_id=waiting.mail_id))  # already Cancelled
    procedures.mark_sent(conn, ids=[leased.mail_id], lock_token=token)
    refused(conn, 50204, lambda: procedures.cancel_mail(conn, mail_id=leased.mail_id))  # Sent


def test_requeue_failed_cancelled_and_expired_mail(conn, account):
    app = new_app(conn, "requeue")
    now = server_now(conn)
    failed, sent = enqueue(conn, account, app, 2, max_attempts=1)
    token, _ = claim(conn, app)
    procedures.mark_failed(conn, ids=[failed.mail_id], lock_token=token, disposition="Stop", error="550 no such user")
    procedures.mark_sent(conn, ids=[sent.mail_id], lock_token=token)
    (cancelled,) = enqueue(conn, account, app, 1)
    procedures.cancel_mail(conn, mail_id=cancelled.mail_id)
    (expired,) = enqueue(conn, account, app, 1, date_to_process=now - timedelta(seconds=10),
                         expires_at_utc=now - timedelta(seconds=5))
    assert claim(conn, app)[1] == []
    assert mail_row(conn, expired.mail_id)["Status"] == "Expired"

    for mail in (failed, cancelled, expired):
        acks = procedures.requeue_mail(conn, mail_id=mail.mail_id, max_attempts=3)
        assert [(a.mail_id, a.status) for a in acks] == [(mail.mail_id, "UnSent")]
        row = mail_row(conn, mail.mail_id)
        assert row["Status"] == "UnSent" and row["AttemptsRemaining"] == 3 and row["DateProcessed"] is None
        assert row["VisibleAtUtc"] == row["DateToProcess"] == acks[0].next_attempt_utc
    assert mail_row(conn, expired.mail_id)["ExpiresAtUtc"] is None, "a past expiry must be cleared"
    assert [a["Outcome"] for a in attempts(conn, failed.mail_id)] == ["Stop"], "the history is kept"

    token, got = claim(conn, app)
    assert {m.id for m in got} == {failed.mail_id, cancelled.mail_id, expired.mail_id}
    assert {m.id: m.attempt_no for m in got}[failed.mail_id] == 2

    # UnSent, Sending and Sent mail cannot be requeued.
    (unsent,) = enqueue(conn, account, app, 1, date_to_process=now + timedelta(hours=1))
    for mail_id in (unsent.mail_id, failed.mail_id, sent.mail_id):
        refused(conn, 50205, lambda: procedures.requeue_mail(conn, mail_id=mail_id))


def test_requeue_at_a_later_time(conn, account):
    app = new_app(conn, "requeuelater")
    (mail,) = enqueue(conn, account, app, 1)
    procedures.cancel_mail(conn, mail_id=mail.mail_id)
    later = (server_now(conn) + timedelta(hours=2)).replace(microsecond=0)
    procedures.requeue_mail(conn, mail_id=mail.mail_id, date_to_process=later)
    assert mail_row(conn, mail.mail_id)["VisibleAtUtc"] == later
    assert claim(conn, app)[1] == []


def test_purge_deletes_old_finished_mail_with_its_children(conn, account):
    app = new_app(conn, "purge")
    files = [procedures.Attachment("a.txt", b"a"), procedures.Attachment("b.txt", b"b")]
    sent, failed, stays_sending = enqueue(conn, account, app, 3, attachments=files)
    token, _ = claim(conn, app)
    procedures.mark_sent(conn, ids=[sent.mail_id], lock_token=token)
    procedures.mark_failed(conn, ids=[failed.mail_id], lock_token=token, disposition="Stop", error="550")
    (cancelled,) = enqueue(conn, account, app, 1)
    procedures.cancel_mail(conn, mail_id=cancelled.mail_id)
    (recent,) = enqueue(conn, account, app, 1)
    token2, _ = claim(conn, app)
    procedures.mark_sent(conn, ids=[recent.mail_id], lock_token=token2)
    (old_unsent,) = enqueue(conn, account, app, 1, date_to_process=server_now(conn) + timedelta(days=1))

    old = [sent.mail_id, failed.mail_id, cancelled.mail_id]
    age_finished(conn, old + [stays_sending.mail_id, old_unsent.mail_id], days=40)
    kept = [recent.mail_id, stays_sending.mail_id, old_unsent.mail_id]
    assert scalar(conn, "SELECT COUNT_BIG(*) FROM mailq.MailAttachment WHERE MailID = ?;", sent.mail_id) == 2

    purged = procedures.purge_mail(conn, older_than_days=30, batch_size=1)
    assert purged == 3
    for mail_id in old:
        assert mail_row(conn, mail_id) is None
        assert attempts(conn, mail_id) == []
        assert scalar(conn, "SELECT COUNT_BIG(*) FROM mailq.MailAttachment WHERE MailID = ?;", mail_id) == 0
    for mail_id in kept:
        assert mail_row(conn, mail_id) is not None
    assert scalar(conn, "SELECT COUNT_BIG(*) FROM mailq.MailAttachment WHERE MailID = ?;",
                  stays_sending.mail_id) == 2
    assert procedures.purge_mail(conn, older_than_days=30) == 0


def test_views_and_queue_stats_count_a_known_set_of_mails(conn):
    account = new_account(conn, "stats")
    app = new_app(conn, "stats")
    now = server_now(conn)
    sent, failed = enqueue(conn, account, app, 2)
    (cancelled,) = enqueue(conn, account, app, 1)
    procedures.cancel_mail(conn, mail_id=cancelled.mail_id)
    token, got = claim(conn, app)
    assert {m.id for m in got} == {sent.mail_id, failed.mail_id}
    procedures.mark_sent(conn, ids=[sent.mail_id], lock_token=token, smtp_code=250)
    procedures.mark_failed(conn, ids=[failed.mail_id], lock_token=token, disposition="Stop",
                           error="550 5.1.1 user unknown", smtp_code=550)
    (due,) = enqueue(conn, account, app, 1, date_to_process=now - timedelta(hours=1))
    enqueue(conn, account, app, 1, date_to_process=now + timedelta(hours=1))  # UnSent, not yet due

    expected = {("Sent", account): 1, ("Failed", account): 1, ("Cancelled", account): 1, ("UnSent", account): 2}
    view = {(r[0], r[1]): r[2] for r in query(
        conn, "SELECT Status, AccountName, MailCount FROM mailq.QueueCountsByStatus WHERE AccountName = ?;", account)}
    assert view == expected

    stats = procedures.get_queue_stats(conn, recent_failures=1000)
    queued = {(r["Status"], r["AccountName"]): r["MailCount"] for r in stats.queued if r["AccountName"] == account}
    assert queued == {("UnSent", account): 2}, "GetQueueStats counts mail queued now only"

    (oldest,) = [r for r in stats.oldest_due if r["AccountName"] == account]
    assert oldest["DueCount"] == 1
    assert abs((oldest["OldestDueUtc"] - mail_row(conn, due.mail_id)["VisibleAtUtc"]).total_seconds()) < 0.01
    assert 3590 <= oldest["OldestDueAgeSeconds"] <= 3700

    hours = [r for r in stats.finished_per_hour if r["AccountName"] == account]
    assert [sum(r[s] for r in hours) for s in ("Sent", "Failed", "Cancelled", "Expired", "Stopped")] == \
        [1, 1, 1, 0, 0]

    failures = [r for r in stats.failures if r["AccountName"] == account]
    assert [(r["ID"], r["Outcome"], r["SmtpCode"], r["Status"]) for r in failures] == \
        [(failed.mail_id, "Stop", 550, "Failed")]
    assert failures[0]["LastError"] == "550 5.1.1 user unknown"

    assert query(conn, "SELECT ID, Outcome FROM mailq.RecentFailures WHERE AccountName = ?;", account) == \
        [(failed.mail_id, "Stop")]
    assert query(conn, "SELECT SUM(Sent), SUM(Failed) FROM mailq.ThroughputPerHour WHERE AccountName = ?;",
                 account) == [(1, 1)]


def test_installation_health(conn, mssql_url):
    from alembic.script import ScriptDirectory

    from mailq_db.deployment import alembic_config

    rows = procedures.get_installation_health(conn)
    assert rows, "no check reported"
    assert {"Area", "CheckName", "Status", "Detail", "Fix"} <= set(rows[0])
    assert {r["Status"] for r in rows} <= {"OK", "WARN", "FAIL"}
    for r in rows:
        if r["Status"] != "OK":
            assert r["Fix"], f"{r['CheckName']} is {r['Status']} without a fix"

    (revision,) = [r for r in rows if r["CheckName"] == "Revision"]
    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    assert revision["Status"] == "OK" and revision["Detail"] == head
    assert scalar(conn, "SELECT version_num FROM dbo.mailq_alembic_version;") == head
    by_name = {r["CheckName"]: r for r in rows}
    assert by_name["CompatibilityLevel"]["Status"] == "OK"
    # the fixture turns it on, unless MAILQ_TEST_RCSI=off (the second run of .ci/run)
    rcsi_on = os.environ.get("MAILQ_TEST_RCSI", "on").lower() != "off"
    assert by_name["ReadCommittedSnapshot"]["Status"] == ("OK" if rcsi_on else "WARN")
    assert by_name["ServiceBrokerEnabled"]["Status"] == "OK"

    # A blocked account is reported as a warning with the way out.
    app = new_app(conn, "health")
    blocked = new_account(conn, "blocked")
    (mail,) = enqueue(conn, blocked, app, 1)
    token, _ = claim(conn, app)
    procedures.mark_failed(conn, ids=[mail.mail_id], lock_token=token, disposition="Wait", error="421 slow down",
                           retry_after_seconds=600)
    rows = procedures.get_installation_health(conn)
    (warning,) = [r for r in rows if r["CheckName"] == f"Blocked {blocked}"]
    assert warning["Status"] == "WARN" and "UnblockSendingAccount" in warning["Fix"]
    procedures.unblock_sending_account(conn, account_name=blocked)
    assert not [r for r in procedures.get_installation_health(conn) if r["CheckName"] == f"Blocked {blocked}"]
