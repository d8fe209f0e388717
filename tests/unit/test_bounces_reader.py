"""The bounce reader's decisions (mailq_db.bounces.reader.process), the [bounces]
configuration, and the RFC 8058 endpoint, without servers; the IMAP side runs
against Dovecot in tests/realmta/test_bounces_lab.py."""

from __future__ import annotations

import io
from pathlib import Path
from wsgiref.util import setup_testing_defaults

import pytest
from fake_bounces import FakeBounceQueue
from fake_queue import FakeConnection, make_mail

from mailq_db.bounces import reader, verp
from mailq_db.bounces.unsubscribe import make_app
from mailq_db.connection import Backoff, ReconnectingConnection
from mailq_db.errors import ConfigurationError, DatabaseError, UnknownUnsubscribeError

KEY = b"unit-bounce-key-0123456789abcdefghij"
SIGNER = verp.Signer([KEY])
SHARED = Path(__file__).resolve().parents[2] / "tests" / "corpus" / "bounces" / "messages"


def config(**kw) -> reader.ReaderConfig:
    values = dict(host="imap.example.com", user="bounces@example.com", account="default", password="pw",
                  keys=(KEY,))
    values.update(kw)
    return reader.ReaderConfig(**values)


def db() -> ReconnectingConnection:
    return ReconnectingConnection(FakeConnection, backoff=Backoff(0.001, 0.002), sleep=lambda s: None)


def dsn(to: str, recipient: str, status: str = "5.1.1", action: str = "failed", message_id: str = "<r1@mx>") -> bytes:
    return f"""From: MAILER-DAEMON@mx.example.org
To: {to}
Subject: Undelivered Mail Returned to Sender
Message-ID: {message_id}
MIME-Version: 1.0
Content-Type: multipart/report; report-type=delivery-status; boundary="B"

--B
Content-Type: text/plain

failed
--B
Content-Type: message/delivery-status

Reporting-MTA: dns; mx.example.org

Final-Recipient: rfc822; {recipient}
Action: {action}
Status: {status}
Diagnostic-Code: smtp; 550 {status} user unknown

--B--
""".replace("\n", "\r\n").encode()


def test_a_dsn_to_the_verp_address_records_the_mail_and_suppresses():
    queue = FakeBounceQueue([make_mail(5, to_address="gone@example.org")])
    token = SIGNER.token(verp.BOUNCE, 5, 1)
    out = reader.process(dsn(f"bounces+{token}@example.com", "gone@example.org"), config(), db(), queue)
    assert out.action == "recorded" and out.suppressed == ["gone@example.org"]
    [call] = queue.calls_to("record_bounce")
    assert call["mail_id"] == 5 and call["recipient_no"] == 1 and call["account_name"] == "default"
    assert call["recipients"] == [{"address": "gone@example.org", "kind": "Hard", "action": "failed",
                                   "status": "5.1.1", "code": 550, "detail": "smtp; 550 5.1.1 user unknown"}]
    assert queue.rows[5].recipients["gone@example.org"][:2] == ("Refused", 550)
    # the same report again: nothing new (the key is the report's Message-ID)
    again = reader.process(dsn(f"bounces+{token}@example.com", "gone@example.org"), config(), db(), queue)
    assert again.suppressed == [] and len([e for e in queue.events if e.event_type == "Bounced"]) == 1


def test_a_forged_token_names_no_mail_and_the_reader_account_is_used():
    queue = FakeBounceQueue([make_mail(5, to_address="gone@example.org")])
    forged = verp.Signer([b"x" * 32]).token(verp.BOUNCE, 5, 1)
    reader.process(dsn(f"bounces+{forged}@example.com", "gone@example.org"), config(), db(), queue)
    [call] = queue.calls_to("record_bounce")
    assert call["mail_id"] is None and call["account_name"] == "default"
    assert "gone@example.org" not in queue.rows[5].recipients  # not tied to mail 5


