"""Mail templates against SQL Server 2022 (issue 16, point 2; docs/templates.md).

* AddMailTemplateVersion numbers versions 1, 2, 3 per name; the same texts
  again add nothing (Created 0), byte for byte (a change of case is a new
  version under a case-insensitive collation); @ExpectedLatestVersion guards
  against two editors (50217).
* Versions are immutable: an UPDATE or DELETE as sa is refused (50218) and
  changes nothing.
* GetMailTemplate reads the latest or a given version; a retired template
  has no latest (50216) but its versions still read; RetireMailTemplate is
  idempotent and @Retire = 0 brings it back.
* Every bad input gets its number and changes nothing.
* A stored template renders with mailq_db.templates (the worker's path).
"""

from __future__ import annotations

import pytest

from mailq_helpers import assert_unchanged, execute, expect_error, query, unique
from mailq_helpers import fingerprint as queue_fingerprint
from mailq_db import procedures
from mailq_db.errors import TemplateInputError, TemplateStateError, UnknownTemplateError
from mailq_db.templates import MailTemplate, render_mail

pytestmark = pytest.mark.integration


def add(conn, name, subject="Hi {{ name }}", html="<p>{{ name }}</p>", text=None, **kw):
    return procedures.add_mail_template_version(
        conn, template_name=name, subject_template=subject, html_template=html, text_template=text, **kw)


def fingerprint(conn):
    """The mail-queue tables' rows and every template row: a refused call changes none."""
    fp = queue_fingerprint(conn)
    fp["MailTemplate"] = query(conn, "SELECT TemplateName, LatestVersion, Description, RetiredAtUtc, RetiredReason "
                                     "FROM mailq.MailTemplate ORDER BY TemplateName;")
    fp["MailTemplateVersion"] = query(conn, "SELECT TemplateName, Version, CAST(SubjectTemplate AS VARBINARY(MAX)), "
                                            "CAST(HtmlTemplate AS VARBINARY(MAX)), CAST(TextTemplate AS VARBINARY(MAX)) "
                                            "FROM mailq.MailTemplateVersion ORDER BY TemplateName, Version;")
    return fp


def test_versions_are_numbered_and_identical_texts_add_nothing(conn):
    name = unique("welcome")
    assert add(conn, name) == (1, True)
    assert add(conn, name) == (1, False)
    assert add(conn, name, html="<p>{{ NAME }}</p>") == (2, True)  # bytes differ: a new version
    assert add(conn, name, text="Hello {{ name }}") == (3, True)
    latest = procedures.get_mail_template(conn, template_name=name)
    assert (latest.version, latest.latest_version, latest.text_template) == (3, 3, "Hello {{ name }}")
    first = procedures.get_mail_template(conn, template_name=name, version=1)
    assert first.html_template == "<p>{{ name }}</p>" and first.text_template is None
    versions = procedures.list_mail_template_versions(conn, template_name=name)
    assert [v["Version"] for v in versions] == [3, 2, 1]


def test_expected_latest_version_guards_concurrent_editors(conn):
    name = unique("guarded")
    assert add(conn, name, expected_latest_version=0) == (1, True)
    before = fingerprint(conn)
    expect_error(50217, add, conn, name, html="<p>other</p>", expected_latest_version=0, cls=TemplateStateError)
    assert_unchanged(before, fingerprint(conn))
    assert add(conn, name, html="<p>mine</p>", expected_latest_version=1) == (2, True)


def test_versions_are_immutable_even_for_sa(conn):
    name = unique("immutable")
    add(conn, name)
    before = query(conn, "SELECT SubjectTemplate, HtmlTemplate FROM mailq.MailTemplateVersion WHERE TemplateName = ?", name)
    for sql in ("UPDATE mailq.MailTemplateVersion SET HtmlTemplate = N'x' WHERE TemplateName = ?",
                "DELETE FROM mailq.MailTemplateVersion WHERE TemplateName = ?"):
        with pytest.raises(Exception) as info:
            execute(conn, sql, name)
        assert "50218" in str(info.value)
    assert query(conn, "SELECT SubjectTemplate, HtmlTemplate FROM mailq.MailTemplateVersion WHERE TemplateName = ?", name) == before


def test_retire_hides_the_latest_but_keeps_versions(conn):
    name = unique("retired")
    add(conn, name)
    row = procedures.retire_mail_template(conn, template_name=name, reason="replaced")
    assert row["Changed"] and row["RetiredReason"] == "replaced"
    assert not procedures.retire_mail_template(conn, template_name=name)["Changed"]
    expect_error(50216, procedures.get_mail_template, conn, template_name=name, cls=TemplateStateError)
    expect_error(50216, add, conn, name, html="<p>new</p>", cls=TemplateStateError)
    assert procedures.get_mail_template(conn, template_name=name, version=1).version == 1
    assert name not in {r["TemplateName"] for r in procedures.list_mail_templates(conn)}
    assert name in {r["TemplateName"] for r in procedures.list_mail_templates(conn, include_retired=True)}
    assert procedures.retire_mail_template(conn, template_name=name, retire=False)["Changed"]
    assert procedures.get_mail_template(conn, template_name=name).version == 1


@pytest.mark.parametrize("number, kwargs", [
    (50210, {"template_name": ""}),
    (50210, {"template_name": "has space"}),
    (50210, {"template_name": "x" * 129}),
    (50210, {"template_name": "caf\u00e9"}),
    (50211, {"subject_template": ""}),
    (50211, {"subject_template": "s" * 4001}),
    (50212, {"html_template": None, "text_template": None}),
    (50212, {"html_template": "", "text_template": ""}),
    (50213, {"description": "d" * 401}),
    (50214, {"expected_latest_version": -1}),
])
def test_bad_input_is_refused_and_changes_nothing(conn, number, kwargs):
    params = {"template_name": unique("bad"), "subject_template": "s", "html_template": "<p>x</p>", **kwargs}
    before = fingerprint(conn)
    expect_error(number, procedures.add_mail_template_version, conn, cls=TemplateInputError, **params)
    assert_unchanged(before, fingerprint(conn))


def test_unknown_names_and_versions(conn):
    name = unique("known")
    add(conn, name)
    expect_error(50215, procedures.get_mail_template, conn, template_name=unique("nope"), cls=UnknownTemplateError)
    expect_error(50215, procedures.get_mail_template, conn, template_name=name, version=2, cls=UnknownTemplateError)
    expect_error(50214, procedures.get_mail_template, conn, template_name=name, version=0, cls=TemplateInputError)
    expect_error(50215, procedures.list_mail_template_versions, conn, template_name=unique("nope"),
                 cls=UnknownTemplateError)
    expect_error(50215, procedures.retire_mail_template, conn, template_name=unique("nope"), cls=UnknownTemplateError)
    expect_error(50213, procedures.retire_mail_template, conn, template_name=name, reason="r" * 401,
                 cls=TemplateInputError)


def test_a_stored_template_renders_as_the_worker_will(conn):
    name = unique("render")
    add(conn, name, subject="Order {{ order.id }}", html="<p>{{ order.note }}</p>", text="Note: {{ order.note }}")
    tpl = MailTemplate.from_row(procedures.get_mail_template(conn, template_name=name))
    out = render_mail(tpl, '{"order": {"id": 42, "note": "<b>\u5feb</b>"}}')
    assert out.subject == "Order 42" and out.template_version == 1
    assert out.html == "<p>&lt;b&gt;\u5feb&lt;/b&gt;</p>" and out.text == "Note: <b>\u5feb</b>"
