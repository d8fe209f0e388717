"""Enqueueing without a server (issue 21 point 6, issue 24 M3, M6, L3, L4):
what the T-SQL of the enqueue path guarantees by construction.

* One source: mailq.EnqueueMail and mailq.EnqueueMailBatch contain no rule, no
  default, no hash and no write of their own; both hand their rows to
  mailq.EnqueueMailRows, whose one statement applies mailq.EnqueueMailCheck to
  every row.  So rule order, defaults and the content hash cannot differ
  between a single call and a batch row (the copy-comparison test is gone:
  there is no copy to compare).
* The hash covers normalized values (defaults applied), so how a default is
  spelled (EnqueueMail's NULL, a batch row's missing field) cannot change it.
* L3: no JSON function in the enqueue path reads text that is not proven JSON.
* L4: the core sets the SET options filtered-index DML needs.
* M3: unmapped enqueuers are refused unless an explicit policy row says so;
  SendDbMail goes through EnqueueMail, so the rule applies to it by construction.
* M6: UpsertSendingAccount changes only what it is given.
The Python wrapper tests use a fake DB-API cursor: they test the Python
layer's formatting, never a procedure.
"""

from __future__ import annotations

import json
import re
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from mailq_db import procedures
from mailq_db.deployment import SESSION_OPTIONS, build_order, code_only, strip_comments
from mailq_db.errors import (BatchRowError, IdempotencyKeyBusyError, InvalidInputError, SenderNotAllowedError,
                             class_for)

ROOT = Path(__file__).resolve().parents[2]
SQL = ROOT / "sql"
FILES = {
    "single": "procedures/mailq.EnqueueMail.sql",
    "batch": "procedures/mailq.EnqueueMailBatch.sql",
    "core": "procedures/mailq.EnqueueMailRows.sql",
    "rules": "functions/mailq.EnqueueMailCheck.sql",
    "attachments": "functions/mailq.MailAttachmentList.sql",
    "json": "functions/mailq.MailBatchJson.sql",
}
TEXT = {k: (SQL / v).read_text(encoding="utf-8") for k, v in FILES.items()}
CODE = {k: strip_comments(v) for k, v in TEXT.items()}
BARE = {k: code_only(v) for k, v in TEXT.items()}   # string literals emptied
TYPE = (SQL / "types/mailq.MailBatchRow.sql").read_text(encoding="utf-8")
UPSERT = strip_comments((SQL / "procedures/mailq.UpsertSendingAccount.sql").read_text(encoding="utf-8"))
ERRORS_MD = (ROOT / "docs/errors.md").read_text(encoding="utf-8")
ENQUEUE_MD = (ROOT / "docs/enqueue.md").read_text(encoding="utf-8")
FIELDS = ["ToAddress", "Subject", "Body", "BodyFormat", "TextBody", "CC", "BCC", "FromAddress", "FromName",
          "ReplyTo", "Headers", "AccountName", "AppName", "Priority", "DateToProcess", "ExpiresAtUtc", "MaxAttempts",
          "IdempotencyKey", "Attachments", "RunMode", "TemplateName", "TemplateVersion", "TemplateModel"]


def body(code: str) -> str:
    return code[code.index("\nAS\n"):]


def params(code: str) -> dict[str, tuple[str, str | None]]:
    """name -> (type, default) of a module's parameter list."""
    head = code[code.index("CREATE OR ALTER"):code.index("\nAS\n")] + "\n"
    found = {}
    for m in re.finditer(r"@(\w+)\s+([A-Za-z][A-Za-z0-9.]*(?:\([^)]*\))?)(?:\s*=\s*([^,\n)]+?))?(?:\s+OUTPUT|\s+READONLY)?\s*[,\n)]",
                         head):
        found[m.group(1)] = (m.group(2), m.group(3))
    return found


# -- one source ---------------------------------------------------------------


