"""The worker's failure paths: the database failing around an accepted mail, refusals
acted on by what they concern, relay incidents, partial deliveries, blocking work,
clock skew, slow uploads, the batch memory budget and the generator allow-list.

The first tests turn the review's reproductions (readings/2026-11-26-python-review.md,
appendix A) around: each asserted a defect; here each asserts the fix.  FakeQueue
stands in for the database layer (tests/unit/fake_queue.py); the SMTP side is the
aiosmtpd sink or, where a reply must be exact, a scripted session.
"""

from __future__ import annotations

import dataclasses
import logging
import smtplib
import socket
import threading
from datetime import datetime, timedelta

import pytest
from worker_helpers import FakeQueue, SmtpSink, account_for, allow_generators, make_mail, make_worker

from mailq_db.errors import DatabaseError, UnknownMailError
from mailq_db.procedures import Attachment, LazyAttachment
from mailq_db.worker.classify import EscalationPolicy
from mailq_db.worker.config import AccountConfig
from mailq_db.worker.smtp import SendResult, SmtpSession


def fast(worker):
    """Acknowledgement retries without real sleeps."""
    worker.pause = lambda seconds: None
    return worker


# --------------------------------------------------------------------------- B1


def test_a_database_outage_after_the_server_accepted_neither_releases_nor_resends(sink):
    sink.final_reply = "250 2.0.0 Ok"
    queue = FakeQueue([make_mail(1)])
    for _ in range(8):  # longer than the connection's own reconnect attempts (1 call + 5)
        queue.drop_connection("mark_sent", committed=False)
    worker = fast(make_worker(queue, {"default": account_for(sink)}))
    worker.run(once=True)
    assert queue.status(1) == "Sent" and len(sink.messages) == 1
    assert queue.calls_to("release_mail") == []  # never given back
    assert len(queue.calls_to("mark_sent")) == 9 and worker.metrics.snapshot()["ack_retries"] >= 1
    worker.run(once=True)
    assert len(sink.messages) == 1


@pytest.mark.parametrize("number", [1205, 1222, 40613, 40501, 49918, 10928, 40197])
def test_a_transient_error_on_mark_sent_is_retried_and_nobody_gets_a_second_copy(sink, number):
    class Failing(FakeQueue):
        failures = 9  # more than the connection retries by itself

        def mark_sent(self, conn, **kw):
            if self.failures:
                self.failures -= 1
                self.calls.append(("mark_sent", kw))
                raise DatabaseError(number, "transient")
            return super().mark_sent(conn, **kw)

    sink.final_reply = "250 2.0.0 Ok"
    queue = Failing([make_mail(1), make_mail(2), make_mail(3)])
    worker = fast(make_worker(queue, {"default": account_for(sink)}))
    worker.db._sleep = lambda s: None
    worker.run(once=True)
    assert queue.statuses() == {1: "Sent", 2: "Sent", 3: "Sent"}
    make_worker(queue, {"default": account_for(sink)}).run(once=True)
    assert len(sink.messages) == 3  # each mail once
    assert queue.calls_to("release_mail") == []


def test_an_acknowledgement_the_database_refuses_is_left_to_lease_expiry_and_flagged(sink, caplog):
    class Refusing(FakeQueue):
        refuse = True

        def mark_sent(self, conn, **kw):
            if self.refuse:
                self.calls.append(("mark_sent", kw))
                raise UnknownMailError(50201, "no mail has this ID")
            return super().mark_sent(conn, **kw)

    sink.final_reply = "250 2.0.0 Ok"
    queue = Refusing([make_mail(1), make_mail(2)])
    with caplog.at_level(logging.WARNING, logger="mailq_db.worker"):
        make_worker(queue, {"default": account_for(sink)}).run(once=True)
    assert queue.statuses() == {1: "Sending", 2: "Sending"} and queue.calls_to("release_mail") == []
    warned = [r for r in caplog.records if "possibly sent twice" in r.getMessage()]
    assert sorted(r.mailq_fields["mail_id"] for r in warned) == [1, 2]  # one line per mail
    queue.refuse = False
    queue.expire_leases()
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="mailq_db.worker"):
        make_worker(queue, {"default": account_for(sink)}).run(once=True)
    assert queue.statuses() == {1: "Sent", 2: "Sent"}
    assert len([r for r in caplog.records if "PossibleDuplicate" in r.getMessage()]) == 2  # said at the claim
    assert all(queue.rows[i].possible_duplicate for i in (1, 2))  # the reclaim flagged them
    assert len(sink.messages) == 4  # the duplicates the flag announces


