"""mailq.EnqueueMailBatch without a server (issue 16, point 6): the contract
between the batch, mailq.EnqueueMail and the Python wrapper.

* One set-based INSERT writes the mails: no cursor, no EXEC of another mail
  procedure; the one loop takes EnqueueMail's application lock per distinct
  key (sp_getapplock locks one resource per call) and nothing else.
* The idempotency lock resource and the content-hash JSON are EnqueueMail's,
  column for column, so a batch row and a single call are the same mail.
* mailq.MailBatchRow has EnqueueMail's parameters with EnqueueMail's types.
* Every rule number a row can fail with is a number EnqueueMail raises (or 50223).
* The place for the event stream's INSERT is marked once, inside the transaction.
* The Python wrapper sends the same header/attachment text as enqueue_mail,
  and reads both result sets (fake DB-API cursor: this tests the Python
  layer's formatting, not the procedure).
"""

from __future__ import annotations

import json
import re
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from mailq_db import procedures
from mailq_db.deployment import build_order, code_only, strip_comments
from mailq_db.errors import BatchRowError, IdempotencyKeyBusyError, InvalidInputError, class_for

ROOT = Path(__file__).resolve().parents[2]
SQL = ROOT / "sql"
BATCH = (SQL / "procedures/mailq.EnqueueMailBatch.sql").read_text(encoding="utf-8")
SINGLE = (SQL / "procedures/mailq.EnqueueMail.sql").read_text(encoding="utf-8")
TYPE = (SQL / "types/mailq.MailBatchRow.sql").read_text(encoding="utf-8")
BATCH_CODE = strip_comments(BATCH)
SINGLE_CODE = strip_comments(SINGLE)


def test_one_insert_of_the_mails_no_cursor_no_nested_exec():
    assert len(re.findall(r"\bINSERT\s+INTO\s+mailq\.MailQueue\b", BATCH_CODE, re.I)) == 1
    assert len(re.findall(r"\bINSERT\s+INTO\s+mailq\.MailAttachment\b", BATCH_CODE, re.I)) == 1
    assert not re.search(r"\bCURSOR\b", code_only(BATCH), re.I)
    execs = re.findall(r"\bEXEC(?:UTE)?\s+(?:@\w+\s*=\s*)?([\w.]+)", BATCH_CODE, re.I)
    assert execs == ["sys.sp_getapplock"]


def test_the_only_loop_takes_the_key_locks():
    loops = re.findall(r"\bWHILE\b(.*?)\bEND;", BATCH_CODE, re.I | re.S)
    assert len(loops) == 1
    body = loops[0]
    assert "sys.sp_getapplock" in body
    assert not re.search(r"\b(INSERT|UPDATE|DELETE|MERGE)\b", body, re.I)
    # the keys are taken in binary order from #Key, numbered by INSERT ... ORDER BY
    assert re.search(r"INSERT INTO #Key \(KeyText\).*?ORDER BY KeyText;", BATCH_CODE, re.S)


def test_lock_resource_is_enqueuemails():
    single = re.search(r"CONCAT\(N'(mailq\.IdempotencyKey:)', RTRIM\(@IdempotencyKey\)\)", SINGLE_CODE)
    batch = re.search(r"CONCAT\(N'(mailq\.IdempotencyKey:)', @KeyText\)", BATCH_CODE)
    assert single and batch and single.group(1) == batch.group(1)
    assert re.search(r"SELECT RTRIM\(b\.IdempotencyKey\) COLLATE Latin1_General_100_BIN2 AS KeyText", BATCH_CODE)
    for code in (SINGLE_CODE, BATCH_CODE):
        assert re.search(r"@LockMode = N'Exclusive',\s*@LockOwner = N'Transaction'", code)


def _json_columns(code: str, prefix: str) -> list[str]:
    end = code.index("FOR JSON PATH, WITHOUT_ARRAY_WRAPPER, INCLUDE_NULL_VALUES")
    start = code.rindex("SELECT", 0, end) + len("SELECT")
    items = [i.strip() for i in code[start:end].split(",")]
    names = []
    for item in items:
        m = re.fullmatch(rf"{re.escape(prefix)}(\w+)(?:\s+AS\s+(\w+))?", item)
        assert m, item
        assert m.group(2) in (None, m.group(1)), item
        names.append(m.group(1))
    return names