def test_enqueuemail_has_no_rule_of_its_own_it_passes_its_parameters_as_one_row():
    code = body(BARE["single"])
    assert not re.search(r"\b(THROW|IF|WHILE|CASE|IIF|COALESCE|INSERT|UPDATE|DELETE|SELECT|HASHBYTES)\b", code), code
    assert re.findall(r"\bEXEC(?:UTE)?\s+([\w.]+)", code) == ["mailq.EnqueueMailRows"]
    passed = dict(re.findall(r"@(\w+) = @(\w+)", code))
    own = [p for p in params(CODE["single"]) if p not in ("MailID", "MessageID", "Created")]
    assert own == FIELDS
    assert {k: v for k, v in passed.items() if k in FIELDS} == {f: f for f in FIELDS}   # every field, by name
    assert "@Single = 1" in code and "@MailID = @MailID OUTPUT" in code


def test_no_default_is_spelled_in_a_signature():
    """NULL means "the default" everywhere; the defaults live in one place."""
    for key in ("single", "core"):
        defaults = {n: d for n, (_, d) in params(CODE[key]).items() if n in FIELDS}   # ToAddress too: Cc-only mail
        assert set(defaults.values()) <= {"NULL"}, (key, defaults)
    rules = BARE["rules"].replace(" ", "")
    for default in ("COALESCE(@Priority,5)", "COALESCE(@MaxAttempts,5)", "COALESCE(@DateToProcess,@Now)",
                    "COALESCE(@RunMode,'')", "COALESCE(@BodyFormat,'')"):
        assert default in rules, default
    for key in ("single", "batch", "core", "json", "attachments"):
        assert not re.search(r"COALESCE\(\s*@?\w*\.?(Priority|MaxAttempts|RunMode|BodyFormat)\b", CODE[key]), key


def test_the_batch_checks_only_the_input_shape_and_hands_over_with_a_fresh_plan():
    code = body(BARE["batch"])
    assert {int(n) for n in re.findall(r"\bTHROW\s+(5\d{4})", code)} == {50221, 50222, 50226}
    assert not re.search(r"\b(INSERT|UPDATE|DELETE|MERGE|HASHBYTES)\b", code)
    assert re.findall(r"\bEXEC(?:UTE)?\s+([\w.]+)", code) == ["mailq.EnqueueMailRows"]
    assert ("EXEC mailq.EnqueueMailRows @Rows = @MailRows, @Mails = @Mails, @RejectInvalid = @RejectInvalid "
            "WITH RECOMPILE;") in code
    assert "WITH RECOMPILE" not in BARE["single"]


def test_the_core_applies_the_one_rule_function_once_to_every_row():
    core = BARE["core"]
    assert core.count("mailq.EnqueueMailCheck(") == 1
    everywhere = [p.relative_to(SQL).as_posix() for p in SQL.rglob("*.sql")
                  if "mailq.EnqueueMailCheck(" in code_only(p.read_text(encoding="utf-8"))
                  and p.name != "mailq.EnqueueMailCheck.sql"]
    assert everywhere == [FILES["core"]]
    # the function's 23 field parameters are MailBatchRow's columns, in order, and the core passes them so
    call = core[core.index("mailq.EnqueueMailCheck("):]
    args = re.findall(r"i\.(\w+)", call[:call.index(") AS c")])
    assert args[:23] == FIELDS and args[23:] == ["InputField", "InputMessage"]
    fn = params(CODE["rules"])
    assert list(fn)[:23] == FIELDS
    assert {n: t for n, (t, _) in fn.items() if n in FIELDS} == {n: t for n, (t, _) in params(CODE["single"]).items()
                                                                 if n in FIELDS}


def test_only_the_core_writes_mail_and_only_the_rule_function_hashes():
    writers = {}
    for path in SQL.rglob("*.sql"):
        code = code_only(path.read_text(encoding="utf-8"))
        for table in ("MailQueue", "MailAttachment"):
            if re.search(rf"\bINSERT\s+INTO\s+mailq\.{table}\b", code):
                writers.setdefault(table, []).append(path.relative_to(SQL).as_posix())
    # SendDbMail's @query results are attached later, by the query runner, to a mail the core queued held
    assert writers == {"MailQueue": [FILES["core"]],
                       "MailAttachment": sorted([FILES["core"], "procedures/mailq.CompleteDbMailQuery.sql"])}
    hashing = [k for k, v in BARE.items() if "HASHBYTES" in v]
    assert hashing == ["rules"]
    assert BARE["core"].count("INSERT INTO mailq.MailQueue") == 1 and "c.ContentHash" in BARE["core"]