def test_a_report_naming_nobody_uses_the_tokens_recipient():
    queue = FakeBounceQueue([make_mail(6, to_address="only@example.org")])
    token = SIGNER.token(verp.BOUNCE, 6, 1)
    raw = (f"From: MAILER-DAEMON@example.net\r\nTo: bounces+{token}@example.com\r\nSubject: failure notice\r\n"
           "Message-ID: <r6@example.net>\r\n\r\nThis is a permanent error; I've given up. Sorry it didn't work out.\r\n")
    out = reader.process(raw.encode(), config(), db(), queue)
    assert out.action == "recorded"
    [call] = queue.calls_to("record_bounce")
    assert call["recipients"] == [{"kind": "Soft"}] and call["recipient_no"] == 1
    assert queue.suppressed == {}  # soft: no suppression by default


def test_auto_replies_and_human_mail_record_nothing():
    queue = FakeBounceQueue()
    raw = (b"From: alice@example.org\r\nTo: bounces@example.com\r\nSubject: Automatic reply: Out of office\r\n"
           b"Auto-Submitted: auto-replied\r\n\r\nBack on Monday.\r\n")
    out = reader.process(raw, config(), db(), queue)
    assert out.action == "nothing" and out.report.kind == "autoreply" and queue.calls_to("record_bounce") == []


def test_a_mail_to_the_unsubscribe_mailto_unsubscribes_its_recipient():
    queue = FakeBounceQueue([make_mail(7, to_address="reader@example.org", app_name="news")])
    token = SIGNER.token(verp.UNSUBSCRIBE, 7, 1)
    raw = (f"From: reader@example.org\r\nTo: bounces+{token}@example.com\r\nSubject: unsubscribe\r\n"
           "Message-ID: <u7@example.org>\r\n\r\nunsubscribe\r\n").encode()
    out = reader.process(raw, config(), db(), queue)
    assert out.action == "unsubscribed"
    assert queue.suppressed[("default", "news", "reader@example.org")].reason == "Unsubscribe"
    assert queue.calls_to("record_unsubscribe")[0]["source"].startswith("unsubscribe-mailto:imap:")


def test_a_complaint_ties_to_the_mail_through_the_returned_x_mailq_token():
    queue = FakeBounceQueue([make_mail(8, to_address="angry@example.org")])
    token = SIGNER.token(verp.BOUNCE, 8, 1)
    raw = f"""From: feedback@isp.example
To: abuse@example.com
Subject: FW: spam
Message-ID: <arf8@isp.example>
MIME-Version: 1.0
Content-Type: multipart/report; report-type=feedback-report; boundary="B"

--B
Content-Type: text/plain

complaint
--B
Content-Type: message/feedback-report

Feedback-Type: abuse
Version: 1
Original-Rcpt-To: angry@example.org

--B
Content-Type: text/rfc822-headers

Message-ID: <m8@mailq.example.com>
X-Mailq-Token: {token}
To: angry@example.org

--B--
""".replace("\n", "\r\n").encode()
    out = reader.process(raw, config(), db(), queue)
    assert out.action == "recorded" and out.suppressed == ["angry@example.org"]
    assert queue.calls_to("record_bounce")[0]["mail_id"] == 8
    assert queue.suppressed[("default", "", "angry@example.org")].reason == "Complaint"


def test_a_deadlock_is_retried_by_the_readers_connection_and_then_raised(monkeypatch):
    """RecordBounce chosen as a deadlock victim (the suppression sweep runs at LOW
    priority, so rarely): the reader's ReconnectingConnection sends the idempotent
    call again; a deadlock that persists is raised, and run_once leaves the message."""
    queue = FakeBounceQueue([make_mail(5, to_address="gone@example.org")])
    token = SIGNER.token(verp.BOUNCE, 5, 1)
    raw = dsn(f"bounces+{token}@example.com", "gone@example.org")
    real, calls = queue.record_bounce, []

    def deadlocked_twice(conn, **kw):
        calls.append(1)
        if len(calls) <= 2:
            raise DatabaseError(1205, "deadlock victim")
        return real(conn, **kw)
    monkeypatch.setattr(queue, "record_bounce", deadlocked_twice)
    out = reader.process(raw, config(), db(), queue)
    assert out.action == "recorded" and len(calls) == 3 and out.suppressed == ["gone@example.org"]

    def always_deadlocked(conn, **kw):
        calls.append(1)
        raise DatabaseError(1205, "deadlock victim")
    calls.clear()
    monkeypatch.setattr(queue, "record_bounce", always_deadlocked)
    connection = db()
    with pytest.raises(DatabaseError):
        reader.process(raw, config(), connection, queue)
    assert len(calls) == connection.retries + 1


