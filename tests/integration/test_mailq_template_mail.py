"""Template mail and lazy attachments through EnqueueMail, EnqueueMailBatch,
ClaimMail and MailAttempt, against SQL Server 2022 (issue 16 point 2, part B;
revision 0016; docs/templates.md "Enqueueing with a template").

* EnqueueMail with a template stores Subject = Body = N'' and the model; every
  bad input has its number (50280-50286) and changes nothing.
* ClaimMail resolves the version (pinned, else the latest active), returns
  the texts once per version in its third result set, and records the version
  on the attempt; a version added later only affects later attempts.
* A retired, unpinned template's mail is claimed with no version (the worker
  stops it); a pinned one still renders.
* Lazy attachments round-trip (Content NULL, Generator + GeneratorArgs).
* The batch takes the template fields and lazy attachments, hashes like
  EnqueueMail (one implementation), refuses a malformed lazy attachment with 50286.
* Worker path: template error -> Stop with the reason; new version +
  RequeueMail -> sent.
"""

from __future__ import annotations

import json

import pytest

from mailq_helpers import (
    assert_unchanged, attempts, claim, expect_error, fingerprint, new_account, new_app, query, unique,
)
from mailq_db import procedures
from mailq_db.errors import BatchRowError, InvalidInputError, TemplateStateError, UnknownTemplateError
from mailq_db.procedures import Attachment, LazyAttachment
from mailq_db.worker.lazy import LazyContentError, prepare

pytestmark = pytest.mark.integration


def template(conn, name=None, text="Hi {{ name }}", subject="Hello {{ name }}"):
    name = name or unique("tpl")
    procedures.add_mail_template_version(conn, template_name=name, subject_template=subject,
                                         text_template=text, expected_latest_version=None)
    return name


def enqueue_t(conn, account, app, name, model, **kw):
    return procedures.enqueue_mail(conn, to_address="rcpt@example.com", account_name=account, app_name=app,
                                   template_name=name, template_model=model, **kw)


def test_enqueue_stores_the_template_and_claim_resolves_and_records_the_version(conn):
    account, app = new_account(conn), new_app(conn)
    name = template(conn)
    mail_id = enqueue_t(conn, account, app, name, {"name": "Ann"}).mail_id
    row = query(conn, "SELECT Subject, Body, TemplateName, TemplateVersion, TemplateModel FROM mailq.MailQueue "
                      "WHERE ID = ?;", mail_id)[0]
    assert tuple(row) == ("", "", name, None, '{"name": "Ann"}')
    template(conn, name, text="Hi again {{ name }}")  # version 2, before the claim
    _, [mail] = claim(conn, app)
    assert (mail.template_name, mail.template_version) == (name, 2)
    assert mail.template.text_template == "Hi again {{ name }}"
    assert prepare(mail).text_body is None and prepare(mail).body == "Hi again Ann"
    assert query(conn, "SELECT TemplateVersion FROM mailq.MailAttempt WHERE MailID = ?;", mail_id)[0][0] == 2


def test_pinned_version_and_retired_template(conn):
    account, app = new_account(conn), new_app(conn)
    name = template(conn)
    template(conn, name, text="v2")
    pinned = enqueue_t(conn, account, app, name, {"name": "x"}, template_version=1).mail_id
    latest = enqueue_t(conn, account, app, name, {"name": "x"}).mail_id
    procedures.retire_mail_template(conn, template_name=name, reason="test")
    _, mails = claim(conn, app)
    by_id = {m.id: m for m in mails}
    assert by_id[pinned].template_version == 1 and by_id[pinned].template.text_template == "Hi {{ name }}"
    assert by_id[latest].template_version is None and by_id[latest].template is None
    with pytest.raises(LazyContentError, match="no version to render"):
        prepare(by_id[latest])


def test_bad_template_input_has_its_number_and_changes_nothing(conn):
    account, app = new_account(conn), new_app(conn)
    name = template(conn)
    retired = template(conn)
    procedures.retire_mail_template(conn, template_name=retired)
    before = fingerprint(conn)
    cases = [
        (50280, InvalidInputError, dict(template_name=name, body="b")),
        (50280, InvalidInputError, dict(template_name=name, subject="s")),
        (50281, InvalidInputError, dict(template_model={"a": 1}, subject="s", body="b")),
        (50282, UnknownTemplateError, dict(template_name=unique("none"))),
        (50282, UnknownTemplateError, dict(template_name=name, template_version=9)),
        (50283, TemplateStateError, dict(template_name=retired)),
        (50284, InvalidInputError, dict(template_name=name, template_model="[1]")),
        (50285, InvalidInputError, dict(template_name="bad name")),
        (50285, InvalidInputError, dict(template_name=name, template_version=0)),
        (50286, InvalidInputError, dict(subject="s", body="b", attachments=[LazyAttachment("a.csv", "csv", "[1]")])),
        (50286, InvalidInputError, dict(subject="s", body="b", attachments=[LazyAttachment("a.csv", "bad name", None)])),
    ]
    for number, cls, kw in cases:
        expect_error(number, procedures.enqueue_mail, conn, to_address="r@example.com", account_name=account,
                     app_name=app, cls=cls, **kw)
    assert_unchanged(before, fingerprint(conn))


