"""One JSON line per state change of a mail (docs/monitoring/README.md,
"Logs"): "what happened to mail N" is a filter on mail_id.  The worker runs
against FakeQueue (the database layer's test double) and an SMTP sink."""

from __future__ import annotations

import io
import json
import logging

from worker_helpers import FakeQueue, account_for, make_mail, make_worker

from mailq_db.worker import logs


def state_lines(stream: io.StringIO) -> list[dict]:
    lines = [json.loads(line) for line in stream.getvalue().splitlines()]
    return [d for d in lines if d.get("event") == logs.MAIL_STATE]


def test_each_acknowledged_state_change_is_one_json_line(sink):
    sink.replies[("rcpt", "rcpt2@example.com")] = "once:451 4.3.0 try again later"
    stream = io.StringIO()
    logs.setup("json", "INFO", stream)
    queue = FakeQueue([make_mail(1), make_mail(2)])
    make_worker(queue, {"default": account_for(sink)}).run(once=True)
    lines = state_lines(stream)
    story = {n: [(d["outcome"], d["status"]) for d in lines if d["mail_id"] == n] for n in (1, 2)}
    assert story[1] == [("Claimed", "Sending"), ("Sent", "Sent")]
    assert story[2][:2] == [("Claimed", "Sending"), ("Retry", "UnSent")]
    sent = next(d for d in lines if d["mail_id"] == 1 and d["outcome"] == "Sent")
    assert sent["account"] == "default" and sent["message_id"] == "<1.test@mailq.example>"
    assert sent["queue_id"] == "Q1" and sent["smtp_code"] == 250 and sent["level"] == "INFO"
    retry = next(d for d in lines if d["mail_id"] == 2 and d["outcome"] == "Retry")
    assert retry["smtp_code"] == 451 and "try again later" in retry["reason"] and retry["level"] == "WARNING"
    assert retry["message_id"] == "<2.test@mailq.example>" and "queue_id" not in retry


def test_a_release_and_a_dry_run_are_logged_too(sink):
    stream = io.StringIO()
    logs.setup("json", "INFO", stream)
    queue = FakeQueue([make_mail(7)])
    worker = make_worker(queue, {"default": account_for(sink)}, dry_run=True)
    worker.run(once=True)
    assert [(d["outcome"], d["status"]) for d in state_lines(stream)] == [("Claimed", "Sending"), ("DryRun", "Sent")]
    stream.truncate(0)
    stream.seek(0)
    queue = FakeQueue([make_mail(8)])
    worker = make_worker(queue, {"default": account_for(sink)})
    mails = worker.db.call(queue.claim_mail, batch_size=1, lock_token=worker.token, lease_seconds=60,
                           app_name=None, worker_name="w", account_names=None, run_modes=["prod"])
    worker.held = {m.id: m for m in mails}
    worker.release(mails, "worker stopping")
    [line] = state_lines(stream)
    assert (line["mail_id"], line["outcome"], line["status"], line["reason"]) == (8, "Released", "UnSent",
                                                                               "worker stopping")


def test_the_text_format_shows_the_same_fields():
    stream = io.StringIO()
    logs.setup("text", "INFO", stream)
    logs.mail_state(logging.getLogger("mailq_db.worker"), mail_id=5, account="default", message_id="<5@x>",
                    status="Sent", outcome="Sent", queue_id="4XyZ")
    text = stream.getvalue()
    assert "mail 5 Sent" in text and "mail_id=5" in text and "queue_id=4XyZ" in text
