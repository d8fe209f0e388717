"""Per-application hooks against SQL Server 2022 (issue 16, point 1; docs/hooks.md).

* Registration: a hook with the documented signature in a dbo-owned schema is
  registered and pinned; a missing procedure (50291), a wrong or extra
  parameter (50293), a schema owned by another user (50292), an unknown
  application (50290) are refused and change nothing.
* Dispatch: each event is passed once, in order; the cursor moves in the
  hook's transaction (a hook's row and the cursor commit together).
* @StopMail = 1 on a 5.1.1 bounce stops the mail (Stopped, its event, no more
  attempts); on a final mail nothing happens.
* Poison: a hook that throws is retried MaxAttempts times across runs, then
  the event is recorded in mailq.ApplicationHookFailure and the later events
  are passed; a hook that dooms its transaction, one that leaves a
  transaction open (266) and one that commits ours (266, not retried) are
  handled the same way, and the dispatcher itself never fails.
* Pin: an ALTER of the hook suspends it (no call, cursor kept) until it is
  re-registered.
* Never inside an acknowledgement: inside an open transaction the dispatcher
  refuses (50296); an acknowledgement never waits on a hook (a hook blocked on
  a lock does not delay MarkSent of another mail).
* Least privilege (issue 23): hooks run as MailqRunner, never dbo; the
  registration grants it EXECUTE, removal revokes it.
* Delayed execution: StartHookDispatcher starts (and re-times) the one
  dispatcher row; the readers run the hooks; stop ends it.
"""

from __future__ import annotations

import time

import pytest

from mailq_helpers import (
    claim,
    enqueue,
    execute,
    expect_error,
    new_account,
    new_app,
    query,
    scalar,
)
from mailq_db import procedures
from mailq_db.errors import InvalidInputError

pytestmark = pytest.mark.integration

SIGNATURE = """
    @EventID BIGINT, @MailID BIGINT, @AppName NVARCHAR(128), @EventType NVARCHAR(32),
    @Status NVARCHAR(16), @SmtpCode INT, @Detail NVARCHAR(4000),
    @StopMail BIT OUTPUT, @StopReason NVARCHAR(4000) OUTPUT"""


def make_hook(conn, name: str, body: str, schema: str = "dbo") -> str:
    execute(conn, f"CREATE OR ALTER PROCEDURE {schema}.{name} {SIGNATURE} AS BEGIN SET NOCOUNT ON; {body} END;")
    return f"{schema}.{name}"


@pytest.fixture(scope="module")
def account(conn) -> str:
    return new_account(conn, "hooks")


@pytest.fixture(scope="module", autouse=True)
def seen_table(conn):
    execute(conn, "IF OBJECT_ID(N'dbo.HookSeen', N'U') IS NULL CREATE TABLE dbo.HookSeen ("
                  "EventID BIGINT NOT NULL, MailID BIGINT NOT NULL, EventType NVARCHAR(32) NOT NULL);")


def seen(conn, app: str) -> list[tuple]:
    return query(conn, "SELECT s.EventType FROM dbo.HookSeen AS s INNER JOIN mailq.MailQueue AS q "
                       "ON q.ID = s.MailID WHERE q.AppName = ? ORDER BY s.EventID", app)


def hook_row(conn, app: str) -> dict:
    return procedures.list_application_hooks(conn, app_name=app)[0]


def test_registration_checks_and_pins(conn):
    app = new_app(conn, "hookreg")
    good = make_hook(conn, "HookGood", "INSERT INTO dbo.HookSeen VALUES (@EventID, @MailID, @EventType);")
    reg = procedures.set_application_hook(conn, app_name=app, hook_procedure=good)
    assert reg.hook_procedure == "[dbo].[HookGood]" and reg.changed
    assert hook_row(conn, app)["Pinned"]

    expect_error(50290, procedures.set_application_hook, conn, app_name="no such app", hook_procedure=good,
                 cls=InvalidInputError)
    expect_error(50291, procedures.set_application_hook, conn, app_name=app, hook_procedure="dbo.NoSuchHook",
                 cls=InvalidInputError)
    execute(conn, "CREATE OR ALTER PROCEDURE dbo.HookWrongType @EventID INT, @MailID BIGINT, @AppName NVARCHAR(128), "
                  "@EventType NVARCHAR(32), @Status NVARCHAR(16), @SmtpCode INT, @Detail NVARCHAR(4000), "
                  "@StopMail BIT OUTPUT, @StopReason NVARCHAR(4000) OUTPUT AS RETURN;")
    err = expect_error(50293, procedures.set_application_hook, conn, app_name=app,
                       hook_procedure="dbo.HookWrongType", cls=InvalidInputError)
    assert "@EventID" in err.message
    execute(conn, f"CREATE OR ALTER PROCEDURE dbo.HookExtra {SIGNATURE}, @Extra INT = 0 AS RETURN;")
    expect_error(50293, procedures.set_application_hook, conn, app_name=app, hook_procedure="dbo.HookExtra",
                 cls=InvalidInputError)
    execute(conn, "IF USER_ID(N'hook_owner') IS NULL CREATE USER hook_owner WITHOUT LOGIN;")
    execute(conn, "IF SCHEMA_ID(N'hookother') IS NULL EXEC (N'CREATE SCHEMA hookother AUTHORIZATION hook_owner');")
    make_hook(conn, "HookElsewhere", "RETURN;", schema="hookother")
    expect_error(50292, procedures.set_application_hook, conn, app_name=app,
                 hook_procedure="hookother.HookElsewhere", cls=InvalidInputError)
    # every refusal changed nothing
    assert hook_row(conn, app)["HookProcedure"] == "[dbo].[HookGood]"

    removed = procedures.set_application_hook(conn, app_name=app, hook_procedure=None)
    assert removed.hook_procedure is None and removed.changed
    assert procedures.set_application_hook(conn, app_name=app, hook_procedure=None).changed is False


