"""Database Mail compatibility against SQL Server 2022 (issues 17 and 25).

* SendDbMail fails as msdb does: msdb's message and return code, nothing
  queued, the caller's transaction open and committable (XACT_STATE() = 1).
* @query through the runner (mailq_db.dbmail.runner), as the sender's
  database user, and the reading's five questions about this design.
* sysmail_event_log has one error row for a mail whose query failed.
"""

from __future__ import annotations

import pytest

from mailq_helpers import execute, new_account, query, scalar, unique
from mailq_db import procedures
from mailq_db.connection import connect
from mailq_db.dbmail import runner
from mailq_db.procedures import _DRIVER_ERRORS


@pytest.fixture(scope="module")
def setup(conn, mssql_url):
    account = new_account(conn, "dbm", from_address="sql@example.org", from_name="SQL Server")
    profile = unique("Ops")
    procedures.upsert_db_mail_profile(conn, profile_name=profile, description="alerts")
    procedures.upsert_db_mail_profile_account(conn, profile_name=profile, account_name=account, sequence_number=1)
    procedures.upsert_db_mail_principal_profile(conn, profile_name=profile, principal_name="public", is_default=True)
    execute(conn, "IF OBJECT_ID(N'dbo.People') IS NULL CREATE TABLE dbo.People (id INT NULL, name NVARCHAR(10) NULL);")
    execute(conn, "DELETE FROM dbo.People; INSERT INTO dbo.People (id, name) VALUES (1, N'alice'), (22, N'李雷');")
    return {"account": account, "profile": profile, "url": mssql_url}


def run_queries(setup) -> int:
    control = connect(setup["url"])
    try:
        return runner.run_forever(control, lambda: connect(setup["url"]), once=True, driver_errors=_DRIVER_ERRORS)
    finally:
        control.close()


def rc_and_state(conn, call: str) -> tuple:
    """Run a SendDbMail call inside an open transaction; its return code,
    XACT_STATE() after it and the error it raised, without aborting."""
    rows = query(conn, f"""
        SET NOCOUNT ON;
        DECLARE @rc INT, @n INT = (SELECT COUNT(*) FROM mailq.DbMailItem);
        BEGIN TRANSACTION;
        BEGIN TRY
            EXEC @rc = mailq.SendDbMail {call};
        END TRY
        BEGIN CATCH
            SELECT -1 AS rc, XACT_STATE() AS xs, ERROR_NUMBER() AS num, 0 AS added;
            ROLLBACK;
            RETURN;
        END CATCH;
        DECLARE @xs INT = XACT_STATE();
        ROLLBACK;
        SELECT @rc, @xs, 0, (SELECT COUNT(*) FROM mailq.DbMailItem) - @n;""")
    return tuple(rows[-1])


@pytest.mark.parametrize("call,number,rc", [
    ("@body = N'x'", 14624, 20),
    ("@recipients = 'a@example.org'", 14624, 19),
    ("@recipients = 'a@example.org', @body = N'x', @importance = 'urgent'", 14622, 16),
    ("@recipients = 'a@example.org', @body = N'x', @importance = NULL", 14618, 15),
    ("@recipients = 'a@example.org', @body = N'x', @body_format = 'RTF'", 14626, 13),
    ("@recipients = 'a@example.org, b@example.org', @body = N'x'", 14613, 1),
    ("@recipients = 'a@example.org', @body = N'x', @profile_name = N'no such profile'", 14607, 1),
    ("@recipients = 'a@example.org', @attach_query_result_as_file = 1, @body = N'x'", 14625, 21),
    ("@recipients = 'a@example.org', @body = N'x', @file_attachments = N'C:\\x.txt'", 50000, 50641),
])
def test_refusals_return_msdbs_code_and_leave_the_transaction_usable(conn, setup, call, number, rc):
    # RAISERROR inside TRY goes to CATCH: XACT_STATE() must still be 1 there.
    got_rc, xs, num, added = rc_and_state(conn, call)
    assert (got_rc, num, xs) in ((-1, number, 1), (rc, 0, 1))
    assert added == 0


def test_the_return_code_reaches_if_rc_without_try(conn, setup):
    rows = query(conn, """
        SET NOCOUNT ON; DECLARE @rc INT;
        BEGIN TRANSACTION;
        EXEC @rc = mailq.SendDbMail @body = N'x';
        SELECT @rc AS rc, XACT_STATE() AS xs;
        ROLLBACK;""")
    assert tuple(rows[-1]) == (20, 1)


def test_positional_call_binds_as_msdb(conn, setup):
    # msdb order: profile, recipients, cc, bcc, subject, body, ...
    execute(conn, f"EXEC mailq.SendDbMail N'{setup['profile']}', 'to@example.org', NULL, NULL, N'Subj', N'Body';")
    assert scalar(conn, "SELECT TOP (1) Subject FROM mailq.MailQueue ORDER BY ID DESC;") == "Subj"


