"""Issue 14's worker fixes where the in-process sink can inject what a real server cannot
(the same behaviours are checked against Postfix in tests/realmta)."""

from __future__ import annotations

import logging

import pytest
from worker_helpers import FakeQueue, SmtpSink, account_for, make_mail, make_worker

from mailq_db.errors import ConfigurationError
from mailq_db.worker.classify import RETRY, STOP, WAIT, classify_reply
from mailq_db.worker.config import is_fqdn, parse_config
from mailq_db.worker.message import MalformedMail, build, fold_ascii_header
from mailq_db.worker.smtp import SmtpSession, queue_id


def run_once(queue, accounts, **settings):
    worker = make_worker(queue, accounts, **settings)
    worker.run(once=True)
    return worker


# ----------------------------------------------------------- classification


@pytest.mark.parametrize("code,text,stage,disposition,scope", [
    (450, "4.7.1 <x>: Error: too much mail from 127.0.0.1", "mail", WAIT, "account"),  # Postfix anvil
    (421, "4.7.0 mx Error: too many connections from 127.0.0.1", "connect", WAIT, "account"),
    (504, "5.5.2 <localhost>: Helo command rejected: need fully-qualified hostname", "rcpt", WAIT, "account"),
    (554, "5.7.1 <x>: Client host rejected: Access denied", "rcpt", WAIT, "account"),
    (553, "5.7.1 <s@x>: Sender address rejected: not owned by user", "rcpt", STOP, "sender"),
    (451, "4.3.0 <s@x>: Sender address rejected: try later", "mail", RETRY, "sender"),
    (550, "5.1.1 <u@x>: Recipient address rejected: User unknown", "rcpt", STOP, "recipient"),
    (450, "4.2.0 <u@x>: Recipient address rejected: Greylisted", "rcpt", RETRY, "recipient"),
    (554, "5.7.1 spam", "dot", STOP, "mail"),
    (554, "5.7.1 spam", "data", STOP, "mail"),  # "data" stays accepted for the final reply
])
def test_classification_of_postfix_replies(code, text, stage, disposition, scope):
    outcome = classify_reply(code, text, stage)
    assert (outcome.disposition, outcome.scope) == (disposition, scope), outcome.rule


# ----------------------------------------------------------- headers


def test_long_ascii_header_is_folded_at_whitespace_and_never_encoded():
    value = ("<https://unsubscribe.example.com/u/0123456789abcdef0123456789abcdef0123456789abcdef?list=news>, "
             "<mailto:unsubscribe@example.com?subject=unsubscribe>")
    folded = fold_ascii_header("List-Unsubscribe", value)
    assert folded.replace("\r\n", "") == value  # unfolding gives the bytes back (RFC 5322 2.2.3)
    assert folded == value.replace(", <mailto", ",\r\n <mailto")
    data = build(make_mail(1, headers={"List-Unsubscribe": value, "List-Unsubscribe-Post": "List-Unsubscribe=One-Click",
                                       "X-Note": "café"})).data
    assert b"List-Unsubscribe: " + folded.encode() + b"\r\n" in data
    assert b"List-Unsubscribe-Post: List-Unsubscribe=One-Click\r\n" in data
    assert b"X-Note: =?utf-8?" in data  # non-ASCII: RFC 2047, as before


def test_a_word_longer_than_998_characters_is_malformed():
    with pytest.raises(MalformedMail, match="998"):
        fold_ascii_header("X-Long", "x" * 1000)
    assert fold_ascii_header("X-Short", "short value") == "short value"
    assert len(fold_ascii_header("X-Mid", "y" * 500)) == 500  # over 78 but unbreakable: kept on one line


# ----------------------------------------------------------- configuration


def config_text(**account):
    body = "\n".join(f"{k} = {v}" for k, v in account.items())
    return f'[accounts.a]\nhost = "smtp.example.com"\n{body}\n'


@pytest.mark.parametrize("text,expected", [
    (config_text(prot=587), "did you mean 'port'?"),
    (config_text(pasword_env='"X"'), "did you mean 'password_env'?"),
    (config_text(port=465, tls='"starttls"'), 'port 465 is implicit TLS'),
    (config_text(port=587, tls='"implicit"'), 'port 587 speaks STARTTLS'),
    (config_text(local_hostname='"localhost"'), "not a fully qualified domain name"),
])
def test_config_explains(text, expected):
    with pytest.raises(ConfigurationError, match=expected):
        parse_config(text, env={})