def test_events_are_passed_once_in_order_and_the_cursor_follows(conn, account):
    app = new_app(conn, "hookorder")
    hook = make_hook(conn, "HookRecord", "INSERT INTO dbo.HookSeen VALUES (@EventID, @MailID, @EventType);")
    procedures.set_application_hook(conn, app_name=app, hook_procedure=hook)
    mails = enqueue(conn, account, app, n=3)
    runs = procedures.run_application_hooks(conn, max_events=500)
    mine = [r for r in runs if r.app_name == app][0]
    assert (mine.calls, mine.succeeded, mine.state) == (3, 3, "UpToDate")
    assert [r[0] for r in seen(conn, app)] == ["Enqueued"] * 3
    # a second run passes nothing again
    procedures.run_application_hooks(conn, max_events=500)
    assert len(seen(conn, app)) == 3
    assert hook_row(conn, app)["CursorEventID"] == mine.cursor_event_id
    assert {m.mail_id for m in mails} == {r[0] for r in query(
        conn, "SELECT s.MailID FROM dbo.HookSeen AS s INNER JOIN mailq.MailQueue AS q ON q.ID = s.MailID "
              "WHERE q.AppName = ?", app)}


def test_a_hook_stops_a_mail_on_a_511_bounce(conn, account):
    app = new_app(conn, "hookstop")
    hook = make_hook(conn, "HookStop511", """
        IF @EventType = N'RetryScheduled' AND @Detail LIKE N'%5.1.1%'
            SELECT @StopMail = 1, @StopReason = CONCAT(N'5.1.1 bounce: ', @Detail);""")
    procedures.set_application_hook(conn, app_name=app, hook_procedure=hook)
    [mail] = enqueue(conn, account, app, n=1)
    token, _ = claim(conn, app)
    procedures.mark_failed(conn, ids=[mail.mail_id], lock_token=token, disposition="Retry",
                           smtp_code=550, error="550 5.1.1 user unknown")
    procedures.run_application_hooks(conn)
    assert scalar(conn, "SELECT Status FROM mailq.MailQueue WHERE ID = ?", mail.mail_id) == "Stopped"
    kinds = [e.event_type for e in procedures.get_mail_events(conn, mail_id=mail.mail_id)]
    assert kinds[-1] == "Stopped"


@pytest.mark.parametrize("body, given_up_at_once", [
    ("THROW 50999, N'hook fails', 1;", False),
    ("SET XACT_ABORT ON; SELECT 1 / 0;", False),             # dooms the transaction
    ("BEGIN TRANSACTION; INSERT INTO dbo.HookSeen VALUES (@EventID, @MailID, @EventType);", False),  # 266, open
    ("COMMIT TRANSACTION;", True),                          # 266, ended ours: not called again
])
def test_a_poisoned_event_is_given_up_and_the_later_ones_pass(conn, account, body, given_up_at_once):
    app = new_app(conn, "hookpoison")
    poison = make_hook(conn, "HookPoison", f"IF @EventID = (SELECT MIN(e.EventID) FROM (SELECT CAST(EventSeq AS BIGINT) "
                                          f"AS EventID FROM mailq.MailEvent WHERE AppName = @AppName) AS e) BEGIN {body} END; "
                                          "ELSE INSERT INTO dbo.HookSeen VALUES (@EventID, @MailID, @EventType);")
    procedures.set_application_hook(conn, app_name=app, hook_procedure=poison, max_attempts=3)
    enqueue(conn, account, app, n=2)
    for _ in range(1 if given_up_at_once else 3):
        procedures.run_application_hooks(conn)
    failures = query(conn, "SELECT Attempts FROM mailq.ApplicationHookFailure WHERE AppName = ?", app)
    assert failures == [(1 if given_up_at_once else 3,)]
    procedures.run_application_hooks(conn)
    assert len(seen(conn, app)) == 1  # the second event passed
    assert scalar(conn, "SELECT @@TRANCOUNT") == 0