@pytest.mark.parametrize("lists", [dict(copy_recipients="cc@example.org"),
                                   dict(blind_copy_recipients="bcc@example.org")])
def test_cc_only_and_bcc_only_mail_is_queued_as_msdb_queues_it(conn, setup, lists):
    sent = procedures.send_db_mail(conn, subject="s", body="b", **lists)
    row = query(conn, "SELECT ToAddress, CC, BCC FROM mailq.MailQueue WHERE ID = ?;", sent.mail_id)[0]
    assert tuple(row) == ("", lists.get("copy_recipients"), lists.get("blind_copy_recipients"))
    assert scalar(conn, "SELECT recipients FROM mailq.sysmail_allitems WHERE mailitem_id = ?;",
                  sent.mailitem_id) is None


def send(conn, **kw):
    kw.setdefault("recipients", "to@example.org")
    return procedures.send_db_mail(conn, **kw)


def body_of(conn, mail_id):
    return scalar(conn, "SELECT Body FROM mailq.MailQueue WHERE ID = ?;", mail_id)


def test_query_mail_waits_for_the_runner_then_carries_the_result(conn, setup):
    sent = send(conn, body="People:", query="SELECT id, name FROM dbo.People ORDER BY id;")
    assert scalar(conn, "SELECT YEAR(VisibleAtUtc) FROM mailq.MailQueue WHERE ID = ?;", sent.mail_id) == 9000
    assert run_queries(setup) >= 1
    assert body_of(conn, sent.mail_id) == (
        "People:\r\nid          name      \r\n----------- ----------\r\n          1 alice     \r\n"
        "         22 李雷        \r\n\r\n(2 rows affected)\r\n")


def test_q1_a_query_error_never_touches_the_callers_transaction(conn, setup):
    rows = query(conn, """
        SET NOCOUNT ON; DECLARE @rc INT;
        BEGIN TRANSACTION;
        EXEC @rc = mailq.SendDbMail @recipients = 'to@example.org', @query = N'SELECT 1/0 AS x',
            @append_query_error = 1;
        SELECT @rc AS rc, XACT_STATE() AS xs;
        COMMIT;""")
    assert tuple(rows[-1]) == (0, 1)
    run_queries(setup)
    failed = send(conn, query="SELECT 1/0 AS x")
    run_queries(setup)
    assert scalar(conn, "SELECT Status FROM mailq.MailQueue WHERE ID = ?;", failed.mail_id) == "Stopped"
    assert query(conn, "SELECT event_type FROM mailq.sysmail_event_log WHERE mailitem_id = ?;",
                 failed.mailitem_id) == [("error",)]


def test_q2_nocount_temp_tables_insert_exec_and_print(conn, setup):
    sent = send(conn, query=("SET NOCOUNT ON; CREATE TABLE #d (n INT); INSERT #d EXEC (N'SELECT 7');"
                             " PRINT 'Report'; SELECT n FROM #d;"))
    run_queries(setup)
    assert body_of(conn, sent.mail_id) == "\r\nReport\r\nn          \r\n-----------\r\n          7\r\n"


def test_q3_no_truncate_keeps_headers_and_width_cuts_lines(conn, setup):
    sent = send(conn, query="SELECT REPLICATE(N'x', 300) AS v;", query_no_truncate=True, query_result_width=100)
    run_queries(setup)
    lines = body_of(conn, sent.mail_id).split("\r\n")
    assert lines[1] == "v" + " " * 99 and lines[3] == "x" * 100


def test_q4_the_query_runs_in_the_mailq_database(conn, setup):
    sent = send(conn, query="SET NOCOUNT ON; SELECT DB_NAME() AS d;", query_result_header=False)
    run_queries(setup)
    assert scalar(conn, "SELECT DB_NAME();") in body_of(conn, sent.mail_id)


def test_q5_attachment_encodings(conn, setup):
    text = send(conn, query="SELECT N'名前' AS n;", attach_query_result_as_file=True)
    csv = send(conn, query="SELECT N'名前' AS n;", attach_query_result_as_file=True, query_result_format="CSV")
    run_queries(setup)
    rows = dict(query(conn, "SELECT MailID, Content FROM mailq.MailAttachment WHERE MailID IN (?, ?);",
                      text.mail_id, csv.mail_id))
    assert bytes(rows[text.mail_id])[:2] == b"\xff\xfe"
    assert bytes(rows[csv.mail_id]).startswith("\ufeffn\r\n名前\r\n".encode("utf-8"))


