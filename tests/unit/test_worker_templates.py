"""The worker renders template mail and generates lazy attachments (issue 16
point 2, part B; revision 0016), against the loopback SMTP sink.

The database layer is replaced by TemplateQueue, FakeQueue plus what
mailq.ClaimMail does for template mail (resolve the version: pinned, else the
latest unless retired; return the texts; record the version on the attempt)
and mailq.RequeueMail: a test double of the procedures' contract, never a test
of them (tests/integration/test_mailq_template_mail.py runs them on SQL Server).
"""

from __future__ import annotations

import dataclasses

import json
from dataclasses import replace
from datetime import timedelta
from email import message_from_bytes, policy
from typing import Any

from worker_helpers import FakeQueue, account_for, allow_generators, make_mail, make_worker

from mailq_db.procedures import Attachment, ClaimedTemplate, LazyAttachment


class TemplateQueue(FakeQueue):
    def __init__(self, mails=(), **kw):
        super().__init__(mails, **kw)
        self.versions: dict[str, list[ClaimedTemplate]] = {}
        self.retired: set[str] = set()
        self.attempt_versions: dict[int, list[int | None]] = {}

    def add_version(self, name: str, subject: str, html: str | None = None, text: str | None = None) -> int:
        versions = self.versions.setdefault(name, [])
        versions.append(ClaimedTemplate(name, len(versions) + 1, subject, html, text))
        return len(versions)

    def claim_mail(self, conn: Any, **kw: Any):
        out = []
        for mail in super().claim_mail(conn, **kw):
            if mail.template_name is not None:
                versions = self.versions[mail.template_name]
                pinned = self.rows[mail.id].mail.template_version
                version = pinned or (None if mail.template_name in self.retired else len(versions))
                mail = replace(mail, template_version=version,
                               template=versions[version - 1] if version else None)
                self.attempt_versions.setdefault(mail.id, []).append(version)
            out.append(mail)
        return out

    def requeue_mail(self, mail_id: int) -> None:
        row = self.rows[mail_id]
        assert row.status in ("Failed", "Cancelled", "Expired", "Stopped")
        row.status, row.attempts_remaining, row.last_error = "UnSent", 5, None


def template_mail(mail_id: int, name: str, model: dict, **kw: Any):
    return make_mail(mail_id, subject="", body="", template_name=name,
                     template_model=json.dumps(model, ensure_ascii=False), **kw)


def parsed(msg) -> Any:
    return message_from_bytes(msg.data, policy=policy.default)


def run_once(queue, sink, **settings):
    worker = make_worker(queue, {"default": account_for(sink)}, **settings)
    worker.run(once=True)
    return worker


def test_template_mail_is_rendered_escaped_and_sent(sink):
    queue = TemplateQueue([template_mail(1, "order-shipped", {"customer": {"name": "Zhang <San>"}, "order": {"id": 42}}),
                           make_mail(2)])
    queue.add_version("order-shipped", "Order {{ order.id }} has shipped",
                      html="<p>Hello {{ customer.name }}</p>", text="Hello {{ customer.name }}")
    run_once(queue, sink)
    assert queue.statuses() == {1: "Sent", 2: "Sent"}
    first = parsed(next(m for m in sink.messages if m.rcpt_tos == ["rcpt1@example.com"]))
    assert first["Subject"] == "Order 42 has shipped"
    assert first.get_body(("html",)).get_content().strip() == "<p>Hello Zhang &lt;San&gt;</p>"
    assert first.get_body(("plain",)).get_content().strip() == "Hello Zhang <San>"
    assert queue.attempt_versions == {1: [1]}