def test_ca_file_is_parsed_not_only_found(tmp_path):
    bad = tmp_path / "ca.pem"
    bad.write_text("not a certificate\n")
    with pytest.raises(ConfigurationError, match="not a PEM file"):
        parse_config(config_text(ca_file=f'"{bad}"'), env={})


@pytest.mark.parametrize("name,ok", [("mailer.example.com", True), ("localhost", False), ("[192.0.2.1]", True),
                                     ("host_1.example.com", False), ("192.0.2.1", False)])
def test_is_fqdn(name, ok):
    assert is_fqdn(name) is ok


# ----------------------------------------------------------- SMTP


class Recording(SmtpSession):
    writes: list[bytes] = []

    def open(self):
        super().open()
        original = self.smtp.send

        def send(data):
            Recording.writes.append(data if isinstance(data, bytes) else data.encode())
            return original(data)
        self.smtp.send = send
        return self


@pytest.mark.parametrize("pipelining", [True, False])
def test_pipelining_sends_mail_rcpt_and_data_in_one_write(pipelining):
    Recording.writes = []
    with SmtpSink(pipelining=pipelining) as s:
        s.replies[("rcpt", "bad@example.com")] = "550 5.1.1 no such user"
        queue = FakeQueue([make_mail(1, to_address="a@example.com; bad@example.com; b@example.com")])
        worker = make_worker(queue, {"default": account_for(s)})
        worker.session_factory = Recording
        worker.run(once=True)
        assert queue.status(1) == "Sent"
        assert [m.rcpt_tos for m in s.messages] == [["a@example.com", "b@example.com"]]
    groups = [w for w in Recording.writes if w.startswith(b"MAIL FROM")]
    if pipelining:
        assert len(groups) == 1 and groups[0].count(b"RCPT TO") == 3 and groups[0].endswith(b"DATA\r\n")
    else:
        assert groups[0].count(b"\r\n") == 1 and sum(w.startswith(b"RCPT TO") for w in Recording.writes) == 3


def test_all_recipients_refused_in_a_pipelined_group_sends_no_message(sink):
    sink.replies[("rcpt", "*")] = "550 5.1.1 no such user"
    queue = FakeQueue([make_mail(1), make_mail(2, to_address="x@example.com")])
    run_once(queue, {"default": account_for(sink)})
    assert [c["disposition"] for c in queue.calls_to("mark_failed")] == ["Stop", "Stop"]
    assert sink.messages == []


def test_too_many_recipients_goes_on_in_a_follow_up_transaction(sink):
    rcpts = [f"r{i}@example.com" for i in range(5)]
    for r in rcpts[3:]:
        sink.replies[("rcpt", r)] = "once:452 4.5.3 Error: too many recipients"
    queue = FakeQueue([make_mail(1, to_address="; ".join(rcpts))])
    run_once(queue, {"default": account_for(sink)})
    assert queue.status(1) == "Sent"
    assert [m.rcpt_tos for m in sink.messages] == [rcpts[:3], rcpts[3:]]  # each recipient once
    assert queue.rows[1].smtp_text.startswith("250 2.0.0 Ok: queued as Q2")


def test_deferred_recipient_is_retried_alone_and_nobody_gets_it_twice(sink):
    sink.replies[("rcpt", "grey@example.com")] = "once:450 4.2.0 Greylisted, try again later"
    queue = FakeQueue([make_mail(1, to_address="ok@example.com; grey@example.com")])
    worker = make_worker(queue, {"default": account_for(sink)})
    worker.run(once=True)
    assert queue.status(1) == "UnSent" and queue.rows[1].dispositions == ["Retry"]
    assert queue.rows[1].recipients == {"ok@example.com": ("Delivered", 250, "2.0.0 Ok: queued as Q1"),
                                        "grey@example.com": ("Deferred", 450, "4.2.0 Greylisted, try again later")}
    queue.rows[1].due = queue.rows[1].due.min  # the next attempt is due (the database's backoff elsewhere)
    worker.run(once=True)
    assert queue.status(1) == "Sent"
    assert [m.rcpt_tos for m in sink.messages] == [["ok@example.com"], ["grey@example.com"]]
    assert queue.calls_to("get_recipient_outcomes")[0]["ids"] == [1]