def test_the_hash_is_over_normalized_values():
    rules = CODE["rules"]
    hashed = rules[rules.index("HASHBYTES('SHA2_256'"):rules.index("AS ContentHash")]
    # defaults applied: these come from n (the defaults CTE), never from the raw parameter
    for column in ("Subject", "Body", "BodyFormat", "FromAddress", "FromName", "ReplyTo", "AccountName", "AppName",
                   "Priority", "MaxAttempts", "RunMode", "TemplateModel"):
        assert re.search(rf"\bn\.{column}\b", hashed), column
        assert not re.search(rf"@{column} AS {column}\b", hashed), column
    # headers and attachments re-serialized, so their JSON spelling does not count
    assert "FROM OPENJSON(n.HeadersJson) AS j" in hashed and "FROM mailq.MailAttachmentList(@Attachments) AS t" in hashed
    assert "COALESCE(t.ContentType, N'application/octet-stream') AS ContentType" in hashed
    # the due time counts as given: "now" is not content (a retry later is the same mail)
    assert "@DateToProcess AS DateToProcess" in hashed


def test_every_rule_number_is_documented_and_raised_as_itself_by_a_single_call():
    numbers = {int(n) for n in re.findall(r"\(\d+, (5\d{4}),", BARE["rules"])}
    numbers |= {int(n) for n in re.findall(r"\(\d+, (5\d{4}), IIF\(", BARE["rules"])}
    assert {50101, 50102, 50103, 50117, 50160, 50161, 50168, 50240, 50286, 50500} <= numbers
    for n in numbers:
        assert f"| {n} |" in ERRORS_MD, n
        assert f"{n}" in ENQUEUE_MD, n
    # a single call throws the row's own number; a batch wraps it in 50220
    assert "@Err = IIF(@Single = 1, w.ErrorNumber, 50220)" in CODE["core"]
    assert "THROW @Err, @Msg, 1;" in CODE["core"]
    assert "@P NVARCHAR(1) = IIF(@Single = 1, N'@', N'')" in CODE["core"]


def test_the_first_broken_rule_wins_in_one_order():
    rules = CODE["rules"]
    orders = [int(n) for n in re.findall(r"^\s+\((\d+), 5\d{4}, ", rules[:rules.index("UNION ALL")], re.M)]
    assert orders == sorted(orders) and len(orders) == len(set(orders))
    assert "ORDER BY p.RuleOrder, p.Position, p.Item" in rules
    assert "(1, 50500, N'AppName'" in rules          # who may enqueue, before what is enqueued


def test_the_table_type_has_enqueuemails_parameters_and_types():
    body_ = TYPE[TYPE.index("AS TABLE ("):]
    columns = {m.group(1): m.group(2) for m in re.finditer(r"^\s+(\w+)\s+([A-Z0-9]+(?:\([^)]*\))?)", body_, re.M)}
    assert columns.pop("RowNo") == "INT"
    assert columns == {n: t for n, (t, _) in params(CODE["single"]).items() if n in FIELDS}
    assert list(columns) == FIELDS == [c for _, c in procedures.BATCH_FIELDS]


# -- idempotency locks --------------------------------------------------------


def test_the_only_loop_takes_one_application_lock_per_key_in_binary_order():
    core = CODE["core"]
    loops = re.findall(r"\bWHILE\b(.*?)\bEND;\s*\n\s*\n", core, re.S)
    assert len(loops) == 1 and "sys.sp_getapplock" in loops[0]
    assert not re.search(r"\b(INSERT|DELETE|MERGE)\b", loops[0])
    assert "@LockMode = N'Exclusive', @LockOwner = N'Transaction'" in core
    assert "ROW_NUMBER() OVER (ORDER BY v.KeyText) AS Seq" in core   # KeyText is binary (BIN2)
    assert "KeyText NVARCHAR(4000) COLLATE Latin1_General_100_BIN2" in core
    assert "INNER JOIN mailq.MailQueue AS q WITH (FORCESEEK)" in core
    assert not re.search(r"\b(HOLDLOCK|SERIALIZABLE|SAVE\s+TRAN)", BARE["core"])


