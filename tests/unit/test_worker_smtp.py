"""The sender worker against a real SMTP server on loopback (aiosmtpd).

The database layer is replaced by FakeQueue (tests/unit/fake_queue.py), a test
double with the procedures' signatures: these tests check the worker's
behaviour, never a procedure.
"""

from __future__ import annotations

from email import message_from_string, policy

import pytest
from worker_helpers import FakeQueue, SmtpSink, account_for, make_mail, make_worker

from mailq_db.worker.classify import EscalationPolicy


def run_once(queue, accounts, **settings):
    worker = make_worker(queue, accounts, **settings)
    worker.run(once=True)
    return worker


def test_sends_every_mail_over_one_connection_and_acks_in_one_call(sink):
    sink.final_reply = "250 2.0.0 Ok"  # one reply text for all: one MarkSent
    queue = FakeQueue([make_mail(i) for i in range(1, 6)])
    worker = run_once(queue, {"default": account_for(sink)})
    assert queue.statuses() == {i: "Sent" for i in range(1, 6)}
    assert [m.rcpt_tos for m in sink.messages] == [[f"rcpt{i}@example.com"] for i in range(1, 6)]
    assert sink.connections == 1 + 1  # aiosmtpd's readiness probe + the worker's one connection
    acks = queue.calls_to("mark_sent")
    assert len(acks) == 1 and acks[0]["ids"] == [1, 2, 3, 4, 5] and acks[0]["dry_run"] is False
    assert acks[0]["smtp_code"] == 250 and acks[0]["smtp_text"] == "250 2.0.0 Ok"
    assert worker.metrics.snapshot()["sent"] == 5


def test_each_mail_stores_its_own_final_reply_with_the_queue_id(sink):
    queue = FakeQueue([make_mail(i) for i in range(1, 4)])
    run_once(queue, {"default": account_for(sink)})
    assert [m.rcpt_tos for m in sink.messages] == [[f"rcpt{i}@example.com"] for i in range(1, 4)]
    assert [queue.rows[i].smtp_text for i in (1, 2, 3)] == [
        f"250 2.0.0 Ok: queued as Q{i}" for i in (1, 2, 3)]


def test_starttls_and_auth_are_used_when_configured(tls_sink):
    queue = FakeQueue([make_mail(1), make_mail(2)])
    run_once(queue, {"default": account_for(tls_sink)})
    assert queue.statuses() == {1: "Sent", 2: "Sent"}
    assert len(tls_sink.messages) == 2


def test_one_connection_per_account_batch(sink):
    other = SmtpSink().start()
    try:
        mails = [make_mail(1), make_mail(2, account_name="other"), make_mail(3), make_mail(4, account_name="other")]
        queue = FakeQueue(mails)
        run_once(queue, {"default": account_for(sink), "other": account_for(other, "other")})
        assert [m.rcpt_tos[0] for m in sink.messages] == ["rcpt1@example.com", "rcpt3@example.com"]
        assert [m.rcpt_tos[0] for m in other.messages] == ["rcpt2@example.com", "rcpt4@example.com"]
        assert sink.connections == 2 and other.connections == 2  # probe + one each
        assert sorted(sum(len(c["ids"]) for c in queue.calls_to("mark_sent")
                          if c["ids"][0] in ids) for ids in ([1, 3], [2, 4])) == [2, 2]
    finally:
        other.stop()


# code, stage -> expected disposition for a reply text without throttle words
EXPECTED = {
    421: "Wait", 450: "Retry", 451: "Retry", 452: "Wait", 454: "Retry",
    550: "Stop", 552: "Stop", 553: "Stop", 554: "Stop",
}