TOML = """
[bounces]
host = "imap.example.com"
user = "bounces@example.com"
password_env = "IMAP_PW"
account = "news"
hard_bounce_limit = 2
soft_bounce_limit = 5
"""


def test_reader_config_reads_secrets_from_the_environment():
    cfg = reader.parse_reader_config(TOML, env={"IMAP_PW": "secret", "MAILQ_BOUNCE_KEY": "k" * 40})
    assert (cfg.port, cfg.tls, cfg.hard_bounce_limit, cfg.soft_bounce_limit) == (993, "implicit", 2, 5)
    assert cfg.password == "secret" and "secret" not in repr(cfg) and cfg.keys == (b"k" * 40,)
    assert cfg.source == "imap:bounces@example.com@imap.example.com/INBOX"


def test_reader_config_lists_every_problem():
    text = TOML.replace('password_env = "IMAP_PW"', 'password = "x"\ntls = "none"\nfolderz = "x"')
    with pytest.raises(ConfigurationError) as err:
        reader.parse_reader_config(text, env={})
    message = str(err.value)
    for part in ("bounces.password: passwords never go in the file", 'bounces.tls: "none"',
                 "bounces.folderz: unknown setting", "bounces.password_env", "MAILQ_BOUNCE_KEY is not set"):
        assert part in message


# ---------------------------------------------------------------- RFC 8058 endpoint


def call(app, method: str, path: str, body: bytes = b"", ctype: str = "application/x-www-form-urlencoded"):
    path, _, query = path.partition("?")
    environ: dict = {"REQUEST_METHOD": method, "PATH_INFO": path, "QUERY_STRING": query,
                     "CONTENT_LENGTH": str(len(body)),
                     "CONTENT_TYPE": ctype, "wsgi.input": io.BytesIO(body)}
    setup_testing_defaults(environ)
    seen = {}

    def start_response(status, headers):
        seen["status"], seen["headers"] = status, dict(headers)
    page = b"".join(app(environ, start_response)).decode()
    return seen["status"], page


def test_one_click_post_unsubscribes_get_only_shows_a_button():
    recorded = []
    app = make_app([KEY], lambda m, r, s: recorded.append((m, r, s)) or {"Recorded": True})
    token = SIGNER.token(verp.UNSUBSCRIBE, 42, 1)
    status, page = call(app, "GET", f"/u/{token}")
    assert status == "200 OK" and 'method="post"' in page and recorded == []
    status, _ = call(app, "POST", f"/u/{token}", b"List-Unsubscribe=One-Click")
    assert status == "200 OK" and recorded == [(42, 1, "unsubscribe-url")]
    multipart = (b'--x\r\nContent-Disposition: form-data; name="List-Unsubscribe"\r\n\r\nOne-Click\r\n--x--\r\n')
    status, _ = call(app, "POST", f"/u/{token}", multipart, "multipart/form-data; boundary=x")
    assert status == "200 OK" and len(recorded) == 2


@pytest.mark.parametrize("method,path,body,expected", [
    ("POST", "/u/{token}", b"", "400 Bad Request"),  # not the RFC 8058 body
    ("POST", "/u/{bounce}", b"List-Unsubscribe=One-Click", "404 Not Found"),  # a return-path token
    ("POST", "/u/{token}x", b"List-Unsubscribe=One-Click", "404 Not Found"),
    ("PUT", "/u/{token}", b"", "405 Method Not Allowed"),
])
def test_the_endpoint_refuses_what_is_not_a_verified_one_click(method, path, body, expected):
    recorded = []
    app = make_app([KEY], lambda m, r, s: recorded.append(m) or {})
    path = path.format(token=SIGNER.token(verp.UNSUBSCRIBE, 42, 1), bounce=SIGNER.token(verp.BOUNCE, 42, 1))
    status, _ = call(app, method, path, body)
    assert status == expected and recorded == []


