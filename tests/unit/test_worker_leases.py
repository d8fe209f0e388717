"""Leases, batched acknowledgements, lost tokens, database reconnects and stopping.

FakeQueue stands in for the database layer (see fake_queue.py)."""

from __future__ import annotations

import logging
import threading

from worker_helpers import FakeQueue, account_for, make_mail, make_worker

from mailq_db.worker.smtp import SmtpSession


def test_ack_falls_back_to_one_call_per_mail_when_a_lease_was_lost(sink, caplog):
    class Stealing(FakeQueue):
        stolen = False

        def mark_sent(self, conn, **kw):
            if not self.stolen:  # another worker reclaimed mail 2 after its lease expired
                self.stolen = True
                self.rows[2].token = "00000000-0000-0000-0000-000000000002"
            return super().mark_sent(conn, **kw)

    # One reply text for every mail, so the three share one MarkSent (each mail
    # stores its own final reply; the sink's replies differ by queue ID).
    sink.final_reply = "250 2.0.0 Ok"
    queue = Stealing([make_mail(1), make_mail(2), make_mail(3)])
    worker = make_worker(queue, {"default": account_for(sink)})
    with caplog.at_level(logging.ERROR, logger="mailq_db.worker"):
        worker.run(once=True)
    assert [c["ids"] for c in queue.calls_to("mark_sent")] == [[1, 2, 3], [1], [2], [3]]
    assert queue.statuses() == {1: "Sent", 2: "Sending", 3: "Sent"}
    assert "possibly sent twice" in caplog.text
    assert worker.metrics.snapshot()["lease_lost"] == 1 and worker.metrics.snapshot()["sent"] == 2


def test_ack_lost_on_a_dropped_connection_is_sent_again_with_the_same_token(sink):
    sink.final_reply = "250 2.0.0 Ok"  # one reply for both mails: one MarkSent call
    queue = FakeQueue([make_mail(1), make_mail(2)])
    queue.drop_connection("mark_sent", committed=False)
    worker = make_worker(queue, {"default": account_for(sink)})
    worker.run(once=True)
    calls = queue.calls_to("mark_sent")
    assert len(calls) == 2 and calls[0] == calls[1]  # same IDs, same token
    assert queue.statuses() == {1: "Sent", 2: "Sent"}
    assert len(sink.messages) == 2  # nothing delivered twice
    assert worker.db.reconnects == 1


def test_ack_committed_before_the_connection_dropped_is_not_sent_twice(sink):
    sink.final_reply = "250 2.0.0 Ok"
    queue = FakeQueue([make_mail(1), make_mail(2)])
    queue.drop_connection("mark_sent", committed=True)
    make_worker(queue, {"default": account_for(sink)}).run(once=True)
    assert queue.statuses() == {1: "Sent", 2: "Sent"}
    assert len(sink.messages) == 2


def test_claim_is_retried_after_a_dropped_connection(sink):
    queue = FakeQueue([make_mail(1)])
    queue.drop_connection("claim_mail", committed=False)
    make_worker(queue, {"default": account_for(sink)}).run(once=True)
    assert queue.status(1) == "Sent"


def test_no_smtp_transaction_on_a_lease_shorter_than_the_margin(sink):
    queue = FakeQueue([make_mail(1), make_mail(2)], lease_override_seconds=5)
    queue.extend_fails = True
    worker = make_worker(queue, {"default": account_for(sink)}, lease_seconds=60,
                         lease_safety_margin_seconds=10)
    worker.run_batch()
    assert sink.messages == []
    assert [c["ids"] for c in queue.calls_to("release_mail")] == [[1], [2]]
    assert queue.statuses() == {1: "UnSent", 2: "UnSent"}
    assert queue.rows[1].attempts_remaining == 5  # not charged


def test_leases_are_extended_when_half_is_used(sink):
    queue = FakeQueue([make_mail(1), make_mail(2)], lease_override_seconds=20)
    worker = make_worker(queue, {"default": account_for(sink)}, lease_seconds=60)
    worker.run_batch()
    [ext] = queue.calls_to("extend_lease")
    assert ext["ids"] == [1, 2] and ext["lease_seconds"] == 60
    assert queue.statuses() == {1: "Sent", 2: "Sent"}
    assert worker.metrics.snapshot()["lease_extensions"] == 1


def test_a_mail_lost_at_extension_is_not_sent(sink):
    class Stealing(FakeQueue):
        def extend_lease(self, conn, **kw):
            self.rows[2].token = "00000000-0000-0000-0000-000000000002"
            return super().extend_lease(conn, **kw)

    queue = Stealing([make_mail(1), make_mail(2), make_mail(3)], lease_override_seconds=20)
    make_worker(queue, {"default": account_for(sink)}, lease_seconds=60).run_batch()
    assert [m.rcpt_tos[0] for m in sink.messages] == ["rcpt1@example.com", "rcpt3@example.com"]
    assert queue.status(2) == "Sending"  # the other worker's


def test_stop_mid_batch_finishes_the_mail_in_flight_and_releases_the_rest(sink):
    stop = threading.Event()

    class StopAfterFirst(SmtpSession):
        def send(self, out):
            result = super().send(out)
            stop.set()  # SIGTERM arrives while mail 1 is in flight
            return result

    queue = FakeQueue([make_mail(i) for i in range(1, 5)])
    worker = make_worker(queue, {"default": account_for(sink)})
    worker.stop = stop
    worker.session_factory = StopAfterFirst
    worker.run()
    assert queue.statuses() == {1: "Sent", 2: "UnSent", 3: "UnSent", 4: "UnSent"}
    assert [c["ids"] for c in queue.calls_to("release_mail")] == [[2, 3, 4]]
    assert len(sink.messages) == 1


def test_idle_worker_backs_off_and_stops_promptly():
    queue = FakeQueue([])
    worker = make_worker(queue, {}, idle_backoff_min_seconds=0.05, idle_backoff_max_seconds=0.2)
    t = threading.Thread(target=worker.run)
    t.start()
    threading.Event().wait(0.6)
    worker.stop.set()
    t.join(2)
    assert not t.is_alive()
    # 0.05 + 0.1 + 0.2 + 0.2 ... : a handful of claims, not a busy loop
    assert 2 <= len(queue.calls_to("claim_mail")) <= 6


def test_once_returns_when_nothing_is_due(sink):
    queue = FakeQueue([make_mail(1)])
    make_worker(queue, {"default": account_for(sink)}).run(once=True)
    assert len(queue.calls_to("claim_mail")) == 2  # one batch, then an empty claim


def test_each_claimed_batch_gets_its_own_token(sink):
    queue = FakeQueue([make_mail(1), make_mail(2)])
    worker = make_worker(queue, {"default": account_for(sink)}, batch_size=1)
    worker.run(once=True)
    worker.run(once=True)
    tokens = [str(call["lock_token"]) for call in queue.calls_to("claim_mail")]
    assert len(tokens) >= 2 and len(set(tokens)) == len(tokens)
    assert queue.statuses() == {1: "Sent", 2: "Sent"}