@pytest.mark.parametrize("stage", ["mail", "rcpt", "data"])
@pytest.mark.parametrize("code", sorted(EXPECTED))
def test_reply_codes_are_classified(sink, stage, code):
    expected = EXPECTED[code]
    if code == 552 and stage == "rcpt":
        expected = "Retry"  # RFC 5321 4.5.3.1.10: treat 552 at RCPT as transient
    if code == 452 and stage == "rcpt":
        expected = "Retry"  # issue 15: 452 at RCPT (too many recipients) retries that recipient
    key = "sender@example.com" if stage == "mail" else "rcpt1@example.com"
    sink.replies[(stage, key)] = f"{code} {code // 100}.0.0 scripted test reply"
    queue = FakeQueue([make_mail(1, from_address="sender@example.com"),
                       make_mail(2, from_address="other@example.com")])
    run_once(queue, {"default": account_for(sink)})
    failed = queue.calls_to("mark_failed")
    assert failed[0]["ids"][0] == 1
    assert failed[0]["disposition"] == expected
    assert failed[0]["smtp_code"] == code
    # the sink scripts "data" replies after the message: the final reply, stage DOT (RFC 5321 4.5.3.2.6)
    assert str(code) in failed[0]["error"] and ("DOT" if stage == "data" else stage.upper()) in failed[0]["error"]
    if expected == "Wait":
        # the account is blocked: the rest of its batch is given back with the mail, not sent
        assert failed[0]["ids"] == [1, 2] and failed[0]["retry_after_seconds"]
        assert sink.messages == []
        assert queue.blocked_until.get("default")
        assert queue.rows[1].attempts_remaining == queue.rows[1].mail.attempts_remaining  # refunded
    else:
        # the other mail goes on over the same connection
        assert queue.status(2) == "Sent"
        assert [m.rcpt_tos for m in sink.messages] == [["rcpt2@example.com"]]
        assert queue.status(1) == ("Failed" if expected == "Stop" else "UnSent")


@pytest.mark.parametrize("code", [450, 451, 454])
def test_throttle_text_means_wait(sink, code):
    sink.replies[("mail", "*")] = f"{code} 4.7.0 Too many messages, slow down"
    queue = FakeQueue([make_mail(1), make_mail(2)])
    run_once(queue, {"default": account_for(sink)})
    [call] = queue.calls_to("mark_failed")
    assert call["disposition"] == "Wait" and call["ids"] == [1, 2]


def test_connection_dropped_after_data_is_a_retry_and_the_batch_goes_on(sink):
    sink.replies[("data", "rcpt1@example.com")] = "drop"
    queue = FakeQueue([make_mail(1), make_mail(2)])
    worker = run_once(queue, {"default": account_for(sink)})
    [call] = queue.calls_to("mark_failed")
    assert call["ids"] == [1] and call["disposition"] == "Retry"
    assert "connection" in call["error"].lower() or "closed" in call["error"].lower()
    assert queue.status(2) == "Sent"  # a new connection for the rest
    assert worker.metrics.snapshot()["smtp_connections"] == 2


def test_a_slow_final_reply_within_its_own_timeout_is_sent_once(sink):
    # RFC 5321 4.5.3.2.6: the reply after the final dot gets its own, longer
    # timeout; a server slower than command_timeout_seconds still gets the mail once.
    sink.stall_seconds = 0.8
    sink.replies[("data", "*")] = "stall"
    queue = FakeQueue([make_mail(1)])
    run_once(queue, {"default": account_for(sink, command_timeout_seconds=0.2)})
    assert queue.status(1) == "Sent" and queue.calls_to("mark_failed") == []


def test_server_stalling_past_the_final_reply_timeout_is_outcome_unknown(sink):
    sink.stall_seconds = 3
    sink.replies[("data", "*")] = "stall"
    queue = FakeQueue([make_mail(1), make_mail(2), make_mail(3)])
    worker = make_worker(queue, {"default": account_for(sink, command_timeout_seconds=0.2,
                                                        final_reply_timeout_seconds=0.3)})
    worker.run(once=True)
    [call] = queue.calls_to("mark_failed")  # held until the account's batch ended, then written at once
    assert call["ids"] == [1, 2, 3] and call["disposition"] == "Retry"
    assert call["possible_duplicate"] is True  # the server may have them: flagged for the operator
    assert "outcome unknown" in call["error"] and "timed out" in call["error"]
    assert "same Message-ID" in call["error"]
    assert sink.messages == []


def test_a_server_that_keeps_stalling_escalates_to_an_account_wait_and_charges_nobody(sink):
    sink.stall_seconds = 3
    sink.replies[("data", "*")] = "stall"
    queue = FakeQueue([make_mail(i) for i in range(1, 6)])
    worker = make_worker(queue, {"default": account_for(sink, command_timeout_seconds=0.2,
                                                        final_reply_timeout_seconds=0.3)},
                         escalation=EscalationPolicy(retry_threshold=3))
    worker.run(once=True)
    calls = queue.calls_to("mark_failed")
    assert all(c["disposition"] == "Wait" and "escalated: 3 temporary failures" in c["error"] for c in calls)
    # the three that stalled after the final dot may be at the server: flagged; the two never tried are not
    assert {tuple(c["ids"]): c["possible_duplicate"] for c in calls} == {(1, 2, 3): True, (4, 5): False}
    assert [i for i in range(1, 6) if queue.rows[i].possible_duplicate] == [1, 2, 3]
    assert all(queue.rows[i].attempts_remaining == 5 for i in range(1, 6))  # refunded
    assert worker.metrics.snapshot()["escalations"] == 1 and "default" in queue.blocked_until