def test_a_purged_mail_is_gone_and_a_database_error_is_a_503():
    token = SIGNER.token(verp.UNSUBSCRIBE, 43, 1)

    def purged(m, r, s):
        raise UnknownUnsubscribeError(50611, "Mail 43 does not exist")

    def down(m, r, s):
        raise DatabaseError(4060, "cannot open database")
    assert call(make_app([KEY], purged), "POST", f"/u/{token}", b"List-Unsubscribe=One-Click")[0] == "410 Gone"
    status = call(make_app([KEY], down), "POST", f"/x?token={token}", b"List-Unsubscribe=One-Click")[0]
    assert status == "503 Service Unavailable"


def test_the_example_configuration_is_valid():
    text = (Path(__file__).resolve().parents[2] / "examples" / "bounces.toml").read_text()
    cfg = reader.parse_reader_config(text, env={"MAILQ_BOUNCE_IMAP_PASSWORD": "x", "MAILQ_BOUNCE_KEY": "k" * 32})
    assert (cfg.host, cfg.port, cfg.soft_bounce_limit) == ("imap.example.com", 993, None)


def test_a_forwarded_final_recipient_is_recorded_as_the_address_the_mail_was_sent_to():
    queue = FakeBounceQueue([make_mail(9, to_address="alias@example.org")])
    token = SIGNER.token(verp.BOUNCE, 9, 1)
    reader.process(dsn(f"bounces+{token}@example.com", "real.mailbox@elsewhere.example"), config(), db(), queue)
    assert ("default", "", "alias@example.org") in queue.suppressed


@pytest.mark.parametrize("status, diagnostic", [
    ("5.1.8", "smtp; 553 5.1.8 <bounces+x@example.com>: Sender address rejected: Domain not found"),
    ("5.1.0", "smtp; 550 5.1.0 <bounces+x@example.com>: Sender address rejected: User unknown in local recipient table"),
    ("5.0.0", "smtp; 550-Verification failed for <bounces+x@example.com> 550-Unrouteable address 550 Sender verify failed"),
])
def test_a_rejected_return_path_is_soft_and_does_not_suppress_the_recipient(status, diagnostic):
    # RFC 3463 X.1.7/X.1.8 and these texts are about our envelope sender (the
    # VERP return path), not the recipient: a hard bounce here would suppress
    # every good recipient of a receiver that verifies senders.
    queue = FakeBounceQueue([make_mail(9, to_address="good@example.org")])
    token = SIGNER.token(verp.BOUNCE, 9, 1)
    raw = dsn(f"bounces+{token}@example.com", "good@example.org", status=status)
    raw = raw.replace(f"Diagnostic-Code: smtp; 550 {status} user unknown".encode(), f"Diagnostic-Code: {diagnostic}".encode())
    out = reader.process(raw, config(), db(), queue)
    assert out.report.kind == "soft" and out.suppressed == [] and queue.suppressed == {}


def test_a_report_naming_nobody_is_classified_by_its_own_words_not_by_the_returned_copy():
    from mailq_db.bounces.parse import parse
    raw = ("From: MAILER-DAEMON@example.net\r\nTo: bounces@example.com\r\nSubject: failure notice\r\n"
           "Message-ID: <r10@example.net>\r\n\r\nThis is a permanent error; I've given up. Sorry it didn't work out.\r\n"
           "\r\n--- Below this line is a copy of the message.\r\n\r\nReturn-Path: <bounces@example.com>\r\n"
           "Subject: news\r\n\r\nThe offer you asked about does not exist any more.\r\n").encode()
    assert parse(raw).kind == "soft"  # "does not exist" is our newsletter's text, not the MTA's


def arf(returned_headers: str, rcpt_to: str = "") -> bytes:
    return f"""From: feedback@isp.example
To: abuse@example.com
Subject: complaint
Message-ID: <arf11@isp.example>
MIME-Version: 1.0
Content-Type: multipart/report; report-type=feedback-report; boundary="B"

--B
Content-Type: text/plain

complaint
--B
Content-Type: message/feedback-report

Feedback-Type: abuse
Version: 1
{rcpt_to}
--B
Content-Type: text/rfc822-headers

{returned_headers}
--B--
""".replace("\n", "\r\n").encode()


