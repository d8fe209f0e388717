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
  the full script allow-lists the dispatcher task after creating it, and the
  downgrade removes the entry before dropping the procedure;
* registration is for db_owner only (no grant), and the dispatcher task is
  granted to nobody.
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
TASK = SQL / "broker" / "mailq.HookDispatcherTask.sql"
START = SQL / "broker" / "mailq.StartHookDispatcher.sql"


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
    # dbo-owned schema, no other owner, the pin
    assert re.search(r"@SchemaOwner <> 1 OR COALESCE\(@ObjectOwner, 1\) <> 1", text)
    assert "HASHBYTES('SHA2_256', OBJECT_DEFINITION(@ObjectId))" in text


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
    for absent in ("mailq.HookDispatcherTask", "mailq.StartHookDispatcher", "mailq.HookDispatcher ",
                   "dbo.InitiateDelayExecution", "delay.AllowProcedure"):
        assert absent not in off, absent
    # and nothing outside sql/broker/ names delayed execution's objects
    for path in SQL.rglob("*.sql"):
        if path.parent.name == "broker":
            continue
        text = code(path)
        assert "InitiateDelayExecution" not in text and "delay." not in text, path


def test_the_full_script_lists_the_task_after_creating_it():
    full = (GOLDEN / "upgrade-head.sql").read_text(encoding="utf-8")
    created = full.index("CREATE OR ALTER PROCEDURE mailq.HookDispatcherTask")
    listed = full.index("EXEC delay.AllowProcedure @ProcedureName = N'mailq.HookDispatcherTask'")
    assert created < listed < full.index("CREATE OR ALTER PROCEDURE mailq.StartHookDispatcher")
    down = (GOLDEN / "downgrade-head-base.sql").read_text(encoding="utf-8")
    assert (down.index("EXEC delay.DisallowProcedure @ProcedureName = N'mailq.HookDispatcherTask'")
            < down.index("DROP PROCEDURE IF EXISTS mailq.HookDispatcherTask"))


def test_the_task_re_arms_before_it_steps_out_and_steps_back_in():
    text = code(TASK)
    rearm = text.index("EXEC dbo.InitiateDelayExecution")
    commit = text.index("COMMIT TRANSACTION")
    run = text.index("EXEC mailq.RunApplicationHooks")
    begin = text.index("BEGIN TRANSACTION", run)
    assert rearm < commit < run < begin
    assert "@IdempotencyKey = @Key" in text
    assert re.search(r"IF @Enabled = 1 AND @Generation = @Current", text)
    # the dispatcher's own error is noted, never re-raised (no THROW after the step-out)
    assert "THROW" not in text[commit:]
    start = code(START)
    assert "@IdempotencyKey = @Key" in start
    assert re.search(r"TaskState IN \(N'Scheduled', N'Running', N'Retrying'\)", start)


def test_grants():
    everything = "\n".join(strip_comments(p.read_text(encoding="utf-8")) for p in SQL.rglob("*.sql"))
    assert not re.search(r"GRANT\s+EXECUTE\s+ON\s+OBJECT::mailq\.SetApplicationHook", everything)
    assert not re.search(r"GRANT\s+EXECUTE\s+ON\s+OBJECT::mailq\.HookDispatcherTask", everything)
    assert re.search(r"GRANT EXECUTE ON OBJECT::mailq\.RunApplicationHooks TO MailqAdmin;", everything)
    assert re.search(r"GRANT EXECUTE ON OBJECT::mailq\.StartHookDispatcher TO MailqAdmin;", everything)


def test_the_baseline_allow_lists_the_dispatcher_after_creating_it():
    frozen = (ROOT / "alembic" / "frozen" / "0001" / "FILES").read_text(encoding="utf-8").split()
    assert "broker/mailq.HookDispatcherTask.allow.sql" in frozen
    assert frozen.index("broker/mailq.HookDispatcherTask.sql") < frozen.index("broker/mailq.HookDispatcherTask.allow.sql")