def test_views_are_unicode(conn, setup):
    sent = send(conn, subject="李雷", body="正文")
    assert query(conn, "SELECT subject, body FROM mailq.sysmail_allitems WHERE mailitem_id = ?;",
                 sent.mailitem_id) == [("李雷", "正文")]


def test_an_error_among_the_rows_keeps_the_rows_before_it(conn, setup):
    # The divide by zero comes with the second row: the first is mailed, then the error.
    sent = send(conn, query="SELECT v, 10 / v AS q FROM (VALUES (1), (0)) AS t(v);", append_query_error=True)
    run_queries(setup)
    body = body_of(conn, sent.mail_id)
    assert "          1          10" in body and "Msg 8134" in body
    assert body.index("          1          10") < body.index("Msg 8134")


def test_sql_variant_and_clr_types_fail_only_their_mail(conn, setup):
    ok = send(conn, query="SELECT SERVERPROPERTY('ProductMajorVersion') AS v;")  # sql_variant (pyodbc >= 5.2)
    clr = send(conn, query="SELECT hierarchyid::GetRoot() AS h;")
    after = send(conn, query="SELECT 1 AS n;")
    assert run_queries(setup) >= 3  # the runner went on after each
    assert scalar(conn, "SELECT Status FROM mailq.MailQueue WHERE ID = ?;", ok.mail_id) == "UnSent"
    assert scalar(conn, "SELECT QueryError FROM mailq.DbMailItem WHERE MailID = ?;", clr.mail_id).startswith(
        "column 1 of the result is a CLR type")
    assert "(1 row affected)" in body_of(conn, after.mail_id)


def test_server_level_data_is_what_a_database_user_sees(conn, setup):
    """docs/database-mail.md section 3: the query runs as the sender's database
    user, so sys.databases shows master, tempdb and this database only, even
    to a login that sees every database itself (VIEW ANY DATABASE, public)."""
    login = unique("dbmrep")
    execute(conn, f"CREATE LOGIN [{login}] WITH PASSWORD = N'{unique('Pw-')}Aa1!', CHECK_POLICY = OFF; "
                  f"CREATE USER [{login}] FOR LOGIN [{login}]; ALTER ROLE MailqDbMailUser ADD MEMBER [{login}];")
    try:
        own = {r[0] for r in query(conn, f"EXECUTE AS LOGIN = N'{login}'; "
                                         "SELECT name FROM sys.databases; REVERT;")}
        assert "msdb" in own  # the login itself sees every database
        mail_id = query(conn, f"""
            SET NOCOUNT ON; DECLARE @id BIGINT;
            EXECUTE AS USER = N'{login}';
            EXEC mailq.SendDbMail @recipients = 'to@example.org', @query_result_header = 0,
                @query = N'SET NOCOUNT ON; SELECT name FROM sys.databases;', @mailq_mail_id = @id OUTPUT;
            REVERT;
            SELECT @id;""")[-1][0]
        run_queries(setup)
        mailed = {line.strip() for line in body_of(conn, mail_id).split("\r\n") if line.strip()}
        assert mailed == {"master", "tempdb", scalar(conn, "SELECT DB_NAME();")}
    finally:
        execute(conn, f"DROP USER [{login}]; DROP LOGIN [{login}];")


def _documented_view_columns():
    """The (name, type) lists tests/static/test_dbmail_views.py reads from Microsoft's pages."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "static" / "test_dbmail_views.py"
    spec = importlib.util.spec_from_file_location("dbmail_view_lists", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return {"sysmail_allitems": module.ALLITEMS, "sysmail_sentitems": module.ALLITEMS,
            "sysmail_unsentitems": module.ALLITEMS, "sysmail_faileditems": module.ALLITEMS,
            "sysmail_event_log": module.EVENT_LOG}


@pytest.mark.parametrize("view,documented", list(_documented_view_columns().items()))
def test_sysmail_view_types_are_the_documented_ones(conn, view, documented):
    """The types SQL Server reports for each column: msdb's names in msdb's
    order, Unicode text (sysname is nvarchar(128) with user type sysname)."""
    rows = query(conn, "SELECT name, system_type_name, user_type_name FROM sys.dm_exec_describe_first_result_set("
                       "?, NULL, 0) ORDER BY column_ordinal;", f"SELECT * FROM mailq.{view};")
    assert [r[0] for r in rows] == [name for name, _ in documented]
    for (name, system_type, _user_type), (_, expected) in zip(rows, documented, strict=True):
        if expected == "sysname":
            assert system_type in ("nvarchar(128)", "sysname"), (name, system_type)
        elif expected == "nvarchar":  # the page gives no length (the queue's lists are nvarchar(4000))
            assert system_type.startswith("nvarchar("), (name, system_type)
        else:
            assert system_type == expected, (name, system_type, expected)
