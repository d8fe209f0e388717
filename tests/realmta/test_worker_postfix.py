"""The sender worker against the lab's Postfix 3.x + Dovecot (tests/realmta/lab.py).

Each test states what the server did and what the worker must do; the
messages are read back from the Maildir as Postfix delivered them, and the
queue IDs from Postfix's own log.
"""

from __future__ import annotations

import logging
import re
import socket
import time

from lab import (
    CONNECTION_RATE_LIMIT, IDLE_TIMEOUT_SECONDS, RATE_UNIT_SECONDS, RECIPIENT_LIMIT, UTF8_PASSWORD, UTF8_USER,
)
from realmta_helpers import FakeQueue, account, mails, make_mail, run_until_final, worker

from mailq_db.procedures import Attachment
from mailq_db.worker.smtp import SmtpSession

LIST_UNSUBSCRIBE = ("<https://unsubscribe.example.com/u/0123456789abcdef0123456789abcdef0123456789abcdef"
                    "?list=news&user=42>, <mailto:unsubscribe+0123456789abcdef@example.com?subject=unsubscribe>")


def test_delivered_bytes_headers_and_queue_id(lab, caplog):
    mail = make_mail(1, message_id="<bytes.1@mailq.lab.test>", from_address="mailer@lab.test",
                     from_name="张三", to_address="王五 <bytes-1@lab.test>", bcc="bytes-bcc@lab.test",
                     subject="你好, a long subject that needs folding " * 3,
                     headers={"List-Unsubscribe": LIST_UNSUBSCRIBE,
                              "List-Unsubscribe-Post": "List-Unsubscribe=One-Click"})
    queue = FakeQueue([mail])
    w = worker(queue, {"default": account(lab)})
    with caplog.at_level(logging.INFO, logger="mailq_db.worker"):
        w.run(once=True)
    assert queue.status(1) == "Sent"
    [to] = lab.wait_delivered("bytes-1@", 1)
    [bcc] = lab.wait_delivered("bytes-bcc@", 1)
    raw = to.raw.decode("ascii")
    # ASCII business headers arrive byte for byte: folded at the space, never RFC 2047
    assert ("List-Unsubscribe: <https://unsubscribe.example.com/u/0123456789abcdef0123456789abcdef0123456789abcdef"
            "?list=news&user=42>,\n <mailto:unsubscribe+0123456789abcdef@example.com?subject=unsubscribe>\n") in raw
    assert "List-Unsubscribe-Post: List-Unsubscribe=One-Click\n" in raw
    assert "=?" not in raw.split("List-Unsubscribe:")[1].split("\n List-Unsubscribe-Post")[0]
    assert to.message["List-Unsubscribe"] == LIST_UNSUBSCRIBE
    assert to.message["Subject"] == mail.subject and str(to.message["From"]) == "张三 <mailer@lab.test>"
    assert "Bcc" not in to.message and "bytes-bcc" not in raw.split("\n\n", 1)[0]  # Bcc: envelope only
    assert to.message["Message-ID"] == "<bytes.1@mailq.lab.test>" == bcc.message["Message-ID"]
    # the queue ID: in the stored text, in the worker's INFO line, in Postfix's log for both recipients
    qid = re.search(r"queued as (\w+)", queue.rows[1].smtp_text).group(1)
    assert queue.rows[1].smtp_text.startswith("250 2.0.0 Ok: queued as ")
    sent = [r for r in caplog.records if r.getMessage() == "sent"]
    assert sent and sent[0].mailq_fields["queue_id"] == qid and sent[0].mailq_fields["message_id"] == mail.message_id
    assert sent[0].mailq_fields["account"] == "default" and sent[0].levelno == logging.INFO
    assert re.search(rf"{qid}: to=<bytes-1@lab.test>.*status=sent", lab.log())
    assert re.search(rf"{qid}: to=<bytes-bcc@lab.test>.*status=sent", lab.log())