# -- L3: no JSON function can fail a batch for one row ------------------------


JSON_CALL = re.compile(r"\b(OPENJSON|JSON_VALUE|JSON_QUERY|JSON_MODIFY)\s*\(", re.I)
#: Arguments that are JSON by construction (IIF over ISJSON or a JSON type, a
#: column that IIF(ISJSON...) produced, or input whose shape was refused first).
PROVEN = (r"IIF\(ISJSON\(", r"IIF\(e\.\[type\] = 5,", r"IIF\(t\.Base64Ok = 1,", r"n\.HeadersJson\)",
          r"@Mails\)")


def json_calls(code: str) -> list[str]:
    return [code[m.end():m.end() + 40] for m in JSON_CALL.finditer(code)]


def test_every_json_function_reads_proven_json():
    for key, code in CODE.items():
        for arg in json_calls(code):
            assert any(re.match(p, arg) for p in PROVEN), (key, arg)
    assert not re.search(r"\bJSON_(VALUE|QUERY|MODIFY)\b", "".join(BARE.values()))
    # the batch reads @Mails with OPENJSON only after ISJSON refused non-JSON with 50221
    batch = CODE["batch"]
    assert batch.index("IF ISJSON(@Mails) = 0") < batch.index("OPENJSON(@Mails)")
    # base64 is decoded only where the text check passed, and never inside the rules
    assert "VARBINARY" not in BARE["rules"] and "VARBINARY" not in BARE["attachments"]


def test_the_json_guard_check_bites():
    assert json_calls("SELECT 1 FROM OPENJSON(e.[value]) AS k") == ["e.[value]) AS k"]
    assert not any(re.match(p, "e.[value]) AS k") for p in PROVEN)


# -- L4: legacy SET options ---------------------------------------------------


@pytest.mark.parametrize("code", [CODE["core"], UPSERT], ids=["EnqueueMailRows", "UpsertSendingAccount"])
def test_writers_of_filtered_index_tables_set_what_they_need(code):
    first_write = min(code.index(w) for w in ("INSERT INTO mailq.", "UPDATE a", "UPDATE w") if w in code)
    sets = code[:first_write]
    assert "SET ANSI_WARNINGS, ANSI_PADDING, CONCAT_NULL_YIELDS_NULL ON;" in sets
    assert "SET NUMERIC_ROUNDABORT OFF;" in sets
    assert "ARITHABORT" not in code   # follows ANSI_WARNINGS; setting it would recompile for ADO.NET callers


def test_modules_are_created_with_ansi_nulls_and_quoted_identifier_on():
    """ANSI_NULLS and QUOTED_IDENTIFIER are captured when a module is created:
    every deployment batch runs after these session options."""
    assert re.search(r"ANSI_NULLS,.*QUOTED_IDENTIFIER ON;", SESSION_OPTIONS, re.S)
    assert "NUMERIC_ROUNDABORT OFF" in SESSION_OPTIONS


# -- M3: who may send as whom ---------------------------------------------------