def test_size_is_declared_and_a_too_big_mail_is_stopped_before_mail_from():
    with SmtpSink(size_limit=5000) as s:
        queue = FakeQueue([make_mail(1, body="x" * 10_000), make_mail(2)])
        run_once(queue, {"default": account_for(s)})
        [call] = queue.calls_to("mark_failed")
        assert call["ids"] == [1] and call["disposition"] == "Stop" and "SIZE" in call["error"]
        assert queue.status(2) == "Sent"
        assert len(s.mail_options) == 1 and s.mail_options[0][0].startswith("SIZE=")


def test_connection_dropped_while_idle_is_reconnected_without_charging(sink, caplog):
    sink.replies[("mail", "second@example.com")] = "drop-once"
    queue = FakeQueue([make_mail(1), make_mail(2, from_address="second@example.com")])
    with caplog.at_level(logging.INFO, logger="mailq_db.worker"):
        worker = run_once(queue, {"default": account_for(sink)})
    assert queue.statuses() == {1: "Sent", 2: "Sent"} and queue.calls_to("mark_failed") == []
    assert worker.metrics.snapshot()["smtp_connections"] == 2 and "reconnecting" in caplog.text


def test_idle_421_at_mail_from_is_reconnected_once_then_the_account_waits(sink):
    sink.replies[("mail", "second@example.com")] = "once:421 4.4.2 mx Error: timeout exceeded"
    queue = FakeQueue([make_mail(1), make_mail(2, from_address="second@example.com")])
    run_once(queue, {"default": account_for(sink)})
    assert queue.statuses() == {1: "Sent", 2: "Sent"}
    assert all(r.attempts == 1 for r in queue.rows.values())


def test_421_to_rset_drops_the_connection_and_the_next_mail_is_not_charged(sink):
    sink.replies[("rcpt", "bad@example.com")] = "550 5.1.1 no such user"
    sink.replies[("rset", "*")] = "once:421 4.4.2 mx Error: timeout exceeded"
    queue = FakeQueue([make_mail(1, to_address="bad@example.com"), make_mail(2)])
    worker = run_once(queue, {"default": account_for(sink)})
    [call] = queue.calls_to("mark_failed")
    assert call["ids"] == [1] and call["disposition"] == "Stop"
    assert queue.status(2) == "Sent" and queue.rows[2].attempts == 1
    assert worker.metrics.snapshot()["smtp_connections"] == 2


def test_final_reply_lost_is_outcome_unknown(sink):
    sink.replies[("data", "rcpt1@example.com")] = "drop"
    queue = FakeQueue([make_mail(1)])
    run_once(queue, {"default": account_for(sink)})
    [call] = queue.calls_to("mark_failed")
    assert call["disposition"] == "Retry" and call["error"].startswith("outcome unknown")


def test_wrong_password_is_one_auth_attempt(tls_sink, caplog):
    queue = FakeQueue([make_mail(1)])
    with caplog.at_level(logging.ERROR, logger="mailq_db.worker"):
        run_once(queue, {"default": account_for(tls_sink, password="wrong")})
    assert tls_sink.auth_attempts == 1
    assert "authentication failed for account default" in caplog.text


def test_throttle_waits_grow_and_reset_after_a_send(sink):
    sink.replies[("mail", "*")] = "450 4.7.1 <s@x>: Error: too much mail from 127.0.0.1"
    queue = FakeQueue([make_mail(1)])
    worker = make_worker(queue, {"default": account_for(sink, wait_min_seconds=2, wait_max_seconds=5)})
    waits = []
    for _ in range(3):
        queue.blocked_until.clear()
        worker.run(once=True)
        waits.append(queue.calls_to("mark_failed")[-1]["retry_after_seconds"])
    assert waits == [2, 4, 5] and queue.rows[1].attempts_remaining == 5  # never charged
    assert 'mailq_worker_account_blocked{account="default"} 1' in worker.metrics.render()
    del sink.replies[("mail", "*")]
    queue.blocked_until.clear()
    worker.run(once=True)
    assert queue.status(1) == "Sent" and worker.escalation.level("default") is None
    text = worker.metrics.render()
    assert 'mailq_worker_account_blocked{account="default"} 0' in text
    assert 'mailq_worker_waited_total{account="default",code="450"} 3' in text
    assert 'mailq_worker_sent_total{account="default",code="250"} 1' in text
    assert 'mailq_worker_send_seconds_count{account="default"} 4' in text


def test_queue_id_parsing():
    assert queue_id("2.0.0 Ok: queued as 4Ab1C2D3") == "4Ab1C2D3"
    assert queue_id("OK id=1abcde-000123-AB") == "1abcde-000123-AB"
    assert queue_id("2.0.0 OK") is None