def test_content_hash_is_enqueuemails_column_for_column():
    single = _json_columns(SINGLE_CODE, "@")
    batch = _json_columns(strip_comments(BATCH), "b.")
    assert batch == single
    # revision 0016: the template fields are appended only when given, in both
    assert "HASHBYTES('SHA2_256', CONCAT(h.ContentJson, t.TemplateJson))" in BATCH_CODE
    single_t = re.search(r"SELECT @TemplateName AS TemplateName, @TemplateVersion AS TemplateVersion,\s*"
                         r"@TemplateModel AS TemplateModel\s*FOR JSON PATH, WITHOUT_ARRAY_WRAPPER\s*\)", SINGLE_CODE)
    batch_t = re.search(r"SELECT b\.TemplateName, b\.TemplateVersion, b\.TemplateModel "
                        r"FOR JSON PATH, WITHOUT_ARRAY_WRAPPER\)", BATCH_CODE)
    assert single_t and batch_t
    assert "HASHBYTES('SHA2_256', @ContentJson)" in SINGLE_CODE


def _single_params() -> dict[str, str]:
    head = SINGLE_CODE[SINGLE_CODE.index("CREATE OR ALTER PROCEDURE"):SINGLE_CODE.index("\nAS\n")]
    found = {}
    for m in re.finditer(r"@(\w+)\s+([A-Z0-9]+(?:\([^)]*\))?)(\s*=\s*[^,\n]+)?(\s+OUTPUT)?", head):
        if "OUTPUT" not in m.group(0):
            found[m.group(1)] = m.group(2)
    return found


def _type_columns() -> dict[str, str]:
    body = TYPE[TYPE.index("AS TABLE ("):]
    return {m.group(1): m.group(2) for m in re.finditer(r"^\s+(\w+)\s+([A-Z0-9]+(?:\([^)]*\))?)", body, re.M)}


def test_table_type_has_enqueuemails_parameters_and_types():
    columns = _type_columns()
    assert columns.pop("RowNo") == "INT"
    assert columns == _single_params()
    # the TVP tuples are built in BATCH_FIELDS order: it must be the type's
    assert list(columns) == [c for _, c in procedures.BATCH_FIELDS]


def test_tvp_rows_follow_the_type_column_order():
    order = list(_type_columns())
    value = procedures._batch_tvp([dict(to_address="a@x.org", subject="s", body="b", priority=9)])
    assert value[:2] == ["MailBatchRow", "mailq"]
    row = dict(zip(order, value[2]))
    assert row["RowNo"] == 1 and row["ToAddress"] == "a@x.org" and row["Priority"] == 9


def test_rule_numbers_are_enqueuemails():
    single = {int(n) for n in re.findall(r"\bTHROW\s+(5\d{4})", SINGLE_CODE)}
    rules = {int(n) for n in re.findall(r"\(\d+, N'\w+', (5\d{4}),", BATCH_CODE)}
    rules |= {int(n) for n in re.findall(r"\(\d+, (5\d{4}), IIF", BATCH_CODE)}
    rules |= {int(n) for n in re.findall(r"SELECT (?:DISTINCT )?[\w.]+, \d+, (?:N'\w+', |[\w.]+, )?(5\d{4}),", BATCH_CODE)}
    rules |= {int(n) for n in re.findall(r"AS RuleOrder, (?:[\w.]+, |v\.Field, )?(5\d{4}) AS ErrorNumber", BATCH_CODE)}
    rules |= {int(n) for n in re.findall(r"^\s+b\.RowNo, \d+, v\.Field, (5\d{4}),", BATCH_CODE, re.M)}
    assert rules, "no rule numbers found"
    assert rules - {50223} <= single, sorted(rules - single)
    # the rules EnqueueMail raises that a row can break, all covered
    assert single - rules <= {50162}, sorted(single - rules)


def test_enqueued_events_are_written_from_inserted_inside_the_transaction():
    """Every mail the batch creates gets its 'Enqueued' event in the batch's
    transaction (docs/events.md), from #Inserted: after the attachments, before
    the commit, and exactly once."""
    code = BATCH_CODE
    inserts = [m.start() for m in re.finditer(r"INSERT INTO mailq\.MailEvent", code)]
    # the Enqueued events in one statement (the other insert: RecipientSuppressed, docs/bounces.md)
    enqueued = [i for i in inserts if "N'Enqueued'" in code[i:code.index(";", i)]]
    assert len(enqueued) == 1, len(enqueued)
    start = enqueued[0]
    assert code.index("INSERT INTO mailq.MailAttachment") < start < code.index("IF @OwnTran = 1 COMMIT TRANSACTION;")
    statement = code[start:code.index(";", start)]
    assert "N'Enqueued'" in statement and "FROM #Inserted" in statement, statement


def test_header_states_idempotency_and_concurrency():
    header = BATCH[:BATCH.index("*/")]
    for line in ("Idempotency:", "Concurrency:", "Transaction:", "Isolation:", "Lock order:", "Errors:",
                 "Result sets:"):
        assert line in header