def test_120_recipients_against_smtpd_recipient_limit_all_receive_it_once(lab):
    rcpts = [f"many-{i}@lab.test" for i in range(120)]
    mail = make_mail(1, message_id="<many@mailq.lab.test>", from_address="mailer@lab.test",
                     to_address=rcpts[0], bcc="; ".join(rcpts[1:]))
    queue = FakeQueue([mail])
    w = worker(queue, {"default": account(lab)})
    w.run(once=True)
    assert queue.status(1) == "Sent"
    got = lab.wait_delivered("many-", 120)
    assert sorted(d.recipient for d in got) == sorted(rcpts)  # all 120, each once
    # Postfix answered RCPT 51 with "452 4.5.3 Error: too many recipients"
    # (not logged): the worker sent the rest in follow-up transactions, 50 + 50 + 20
    per_queue_id = {}
    for qid in re.findall(r"(\w+): to=<many-", lab.log()):
        per_queue_id[qid] = per_queue_id.get(qid, 0) + 1
    assert sorted(per_queue_id.values()) == [120 - 2 * RECIPIENT_LIMIT, RECIPIENT_LIMIT, RECIPIENT_LIMIT]


def test_greylisted_recipient_is_retried_alone_later(lab):
    mail = make_mail(1, message_id="<grey@mailq.lab.test>", from_address="mailer@lab.test",
                     to_address="okgrey@lab.test; greylisted-1@lab.test")
    queue = FakeQueue([mail])
    w = worker(queue, {"default": account(lab)})
    w.run(once=True)
    # first attempt: okgrey@ got it, greylisted-1@ was deferred (450): the mail is NOT Sent
    assert queue.status(1) == "UnSent"
    assert queue.rows[1].recipients["okgrey@lab.test"][0] == "Delivered"
    assert queue.rows[1].recipients["greylisted-1@lab.test"][:2] == ("Deferred", 450)
    assert queue.rows[1].dispositions == ["Retry"] and "Greylisted" in queue.rows[1].last_error
    run_until_final(w, queue, 60, make_retries_due=True)
    assert queue.status(1) == "Sent"
    assert len(lab.wait_delivered("greylisted-1@", 1)) == 1
    assert len(lab.wait_delivered("okgrey@", 1)) == 1  # not twice
    time.sleep(0.5)
    assert len(lab.delivered_to("okgrey@")) == 1


def test_5xx_recipient_is_recorded_and_the_others_get_it(lab):
    mail = make_mail(1, message_id="<nouser@mailq.lab.test>", from_address="mailer@lab.test",
                     to_address="partial-ok@lab.test; nouser-1@lab.test")
    queue = FakeQueue([mail])
    worker(queue, {"default": account(lab)}).run(once=True)
    assert queue.status(1) == "Sent"
    assert queue.rows[1].recipients["nouser-1@lab.test"][:2] == ("Refused", 550)
    assert "refused nouser-1@lab.test: 550 5.1.1" in queue.rows[1].smtp_text
    assert len(lab.wait_delivered("partial-ok@", 1)) == 1


def test_anvil_message_rate_limit_is_an_account_wait_and_every_mail_ends_sent(lab):
    queue = FakeQueue(mails("rate", 12))
    w = worker(queue, {"default": account(lab, "rate", wait_min_seconds=2, wait_max_seconds=RATE_UNIT_SECONDS)})
    run_until_final(w, queue, 150)
    assert queue.statuses() == {i: "Sent" for i in range(1, 13)}
    dispositions = [d for r in queue.rows.values() for d in r.dispositions]
    assert dispositions and set(dispositions) == {"Wait"}  # throttled, never charged
    waits = [c for c in queue.calls_to("mark_failed")]
    assert all("too much mail" in c["error"] for c in waits)
    assert waits[1]["retry_after_seconds"] > waits[0]["retry_after_seconds"] or len(waits) == 1
    assert len(lab.wait_delivered("rate-", 12)) == 12


