"""mailq.EnqueueMail against SQL Server 2022: what good input becomes.

* Idempotency: the same key with the same content returns the same mail
  (same ID and Message-ID, ``Created = 0``) and inserts nothing, also when
  several sessions race with the same key; with other content it is 50116
  (tests/integration/test_mailq_bad_input.py).
* Message-ID: ``<uuid@sender-domain>`` (a neutral domain for a non-ASCII
  sender domain), different for every mail, and the same on every attempt.
* Values that sit at a limit, or that a too-strict rule could refuse
  (hyphens, plus signs, Chinese text, 'Display Name <address>' recipients),
  are accepted and come back unchanged
  from mailq.ClaimMail, attachments included.
"""

from __future__ import annotations

import re
import uuid

import pytest

from mailq_helpers import (
    attempts,
    claim,
    connection,
    enqueue,
    expect_error,
    mail_row,
    make_due_now,
    new_account,
    new_app,
    query,
    run_threads,
    scalar,
)
from mailq_db import procedures

pytestmark = pytest.mark.integration

UUID_RE = "[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"


@pytest.fixture(scope="module")
def account(conn) -> str:
    return new_account(conn, "enq", from_address="noreply@example.org", from_name="Ops 运维")


def test_same_key_same_content_returns_the_first_mail_and_inserts_nothing(conn, account):
    key = f"invoice-{uuid.uuid4()}"
    params = dict(to_address="a@example.com", subject="Invoice 7", body="Total: 42", account_name=account,
                  headers={"X-Invoice": "7"}, idempotency_key=key,
                  attachments=[procedures.Attachment("invoice-7.pdf", b"%PDF-1.4 ...", "application/pdf")])
    first = procedures.enqueue_mail(conn, **params)
    rows_before = scalar(conn, "SELECT COUNT_BIG(*) FROM mailq.MailQueue;")
    attachments_before = scalar(conn, "SELECT COUNT_BIG(*) FROM mailq.MailAttachment;")
    second = procedures.enqueue_mail(conn, **params)
    assert first.created is True and second.created is False
    assert second.mail_id == first.mail_id
    assert second.message_id == first.message_id
    assert scalar(conn, "SELECT COUNT_BIG(*) FROM mailq.MailQueue;") == rows_before
    assert scalar(conn, "SELECT COUNT_BIG(*) FROM mailq.MailAttachment;") == attachments_before
    assert scalar(conn, "SELECT COUNT_BIG(*) FROM mailq.MailQueue WHERE IdempotencyKey = ?;", key) == 1


def test_concurrent_enqueues_with_one_key_make_one_mail(mssql_url, conn, account):
    key = f"race-{uuid.uuid4()}"

    def worker(i, barrier):
        with connection(mssql_url) as c:
            barrier.wait()
            return procedures.enqueue_mail(c, to_address="race@example.com", subject="race", body="same",
                                           account_name=account, idempotency_key=key)

    results = run_threads(6, worker)
    assert len({r.mail_id for r in results}) == 1
    assert len({r.message_id for r in results}) == 1
    assert sum(r.created for r in results) == 1
    assert scalar(conn, "SELECT COUNT_BIG(*) FROM mailq.MailQueue WHERE IdempotencyKey = ?;", key) == 1


def test_message_id_format_and_uniqueness(conn, account):
    a, b = enqueue(conn, account, None, 2)
    assert re.fullmatch(f"<{UUID_RE}@example\\.org>", a.message_id), a.message_id
    assert a.message_id != b.message_id
    assert mail_row(conn, a.mail_id)["MessageID"] == a.message_id

    own = procedures.enqueue_mail(conn, to_address="x@example.com", subject="s", body="b", account_name=account,
                                  from_address="sales@shop.example.net")
    assert re.fullmatch(f"<{UUID_RE}@shop\\.example\\.net>", own.message_id), own.message_id

    idn = procedures.enqueue_mail(conn, to_address="x@example.com", subject="s", body="b", account_name=account,
                                  from_address="info@例え.jp")
    assert re.fullmatch(f"<{UUID_RE}@mailq-db\\.invalid>", idn.message_id), idn.message_id


def test_message_id_is_stable_across_attempts(conn, account):
    app = new_app(conn, "msgid")
    (mail,) = enqueue(conn, account, app, 1)
    token, (first,) = claim(conn, app)
    assert first.message_id == mail.message_id and first.attempt_no == 1
    procedures.mark_failed(conn, ids=[mail.mail_id], lock_token=token, disposition="Retry",
                           error="451 4.7.1 try later", retry_after_seconds=0)
    make_due_now(conn, [mail.mail_id])
    _, (second,) = claim(conn, app)
    assert second.id == mail.mail_id and second.attempt_no == 2
    assert second.message_id == mail.message_id
    assert mail_row(conn, mail.mail_id)["MessageID"] == mail.message_id
    assert [a["AttemptNo"] for a in attempts(conn, mail.mail_id)] == [1, 2]


