"""Messages the worker produces, parsed back with Python's email parser."""

from __future__ import annotations

from email import message_from_bytes, policy

import pytest
from worker_helpers import FakeQueue, account_for, make_mail, make_worker

from mailq_db.procedures import Attachment
from mailq_db.worker.message import MalformedMail, build, validate_header

CHINESE = dict(
    from_name="张三", subject="季度报告：你好，世界（第二季度）", to_address="李四 <li@example.com>; b@example.com",
    cc="王五 <wang@example.com>", bcc="hidden@example.com; secret@example.com",
    reply_to="客服 <support@example.com>", body="<p>你好</p>", body_format="Html", text_body="你好，纯文本",
    headers={"X-Tenant": "租户 42", "List-Unsubscribe": "<mailto:unsub@example.com>"},
    attachments=[Attachment("报告.pdf", b"%PDF-1.4 test", "application/pdf")],
)


def parse(data: bytes):
    return message_from_bytes(data, policy=policy.default)


def test_message_parses_back_with_every_header_intact():
    mail = make_mail(7, message_id="<7.abc@mailq.example>", **CHINESE)
    out = build(mail)
    msg = parse(out.data)
    assert msg["Message-ID"] == "<7.abc@mailq.example>"
    assert msg["Date"] == "Wed, 01 May 2024 12:00:00 +0000"
    assert msg["Subject"] == CHINESE["subject"]
    assert msg["From"].addresses[0].display_name == "张三"
    assert msg["From"].addresses[0].addr_spec == "sender@example.com"
    assert [a.display_name for a in msg["To"].addresses] == ["李四", ""]
    assert msg["Cc"].addresses[0].display_name == "王五"
    assert msg["Reply-To"].addresses[0].display_name == "客服"
    assert msg["X-Tenant"] == "租户 42"
    assert msg["Bcc"] is None and b"hidden@" not in out.data and b"secret@" not in out.data
    assert out.recipients == ("li@example.com", "b@example.com", "wang@example.com",
                              "hidden@example.com", "secret@example.com")
    assert msg.get_body(("plain",)).get_content().strip() == "你好，纯文本"
    assert msg.get_body(("html",)).get_content().strip() == "<p>你好</p>"
    [att] = list(msg.iter_attachments())
    assert att.get_filename() == "报告.pdf" and att.get_content() == b"%PDF-1.4 test"
    assert out.data.isascii() and not out.smtputf8  # RFC 2047 / base64: 7-bit clean


@pytest.mark.parametrize("lists,header", [
    (dict(cc="Copy <copy@example.com>"), "Cc"),
    (dict(bcc="blind@example.com"), None),
])
def test_a_mail_without_to_is_sent_to_its_cc_or_bcc(lists, header):
    """The enqueue core stores N'' as To of a Cc-only or Bcc-only mail (Database
    Mail sends them): no To header, the Cc header or none, the envelope to them."""
    out = build(make_mail(3, to_address="", **lists))
    msg = parse(out.data)
    assert msg["To"] is None and msg["Bcc"] is None
    assert out.recipients == (("copy@example.com",) if header else ("blind@example.com",))
    assert (msg["Cc"] is not None) == (header == "Cc") and b"blind@" not in out.data
    with pytest.raises(MalformedMail, match="no recipient"):
        build(make_mail(4, to_address=""))


def test_message_ids_without_brackets_get_them_and_nothing_else_changes():
    assert parse(build(make_mail(1, message_id="x.1@h.example")).data)["Message-ID"] == "<x.1@h.example>"


def test_text_mail_has_a_single_plain_part():
    msg = parse(build(make_mail(1, body="plain body")).data)
    assert msg.get_content_type() == "text/plain" and msg.get_content().strip() == "plain body"


def test_html_without_text_alternative():
    msg = parse(build(make_mail(1, body="<b>x</b>", body_format="Html")).data)
    assert msg.get_content_type() == "text/html"


@pytest.mark.parametrize("field,value", [
    ("subject", "Hello\r\nBcc: victim@example.com"),
    ("subject", "Hello\nX-Injected: 1"),
    ("from_name", "Eve\r\nBcc: victim@example.com"),
    ("to_address", "a@example.com\r\nBcc: victim@example.com"),
    ("reply_to", "r@example.com\nBcc: victim@example.com"),
    ("headers", {"X-Ok": "v\r\nBcc: victim@example.com"}),
    ("headers", {"X-Bad\r\nBcc": "victim@example.com"}),
])
def test_header_injection_is_refused(field, value):
    with pytest.raises(MalformedMail, match="line break|ftext"):
        build(make_mail(1, **{field: value}))


@pytest.mark.parametrize("name", ["From", "to", "BCC", "Subject", "Message-ID", "Date", "Reply-To", "Sender",
                                  "MIME-Version", "Content-Type", "content-transfer-encoding"])
def test_business_headers_may_not_override_the_workers_headers(name):
    with pytest.raises(MalformedMail, match="may not be set"):
        validate_header(name, "x")


@pytest.mark.parametrize("name", ["X Space", "X:Colon", "", "X-Ümlaut"])
def test_business_header_names_must_be_ftext(name):
    with pytest.raises(MalformedMail, match="ftext"):
        validate_header(name, "x")


@pytest.mark.parametrize("value", ["not-an-address", "a@", "@b", "a b@example.com", "a@example.com, b@example.com"])
def test_malformed_addresses_are_refused(value):
    with pytest.raises(MalformedMail):
        build(make_mail(1, to_address=value))


def test_malformed_mail_is_stopped_and_never_sent(sink):
    queue = FakeQueue([make_mail(1, subject="x\r\nBcc: victim@example.com"), make_mail(2)])
    make_worker(queue, {"default": account_for(sink)}).run(once=True)
    [call] = queue.calls_to("mark_failed")
    assert call["ids"] == [1] and call["disposition"] == "Stop" and "malformed" in call["error"]
    assert [m.rcpt_tos for m in sink.messages] == [["rcpt2@example.com"]]
    assert b"victim" not in sink.messages[0].data


def test_delivered_message_is_byte_for_byte_parseable_with_chinese_intact(sink):
    queue = FakeQueue([make_mail(9, message_id="<9.z@mailq.example>", **CHINESE)])
    make_worker(queue, {"default": account_for(sink)}).run(once=True)
    [received] = sink.messages
    assert sorted(received.rcpt_tos) == sorted(["li@example.com", "b@example.com", "wang@example.com",
                                                "hidden@example.com", "secret@example.com"])
    msg = parse(received.data)
    assert msg["Message-ID"] == "<9.z@mailq.example>"
    assert msg["Subject"] == CHINESE["subject"] and msg["From"].addresses[0].display_name == "张三"
    assert msg["Bcc"] is None and b"hidden@" not in received.data