def test_build_order_grants_and_revision():
    order = build_order(ROOT)
    assert order.index("types/mailq.MailBatchRow.sql") < order.index("procedures/mailq.EnqueueMailBatch.sql")
    assert order.index("procedures/mailq.EnqueueMailBatch.sql") < order.index("security/MailqEnqueuer.batch.grants.sql")
    grants = (SQL / "security/MailqEnqueuer.batch.grants.sql").read_text(encoding="utf-8")
    assert "GRANT EXECUTE ON OBJECT::mailq.EnqueueMailBatch TO MailqEnqueuer;" in grants
    assert "GRANT EXECUTE ON TYPE::mailq.MailBatchRow TO MailqEnqueuer;" in grants
    files = (ROOT / "alembic/frozen/0014/FILES").read_text(encoding="utf-8").split()
    assert files == ["types/mailq.MailBatchRow.sql", "procedures/mailq.EnqueueMailBatch.sql",
                     "security/MailqEnqueuer.batch.grants.sql"]


def test_downgrade_drops_the_type_after_the_procedure():
    from mailq_db.deployment import RevisionPlan

    revision_file = next((ROOT / "alembic/versions").glob("0014_*.py"))
    plan = RevisionPlan.load("0014", str(revision_file), drop_overrides={
        "types/mailq.MailBatchRow.sql": ["IF TYPE_ID(N'mailq.MailBatchRow') IS NOT NULL\n    DROP TYPE mailq.MailBatchRow"]})
    statements = plan.downgrade_statements()
    proc = next(i for i, s in enumerate(statements) if "DROP PROCEDURE IF EXISTS mailq.EnqueueMailBatch" in s)
    typ = next(i for i, s in enumerate(statements) if "DROP TYPE mailq.MailBatchRow" in s)
    revoke = next(i for i, s in enumerate(statements) if "REVOKE EXECUTE ON TYPE::mailq.MailBatchRow" in s)
    assert revoke < proc < typ


# -- the Python wrapper -------------------------------------------------------


def test_batch_row_sends_the_text_enqueue_mail_sends():
    attachment = procedures.Attachment("a.txt", b"alpha", "text/plain")
    row = procedures.batch_row(dict(to_address="a@x.org", subject="s", body="b", headers={"X-Id": "张"},
                                    attachments=[attachment], priority=0))
    assert row["Headers"] == json.dumps({"X-Id": "张"}, ensure_ascii=False)
    assert row["Attachments"] == procedures.attachments_json([attachment])
    assert row["Priority"] == 0 and "CC" not in row


def test_batch_times_are_utc_iso_text():
    aware = datetime(2030, 1, 1, 8, 0, tzinfo=timezone(timedelta(hours=8)))
    row = procedures.batch_row(dict(to_address="a@x.org", subject="s", body="b", date_to_process=aware,
                                    expires_at_utc=datetime(2030, 1, 2, 0, 0, 0, 123000)))
    assert row["DateToProcess"] == "2030-01-01T00:00:00.000000"
    assert row["ExpiresAtUtc"] == "2030-01-02T00:00:00.123000"


def test_unknown_field_and_batch_size_are_refused_before_the_server():
    with pytest.raises(ValueError, match="subjekt"):
        procedures.batch_row(dict(to_address="a@x.org", subjekt="s"))
    with pytest.raises(ValueError, match="1-10000"):
        procedures.enqueue_mail_batch(FakeConn([]), [])
    with pytest.raises(ValueError, match="1-10000"):
        procedures.enqueue_mail_batch(FakeConn([]), [dict(to_address="a@x.org")] * 10001)


class FakeCursor:
    def __init__(self, sets):
        self.sets = list(sets)
        self.executed = None

    @property
    def description(self):
        return [("c",)] if self.sets else None

    def execute(self, sql, *params):
        self.executed = (sql, params)

    def fetchall(self):
        return self.sets[0]

    def nextset(self):
        self.sets.pop(0)
        return bool(self.sets)

    def close(self):
        pass


class FakeConn:
    def __init__(self, sets):
        self.cursor_ = FakeCursor(sets)

    def cursor(self):
        return self.cursor_


def test_wrapper_sends_json_and_reads_both_result_sets():
    conn = FakeConn([[(1, 101, "<a@x>", True), (3, 55, "<b@x>", False)], [(2, "Priority", 50109, "Priority ...")]])
    result = procedures.enqueue_mail_batch(conn, [dict(to_address="a@x.org", subject="s", body="b")] * 3,
                                           reject_invalid=True)
    sql, params = conn.cursor_.executed
    assert sql == procedures.ENQUEUE_BATCH_SQL and params[1] == 1
    assert [m["ToAddress"] for m in json.loads(params[0])] == ["a@x.org"] * 3
    assert result.mail_ids == [101, 55]
    assert result.enqueued[1] == procedures.BatchEnqueued(3, 55, "<b@x>", False)
    assert result.rejected == [procedures.BatchRejected(2, "Priority", 50109, "Priority ...")]