def test_anvil_connection_rate_421_waits_without_charging(lab):
    def exhaust() -> None:
        """Connect until anvil refuses (421): the limit is reached in the current time unit."""
        for _ in range(CONNECTION_RATE_LIMIT + 3):
            with socket.create_connection(("127.0.0.1", lab.ports["connrate"]), timeout=5) as s:
                if s.recv(512).startswith(b"421"):
                    return

    # anvil counts per time unit; should the unit roll over between exhaust() and the
    # worker's connection (the worker then simply sends), do it once more
    for _ in range(2):
        exhaust()
        queue = FakeQueue(mails("connrate", 2))
        worker(queue, {"default": account(lab, "connrate")}).run(once=True)
        if queue.calls_to("mark_failed"):
            break
    [call] = queue.calls_to("mark_failed")
    assert call["disposition"] == "Wait" and call["ids"] == [1, 2] and call["smtp_code"] == 421
    assert "too many connections" in call["error"]
    assert all(queue.rows[i].attempts_remaining == 5 for i in (1, 2))


def test_helo_rejected_at_rcpt_pauses_the_account_and_says_what_to_fix(lab, caplog):
    queue = FakeQueue(mails("helo", 3))
    w = worker(queue, {"default": account(lab, "mx", local_hostname="localhost")})
    with caplog.at_level(logging.ERROR, logger="mailq_db.worker"):
        w.run(once=True)
    [call] = queue.calls_to("mark_failed")
    assert call["disposition"] == "Wait" and call["ids"] == [1, 2, 3]
    assert "Helo command rejected" in call["error"] and "RCPT" in call["error"]
    [record] = [r for r in caplog.records if "must fix" in r.getMessage()]
    assert record.levelno == logging.ERROR and "local_hostname" in record.mailq_fields["fix"]


def test_sender_rejected_at_rcpt_fails_those_mails_and_never_pauses_the_account(lab):
    # smtpd_delay_reject = yes: Postfix reports the sender restriction at RCPT TO, for
    # every recipient; the refusal names the sender address, so it concerns that mail
    queue = FakeQueue(mails("sender", 2, from_address="blocked-sender@lab.test"))
    worker(queue, {"default": account(lab, "mx")}).run(once=True)
    calls = queue.calls_to("mark_failed")
    assert [c["disposition"] for c in calls] == ["Stop", "Stop"]
    assert all("Sender address rejected" in c["error"] and "sender-address-refused" in c["error"] for c in calls)
    assert queue.statuses() == {1: "Failed", 2: "Failed"} and queue.blocked_until == {}


def test_sender_4xx_and_5xx_at_mail_from(lab):
    # 451: the From address pauses (the second mail is not even tried); 553: each mail
    # with that From fails.  Neither pauses the account.
    for sender, code, statuses in (("tempfail-sender@lab.test", 451, {1: "UnSent", 2: "UnSent"}),
                                   ("refused-sender@lab.test", 553, {1: "Failed", 2: "Failed"})):
        queue = FakeQueue(mails(f"mf{code}", 2, from_address=sender))
        worker(queue, {"default": account(lab)}).run(once=True)
        first = queue.calls_to("mark_failed")[0]
        assert first["smtp_code"] == code and "MAIL" in first["error"]
        assert queue.statuses() == statuses and queue.blocked_until == {}
        assert lab.wait_delivered(f"mf{code}-", 0, timeout=0) == []