def test_unmapped_enqueuers_are_refused_unless_an_explicit_policy_row_allows_them():
    table = (SQL / "tables/mailq.EnqueuePolicy.sql").read_text(encoding="utf-8")
    assert "INSERT INTO mailq.EnqueuePolicy (PolicyId, AllowUnmappedEnqueuers) VALUES (1, 0);" in table
    assert "CHECK (PolicyId = 1)" in table
    core = CODE["core"]
    assert "FROM mailq.ApplicationPrincipal AS u WHERE u.PrincipalName = USER_NAME()" in core
    assert "(SELECT p.AllowUnmappedEnqueuers FROM mailq.EnqueuePolicy AS p WHERE p.PolicyId = 1), 0" in core
    assert "IIF(@PrincipalApp IS NULL AND @AllowUnmapped = 0, 1, 0)" in CODE["rules"]
    assert "EXECUTE AS" not in BARE["core"] + BARE["single"] + BARE["batch"]    # USER_NAME() is the caller
    setter = strip_comments((SQL / "procedures/mailq.SetEnqueuePolicy.sql").read_text(encoding="utf-8"))
    assert setter.index("THROW 50502") < setter.index("BEGIN TRANSACTION")
    assert "IS_ROLEMEMBER(N'db_owner')" in setter and "IS_ROLEMEMBER(N'MailqAdmin')" in setter


def test_senddbmail_goes_through_enqueuemail_so_the_rule_applies_to_it():
    text = code_only((SQL / "procedures/mailq.SendDbMail.sql").read_text(encoding="utf-8"))
    assert re.search(r"\bEXEC\s+mailq\.EnqueueMail\b", text) and "EXECUTE AS" not in text


def test_grants_keep_the_core_and_the_policy_setter_to_themselves():
    grants = "\n".join(code_only(p.read_text(encoding="utf-8")) for p in (SQL / "security").glob("*.grants.sql"))
    assert "EnqueueMailRows" not in grants and "EnqueueMailCheck" not in grants
    setters = re.findall(r"GRANT EXECUTE ON OBJECT::mailq\.SetEnqueuePolicy TO (\w+);", grants)
    assert setters == ["MailqAdmin"]
    order = build_order(ROOT)
    for rel in ("tables/mailq.EnqueuePolicy.sql", "functions/mailq.EnqueueMailCheck.sql",
                "procedures/mailq.EnqueueMailRows.sql", "procedures/mailq.SetEnqueuePolicy.sql",
                "procedures/mailq.GetEnqueuePolicy.sql", "security/MailqAdmin.enqueue.grants.sql"):
        assert rel in order
    assert order.index("functions/mailq.MailAttachmentList.sql") < order.index("functions/mailq.EnqueueMailCheck.sql") \
        < order.index("procedures/mailq.EnqueueMailRows.sql") < order.index("procedures/mailq.EnqueueMail.sql")


# -- recipients: To, Cc or Bcc (Database Mail sends Cc-only and Bcc-only mail) --


def test_a_mail_needs_one_recipient_in_to_cc_or_bcc_and_they_count_together():
    rules = " ".join(CODE["rules"].split())
    assert ("( SELECT COUNT(*) FROM (VALUES (@ToAddress), (@CC), (@BCC)) AS v(List) "
            "CROSS APPLY mailq.ParseAddressList(v.List) ) AS Recipients") in rules
    assert "(3, 50101, N'ToAddress', IIF(n.Recipients = 0, 1, 0)," in rules    # none at all: still 50101
    assert "(14, 50104, N'ToAddress', IIF(n.Recipients > 100, 1, 0)," in rules  # To+Cc+Bcc toward the limit
    assert not re.search(r"\bToCount\b", rules) and "ParseAddressList(@ToAddress)" not in rules   # nothing counts To alone
    # MailQueue.ToAddress is NOT NULL: a mail without To stores N'', which the worker and the sweep read as none
    assert "ISNULL(w.ToAddress, N'')" in CODE["core"]
    assert "ToAddress NVARCHAR(4000) NOT NULL" in (SQL / "tables/mailq.MailQueue.sql").read_text(encoding="utf-8")
    senddb = strip_comments((SQL / "procedures/mailq.SendDbMail.sql").read_text(encoding="utf-8"))
    assert "@ToAddress NVARCHAR(MAX) = NULLIF(LTRIM(RTRIM(@recipients)), '');" in senddb
    view = strip_comments((SQL / "views/mailq.sysmail_allitems.sql").read_text(encoding="utf-8"))
    assert "NULLIF(q.ToAddress, N'') AS recipients" in view   # msdb shows no recipients, not ''
    row = ERRORS_MD[ERRORS_MD.index("| 50101 |"):]
    assert "CC" in row[:row.index("\n")] and "Cc-only" in ENQUEUE_MD