def test_a_complaint_without_original_rcpt_to_never_suppresses_another_recipient_of_the_mail():
    # RFC 5965 makes Original-Rcpt-To optional.  Mail 11 went to To: shown and
    # Bcc: hidden; the complaint came from the hidden one.  The returned To is
    # a guess that would suppress the wrong address at once, account-wide.
    queue = FakeBounceQueue([make_mail(11, to_address="shown@example.org", bcc="hidden@example.org")])
    token = SIGNER.token(verp.BOUNCE, 11, 0)
    out = reader.process(arf(f"Message-ID: <m11@mailq.example.com>\nX-Mailq-Token: {token}\nTo: shown@example.org\n"),
                         config(), db(), queue)
    assert out.action == "nothing" and queue.suppressed == {}
    # To and Cc naming two addresses: no guess at all
    from mailq_db.bounces.parse import parse
    assert parse(arf("To: a@example.org\nCc: b@example.org\n")).recipients == []
    # a mail with one recipient: the guess is that recipient (the token names it too)
    queue = FakeBounceQueue([make_mail(12, to_address="one@example.org")])
    token = SIGNER.token(verp.BOUNCE, 12, 1)
    out = reader.process(arf(f"X-Mailq-Token: {token}\nTo: one@example.org\n"), config(), db(), queue)
    assert out.suppressed == ["one@example.org"]


class ListMailbox:
    """The three calls run_once makes on reader.Mailbox, over a dict of messages."""

    def __init__(self, messages: dict[bytes, bytes]):
        self.imap = object()
        self.messages = dict(messages)
        self.moved: dict[bytes, str] = {}

    def uids(self):
        return sorted(self.messages)

    def fetch(self, uid):
        return self.messages[uid]

    def move(self, uid, folder):
        self.moved[uid] = folder
        del self.messages[uid]


def test_a_message_the_parser_trips_on_stays_and_the_pass_goes_on():
    # Anyone can mail the bounce mailbox: an SNS-like JSON body with odd fields
    # used to raise out of run_once, so every later message waited forever.
    queue = FakeBounceQueue([make_mail(13, to_address="gone@example.org")])
    token = SIGNER.token(verp.BOUNCE, 13, 1)
    odd = (b"From: x@example.net\r\nSubject: x\r\n\r\n"
           b'{"notificationType":"Bounce","bounce":{"bounceType":"Permanent","bouncedRecipients":[{"emailAddress":"x"}]}}')
    box = ListMailbox({b"1": odd, b"2": dsn(f"bounces+{token}@example.com", "gone@example.org")})
    summary = reader.run_once(config(), db(), queue, mailbox=box)  # type: ignore[arg-type]
    assert summary.failed == 1 and summary.recorded == 1 and summary.suppressed == ["gone@example.org"]
    assert box.moved == {b"2": "mailq-processed"} and b"1" in box.messages  # never deleted


def test_an_address_the_procedure_would_refuse_does_not_hold_back_the_rest_of_the_report():
    from mailq_db.bounces.parse import Recipient, Report
    report = Report("hard", [Recipient('"a@b"@example.org', "failed", "5.1.1", "hard"),
                             Recipient("x" * 320 + "@example.org", "failed", "5.1.1", "hard"),
                             Recipient("gone@example.org", "failed", "5.1.1", "hard")])
    assert [r["address"] for r in reader.bounce_recipients(report, None)] == ["gone@example.org"]


def test_two_reports_of_one_bounce_count_once_against_the_hard_bounce_limit():
    # The DSN to the VERP address and the relay's own notification (SES, by
    # SNS) are two reports with two Message-IDs about one failed delivery.
    queue = FakeBounceQueue([make_mail(14, to_address="gone@example.org"), make_mail(15, to_address="gone@example.org")])
    cfg = config(hard_bounce_limit=2)
    for mail_id, message_id in ((14, "<a@mx>"), (14, "<b@relay>"), (15, "<c@mx>")):
        token = SIGNER.token(verp.BOUNCE, mail_id, 1)
        out = reader.process(dsn(f"bounces+{token}@example.com", "gone@example.org", message_id=message_id),
                             cfg, db(), queue)
        assert out.suppressed == ([] if mail_id == 14 else ["gone@example.org"])