def test_at_shutdown_unwritten_acknowledgements_wait_a_bounded_time_then_are_left_to_the_lease(sink, caplog):
    class Down(FakeQueue):
        def mark_sent(self, conn, **kw):
            self.calls.append(("mark_sent", kw))
            raise ConnectionResetError("the database is down")

    queue = Down([make_mail(1), make_mail(2), make_mail(3)])
    now = [0.0]
    worker = make_worker(queue, {"default": account_for(sink)}, ack_shutdown_wait_seconds=30)
    worker.db._sleep = lambda s: None
    worker.monotonic = lambda: now[0]

    def pause(seconds):  # the wait between two attempts, on the fake clock
        now[0] += seconds

    worker.pause = pause

    class StopAfterFirst(SmtpSession):
        def send(self, out):
            result = super().send(out)
            worker.stop.set()  # SIGTERM while mail 1 is in flight
            return result

    worker.session_factory = StopAfterFirst
    with caplog.at_level(logging.WARNING, logger="mailq_db.worker"):
        worker.run()
    assert len(sink.messages) == 1 and now[0] <= 31  # bounded by ack_shutdown_wait_seconds
    assert [c["ids"] for c in queue.calls_to("release_mail")] == [[2, 3]]  # not mail 1
    assert queue.statuses() == {1: "Sending", 2: "UnSent", 3: "UnSent"}
    left = [r for r in caplog.records if "left to lease expiry" in r.getMessage()]
    assert [r.mailq_fields["mail_id"] for r in left] == [1]
    assert worker.metrics.snapshot()["acks_abandoned"] == 1


def test_a_failed_record_of_recipient_outcomes_is_kept_and_retried(sink):
    sink.replies[("rcpt", "gone@example.com")] = "550 5.1.1 <gone@example.com>: User unknown"
    queue = FakeQueue([make_mail(1, to_address="ok@example.com;gone@example.com")])
    for _ in range(7):
        queue.drop_connection("record_recipient_outcomes", committed=False)
    worker = fast(make_worker(queue, {"default": account_for(sink)}))
    worker.run(once=True)
    assert queue.status(1) == "Sent" and queue.calls_to("release_mail") == []
    assert queue.rows[1].recipients["gone@example.com"][0] == "Refused"
    assert [m.rcpt_tos for m in sink.messages] == [["ok@example.com"]]


# --------------------------------------------------------------------------- H1: a refusal concerns what it names


class ScriptedSession:
    """A session whose MAIL FROM reply depends on the sender (no server)."""

    replies: dict[str, tuple[int, bytes]] = {}
    sent: list[str] = []

    def __init__(self, account, **kw):
        self.account, self.stage, self.connected = account, "connect", False
        self.greeting = self.ehlo_domain = ""

    def open(self):
        self.connected = True
        return self

    def send(self, out):
        self.stage = "mail"
        if out.envelope_from in self.replies:
            code, text = self.replies[out.envelope_from]
            raise smtplib.SMTPSenderRefused(code, text, out.envelope_from)
        type(self).sent.append(out.envelope_from)
        return SendResult(250, "Ok", accepted=list(out.recipients))

    def abort(self):
        self.connected = False

    close = abort


def scripted_worker(queue, replies, **account):
    class Session(ScriptedSession):
        pass

    Session.replies, Session.sent = replies, []
    worker = make_worker(queue, {"default": AccountConfig(name="default", **{"host": "smtp.example.com",
                                                                             **account})})
    worker.session_factory = Session
    return worker, Session


def test_an_unverified_from_address_fails_that_mail_and_the_account_goes_on():
    mails = [make_mail(1, from_address="unverified@example.com", priority=9)]
    mails += [make_mail(i, from_address="ok@example.com") for i in range(2, 12)]
    queue = FakeQueue(mails)
    worker, session = scripted_worker(queue, {"unverified@example.com": (
        554, b"Message rejected: Email address is not verified. The following identities failed the check "
             b"in region US-EAST-1: unverified@example.com")}, host="email-smtp.us-east-1.amazonaws.com")
    worker.run(once=True)
    assert queue.rows[1].dispositions == ["Stop"] and queue.status(1) == "Failed"
    assert "sender-address-refused" in queue.rows[1].last_error
    assert all(queue.status(i) == "Sent" for i in range(2, 12))
    assert queue.blocked_until == {}  # never the whole account