# -- suppression lists (docs/bounces.md): the core's last rule -----------------


def test_the_suppression_list_is_checked_once_in_the_core_for_every_enqueue():
    """In the core, so EnqueueMail, EnqueueMailBatch and SendDbMail (through
    EnqueueMail) hold it by construction; the public procedures have none."""
    callers = sorted(p.relative_to(SQL).as_posix() for p in SQL.rglob("*.sql")
                     if "mailq.FilterSuppressedRecipients(" in code_only(p.read_text(encoding="utf-8"))
                     and p.name != "mailq.FilterSuppressedRecipients.sql")
    # enqueue, the sweep, and RequeueMail (the one way a finished mail goes back to UnSent)
    assert callers == sorted([FILES["core"], "procedures/mailq.ApplySuppressions.sql",
                              "procedures/mailq.RequeueMail.sql"])
    assert BARE["core"].count("mailq.FilterSuppressedRecipients(") == 1
    for key in ("single", "batch"):
        assert "Suppress" not in BARE[key], key


def test_the_suppression_rule_runs_last_under_the_key_locks_inside_the_transaction():
    core = BARE["core"]
    at = core.index("mailq.FilterSuppressedRecipients(")
    # a retried key finds its mail first; nothing is written before the refusal
    assert core.index("BEGIN TRANSACTION") < core.index("sys.sp_getapplock") \
        < core.index("INNER JOIN mailq.MailQueue AS q WITH (FORCESEEK)") < at \
        < core.index("SET @Bad = (SELECT COUNT(*)", at) < core.index("THROW @Err, @Msg, 1;", at) \
        < core.index("INSERT INTO mailq.MailQueue")
    statement = core[core.rindex("UPDATE w", 0, at):core.index(";", at)]
    assert "IIF(f.EntriesLeft = 0, 50600, NULL)" in statement
    # only a row that passed every other rule and would create a mail (not a key's follower, not a returned mail)
    assert "WHERE w.ErrorNumber IS NULL AND w.MailID IS NULL AND (w.KeyLeader IS NULL OR w.KeySeq IS NOT NULL)" \
        in " ".join(statement.split())
    # the followers of a refused key leader inherit its rule (the statement after it)
    assert core.index("f.ErrorNumber = l.ErrorNumber", at) < core.index("SET @Bad = (SELECT COUNT(*)", at)


def test_the_enqueue_and_the_sweep_cannot_miss_each_other():
    """The enqueue keeps shared key-range locks on the addresses to its commit;
    the sweep writes the suppression before it reads the queue."""
    fn = code_only((SQL / "functions/mailq.FilterSuppressedRecipients.sql").read_text(encoding="utf-8"))
    assert "FROM mailq.Suppression AS s WITH (HOLDLOCK)" in fn
    sweep = code_only((SQL / "procedures/mailq.ApplySuppressions.sql").read_text(encoding="utf-8"))
    assert sweep.index("INSERT INTO mailq.Suppression (") < sweep.index("FROM mailq.MailQueue AS q WITH (UPDLOCK")
    for key in ("single", "batch", "core"):
        order = TEXT[key][TEXT[key].index("Lock order:"):]
        assert order.index("application lock") < order.index("mailq.Suppression") < order.index("mailq.MailQueue"), key


def test_a_mail_with_suppressed_recipients_gets_its_event_after_enqueued():
    core = CODE["core"]
    start = core.index("INSERT INTO mailq.MailEvent")
    statement = core[start:core.index(";", start)]
    assert core.count("INSERT INTO mailq.MailEvent") == 1 and "FROM @Inserted AS i" in statement
    assert "(1, N'Enqueued', NULL), (2, N'RecipientSuppressed'," in statement
    assert "WHERE e.EventNo = 1 OR w.Suppressed IS NOT NULL" in statement
    assert "ORDER BY i.MailID, e.EventNo" in statement
    assert "| 50600 |" in ERRORS_MD and "50600" in ENQUEUE_MD