def test_connection_closed_while_idle_is_reconnected_without_charging(lab, caplog):
    class SlowSecond(SmtpSession):
        def send(self, out):
            if self.transactions == 1:
                time.sleep(IDLE_TIMEOUT_SECONDS + 1.0)  # Postfix's smtpd_timeout closes the connection
            return super().send(out)

    queue = FakeQueue(mails("idle", 2))
    w = worker(queue, {"default": account(lab, "idle", tls="none", allow_plaintext=True)})
    w.session_factory = SlowSecond
    with caplog.at_level(logging.INFO, logger="mailq_db.worker"):
        w.run(once=True)
    assert queue.statuses() == {1: "Sent", 2: "Sent"}
    assert queue.calls_to("mark_failed") == []
    assert all(r.attempts == 1 for r in queue.rows.values())
    assert "reconnecting" in caplog.text and w.metrics.snapshot()["smtp_connections"] == 2
    assert len(lab.wait_delivered("idle-2@", 1)) == 1


def test_wrong_password_is_one_auth_attempt_then_the_account_waits(lab, caplog):
    queue = FakeQueue(mails("auth", 2))
    before = lab.log().count("auth=0/1")
    with caplog.at_level(logging.ERROR, logger="mailq_db.worker"):
        worker(queue, {"default": account(lab, password="wrong-password")}).run(once=True)
    [call] = queue.calls_to("mark_failed")
    assert call["disposition"] == "Wait" and call["smtp_code"] == 535 and call["ids"] == [1, 2]
    assert "authentication failed for account default" in caplog.text
    deadline = time.monotonic() + 10
    while lab.log().count("auth=0/1") == before and time.monotonic() < deadline:
        time.sleep(0.1)
    # Postfix's disconnect line counts AUTH commands: one, failed ("auth=0/1"), never "auth=0/2"
    assert lab.log().count("auth=0/1") == before + 1 and "auth=0/2" not in lab.log()


def test_a_non_ascii_password_signs_in_to_dovecot_and_the_mail_is_delivered(lab):
    """SASL PLAIN carries the password as UTF-8 (RFC 4616); smtplib's own login() would
    fail on it before sending anything.  Dovecot checks it byte for byte."""
    queue = FakeQueue(mails("utf8pw", 1))
    worker(queue, {"default": account(lab, user=UTF8_USER, password=UTF8_PASSWORD)}).run(once=True)
    assert queue.status(1) == "Sent"
    assert len(lab.wait_delivered("utf8pw-1@", 1)) == 1
    assert re.search(rf"sasl_username={re.escape(UTF8_USER)}", lab.log())


def test_message_above_size_is_stopped_before_data(lab):
    big = Attachment("big.bin", b"\0" * 300_000)
    queue = FakeQueue([*mails("size", 1, attachments=[big]), *mails("size", 1, start=2)])
    worker(queue, {"default": account(lab)}).run(once=True)
    [call] = queue.calls_to("mark_failed")
    assert call["ids"] == [1] and call["disposition"] == "Stop" and "SIZE" in call["error"]
    assert queue.status(2) == "Sent" and len(lab.wait_delivered("size-2@", 1)) == 1
    assert "message size" not in lab.log()  # Postfix never had to refuse it


def test_pipelined_group_with_a_refused_recipient(lab):
    sent: list[bytes] = []

    class Recording(SmtpSession):
        def open(self):
            super().open()
            original = self.smtp.send

            def send(data):
                sent.append(data if isinstance(data, bytes) else data.encode())
                return original(data)
            self.smtp.send = send
            return self

    queue = FakeQueue([make_mail(1, message_id="<pipe@mailq.lab.test>", from_address="mailer@lab.test",
                                 to_address="pipe-1@lab.test; nouser-pipe@lab.test; pipe-2@lab.test")])
    w = worker(queue, {"default": account(lab)})
    w.session_factory = Recording
    w.run(once=True)
    assert queue.status(1) == "Sent"
    group = next(d for d in sent if d.startswith(b"MAIL FROM"))
    assert group.count(b"RCPT TO") == 3 and group.endswith(b"DATA\r\n")  # one write, one round trip
    assert len(lab.wait_delivered("pipe-", 2)) == 2
    assert queue.rows[1].recipients["nouser-pipe@lab.test"][0] == "Refused"