@pytest.mark.parametrize("reply", [
    b"5.7.60 SMTP; Client does not have permissions to send as this sender",
    b"5.7.1 <bad@example.com>: Sender address rejected: not owned by user mailer",
])
def test_a_send_as_refusal_fails_that_mail_only(reply):
    queue = FakeQueue([make_mail(1, from_address="bad@example.com"), make_mail(2)])
    worker, _ = scripted_worker(queue, {"bad@example.com": (550, reply)})
    worker.run(once=True)
    assert queue.statuses() == {1: "Failed", 2: "Sent"} and queue.blocked_until == {}


def test_a_temporary_sender_refusal_pauses_that_from_address_only():
    mails = [make_mail(1, from_address="new@example.com"), make_mail(2),
             make_mail(3, from_address="new@example.com"), make_mail(4)]
    queue = FakeQueue(mails)
    worker, session = scripted_worker(queue, {"new@example.com": (
        450, b"4.1.8 <new@example.com>: Sender address rejected: Domain not found")})
    worker.run(once=True)
    assert queue.statuses() == {1: "UnSent", 2: "Sent", 3: "UnSent", 4: "Sent"}
    assert queue.blocked_until == {}
    assert session.sent == ["sender@example.com", "sender@example.com"]  # mail 3 was not tried
    assert "is paused" in queue.rows[3].last_error and queue.calls_to("mark_failed")[-1]["retry_after_seconds"]
    assert worker.metrics.snapshot()["sender_pauses"] == 1


# --------------------------------------------------------------------------- H2: a relay's bad minutes


def test_a_relay_incident_escalates_to_one_account_wait_and_spends_no_attempt(sink):
    sink.replies[("data", "*")] = "451 4.3.0 Temporary server error. Please try again later"
    queue = FakeQueue([make_mail(i) for i in range(1, 41)])
    worker = make_worker(queue, {"default": account_for(sink)})
    worker.run(once=True)
    assert all(queue.rows[i].dispositions == ["Wait"] for i in range(1, 41))
    assert all(queue.rows[i].attempts_remaining == 5 for i in range(1, 41))  # none spent
    assert "default" in queue.blocked_until
    waits = queue.calls_to("mark_failed")
    assert len(waits) == 1 and "escalated: 5 temporary failures" in waits[0]["error"]  # the reason, in the events
    del sink.replies[("data", "*")]  # the relay is back
    queue.blocked_until.clear()
    worker.run(once=True)
    assert queue.statuses() == {i: "Sent" for i in range(1, 41)}
    assert len(sink.messages) == 40  # each mail once


def test_a_relay_incident_at_rcpt_escalates_too_and_spends_no_attempt(sink):
    # The relay's trouble said to every RCPT instead of after the dot: no recipient is
    # at fault (scope mail), so it counts for the escalation like the DATA case.
    sink.replies[("rcpt", "*")] = "451 4.3.0 Temporary server error. Please try again later"
    queue = FakeQueue([make_mail(i) for i in range(1, 13)])
    make_worker(queue, {"default": account_for(sink)}).run(once=True)
    assert all(queue.rows[i].dispositions == ["Wait"] for i in range(1, 13))
    assert all(queue.rows[i].attempts_remaining == 5 for i in range(1, 13))
    assert "default" in queue.blocked_until and sink.messages == []


def test_a_connection_timeout_421_at_rcpt_sends_the_mail_again_on_a_new_connection(sink):
    sink.replies[("rcpt", "rcpt2@example.com")] = "once:421 4.4.2 mx.example.com Error: timeout exceeded"
    queue = FakeQueue([make_mail(i) for i in range(1, 4)])
    make_worker(queue, {"default": account_for(sink)}).run(once=True)
    assert queue.statuses() == {1: "Sent", 2: "Sent", 3: "Sent"}
    assert queue.rows[2].dispositions == [] and queue.rows[2].recipients == {}
    assert sorted(a for m in sink.messages for a in m.rcpt_tos) == [f"rcpt{i}@example.com" for i in (1, 2, 3)]