def test_batch_errors_map_to_classes():
    error = class_for(50220)(50220, "Row 17, field ToAddress, rule 50102: ToAddress: address 'x@' has no "
                                    "local part or no domain. Nothing was queued.")
    assert isinstance(error, BatchRowError) and isinstance(error, InvalidInputError)
    assert (error.row, error.field, error.rule) == (17, "ToAddress", 50102)
    assert class_for(50225) is IdempotencyKeyBusyError
    for number in (50221, 50222, 50224):
        assert class_for(number) is InvalidInputError


# --- revision 0018: input hardening and lock escalation ---------------------

def test_times_go_through_datetimeoffset_so_an_offset_is_converted_not_dropped():
    code = " ".join(BATCH_CODE.split())
    for field in ("DateToProcess", "ExpiresAtUtc"):
        # converted to UTC through DATETIMEOFFSET, and only for years 2-9998
        # (SWITCHOFFSET at either end of the range could overflow the batch)
        assert (f"CONVERT(DATETIME2(3), SWITCHOFFSET(IIF( YEAR(TRY_CONVERT(DATETIMEOFFSET(3), f.{field}, 127)) "
                f"BETWEEN 2 AND 9998, TRY_CONVERT(DATETIMEOFFSET(3), f.{field}, 127), NULL ), N'+00:00'))"
                in code), field
    assert "TRY_CONVERT(DATETIME2(3), f.DateToProcess" not in BATCH_CODE
    # the 50223 check accepts exactly what the conversion accepts
    assert "TRY_CONVERT(DATETIMEOFFSET(3), k.[value], 127) IS NULL" in BATCH_CODE
    assert "YEAR(TRY_CONVERT(DATETIMEOFFSET(3), k.[value], 127)) NOT BETWEEN 2 AND 9998" in BATCH_CODE


def test_integers_must_be_json_numbers():
    assert "AND (k.[type] <> 2 OR TRY_CONVERT(INT, k.[value]) IS NULL)" in BATCH_CODE
    assert "k.[type] NOT IN (1, 2)" not in BATCH_CODE


def test_the_size_cap_comes_before_any_parsing_and_covers_both_inputs():
    code = BATCH_CODE
    assert "DECLARE @MaxBatchBytes BIGINT = 268435456;" in code
    json_cap = code.index("IF DATALENGTH(@Mails) > @MaxBatchBytes")
    assert json_cap < code.index("IF ISJSON(@Mails) = 0") < code.index("OPENJSON(@Mails)")
    tvp_cap = code.index("IF @Bytes > @MaxBatchBytes")
    assert tvp_cap < code.index("INSERT INTO #Batch", tvp_cap)
    assert code.count("THROW 50226") == 2
    assert class_for(50226) is InvalidInputError


def test_json_white_space_before_the_array_is_allowed():
    assert "LEFT(LTRIM(TRANSLATE(LEFT(@Mails, 4000), NCHAR(9) + NCHAR(10) + NCHAR(13), N'   ')), 1) <> N'['" in BATCH_CODE
    assert "LEFT(LTRIM(@Mails), 1)" not in BATCH_CODE


def test_existing_keys_are_read_by_seek():
    assert "INNER JOIN mailq.MailQueue AS q WITH (FORCESEEK)" in BATCH_CODE


def test_revision_0018_disables_lock_escalation_and_its_downgrade_restores_it():
    import importlib.util

    upgrade = strip_comments((SQL / "upgrades/mailq.0018.LockEscalation.sql").read_text(encoding="utf-8"))
    tables = ("MailQueue", "MailAttachment", "MailEvent")
    for table in tables:
        assert f"ALTER TABLE mailq.{table} SET (LOCK_ESCALATION = DISABLE);" in upgrade
        assert f"OBJECT_ID(N'mailq.{table}') AND lock_escalation_desc <> N'DISABLE'" in upgrade
    assert "upgrades/mailq.0018.LockEscalation.sql" in build_order()
    [path] = (ROOT / "alembic/versions").glob("0018_*.py")
    spec = importlib.util.spec_from_file_location("rev0018", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    down = " ".join(module.DOWNGRADE_0018)
    for table in tables:
        assert f"ALTER TABLE mailq.{table} SET (LOCK_ESCALATION = TABLE)" in down
    assert module.PLAN.drop_overrides == {"upgrades/mailq.0018.LockEscalation.sql": module.DOWNGRADE_0018}