def test_lazy_attachment_round_trips(conn):
    account, app = new_account(conn), new_app(conn)
    lazy = LazyAttachment("report.csv", "csv", {"rows": [{"a": 1}]})
    mail_id = procedures.enqueue_mail(conn, to_address="r@example.com", subject="s", body="b", account_name=account,
                                      app_name=app, attachments=[Attachment("x.txt", b"x", "text/plain"), lazy]).mail_id
    rows = query(conn, "SELECT AttachmentNo, Content, Generator, GeneratorArgs FROM mailq.MailAttachment "
                       "WHERE MailID = ? ORDER BY AttachmentNo;", mail_id)
    assert [tuple(r) for r in rows] == [(1, b"x", None, None), (2, None, "csv", '{"rows": [{"a": 1}]}')]
    _, [mail] = claim(conn, app)
    prepared = prepare(mail)
    assert [a.file_name for a in prepared.attachments] == ["x.txt", "report.csv"]
    assert prepared.attachments[1].content_type == "text/csv"


def test_batch_takes_templates_and_lazy_attachments_with_enqueuemails_hash(conn):
    account, app = new_account(conn), new_app(conn)
    name = template(conn)
    key = unique("k")
    mail = dict(to_address="r@example.com", account_name=account, app_name=app, template_name=name,
                template_model=json.dumps({"name": "B"}), idempotency_key=key)
    [first] = procedures.enqueue_mail_batch(conn, [mail]).enqueued
    again = procedures.enqueue_mail(conn, **mail)  # the same mail: same content hash
    assert (again.mail_id, again.created) == (first.mail_id, False)
    # one set of rules: the batch takes lazy attachments like EnqueueMail (and refuses a malformed one alike)
    lazy = dict(to_address="r@example.com", subject="s", body="b", account_name=account, app_name=app,
                attachments=[LazyAttachment("a", "csv")])
    [queued] = procedures.enqueue_mail_batch(conn, [lazy]).enqueued
    assert query(conn, "SELECT Generator FROM mailq.MailAttachment WHERE MailID = ?;", queued.mail_id) == [("csv",)]
    with pytest.raises(BatchRowError) as err:
        procedures.enqueue_mail_batch(conn, [dict(lazy, attachments=[LazyAttachment("a", "bad name")])])
    assert err.value.rule == 50286
    for use_tvp in (False, True):
        [row] = procedures.enqueue_mail_batch(conn, [dict(mail, idempotency_key=None)], use_tvp=use_tvp).enqueued
        assert query(conn, "SELECT TemplateName FROM mailq.MailQueue WHERE ID = ?;", row.mail_id)[0][0] == name


def test_template_error_stops_and_a_new_version_plus_requeue_sends(conn):
    account, app = new_account(conn), new_app(conn)
    name = template(conn, text="{{ missing }}")
    mail_id = enqueue_t(conn, account, app, name, {"name": "C"}).mail_id
    token, [mail] = claim(conn, app)
    with pytest.raises(LazyContentError) as err:
        prepare(mail)
    procedures.mark_failed(conn, ids=[mail_id], lock_token=token, disposition="Stop", error=err.value.reason)
    assert query(conn, "SELECT Status, LastError FROM mailq.MailQueue WHERE ID = ?;", mail_id)[0][0] == "Failed"
    template(conn, name, text="Hi {{ name }}")
    procedures.requeue_mail(conn, mail_id=mail_id)
    token, [mail] = claim(conn, app)
    assert prepare(mail).body == "Hi C"
    procedures.mark_sent(conn, ids=[mail_id], lock_token=token, smtp_code=250, smtp_text="ok")
    assert [a["AttemptNo"] for a in attempts(conn, mail_id)] == [1, 2]
    assert [r[0] for r in query(conn, "SELECT TemplateVersion FROM mailq.MailAttempt WHERE MailID = ? "
                                      "ORDER BY AttemptNo;", mail_id)] == [1, 2]