def test_a_greylisted_recipient_is_still_that_mails_retry_and_not_the_accounts(sink):
    sink.replies[("rcpt", "*")] = "450 4.2.0 Greylisted, please try again later"
    queue = FakeQueue([make_mail(i) for i in range(1, 9)])
    make_worker(queue, {"default": account_for(sink)}).run(once=True)
    assert all(queue.rows[i].dispositions == ["Retry"] for i in range(1, 9)) and queue.blocked_until == {}


def test_a_single_temporary_failure_among_good_mail_is_that_mails_retry(sink):
    sink.replies[("data", "rcpt2@example.com")] = "451 4.3.0 Temporary server error"
    queue = FakeQueue([make_mail(i) for i in range(1, 5)])
    make_worker(queue, {"default": account_for(sink)}).run(once=True)
    assert queue.statuses() == {1: "Sent", 2: "UnSent", 3: "Sent", 4: "Sent"}
    assert queue.rows[2].dispositions == ["Retry"] and queue.blocked_until == {}


# --------------------------------------------------------------------------- M1, M2


def test_a_failed_follow_up_transaction_never_gives_the_first_recipients_a_second_copy(sink):
    rcpts = [f"r{i}@example.com" for i in range(4)]
    sink.final_reply = "250 2.0.0 Ok"
    sink.replies[("rcpt", "r2@example.com")] = "once:452 4.5.3 Too many recipients"
    sink.replies[("data", "r2@example.com")] = "once:451 4.3.0 Temporary failure"
    queue = FakeQueue([make_mail(1, to_address=";".join(rcpts))])
    make_worker(queue, {"default": account_for(sink)}).run(once=True)
    assert queue.rows[1].dispositions == ["Retry"]
    assert {a: o[0] for a, o in queue.rows[1].recipients.items()} == {
        "r0@example.com": "Delivered", "r1@example.com": "Delivered", "r3@example.com": "Delivered",
        "r2@example.com": "Deferred"}
    queue.rows[1].due = datetime(2000, 1, 1)
    make_worker(queue, {"default": account_for(sink)}).run(once=True)
    delivered = [a for m in sink.messages for a in m.rcpt_tos]
    assert sorted(delivered) == sorted(rcpts) and queue.status(1) == "Sent"  # everyone once


def test_a_follow_up_transaction_without_a_reply_after_its_dot_flags_the_mail_possible_duplicate(sink):
    rcpts = [f"r{i}@example.com" for i in range(4)]
    sink.final_reply = "250 2.0.0 Ok"
    sink.stall_seconds = 3
    sink.replies[("rcpt", "r2@example.com")] = "once:452 4.5.3 Too many recipients"
    sink.replies[("data", "r2@example.com")] = "stall"
    queue = FakeQueue([make_mail(1, to_address=";".join(rcpts))])
    make_worker(queue, {"default": account_for(sink, command_timeout_seconds=0.2,
                                               final_reply_timeout_seconds=0.3)}).run(once=True)
    [call] = queue.calls_to("mark_failed")
    assert call["disposition"] == "Retry" and call["possible_duplicate"] is True  # r2 may have it
    assert queue.rows[1].recipients["r2@example.com"][0] == "Deferred" and queue.rows[1].possible_duplicate


def test_every_recipient_refused_with_4xx_and_5xx_retries_the_deferred_one_only(sink):
    sink.replies[("rcpt", "gone@example.com")] = "550 5.1.1 <gone@example.com>: Recipient address rejected"
    sink.replies[("rcpt", "busy@example.com")] = "once:450 4.2.1 The user you are trying to contact is " \
                                                 "receiving mail too quickly"
    queue = FakeQueue([make_mail(1, to_address="gone@example.com;busy@example.com")])
    make_worker(queue, {"default": account_for(sink)}).run(once=True)
    assert queue.rows[1].dispositions == ["Retry"] and queue.status(1) == "UnSent"
    assert {a: o[0] for a, o in queue.rows[1].recipients.items()} == {
        "gone@example.com": "Refused", "busy@example.com": "Deferred"}
    queue.rows[1].due = datetime(2000, 1, 1)
    make_worker(queue, {"default": account_for(sink)}).run(once=True)
    assert queue.status(1) == "Sent" and [m.rcpt_tos for m in sink.messages] == [["busy@example.com"]]


# --------------------------------------------------------------------------- M3, M4


class QQRefused(ScriptedSession):
    def send(self, out):
        self.stage = "rcpt"
        raise smtplib.SMTPRecipientsRefused({r: (550, b"Mailbox unavailable or access denied")
                                             for r in out.recipients})


