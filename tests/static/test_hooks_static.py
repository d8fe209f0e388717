"""Per-application hooks (issue 16 point 1; docs/hooks.md),
checked without a server.  What the procedures do is tested against SQL
Server in tests/integration/test_mailq_hooks.py (skips here); these tests pin
the properties a reader could break without noticing:

* the hook signature is one thing: SetApplicationHook's check, the dispatcher's
  parameter list, the Python constant and the docs agree;
* the dispatcher never runs inside a caller's (an acknowledging) transaction,
  runs each call in its own transaction with the cursor in it, and handles
  doomed transactions and 266;
* no acknowledging procedure knows about hooks, and mailq.MailEvent gets no
  trigger;
* broker gating: the queue-only script (`-x broker=off`, Azure SQL Database)
  has the registration and the dispatcher but nothing of delayed execution;
  with delayed execution a reader runs the hooks when the hook run is due;
* registration is for db_owner only (no grant);
* hooks run as MailqRunner, never as dbo: registration grants EXECUTE on the
  hook to it, the call is wrapped in EXECUTE AS USER ... REVERT, and the pin is
  read again after the call in its transaction (the same ModifyDate).
"""

from __future__ import annotations

import re
from pathlib import Path

from mailq_db import procedures
from mailq_db.deployment import strip_comments

ROOT = Path(__file__).resolve().parents[2]
SQL = ROOT / "sql"
GOLDEN = ROOT / "tests" / "static" / "golden"
SET_HOOK = SQL / "procedures" / "mailq.SetApplicationHook.sql"
RUN_HOOKS = SQL / "procedures" / "mailq.RunApplicationHooks.sql"
START = SQL / "broker" / "mailq.StartHookDispatcher.sql"
DUE = SQL / "broker" / "delay.RunDueTasks.sql"


def code(path: Path) -> str:
    return strip_comments(path.read_text(encoding="utf-8"))


def _norm(declared: str) -> str:
    return re.sub(r"\s+", " ", declared.strip()).upper()


def test_the_signature_is_the_same_everywhere():
    expected = [(n, _norm(t)) for n, t in procedures.HOOK_SIGNATURE]
    # SetApplicationHook's VALUES: (ord, name, type, length, is_output, declared)
    checked = re.findall(r"\(\d+, N'(@\w+)', N'\w+', \d+, [01], N'([^']+)'\)", code(SET_HOOK))
    assert [(n, _norm(t)) for n, t in checked] == expected
    # the dispatcher's sp_executesql parameter list
    params = re.search(r"@ParameterList NVARCHAR\(400\) = (.*?);", code(RUN_HOOKS), re.S).group(1)
    declared = " ".join(re.findall(r"N'([^']*)'", params))
    assert [(n, _norm(t)) for n, t in re.findall(r"(@\w+) ([A-Z]+(?:\(\d+\))?(?: OUTPUT)?)", declared)] == expected
    # the documented signature
    docs = (ROOT / "docs" / "hooks.md").read_text(encoding="utf-8")
    for name, declared_type in procedures.HOOK_SIGNATURE:
        assert f"{name} {declared_type}" in docs, name
    # length in bytes = 2 x NVARCHAR length
    for name, type_name, length, declared in re.findall(
            r"\(\d+, N'(@\w+)', N'(\w+)', (\d+), [01], N'([^']+)'\)", code(SET_HOOK)):
        n = re.search(r"NVARCHAR\((\d+)\)", declared)
        if n:
            assert int(length) == 2 * int(n.group(1)), name


def test_the_signature_check_refuses_extra_parameters_and_reads_sys_parameters():
    text = code(SET_HOOK)
    assert "sys.parameters" in text
    assert "is not a hook parameter" in text
    assert re.search(r"p\.is_output <> e\.IsOutput", text)
    assert re.search(r"TYPE_NAME\(p\.user_type_id\) <> e\.TypeName", text)
    # dbo-owned schema, no other owner, the pin, the grant to the runner
    assert re.search(r"@SchemaOwner <> 1 OR COALESCE\(@ObjectOwner, 1\) <> 1", text)
    assert "HASHBYTES('SHA2_256', OBJECT_DEFINITION(@ObjectId))" in text
    assert "N' TO MailqRunner;'" in text and "N' FROM MailqRunner;'" in text


