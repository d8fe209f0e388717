"""Templates and lazy attachments wired into enqueue, claim and attempt
(issue 16 point 2, part B), without a server.

* The tables hold the template columns and their constraints.
* ClaimMail's first result set grows by exactly three columns, appended at
  its end; attachments gain Generator/GeneratorArgs at the end; a third result
  set carries each template version once; the version is resolved by seeks
  and recorded on the attempt.
* EnqueueMail's new parameters are appended at the end of its list.
* The Python reader handles the three result sets (a fake DB-API cursor: this
  tests the Python layer's mapping, not the procedure).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from types import SimpleNamespace

from mailq_db import procedures
from mailq_db.deployment import strip_comments
from mailq_db.procedures import Attachment, LazyAttachment

ROOT = Path(__file__).resolve().parents[2]
SQL = ROOT / "sql"


def code(rel: str) -> str:
    return strip_comments((SQL / rel).read_text(encoding="utf-8"))


CLAIM = code("procedures/mailq.ClaimMail.sql")
ENQUEUE = code("procedures/mailq.EnqueueMail.sql")


def test_the_tables_hold_the_template_columns_and_rules():
    queue = code("tables/mailq.MailQueue.sql")
    for column in ("TemplateName NVARCHAR(128) NULL", "TemplateVersion INT NULL", "TemplateModel NVARCHAR(MAX) NULL",
                   "CONSTRAINT CK_MailQueue_Template CHECK"):
        assert column in queue, column
    attachment = code("tables/mailq.MailAttachment.sql")
    for column in ("Content VARBINARY(MAX) NULL", "Generator NVARCHAR(128) NULL", "GeneratorArgs NVARCHAR(MAX) NULL",
                   "CONSTRAINT CK_MailAttachment_Source CHECK"):
        assert column in attachment, column
    assert "TemplateVersion INT NULL" in code("tables/mailq.MailAttempt.sql")


def test_type_file_creates_the_type_once_and_drops_nothing():
    """The baseline has no older shape to replace, and a DROP TYPE would fail anyway
    while mailq.EnqueueMailRows (not only EnqueueMailBatch) takes the type (3732)."""
    text = code("types/mailq.MailBatchRow.sql")
    assert "DROP " not in text.upper()
    assert "IF TYPE_ID(N'mailq.MailBatchRow') IS NULL\n    CREATE TYPE mailq.MailBatchRow AS TABLE (" in text
    assert "@Rows mailq.MailBatchRow READONLY" in code("procedures/mailq.EnqueueMailRows.sql")
    order = [l.strip() for l in (SQL / "BuildOrder.txt").read_text().splitlines()]
    assert order.index("types/mailq.MailBatchRow.sql") < order.index("procedures/mailq.EnqueueMailBatch.sql") \
        < order.index("security/MailqEnqueuer.batch.grants.sql")
    assert order.index("tables/mailq.MailQueue.sql") < order.index("procedures/mailq.EnqueueMail.sql")


def _selects(text: str) -> list[str]:
    tail = text[text.index("END CATCH;"):]
    return re.findall(r"\bSELECT\b(.*?)\bFROM\b", tail, re.S)


def test_claim_result_sets_grow_only_at_their_ends():
    first, second, _used, third = _selects(CLAIM)[:4]  # (_used: the CTE of the distinct versions)
    # The last column is computed: LeaseSecondsRemaining (server clock, floor).
    lease = first.rindex("CAST(FLOOR(")
    assert first[lease:].strip().endswith("AS LeaseSecondsRemaining")
    cols = [c.strip().split(".")[-1].split(" AS ")[-1] for c in first[:lease].strip().rstrip(",").split(",")]
    # revision 0015 appended RunMode, DryRun; 0016 the three template columns; then LeaseSecondsRemaining
    assert cols[-6:] == ["dtStamp", "RunMode", "DryRun", "TemplateName", "TemplateVersion", "TemplateModel"]
    assert len(cols) == 21 + 2 + 3
    cols2 = [c.strip().split(".")[-1] for c in second.split(",")]
    assert cols2 == ["MailID", "AttachmentNo", "FileName", "ContentType", "Content", "Generator", "GeneratorArgs"]
    assert [c.strip().split(".")[-1] for c in third.split(",")] == [
        "TemplateName", "Version", "SubjectTemplate", "HtmlTemplate", "TextTemplate"]
    assert "INNER JOIN mailq.MailTemplateVersion AS v WITH (FORCESEEK)" in CLAIM


def test_claim_resolves_by_seek_and_records_the_version_on_the_attempt():
    assert re.search(r"INNER JOIN mailq\.MailTemplate AS t WITH \(FORCESEEK\) ON c\.TemplateName = t\.TemplateName",
                     CLAIM)
    assert "COALESCE(c.TemplateVersion, IIF(t.RetiredAtUtc IS NULL, t.LatestVersion, NULL))" in CLAIM
    assert re.search(r"INSERT INTO mailq\.MailAttempt \([^)]*TemplateVersion\)\s*SELECT [^;]*c\.TemplateVersion", CLAIM)
    # resolved inside the claim's transaction, before its commit
    assert CLAIM.index("INNER JOIN mailq.MailTemplate") < CLAIM.index("COMMIT TRANSACTION")


def test_enqueue_template_parameters_are_appended_at_the_end():
    head = ENQUEUE[ENQUEUE.index("CREATE OR ALTER PROCEDURE"):ENQUEUE.index("\nAS\n")]
    params = re.findall(r"@(\w+)\s+[A-Z]", head)
    # revision 0015 appended RunMode, 0016 the template parameters after it
    assert params[-7:] == ["MailID", "MessageID", "Created", "RunMode", "TemplateName", "TemplateVersion",
                           "TemplateModel"]
    # the rules live in the one rule function every enqueue path uses (docs/enqueue.md)
    rules = code("functions/mailq.EnqueueMailCheck.sql")
    for number in range(50280, 50287):
        assert re.search(rf"\(\d+, {number}, N'\w+'", rules) or f", {number}, IIF(" in rules, number


class FakeCursor:
    def __init__(self, *sets):
        self.sets = [list(s) for s in sets]
        self.description = True

    def execute(self, sql, *params):
        self.sql, self.params = sql, params

    def fetchall(self):
        return self.sets[0]

    def fetchone(self):
        return self.sets[0].pop(0) if self.sets[0] else None

    def nextset(self):
        self.sets.pop(0)
        return bool(self.sets)


class FakeConn:
    def __init__(self, cursor):
        self._cursor = cursor

    def cursor(self):
        return self._cursor


def _mail_row(i, **kw):
    values = dict(ID=i, MessageID=f"<{i}@x>", AccountName="a", AppName=None, FromName=None, FromAddress="f@x.org",
                  ReplyTo=None, ToAddress="t@x.org", CC=None, BCC=None, Subject="", Body="", BodyFormat="Text",
                  TextBody=None, Headers=None, Priority=5, AttemptNo=1, AttemptsRemaining=4, LeaseExpiresUtc=None,
                  PossibleDuplicate=False, dtStamp=None, TemplateName=None, TemplateVersion=None, TemplateModel=None)
    values.update(kw)
    return SimpleNamespace(**values)


def test_claim_reader_maps_templates_and_lazy_attachments():
    cursor = FakeCursor(
        [_mail_row(1, TemplateName="Welcome", TemplateVersion=2, TemplateModel='{"a": 1}'), _mail_row(2)],
        [SimpleNamespace(MailID=2, AttachmentNo=1, FileName="x.txt", ContentType="text/plain", Content=b"x",
                         Generator=None, GeneratorArgs=None),
         SimpleNamespace(MailID=2, AttachmentNo=2, FileName="r.csv", ContentType="application/octet-stream",
                         Content=None, Generator="csv", GeneratorArgs='{"rows": []}')],
        [SimpleNamespace(TemplateName="welcome", Version=2, SubjectTemplate="S", HtmlTemplate=None,
                         TextTemplate="T")],
    )
    m1, m2 = procedures.claim_mail(FakeConn(cursor), batch_size=10, lock_token="00000000-0000-0000-0000-000000000001",
                                   lease_seconds=60)
    assert (m1.template_name, m1.template_version, m1.template_model) == ("Welcome", 2, '{"a": 1}')
    assert m1.template.text_template == "T"  # matched under a case-insensitive name
    assert m2.template is None and m2.template_name is None
    assert m2.attachments == [Attachment("x.txt", b"x", "text/plain"),
                              LazyAttachment("r.csv", "csv", '{"rows": []}', "application/octet-stream")]


def test_claim_reader_works_against_a_database_below_0016():
    row = _mail_row(1)
    for name in ("TemplateName", "TemplateVersion", "TemplateModel"):
        delattr(row, name)
    cursor = FakeCursor([row], [SimpleNamespace(MailID=1, AttachmentNo=1, FileName="x", ContentType="a/b", Content=b"")])
    [mail] = procedures.claim_mail(FakeConn(cursor), batch_size=1, lock_token="00000000-0000-0000-0000-000000000001",
                                   lease_seconds=60)
    assert mail.template_name is None and mail.attachments == [Attachment("x", b"", "a/b")]


def test_lazy_attachment_json_is_what_enqueuemail_reads():
    text = procedures.attachments_json([Attachment("a.txt", b"hi", "text/plain"),
                                        LazyAttachment("r.csv", "csv", {"rows": [[1]]})])
    assert json.loads(text) == [
        {"FileName": "a.txt", "ContentType": "text/plain", "ContentBase64": "aGk="},
        {"FileName": "r.csv", "Generator": "csv", "Arguments": {"rows": [[1]]}},
    ]
    for key in ("'$.Generator'", "'$.Arguments' AS JSON"):
        assert key in code("functions/mailq.MailAttachmentList.sql")


def test_batch_rows_carry_the_template_fields_in_the_type_order():
    row = procedures.batch_row(dict(to_address="a@x.org", template_name="t", template_version=2,
                                    template_model={"k": "张"}))
    assert row == {"ToAddress": "a@x.org", "TemplateName": "t", "TemplateVersion": 2, "TemplateModel": '{"k": "张"}'}
    tvp = procedures._batch_tvp([dict(to_address="a@x.org", template_name="t", template_model='{"k": 1}')])
    assert tvp[2][-3:] == ("t", None, '{"k": 1}')