@pytest.mark.parametrize("account", [dict(host="smtp.qq.com", port=465, tls="implicit"),
                                     dict(host="relay.example.com", provider="qq")])
def test_the_worker_passes_the_provider_so_qqs_frequency_limit_is_retried(account):
    queue = FakeQueue([make_mail(1, to_address="someone@qq.com")])
    worker = make_worker(queue, {"default": AccountConfig(name="default", **account)})
    worker.session_factory = QQRefused
    worker.run(once=True)
    assert queue.rows[1].dispositions == ["Retry"]  # as `mailq-db classify --provider qq` says
    assert queue.rows[1].recipients["someone@qq.com"][0] == "Deferred"


def test_a_non_ascii_password_logs_in_once_in_utf8(cert_dir):
    with SmtpSink(starttls=True, auth=True, cert_dir=cert_dir) as tls_sink:
        tls_sink.password = "pässwörd-€"
        queue = FakeQueue([make_mail(1)])
        make_worker(queue, {"default": account_for(tls_sink, password="pässwörd-€")}).run(once=True)
        assert queue.status(1) == "Sent" and tls_sink.auth_attempts == 1


def test_a_wrong_non_ascii_password_is_an_account_wait_never_a_charge(cert_dir):
    with SmtpSink(starttls=True, auth=True, cert_dir=cert_dir) as tls_sink:
        queue = FakeQueue([make_mail(1), make_mail(2)])
        make_worker(queue, {"default": account_for(tls_sink, password="pässwörd-€")}).run(once=True)
        assert [queue.rows[i].dispositions for i in (1, 2)] == [["Wait"], ["Wait"]]
        assert tls_sink.auth_attempts == 1 and queue.rows[1].attempts_remaining == 5


def test_an_unforeseen_error_before_any_mail_is_an_account_wait(sink):
    class Broken(SmtpSession):
        def _authenticate(self):
            raise UnicodeEncodeError("ascii", "é", 0, 1, "a mechanism that cannot encode it")

    queue = FakeQueue([make_mail(1), make_mail(2)])
    worker = make_worker(queue, {"default": account_for(sink, user="u", password="p", password_env="X")})
    worker.session_factory = Broken
    worker.run(once=True)
    assert [queue.rows[i].dispositions for i in (1, 2)] == [["Wait"], ["Wait"]]


# --------------------------------------------------------------------------- M6: blocking work


def test_a_stop_request_interrupts_the_preparation_of_lazy_content(sink):
    release = threading.Event()
    calls = []

    def slow(args):
        calls.append(args)
        release.wait(10)
        return b"data"

    queue = FakeQueue([make_mail(i, attachments=[LazyAttachment("a.bin", "slow", "{}")]) for i in (1, 2)])
    worker = make_worker(queue, {"default": account_for(sink)})
    allow_generators(worker, {"slow": slow})
    timer = threading.Timer(0.1, worker.stop.set)  # SIGTERM while the first generator runs
    timer.start()
    try:
        worker.run_batch()
    finally:
        release.set()
        timer.cancel()
    assert len(calls) == 1  # the second mail's generator never started
    assert queue.statuses() == {1: "UnSent", 2: "UnSent"} and queue.calls_to("mark_failed") == []
    assert [r.attempts_remaining for r in queue.rows.values()] == [5, 5]  # released, refunded


def test_leases_are_extended_while_a_generator_blocks(sink):
    release = threading.Event()
    extended_while_running = []
    now = [1000.0]
    queue = FakeQueue([make_mail(1, attachments=[LazyAttachment("a.bin", "slow", "{}")])])
    worker = make_worker(queue, {"default": account_for(sink)}, lease_seconds=60)
    worker.monotonic = lambda: now[0]

    def slow(args):
        now[0] += 40  # the generator takes 40 s of the 60 s lease
        for _ in range(500):
            if queue.calls_to("extend_lease"):
                extended_while_running.append(True)
                break
            threading.Event().wait(0.01)
        return b"data"

    allow_generators(worker, {"slow": slow})
    try:
        worker.run(once=True)
    finally:
        release.set()
    assert extended_while_running == [True] and queue.status(1) == "Sent"