def test_template_error_stops_the_mail_with_what_and_where_then_a_fix_and_requeue_sends_it(sink):
    queue = TemplateQueue([template_mail(1, "welcome", {"user": {"name": "Ann"}})])
    queue.add_version("welcome", "Welcome {{ user.name }}", text="Hi {{ user.name }},\nyour code: {{ code }}")
    run_once(queue, sink)
    assert queue.status(1) == "Failed" and sink.messages == []
    [call] = queue.calls_to("mark_failed")
    assert call["disposition"] == "Stop"
    error = call["error"]
    assert error.startswith("template 'welcome' version 1, text part, line 2: undefined variable")
    assert "'code' is undefined" in error

    # the template is fixed (a new version); RequeueMail puts the mail back; it sends
    queue.add_version("welcome", "Welcome {{ user.name }}", text="Hi {{ user.name }},\nyour code: {{ code|default('none') }}")
    queue.requeue_mail(1)
    run_once(queue, sink)
    assert queue.status(1) == "Sent"
    [msg] = sink.messages
    assert parsed(msg).get_body(("plain",)).get_content().replace("\r\n", "\n").strip() == "Hi Ann,\nyour code: none"
    assert queue.attempt_versions[1] == [1, 2]  # each attempt records the version it rendered


def test_pinned_version_is_rendered_and_a_newer_version_does_not_change_it(sink):
    mail = template_mail(1, "t", {"x": "1"}, template_version=1)
    queue = TemplateQueue([mail])
    queue.rows[1].mail = mail
    queue.add_version("t", "v1 {{ x }}", text="one")
    queue.add_version("t", "v2 {{ x }}", text="two")
    run_once(queue, sink)
    [msg] = sink.messages
    assert parsed(msg)["Subject"] == "v1 1"


def test_model_error_and_retired_template_stop_with_a_reason(sink):
    queue = TemplateQueue([make_mail(1, subject="", body="", template_name="t", template_model='{"a": 1, "a": 2}'),
                           template_mail(2, "gone", {})])
    queue.add_version("t", "S", text="T")
    queue.add_version("gone", "S", text="T")
    queue.retired.add("gone")
    run_once(queue, sink)
    errors = {c["ids"][0]: c["error"] for c in queue.calls_to("mark_failed")}
    assert queue.statuses() == {1: "Failed", 2: "Failed"} and sink.messages == []
    assert errors[1].startswith("template 't' version 1, model") and "twice" in errors[1]
    assert "template 'gone': no version to render" in errors[2] and "RequeueMail" in errors[2]


def test_a_payload_in_a_stored_template_is_refused_never_run(sink):
    queue = TemplateQueue([template_mail(1, "evil", {})])
    queue.add_version("evil", "S", text="{{ cycler.__init__.__globals__.os.popen('id').read() }}")
    run_once(queue, sink)
    [call] = queue.calls_to("mark_failed")
    assert call["disposition"] == "Stop" and "refused" in call["error"] and sink.messages == []


def _rows(args: dict) -> bytes:
    return ("\n".join(str(r) for r in args["rows"])).encode()


def test_lazy_attachment_is_generated_and_sent(sink):
    lazy = LazyAttachment("report.csv", "csv", '{"rows": [{"name": "Ann", "n": 1}]}', "application/octet-stream")
    queue = FakeQueue([make_mail(1, attachments=[Attachment("a.txt", b"stored", "text/plain"), lazy])])
    run_once(queue, sink)
    assert queue.status(1) == "Sent"
    [msg] = sink.messages
    names = [(p.get_filename(), p.get_content_type()) for p in parsed(msg).iter_attachments()]
    assert names == [("a.txt", "text/plain"), ("report.csv", "text/csv")]  # order kept; the generator's type
    csv_part = [p for p in parsed(msg).iter_attachments() if p.get_filename() == "report.csv"][0]
    assert csv_part.get_content().replace("\r\n", "\n").startswith("name,n\nAnn,1")


def test_unknown_generator_or_oversized_output_stops_the_mail(sink):
    queue = FakeQueue([make_mail(1, attachments=[LazyAttachment("x.pdf", "invoice-pdf", "{}")]),
                       make_mail(2, attachments=[LazyAttachment("big.bin", "big", "{}")])])
    worker = make_worker(queue, {"default": account_for(sink)})
    allow_generators(worker, {"big": lambda args: iter([b"x" * 1024 * 1024] * 11)})
    worker.config = dataclasses.replace(worker.config, generators={"*": ("big", "invoice-pdf")})
    worker.run(once=True)
    errors = {c["ids"][0]: c["error"] for c in queue.calls_to("mark_failed")}
    assert queue.statuses() == {1: "Failed", 2: "Failed"} and sink.messages == []
    assert errors[1].startswith("generator 'invoice-pdf'") and "no generator of this name" in errors[1]
    assert errors[2].startswith("attachment 'big.bin', generator 'big'") and "limit" in errors[2]
    assert worker.metrics.snapshot()["lazy_content_errors"] == 2