def test_hooks_run_as_mailqrunner_and_are_checked_after_the_call():
    text = code(RUN_HOOKS)
    call = text.index("EXEC sys.sp_executesql")
    execute_as = text.rindex("EXECUTE AS USER = N'MailqRunner';", 0, call)
    revert = text.index("REVERT;", call)
    assert re.fullmatch(r"\s*BEGIN TRY\s*", text[execute_as + len("EXECUTE AS USER = N'MailqRunner';"):
                                                  text.index("EXEC sys.sp_executesql", execute_as)])
    assert text.index("END CATCH;", call) < revert and "COOKIE" not in text
    # the pin before the call (ModifyDate) and after it, in the call's transaction
    before = text.rindex("FROM mailq.HookPin(@ObjectId, @SchemaName, @ProcedureName, @DefinitionHash)", 0, call)
    after = text.index("mailq.HookPin(@ObjectId, @SchemaName, @ProcedureName, @DefinitionHash)", revert)
    assert before < call < after and "WHERE p.ModifyDate = @Modified" in text[after:after + 200]
    assert "COMMIT" not in text[call:after]
    # the same SET line as delayed targets, with the hooks' 5 s lock timeout
    line = " ".join(re.findall(r"N'([^']*)'", re.search(r"SET @Sql = CONCAT\((.*?)\);", text, re.S).group(1)))
    for option in ("CONCAT_NULL_YIELDS_NULL ON;", "SET NUMERIC_ROUNDABORT OFF;", "SET XACT_ABORT OFF;",
                   "SET DEADLOCK_PRIORITY NORMAL;", "SET LOCK_TIMEOUT 5000;"):
        assert option in line, option


def test_the_dispatcher_refuses_a_caller_transaction_before_any_work():
    text = code(RUN_HOOKS)
    refuse = text.index("IF @@TRANCOUNT > 0")
    assert re.match(r"IF @@TRANCOUNT > 0\s+THROW 50296", text[refuse:])
    assert refuse < text.index("sp_getapplock") < text.index("BEGIN TRANSACTION")
    assert "WITH EXECUTE AS OWNER" in text


def test_each_call_has_its_own_transaction_with_the_cursor_in_it():
    text = code(RUN_HOOKS)
    start = text.index("EXEC sys.sp_executesql")
    begin = text.rindex("BEGIN TRANSACTION", 0, start)
    commit = text.index("COMMIT TRANSACTION", start)
    body = text[begin:commit]
    # the hook, the optional stop and the cursor between one BEGIN and its COMMIT
    assert "EXEC mailq.StopMail" in body
    assert re.search(r"h\.CursorEventID = @EventID", body)
    # guarded by the cursor it started from (a re-registration meanwhile undoes the call)
    assert re.search(r"h\.CursorEventID = @Cursor AND h\.ObjectId = @ObjectId", body)
    catch = text[commit:]
    assert re.search(r"BEGIN CATCH.*?@TranCountInCatch = @@TRANCOUNT.*?IF XACT_STATE\(\) <> 0 ROLLBACK TRANSACTION;",
                     catch, re.S)
    # 266 with nothing left open: given up at once (the hook's work may be committed)
    assert re.search(r"IF @ErrorNumber = 266 AND @TranCountInCatch = 0 SET @GiveUp = 1;", text)
    assert re.search(r"IF @Attempts >= @MaxAttempts SET @GiveUp = 1;", text)
    assert "INSERT INTO mailq.ApplicationHookFailure" in text


def test_the_dispatcher_reads_events_as_get_mail_events_does():
    text = code(RUN_HOOKS)
    bound = text.index("SET @Upper = MIN_ACTIVE_ROWVERSION();")
    read = text.index("FROM mailq.MailEvent AS e WITH (INDEX (IX_MailEvent_AppName), FORCESEEK, READCOMMITTEDLOCK)")
    assert bound < read
    assert "e.EventSeq < @Upper" in text[read:read + 300]