def test_a_generator_over_its_time_limit_is_abandoned_and_its_mail_retried(sink):
    release = threading.Event()
    queue = FakeQueue([make_mail(1, attachments=[LazyAttachment("a.bin", "hang", "{}")]), make_mail(2)])
    worker = make_worker(queue, {"default": account_for(sink)}, generator_timeout_seconds=0.3)
    allow_generators(worker, {"hang": lambda args: release.wait(30) and b""})
    try:
        worker.run(once=True)
    finally:
        release.set()
    assert queue.statuses() == {1: "UnSent", 2: "Sent"}
    assert queue.rows[1].dispositions == ["Retry"] and "generator_timeout_seconds" in queue.rows[1].last_error


# --------------------------------------------------------------------------- clock skew


@pytest.mark.parametrize("minutes", [-10, 10])
@pytest.mark.parametrize("reported", [True, False])
def test_a_skewed_wall_clock_neither_gives_mail_back_early_nor_sends_late(sink, minutes, reported):
    """The database's expiry (a wall-clock time of the database's host) is never
    compared with this host's clock: a worker whose clock is minutes off sends
    its leased mail normally."""
    queue = FakeQueue([make_mail(1), make_mail(2)], report_seconds_remaining=reported)
    worker = make_worker(queue, {"default": account_for(sink)})
    worker.clock = lambda: datetime.utcnow() + timedelta(minutes=minutes)
    worker.run(once=True)
    assert queue.statuses() == {1: "Sent", 2: "Sent"} and queue.calls_to("release_mail") == []


@pytest.mark.parametrize("reported", [True, False])
def test_no_mail_is_sent_after_its_lease_passed_by_the_monotonic_clock(sink, reported):
    now = [1000.0]

    class Slow(FakeQueue):
        def claim_mail(self, conn, **kw):
            mails = super().claim_mail(conn, **kw)
            now[0] += 61  # the claim's answer took longer than the lease
            return mails

        def extend_lease(self, conn, **kw):
            return {}  # the leases are gone

    queue = Slow([make_mail(1)], report_seconds_remaining=reported)
    worker = make_worker(queue, {"default": account_for(sink)}, lease_seconds=60)
    worker.monotonic = lambda: now[0]
    worker.clock = lambda: datetime.utcnow() - timedelta(hours=1)  # a wall clock that says "plenty left"
    worker.run_batch()
    assert sink.messages == []


# --------------------------------------------------------------------------- M7: slow uploads


class SlowReader(threading.Thread):
    """An SMTP server that reads the message content slowly (``chunk`` bytes every
    ``pause`` seconds, always making progress), or not at all (``chunk`` 0)."""

    def __init__(self, chunk: int, pause: float):
        super().__init__(daemon=True)
        self.chunk, self.pause = chunk, pause
        self.listener = socket.socket()
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16384)
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(1)
        self.port = self.listener.getsockname()[1]
        self.received = 0
        self.done = threading.Event()

    def run(self) -> None:
        self.listener.settimeout(0.2)
        while not self.done.is_set():
            try:
                conn, _ = self.listener.accept()
            except OSError:
                continue
            threading.Thread(target=self.serve, args=(conn,), daemon=True).start()

    def serve(self, conn: socket.socket) -> None:
        with conn:
            f = conn.makefile("rb")
            conn.sendall(b"220 slow ESMTP\r\n")
            for reply in (b"250-slow\r\n250 SIZE 0\r\n", b"250 ok\r\n", b"250 ok\r\n", b"354 go\r\n"):
                f.readline()
                conn.sendall(reply)
            tail = b""
            while self.chunk and not tail.endswith(b"\r\n.\r\n"):
                data = conn.recv(self.chunk)
                if not data:
                    return
                self.received += len(data)
                tail = (tail + data)[-5:]
                self.done.wait(self.pause)
            if self.chunk:
                conn.sendall(b"250 2.0.0 Ok: queued as SLOW1\r\n")
            self.done.wait(5)

    def stop(self) -> None:
        self.done.set()
        self.listener.close()


class SmallSendBuffer(SmtpSession):
    """The kernel cannot buffer the message: each send waits for the server, as on a WAN."""

    def _connect(self) -> None:
        super()._connect()
        self._sock().setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 16384)


def slow_account(port: int, **kw) -> AccountConfig:
    return AccountConfig(name="default", host="127.0.0.1", port=port, tls="none", allow_plaintext=True,
                         pipelining=False, command_timeout_seconds=0.3, **kw)