def test_authentication_failure_blocks_the_account_without_charging(tls_sink):
    queue = FakeQueue([make_mail(1), make_mail(2)])
    run_once(queue, {"default": account_for(tls_sink, password="wrong")})
    [call] = queue.calls_to("mark_failed")
    assert call["disposition"] == "Wait" and call["ids"] == [1, 2] and call["smtp_code"] == 535
    assert "AUTH" in call["error"]
    assert all(queue.rows[i].attempts_remaining == 5 for i in (1, 2))
    assert tls_sink.messages == []


def test_starttls_required_but_not_offered(sink):
    queue = FakeQueue([make_mail(1)])
    run_once(queue, {"default": account_for(sink, tls="starttls", allow_plaintext=False)})
    [call] = queue.calls_to("mark_failed")
    assert call["disposition"] == "Wait"
    assert "STARTTLS required but not offered" in call["error"]
    assert sink.messages == []


def test_mixed_batch_one_refused_recipient(sink):
    sink.replies[("rcpt", "bad@example.com")] = "550 5.1.1 bad@example.com: no such user"
    mails = [make_mail(1), make_mail(2, to_address="bad@example.com"), make_mail(3),
             make_mail(4, to_address="ok@example.com; bad@example.com")]
    queue = FakeQueue(mails)
    run_once(queue, {"default": account_for(sink)})
    assert queue.statuses() == {1: "Sent", 2: "Failed", 3: "Sent", 4: "Sent"}
    assert "no such user" in queue.rows[2].last_error
    # mail 4 reached ok@ and records the refused recipient instead of being sent twice to ok@
    assert [m.rcpt_tos for m in sink.messages] == [["rcpt1@example.com"], ["rcpt3@example.com"],
                                                   ["ok@example.com"]]
    assert "refused bad@example.com: 550" in queue.rows[4].smtp_text
    assert queue.rows[4].smtp_text.startswith("250 2.0.0 Ok: queued as")
    assert queue.rows[4].recipients == {
        "ok@example.com": ("Delivered", 250, "2.0.0 Ok: queued as Q3"),
        "bad@example.com": ("Refused", 550, "5.1.1 bad@example.com: no such user")}


def test_dry_run_sends_nothing_and_records_dry_run(sink):
    queue = FakeQueue([make_mail(1), make_mail(2)])
    run_once(queue, {"default": account_for(sink)}, dry_run=True)
    assert sink.messages == [] and sink.connections == 1  # only aiosmtpd's own probe
    [ack] = queue.calls_to("mark_sent")
    assert ack["dry_run"] is True and ack["ids"] == [1, 2]
    assert all(r.dry_run for r in queue.rows.values())


def test_non_ascii_address_without_smtputf8_is_stopped():
    with SmtpSink(smtputf8=False) as s:
        queue = FakeQueue([make_mail(1, to_address="用户@例子.中国"), make_mail(2)])
        run_once(queue, {"default": account_for(s)})
        [call] = queue.calls_to("mark_failed")
        assert call["disposition"] == "Stop" and "SMTPUTF8" in call["error"]
        assert queue.status(2) == "Sent"


def test_non_ascii_address_with_smtputf8_is_sent(sink):
    queue = FakeQueue([make_mail(1, to_address="张三 <用户@例子.中国>")])
    run_once(queue, {"default": account_for(sink)})
    assert queue.status(1) == "Sent"
    [msg] = sink.messages
    assert msg.rcpt_tos == ["用户@例子.中国"]
    assert b"\n\n" in msg.data.replace(b"\r\n", b"\n")
    parsed = message_from_string(msg.data.decode("utf-8"), policy=policy.default)  # raw UTF-8 headers
    assert parsed["To"].addresses[0].addr_spec == "用户@例子.中国"


def test_mail_of_an_account_without_credentials_is_not_claimed(sink):
    # The claim names the worker's accounts (ClaimMail @AccountNames), so a
    # worker never leases, nor blocks for everyone, an account it cannot send for.
    queue = FakeQueue([make_mail(1, account_name="nowhere"), make_mail(2)])
    run_once(queue, {"default": account_for(sink)})
    [claim] = queue.calls_to("claim_mail")[:1]
    assert list(claim["account_names"]) == ["default"]
    assert queue.status(1) == "UnSent" and queue.status(2) == "Sent"
    assert queue.calls_to("mark_failed") == []