def test_enqueued_content_comes_back_unchanged_from_the_claim(conn, account):
    app = new_app(conn, "content")
    files = [procedures.Attachment("报告-2024.pdf", bytes(range(256)) * 40, "application/pdf"),
             procedures.Attachment("notes.txt", "备注".encode("utf-8"), "text/plain")]
    mail = procedures.enqueue_mail(
        conn, to_address="first.last+tag@my-domain.example.com; 张三@例子.公司; 李四 <li.si@example.com>",
        cc="Carol O'Neil <c-c@example.com>",
        bcc="hidden@example.com", subject="季度报告 – Q3", body="<p>你好</p>", body_format="Html",
        text_body="你好", reply_to="reply-to@example.com", headers={"X-Order-Id": "42", "X-Tenant": "租户"},
        account_name=account, app_name=app, priority=9, attachments=files)
    _, (got,) = claim(conn, app)
    assert got.id == mail.mail_id
    assert got.to_address == "first.last+tag@my-domain.example.com; 张三@例子.公司; 李四 <li.si@example.com>"
    assert (got.cc, got.bcc, got.reply_to) == \
        ("Carol O'Neil <c-c@example.com>", "hidden@example.com", "reply-to@example.com")
    assert got.subject == "季度报告 – Q3" and got.body == "<p>你好</p>" and got.text_body == "你好"
    assert got.body_format == "Html" and got.priority == 9
    assert got.headers == {"X-Order-Id": "42", "X-Tenant": "租户"}
    assert got.from_address == "noreply@example.org" and got.from_name == "Ops 运维"  # the account's defaults
    assert got.account_name == account and got.app_name == app
    assert [(a.file_name, a.content, a.content_type) for a in got.attachments] == \
        [(f.file_name, f.content, f.content_type) for f in files]


def test_values_at_their_limits_are_accepted(conn, account):
    app = new_app(conn, "limits")
    hundred = ";".join(f"u{i:03d}@example.com" for i in range(100))
    ten_files = [procedures.Attachment(f"file-{i}.txt", b"x") for i in range(10)]
    results = [
        procedures.enqueue_mail(conn, to_address=hundred, subject="s" * 900, body="b", account_name=account,
                                app_name=app, from_name="n" * 200, priority=0, max_attempts=20),
        procedures.enqueue_mail(conn, to_address="a" * 242 + "@example.com", subject="", body="b",
                                account_name=account, app_name=app, priority=9, max_attempts=1,
                                attachments=ten_files),
        procedures.enqueue_mail(conn, to_address="a@example.com", subject="s", body="b",
                                account_name=account, app_name=app,
                                headers={f"X-H{i}": "v" * 900 for i in range(50)}),
    ]
    assert all(r.created for r in results)
    assert scalar(conn, "SELECT COUNT_BIG(*) FROM mailq.MailAttachment WHERE MailID = ?;", results[1].mail_id) == 10


def test_enqueue_defaults(conn, account):
    default = new_account(conn, "default", from_address="default@example.org")
    procedures.upsert_sending_account(conn, account_name=default, default_from_address="default@example.org",
                                      is_default=True)
    mail = procedures.enqueue_mail(conn, to_address="a@example.com", subject="s", body="b")
    row = mail_row(conn, mail.mail_id)
    assert row["AccountName"] == default
    assert row["Status"] == "UnSent" and row["Priority"] == 5 and row["AttemptsRemaining"] == 5
    assert row["AttemptCount"] == 0 and row["ThreadLock"] is None and row["PossibleDuplicate"] in (False, 0)
    assert row["VisibleAtUtc"] == row["DateToProcess"]
    ((body_format, from_address),) = query(
        conn, "SELECT BodyFormat, FromAddress FROM mailq.MailQueue WHERE ID = ?;", mail.mail_id)
    assert (body_format, from_address) == ("Text", "default@example.org")


@pytest.mark.parametrize("lists", [dict(cc="Copy <copy@example.com>"), dict(bcc="blind@example.com"),
                                   dict(to_address="", cc="c@example.com", bcc="b@example.com")])
def test_a_mail_without_to_is_queued_for_its_cc_or_bcc(conn, account, lists):
    """Database Mail sends Cc-only and Bcc-only mail: the core needs one recipient
    in To, Cc or Bcc; the To is stored empty and the claim hands it over so."""
    mail = procedures.enqueue_mail(conn, subject="s", body="b", account_name=account, **lists)
    to, cc, bcc = query(conn, "SELECT ToAddress, CC, BCC FROM mailq.MailQueue WHERE ID = ?;", mail.mail_id)[0]
    assert to == "" and (cc, bcc) == (lists.get("cc"), lists.get("bcc"))
    batch = procedures.enqueue_mail_batch(conn, [dict(subject="s", body="b", account_name=account, **lists)])
    assert [r.row_no for r in batch.enqueued] == [1] and batch.rejected == []


def test_no_recipient_at_all_is_50101_and_to_cc_bcc_count_together_toward_100(conn, account):
    for lists in (dict(), dict(to_address=" ; ", cc="", bcc=None)):
        expect_error(50101, procedures.enqueue_mail, conn, subject="s", body="b", account_name=account, **lists)
    addresses = [f"r{i}@example.com" for i in range(101)]
    expect_error(50104, procedures.enqueue_mail, conn, subject="s", body="b", account_name=account,
                 to_address="; ".join(addresses[:40]), cc="; ".join(addresses[40:80]), bcc="; ".join(addresses[80:]))
    expect_error(50104, procedures.enqueue_mail, conn, subject="s", body="b", account_name=account,
                 bcc="; ".join(addresses))
    ok = procedures.enqueue_mail(conn, subject="s", body="b", account_name=account,
                                 cc="; ".join(addresses[:50]), bcc="; ".join(addresses[50:100]))
    assert ok.created