# -- M6: UpsertSendingAccount changes only what it is given --------------------


def test_upsert_sending_account_keeps_what_it_is_not_given():
    optional = {n: d for n, (_, d) in params(UPSERT).items() if n != "AccountName"}
    assert set(optional.values()) == {"NULL"}, optional
    for column in ("DefaultFromAddress", "DefaultFromName", "PerMinuteLimit", "PerHourLimit", "PerDayLimit",
                   "IsDefault", "MinLoginIntervalMs"):
        assert re.search(rf"COALESCE\((?:LTRIM\(RTRIM\()?@{column}(?:\)\))?, a\.{column}\)", UPSERT), column
    # the previous default stops being it only when this call makes another the default
    assert re.search(r"IF @IsDefault = 1\s+UPDATE a\s+SET a\.IsDefault = 0", UPSERT)
    assert UPSERT.index("THROW 50504") < UPSERT.index("BEGIN TRANSACTION")
    assert UPSERT.index("THROW 50503") < UPSERT.index("UPDATE a")


# -- the batch's JSON input -------------------------------------------------------


def test_json_times_go_through_datetimeoffset_so_an_offset_is_converted_not_dropped():
    code = " ".join(CODE["json"].split())
    assert "VALUES (TRY_CONVERT(DATETIMEOFFSET(3), f.DateToProcess, 127), TRY_CONVERT(DATETIMEOFFSET(3), " \
           "f.ExpiresAtUtc, 127))" in code
    for column in ("Due", "Expires"):
        # years 2-9998 only: SWITCHOFFSET at either end of the range could raise for the whole batch
        assert (f"SWITCHOFFSET(IIF(YEAR(t.{column}) BETWEEN 2 AND 9998, t.{column}, NULL), N'+00:00')" in code), column
    assert "YEAR(TRY_CONVERT(DATETIMEOFFSET(3), k.[value], 127)) BETWEEN 2 AND 9998" in code   # 50223 agrees
    assert "IIF(k.[type] = 2 AND TRY_CONVERT(INT, k.[value]) IS NOT NULL, NULL," in code       # numbers, not strings


def test_the_size_cap_comes_before_any_parsing_and_covers_both_inputs():
    batch = CODE["batch"]
    assert batch.index("SET @Bytes = DATALENGTH(@Mails);") < batch.index("IF @Bytes <= 268435456") \
        < batch.index("ISJSON(@Mails)")
    assert "COALESCE(DATALENGTH(r.Attachments), 0)" in batch and batch.count("THROW 50226") == 1
    assert "LEFT(LTRIM(TRANSLATE(LEFT(@Mails, 4000), NCHAR(9) + NCHAR(10) + NCHAR(13), N'   ')), 1) <> N'['" in batch


# -- sizes and headers ----------------------------------------------------------


def test_the_enqueue_path_is_at_most_half_of_the_two_copies_it_replaced():
    lines = sum(len(t.splitlines()) for t in TEXT.values())
    assert lines <= 890, lines   # EnqueueMail 737 + EnqueueMailBatch 1,043 before


OTHER = ["procedures/mailq.UpsertSendingAccount.sql", "procedures/mailq.SetEnqueuePolicy.sql",
         "procedures/mailq.GetEnqueuePolicy.sql", "tables/mailq.EnqueuePolicy.sql"]


@pytest.mark.parametrize("rel", list(FILES.values()) + OTHER)
def test_headers_are_contracts_of_10_to_30_lines(rel):
    text = (SQL / rel).read_text(encoding="utf-8")
    header = text[:text.index("*/")]
    assert 10 <= len(header.splitlines()) <= 30, len(header.splitlines())
    assert not re.search(r"\b(issue|revision) \d", header, re.I)   # a contract, not history


def test_headers_state_transaction_isolation_and_lock_order():
    for key in ("single", "batch", "core"):
        for line in ("Transaction:", "Isolation:", "Lock order:", "Errors:", "Example:"):
            assert line in TEXT[key], (key, line)


# -- the Python wrappers (fake cursor: formatting only) -------------------------


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