def test_hooks_stay_out_of_the_acknowledgement_path():
    for name in ("ClaimMail", "MarkSent", "MarkFailed", "FinalizeMail", "ReleaseMail", "ExtendLease",
                 "EnqueueMail", "EnqueueMailBatch", "StopMail", "LockLeasedMail"):
        text = code(SQL / "procedures" / f"mailq.{name}.sql")
        assert "ApplicationHook" not in text and "RunApplicationHooks" not in text, name
    for path in SQL.rglob("*.sql"):
        assert not re.search(r"CREATE\s+(OR\s+ALTER\s+)?TRIGGER\s+\S+\s+ON\s+mailq\.MailEvent", code(path), re.I), path


def test_the_queue_only_script_has_hooks_but_no_delayed_execution():
    off = strip_comments((GOLDEN / "upgrade-head-broker-off.sql").read_text(encoding="utf-8"))
    assert "CREATE OR ALTER PROCEDURE mailq.RunApplicationHooks" in off
    assert "CREATE OR ALTER PROCEDURE mailq.SetApplicationHook" in off
    for absent in ("mailq.StartHookDispatcher", "mailq.HookDispatcher ", "dbo.InitiateDelayExecution",
                   "delay.AllowProcedure", "delay.RunDueTasks"):
        assert absent not in off, absent
    # and nothing outside sql/broker/ names delayed execution's objects
    for path in SQL.rglob("*.sql"):
        if path.parent.name == "broker":
            continue
        text = code(path)
        assert "InitiateDelayExecution" not in text and "delay." not in text, path


def test_a_reader_runs_the_hooks_when_due_outside_any_transaction():
    text = code(DUE)
    claim = text.index("FROM mailq.HookDispatcher AS h WITH (READPAST, ROWLOCK)")
    run = text.index("EXEC mailq.RunApplicationHooks @MaxEvents = 1000, @Quiet = 1;")
    assert claim < run < text.index("BEGIN TRANSACTION")  # before the first claim's transaction
    assert "h.NextRunAtUtc <= @Now" in text[claim:run]
    start = code(START)
    assert "EXEC delay.ArmDispatcher @DueAtUtc = @Now;" in start and "THROW 50295" in start


def test_grants():
    everything = "\n".join(strip_comments(p.read_text(encoding="utf-8")) for p in SQL.rglob("*.sql"))
    assert not re.search(r"GRANT\s+EXECUTE\s+ON\s+OBJECT::mailq\.SetApplicationHook", everything)
    assert re.search(r"GRANT EXECUTE ON OBJECT::mailq\.RunApplicationHooks TO MailqAdmin;", everything)
    assert re.search(r"GRANT EXECUTE ON OBJECT::mailq\.StartHookDispatcher TO MailqAdmin;", everything)


def test_every_write_of_the_hook_row_names_the_hook_it_ran():
    """A hook re-registered by SetApplicationHook while the dispatcher runs gets a new ObjectId:
    no cursor, failure count or 'Suspended' note of the old procedure may land on it."""
    text = code(RUN_HOOKS)
    writes = re.findall(r"UPDATE h\s+SET(.*?)FROM mailq\.ApplicationHook AS h\s+WHERE ([^;]*);", text, re.S)
    assert len(writes) == 4, writes
    for _, where in writes:
        assert "h.AppName = @App" in where and "h.ObjectId = @ObjectId" in where, where


def test_the_suspended_note_lands_only_on_the_pin_it_checked():
    """ALTER PROCEDURE keeps the object_id, and the note itself says 'review it and run
    mailq.SetApplicationHook again': a re-registration of the altered hook keeps its ObjectId and
    changes its DefinitionHash (a rename keeps both and changes the name).  The 'Suspended' note
    of the run that found the old pin broken must not land on the new registration, which
    SetApplicationHook left with LastError NULL: its write names the whole pin the run checked."""
    text = code(RUN_HOOKS)
    suspended = re.search(r"UPDATE h\s+SET\s+h\.LastError = CONCAT\(N'Suspended: '.*?"
                          r"FROM mailq\.ApplicationHook AS h\s+WHERE ([^;]*);", text, re.S)
    assert suspended, "the one write of 'Suspended'"
    where = suspended.group(1)
    for key in ("h.AppName = @App", "h.ObjectId = @ObjectId", "h.DefinitionHash = @DefinitionHash",
                "h.SchemaName = @SchemaName", "h.ProcedureName = @ProcedureName"):
        assert key in where, (key, where)