def test_a_large_message_on_a_slow_link_is_sent_while_it_keeps_moving():
    server = SlowReader(chunk=32768, pause=0.02)  # about 1.5 MB/s, always making progress
    server.start()
    try:
        queue = FakeQueue([make_mail(1, attachments=[Attachment("big.bin", bytes(700_000), "application/octet-stream")])])
        worker = make_worker(queue, {"default": slow_account(server.port, data_timeout_seconds=5)})
        worker.session_factory = SmallSendBuffer
        worker.run(once=True)
        assert queue.status(1) == "Sent" and server.received > 900_000
    finally:
        server.stop()


def test_an_upload_that_stops_moving_fails_after_the_data_timeout_with_the_real_error():
    server = SlowReader(chunk=0, pause=0)  # reads nothing after the 354
    server.start()
    try:
        queue = FakeQueue([make_mail(1, attachments=[Attachment("big.bin", bytes(700_000), "application/octet-stream")])])
        worker = make_worker(queue, {"default": slow_account(server.port, data_timeout_seconds=0.5)})
        worker.session_factory = SmallSendBuffer
        worker.run(once=True)
        assert queue.rows[1].dispositions == ["Retry"]
        assert "timeout" in queue.rows[1].last_error.lower() and "DOT" in queue.rows[1].last_error
    finally:
        server.stop()


# --------------------------------------------------------------------------- M8, M9


def test_a_batch_keeps_within_its_memory_budget_and_the_next_claims_are_smaller(sink):
    big = bytes(300_000)
    queue = FakeQueue([make_mail(i, attachments=[Attachment("a.bin", big, "application/octet-stream")])
                       for i in range(1, 6)])
    worker = make_worker(queue, {"default": account_for(sink)}, batch_memory_budget_bytes=1024 * 1024)
    worker.run_batch()
    assert [c["ids"] for c in queue.calls_to("release_mail")] == [[4, 5]]  # over the budget: given back
    assert worker.claim_size == 3 and worker.metrics.snapshot()["budget_releases"] == 2
    worker.run(once=True)
    assert queue.statuses() == {i: "Sent" for i in range(1, 6)}
    assert [c["batch_size"] for c in queue.calls_to("claim_mail")][1:] == [3, 3]  # mails 4-5, then none


def test_content_made_past_the_budget_is_given_back_and_the_next_claims_are_smaller(sink):
    """Lazy content counts once it is made: the mails it would put past the budget are given
    back (their size not counted as kept), and the next claim asks for what the budget holds,
    so the same content is not made again and again."""
    queue = FakeQueue([make_mail(i, attachments=[LazyAttachment("r.bin", "report", "{}")]) for i in range(1, 4)])
    worker = make_worker(queue, {"default": account_for(sink)}, batch_memory_budget_bytes=1024 * 1024)
    allow_generators(worker, {"report": lambda args: bytes(600_000)})
    worker.run_batch()
    assert [c["ids"] for c in queue.calls_to("release_mail")] == [[2], [3]]
    assert worker.claim_size == 1 and worker.metrics.snapshot()["budget_releases"] == 2
    worker.run(once=True)
    assert queue.statuses() == {i: "Sent" for i in range(1, 4)}
    assert [c["batch_size"] for c in queue.calls_to("claim_mail")][1:] == [1, 1, 1]


def test_an_application_calls_only_the_generators_allowed_to_it(sink):
    lazy = [LazyAttachment("i.pdf", "invoice", '{"id": 7}')]
    queue = FakeQueue([make_mail(1, app_name="billing", attachments=list(lazy)),
                       make_mail(2, app_name="newsletter", attachments=list(lazy))])
    worker = make_worker(queue, {"default": account_for(sink)})
    worker.generators = {"invoice": lambda args: b"%PDF-1.4"}
    worker.config = dataclasses.replace(worker.config, generators={"*": ("csv",), "billing": ("invoice",)})
    worker.run(once=True)
    assert queue.statuses() == {1: "Sent", 2: "Failed"}
    assert "not allowed for application 'newsletter'" in queue.rows[2].last_error


def test_the_escalation_threshold_comes_from_the_configuration(sink):
    sink.replies[("data", "*")] = "451 4.3.0 Temporary server error"
    queue = FakeQueue([make_mail(i) for i in range(1, 4)])
    make_worker(queue, {"default": account_for(sink)}, escalation=EscalationPolicy(retry_threshold=2)).run(once=True)
    assert all(queue.rows[i].dispositions == ["Wait"] for i in range(1, 4))