def test_an_altered_hook_is_suspended_until_re_registered(conn, account):
    app = new_app(conn, "hookpin")
    hook = make_hook(conn, "HookPinned", "INSERT INTO dbo.HookSeen VALUES (@EventID, @MailID, @EventType);")
    procedures.set_application_hook(conn, app_name=app, hook_procedure=hook)
    make_hook(conn, "HookPinned", "INSERT INTO dbo.HookSeen VALUES (@EventID, @MailID, N'changed');")
    enqueue(conn, account, app, n=1)
    runs = [r for r in procedures.run_application_hooks(conn) if r.app_name == app]
    assert runs[0].state == "Suspended" and seen(conn, app) == []
    assert not hook_row(conn, app)["Pinned"]
    procedures.set_application_hook(conn, app_name=app, hook_procedure=hook)
    procedures.run_application_hooks(conn)
    assert [r[0] for r in seen(conn, app)] == ["changed"]


def test_the_dispatcher_refuses_an_open_transaction(conn):
    execute(conn, "BEGIN TRANSACTION;")
    try:
        expect_error(50296, procedures.run_application_hooks, conn, cls=InvalidInputError)
    finally:
        execute(conn, "IF @@TRANCOUNT > 0 ROLLBACK;")


def test_hooks_run_as_mailqrunner_not_dbo(conn, account):
    """Issue 23 point 3: the one least-privilege mechanism of delayed targets and hooks."""
    execute(conn, "IF OBJECT_ID(N'dbo.HookWho', N'U') IS NULL CREATE TABLE dbo.HookWho ("
                  "EventID BIGINT, UserName SYSNAME, IsDbOwner INT, DynamicDenied INT);")
    app = new_app(conn, "hookwho")
    hook = make_hook(conn, "HookWho", """
        DECLARE @Denied INT = 0;
        BEGIN TRY EXEC (N'SELECT TOP (0) * FROM mailq.MailQueue'); END TRY BEGIN CATCH SET @Denied = 1; END CATCH;
        INSERT INTO dbo.HookWho VALUES (@EventID, USER_NAME(), IS_MEMBER(N'db_owner'), @Denied);""")
    procedures.set_application_hook(conn, app_name=app, hook_procedure=hook)
    granted = ("SELECT COUNT(*) FROM sys.database_permissions WHERE grantee_principal_id = "
               "DATABASE_PRINCIPAL_ID(N'MailqRunner') AND major_id = OBJECT_ID(N'dbo.HookWho') "
               "AND permission_name = N'EXECUTE' AND state = 'G'")
    assert scalar(conn, granted) == 1
    enqueue(conn, account, app, n=1)
    procedures.run_application_hooks(conn)
    assert query(conn, "SELECT UserName, IsDbOwner, DynamicDenied FROM dbo.HookWho") == [("MailqRunner", 0, 1)]
    assert scalar(conn, "SELECT USER_NAME()") == "dbo"     # reverted after the call
    procedures.set_application_hook(conn, app_name=app, hook_procedure=None)
    assert scalar(conn, granted) == 0


def test_the_delayed_dispatcher_runs_hooks_on_the_readers(conn, account):
    if scalar(conn, "SELECT OBJECT_ID(N'mailq.StartHookDispatcher')") is None:
        pytest.skip("delayed execution is not deployed in this database")
    app = new_app(conn, "hookdelay")
    hook = make_hook(conn, "HookDelayed", "INSERT INTO dbo.HookSeen VALUES (@EventID, @MailID, @EventType);")
    procedures.set_application_hook(conn, app_name=app, hook_procedure=hook)
    first = procedures.start_hook_dispatcher(conn, interval_seconds=1)
    again = procedures.start_hook_dispatcher(conn, interval_seconds=2)   # re-timed, still one dispatcher
    assert first["Enabled"] and again["IntervalSeconds"] == 2
    assert scalar(conn, "SELECT COUNT(*) FROM mailq.HookDispatcher") == 1
    enqueue(conn, account, app, n=1)
    deadline = time.monotonic() + 60
    while not seen(conn, app) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert [r[0] for r in seen(conn, app)] == ["Enqueued"]
    state = procedures.start_hook_dispatcher(conn, enabled=False)
    assert not state["Enabled"] and state["LastRunAtUtc"] is not None and state["LastError"] is None
    # no task of delay.Task stands for the dispatcher any more
    assert scalar(conn, "SELECT COUNT(*) FROM delay.Task WHERE TargetName LIKE N'%Hook%'") == 0