def test_ordinary_mail_never_loads_the_renderer(sink):
    queue = FakeQueue([make_mail(1)])
    run_once(queue, sink)
    assert queue.status(1) == "Sent"


def test_leases_are_extended_while_a_batch_of_lazy_content_is_prepared(sink, monkeypatch):
    """Generators and renders run before any login for the whole batch: the leases
    must be kept alive meanwhile, or they run out mid-batch and another worker may
    claim mail this one is still preparing.  Each generation moves the database's
    clock and the worker's monotonic clock 25 s on."""
    import fake_queue

    now = [fake_queue.utcnow()]
    mono = [1000.0]
    monkeypatch.setattr(fake_queue, "utcnow", lambda: now[0])
    queue = FakeQueue([make_mail(i, attachments=[LazyAttachment(f"r{i}.bin", "slow", "{}")]) for i in (1, 2, 3, 4)])
    worker = make_worker(queue, {"default": account_for(sink)}, lease_seconds=60, lease_safety_margin_seconds=10)
    worker.monotonic = lambda: mono[0]
    lease_left_at_generation = []

    def slow(args):
        lease_left_at_generation.append(min((r.lease_expires - now[0]).total_seconds()
                                            for r in queue.rows.values() if r.status == "Sending"))
        now[0] += timedelta(seconds=25)
        mono[0] += 25
        return b"data"

    allow_generators(worker, {"slow": slow})
    worker.run(once=True)
    assert all(left > 0 for left in lease_left_at_generation), lease_left_at_generation
    assert queue.calls_to("extend_lease")
    assert queue.statuses() == {1: "Sent", 2: "Sent", 3: "Sent", 4: "Sent"}


def test_an_unforeseen_error_in_lazy_content_defers_that_mail_and_the_batch_goes_on(sink):
    """A generator returning a bytes content type made generate_attachment raise a
    TypeError that escaped the worker's preparation: the batch was abandoned
    (released, no attempt spent) on every claim, so that one mail blocked the
    mail claimed with it forever.  Now that mail alone is deferred (Retry, an
    attempt spent: not foreseen is not known to be permanent) and the rest sends."""
    from mailq_db.generators import Generated

    queue = FakeQueue([make_mail(1, attachments=[LazyAttachment("r.csv", "bad", "{}")]), make_mail(2)])
    worker = make_worker(queue, {"default": account_for(sink)})
    allow_generators(worker, {"bad": lambda args: Generated(b"a,b\n", content_type=b"text/csv")})
    worker.run(once=True)
    assert queue.statuses() == {1: "UnSent", 2: "Sent"}
    [call] = queue.calls_to("mark_failed")
    assert call["disposition"] == "Retry" and "TypeError" in call["error"]


def test_a_generator_that_raises_is_deferred_not_stopped(sink):
    """A generator's own failure may be transient (a service it calls timed
    out): the mail is deferred with the reason, as a mail server defers, and
    fails only when its attempts run out; nothing reaches the server."""
    def flaky(args):
        raise TimeoutError("report service did not answer in 30 s")

    queue = FakeQueue([make_mail(1, attachments=[LazyAttachment("r.csv", "report", "{}")])])
    worker = make_worker(queue, {"default": account_for(sink)})
    allow_generators(worker, {"report": flaky})
    worker.run(once=True)
    assert queue.statuses() == {1: "UnSent"}
    [call] = queue.calls_to("mark_failed")
    assert call["disposition"] == "Retry"
    assert "generator 'report'" in call["error"] and "TimeoutError" in call["error"]
    assert sink.messages == []