def test_tvp_rows_follow_the_type_column_order():
    value = procedures._batch_tvp([dict(to_address="a@x.org", subject="s", body="b", priority=9)])
    assert value[:2] == ["MailBatchRow", "mailq"]
    row = dict(zip(["RowNo", *FIELDS], value[2]))
    assert row["RowNo"] == 1 and row["ToAddress"] == "a@x.org" and row["Priority"] == 9


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
    sql, sent = conn.cursor_.executed
    assert sql == procedures.ENQUEUE_BATCH_SQL and sent[1] == 1
    assert [m["ToAddress"] for m in json.loads(sent[0])] == ["a@x.org"] * 3
    assert result.mail_ids == [101, 55]
    assert result.enqueued[1] == procedures.BatchEnqueued(3, 55, "<b@x>", False)
    assert result.rejected == [procedures.BatchRejected(2, "Priority", 50109, "Priority ...")]


def test_upsert_sending_account_sends_null_for_what_it_is_not_given():
    conn = FakeConn([])
    procedures.upsert_sending_account(conn, account_name="qq", per_minute_limit=30)
    sql, sent = conn.cursor_.executed
    assert sql == procedures.UPSERT_ACCOUNT_SQL
    assert list(sent) == ["qq", None, None, 30, None, None, None, None, None]
    procedures.upsert_sending_account(conn, account_name="qq", is_default=False,
                                      clear=["PerHourLimit", "MinLoginIntervalMs"])
    assert list(conn.cursor_.executed[1])[6:] == [0, None, "PerHourLimit,MinLoginIntervalMs"]
    with pytest.raises(ValueError, match="DefaultFromAddress"):
        procedures.upsert_sending_account(conn, account_name="qq", clear=["DefaultFromAddress"])


def test_enqueue_policy_wrappers():
    conn = FakeConn([])
    procedures.set_enqueue_policy(conn, allow_unmapped_enqueuers=True)
    assert conn.cursor_.executed == (procedures.SET_ENQUEUE_POLICY_SQL, (1,))
    when = datetime(2030, 1, 1)
    conn = FakeConn([[(False, when, "sa", True)], [("app_user", "MailqEnqueuer"), ("dbo", "dbo")]])
    policy = procedures.get_enqueue_policy(conn)
    assert policy == procedures.EnqueuePolicy(False, when, "sa", True,
                                              [("app_user", "MailqEnqueuer"), ("dbo", "dbo")])


def test_error_classes():
    error = class_for(50220)(50220, "Row 17, field ToAddress, rule 50102: ToAddress: address 'x@' has no "
                                    "local part or no domain. Nothing was queued.")
    assert isinstance(error, BatchRowError) and isinstance(error, InvalidInputError)
    assert (error.row, error.field, error.rule) == (17, "ToAddress", 50102)
    assert class_for(50225) is IdempotencyKeyBusyError
    for number in (50221, 50222, 50224, 50501, 50503, 50504):
        assert class_for(number) is InvalidInputError
    assert class_for(50500) is SenderNotAllowedError and class_for(50502) is SenderNotAllowedError


def test_every_role_that_may_enqueue_may_also_enqueue_a_batch():
    """`mailq-db enqueue --batch` needs EXECUTE on EnqueueMailBatch and on its table type:
    every role granted EnqueueMail gets both (else the batch path fails with 229)."""
    grants = "\n".join(strip_comments((SQL / rel).read_text(encoding="utf-8"))
                       for rel in build_order() if rel.endswith(".grants.sql"))
    single = set(re.findall(r"GRANT EXECUTE ON OBJECT::mailq\.EnqueueMail TO (\w+);", grants))
    batch = set(re.findall(r"GRANT EXECUTE ON OBJECT::mailq\.EnqueueMailBatch TO (\w+);", grants))
    rowtype = set(re.findall(r"GRANT EXECUTE ON TYPE::mailq\.MailBatchRow TO (\w+);", grants))
    assert {"MailqEnqueuer", "MailqAdmin"} <= single
    assert single <= batch and single <= rowtype, (single, batch, rowtype)
