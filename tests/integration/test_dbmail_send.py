"""Database Mail compatibility against SQL Server 2022 (issue 17).

* mailq.SendDbMail maps every sp_send_dbmail parameter onto the queued mail:
  recipients, Cc, Bcc, From ('Name <address>'), Reply-To, subject (default
  'SQL Server Message'), body, TEXT/HTML, importance and sensitivity headers,
  @mailitem_id = the queue's ID, return code 0; @file_attachments and bad
  values are refused with their numbers, and nothing is queued.
* Profiles: the named profile's first unblocked account (failover), the
  default public profile, a principal's own default, a private profile
  refused to a user without a grant.
* @query: the text format (header, dashes, padding, right-aligned numbers,
  '(n rows affected)'), without header, without padding, with a separator,
  wrapped at @query_result_width, as an attachment, in another database,
  failing with and without @append_query_error, the HTML and CSV extension,
  and a caller without rights to the queried table (refused, as the caller).
* The sysmail_* views show the mail with Database Mail's columns and statuses.
* Inside a caller's transaction that rolls back, nothing is queued.
"""

from __future__ import annotations

import json
from contextlib import contextmanager

import pytest

from mailq_helpers import exec_proc, execute, expect_error, new_account, query, scalar, unique
from mailq_db import procedures
from mailq_db.errors import InvalidInputError, MailStateError

CRLF = "\r\n"


@pytest.fixture(scope="module")
def setup(conn):
    """One account, a profile 'Ops<id>' made the default public profile, and a small table."""
    account = new_account(conn, "dbm", from_address="sql@example.org", from_name="SQL Server")
    profile = unique("Ops")
    procedures.upsert_db_mail_profile(conn, profile_name=profile, description="alerts")
    procedures.upsert_db_mail_profile_account(conn, profile_name=profile, account_name=account, sequence_number=1)
    procedures.upsert_db_mail_principal_profile(conn, profile_name=profile, principal_name="public", is_default=True)
    execute(conn, "IF OBJECT_ID(N'dbo.People') IS NULL CREATE TABLE dbo.People (id INT NULL, name NVARCHAR(10) NULL);")
    execute(conn, "DELETE FROM dbo.People; INSERT INTO dbo.People (id, name) VALUES (1, N'alice'), (22, N'李雷');")
    return {"account": account, "profile": profile}


def send(conn, **params) -> int:
    params.setdefault("recipients", "to@example.org")
    return procedures.send_db_mail(conn, **params)


def mail_row(conn, mail_id: int) -> dict:
    """The queued mail's message columns, by name."""
    cursor = conn.cursor()
    try:
        cursor.execute(
            "SELECT ToAddress, CC, BCC, FromAddress, FromName, ReplyTo, Subject, Body, BodyFormat, Headers,"
            " AccountName, Status FROM mailq.MailQueue WHERE ID = ?;", mail_id)
        row = cursor.fetchone()
        return {d[0]: v for d, v in zip(cursor.description, row)}
    finally:
        cursor.close()


def body_of(conn, mail_id: int) -> str:
    return mail_row(conn, mail_id)["Body"]


def people(**params) -> dict:
    return {"query": "SELECT id, name FROM dbo.People ORDER BY id;", **params}


@contextmanager
def as_user(conn, user: str):
    execute(conn, f"EXECUTE AS USER = N'{user}';")
    try:
        yield
    finally:
        execute(conn, "REVERT;")


# --------------------------------------------------------------------------
# Parameters
# --------------------------------------------------------------------------


def test_every_message_parameter_reaches_the_mail(conn, setup):
    mail_id = send(
        conn, profile_name=setup["profile"], recipients="a@example.org; b@example.org",
        copy_recipients="c@example.org", blind_copy_recipients="d@example.org",
        from_address="Reports <reports@example.org>", reply_to="dba@example.org",
        subject="Nightly", body="<b>done</b>", body_format="HTML", importance="High", sensitivity="Confidential",
    )
    row = mail_row(conn, mail_id)
    assert row["ToAddress"] == "a@example.org; b@example.org"
    assert (row["CC"], row["BCC"], row["ReplyTo"]) == ("c@example.org", "d@example.org", "dba@example.org")
    assert (row["FromAddress"], row["FromName"]) == ("reports@example.org", "Reports")
    assert (row["Subject"], row["Body"], row["BodyFormat"]) == ("Nightly", "<b>done</b>", "Html")
    assert row["AccountName"] == setup["account"]
    assert json.loads(row["Headers"]) == {
        "X-Priority": "1", "Priority": "urgent", "Importance": "high", "Sensitivity": "Company-Confidential",
    }


def test_defaults_are_database_mails(conn, setup):
    mail_id = send(conn, body="x")
    row = mail_row(conn, mail_id)
    assert row["Subject"] == "SQL Server Message"
    assert row["BodyFormat"] == "Text"
    assert row["Headers"] is None  # Normal importance and sensitivity write no header
    assert (row["FromAddress"], row["FromName"]) == ("sql@example.org", "SQL Server")
    low = mail_row(conn, send(conn, body="x", importance="low", sensitivity="Personal"))
    assert json.loads(low["Headers"]) == {
        "X-Priority": "5", "Priority": "non-urgent", "Importance": "low", "Sensitivity": "Personal",
    }


def test_return_code_outputs_and_message(conn, setup):
    rows = query(
        conn,
        "SET NOCOUNT ON; DECLARE @rc INT, @id INT, @big BIGINT;"
        " EXEC @rc = mailq.SendDbMail @recipients = 'x@example.org', @body = N'b',"
        " @mailitem_id = @id OUTPUT, @mailq_mail_id = @big OUTPUT;"
        " SELECT @rc, @id, @big;",
    )
    rc, mailitem_id, mail_id = rows[0]
    assert rc == 0 and mailitem_id == mail_id and mail_row(conn, mail_id) is not None


@pytest.mark.parametrize("params,number", [
    ({"file_attachments": r"C:\temp\a.txt"}, 50191),
    ({"recipients": None, "copy_recipients": "c@example.org"}, 50190),
    ({"recipients": ""}, 50190),
    ({"body_format": "RTF"}, 50192),
    ({"importance": "Urgent"}, 50192),
    ({"sensitivity": "Secret"}, 50192),
    ({"query": "SELECT 1 AS x;", "query_result_width": 9}, 50193),
    ({"query": "SELECT 1 AS x;", "query_result_width": 32768}, 50193),
    ({"query": "SELECT 1 AS x;", "query_result_no_padding": True, "query_no_truncate": True}, 50193),
    ({"query": "SELECT 1 AS x;", "query_result_format": "XML"}, 50193),
    ({"attach_query_result_as_file": True}, 50193),
    ({"query": "SELECT 1 AS x;", "execute_query_database": "no_such_db_xyz"}, 50194),
    ({"profile_name": "no such profile"}, 50250),
])
def test_refused_parameters_queue_nothing(conn, setup, params, number):
    before = scalar(conn, "SELECT COUNT(*) FROM mailq.MailQueue;")
    call = {"body": "b", **params}
    if "file_attachments" in call:
        # Not offered by the wrapper on purpose: call the procedure directly.
        err = expect_error(number, exec_proc, conn, "mailq.SendDbMail", recipients="x@example.org",
                           file_attachments=call["file_attachments"])
        assert "never reads" in err.message
    else:
        expect_error(number, send, conn, **call)
    assert scalar(conn, "SELECT COUNT(*) FROM mailq.MailQueue;") == before


def test_no_content_is_refused(conn, setup):
    expect_error(50197, exec_proc, conn, "mailq.SendDbMail", recipients="x@example.org")


def test_enqueue_mail_still_validates(conn, setup):
    expect_error(50102, send, conn, recipients="not-an-address", body="b")
    expect_error(50105, send, conn, subject="a\r\nBcc: evil@example.org", body="b")


def test_rolled_back_caller_transaction_queues_nothing(conn, setup):
    marker = unique("rollback")
    execute(conn, "BEGIN TRANSACTION; EXEC mailq.SendDbMail @recipients = 'x@example.org', @subject = ?;"
                  " ROLLBACK TRANSACTION;", marker)
    assert scalar(conn, "SELECT COUNT(*) FROM mailq.MailQueue WHERE Subject = ?;", marker) == 0


# --------------------------------------------------------------------------
# Profiles
# --------------------------------------------------------------------------


def test_failover_takes_the_first_unblocked_account(conn, setup):
    first, second = new_account(conn, "fo1"), new_account(conn, "fo2")
    profile = unique("Failover")
    procedures.upsert_db_mail_profile(conn, profile_name=profile)
    procedures.upsert_db_mail_profile_account(conn, profile_name=profile, account_name=second, sequence_number=2)
    procedures.upsert_db_mail_profile_account(conn, profile_name=profile, account_name=first, sequence_number=1)
    procedures.upsert_db_mail_principal_profile(conn, profile_name=profile, principal_name="public")
    assert mail_row(conn, send(conn, profile_name=profile, body="b"))["AccountName"] == first
    # Fast-forward: block the first account as MarkFailed @Disposition = 'Wait' would.
    execute(conn, "UPDATE mailq.SendingAccount SET BlockedUntilUtc = DATEADD(HOUR, 1, SYSUTCDATETIME())"
                  " WHERE AccountName = ?;", first)
    assert mail_row(conn, send(conn, profile_name=profile, body="b"))["AccountName"] == second
    execute(conn, "UPDATE mailq.SendingAccount SET BlockedUntilUtc = DATEADD(HOUR, 1, SYSUTCDATETIME())"
                  " WHERE AccountName = ?;", second)
    assert mail_row(conn, send(conn, profile_name=profile, body="b"))["AccountName"] == first  # all blocked
    procedures.unblock_sending_account(conn, account_name=first)
    procedures.unblock_sending_account(conn, account_name=second)


def test_empty_profile_and_management_errors(conn, setup):
    empty = unique("Empty")
    procedures.upsert_db_mail_profile(conn, profile_name=empty)
    procedures.upsert_db_mail_principal_profile(conn, profile_name=empty, principal_name="public")
    expect_error(50252, send, conn, profile_name=empty, body="b", cls=MailStateError)
    expect_error(50253, procedures.upsert_db_mail_profile_account, conn, profile_name=empty,
                 account_name="no such account", sequence_number=1)
    expect_error(50254, procedures.upsert_db_mail_principal_profile, conn, profile_name=empty,
                 principal_name="no_such_user")
    expect_error(50198, procedures.upsert_db_mail_profile_account, conn, profile_name=empty,
                 account_name=setup["account"], sequence_number=-1, cls=InvalidInputError)
    procedures.delete_db_mail_profile(conn, profile_name=empty)
    expect_error(50250, procedures.delete_db_mail_profile, conn, profile_name=empty)


@pytest.fixture(scope="module")
def low_user(conn, setup):
    """A user without login, member of MailqDbMailUser only, with SELECT on dbo.People only."""
    user = unique("dbmuser")
    execute(conn, f"CREATE USER [{user}] WITHOUT LOGIN; ALTER ROLE MailqDbMailUser ADD MEMBER [{user}];"
                  f" GRANT SELECT ON dbo.People TO [{user}];")
    execute(conn, "IF OBJECT_ID(N'dbo.Secret') IS NULL CREATE TABLE dbo.Secret (pin INT NOT NULL);"
                  " DELETE FROM dbo.Secret; INSERT INTO dbo.Secret (pin) VALUES (4711);")
    return user


def test_private_profile_needs_a_grant_and_a_principal_default_wins(conn, setup, low_user):
    private = unique("Private")
    procedures.upsert_db_mail_profile(conn, profile_name=private)
    procedures.upsert_db_mail_profile_account(conn, profile_name=private, account_name=setup["account"],
                                              sequence_number=1)
    with as_user(conn, low_user):
        expect_error(50251, send, conn, profile_name=private, body="b", cls=MailStateError)
    procedures.upsert_db_mail_principal_profile(conn, profile_name=private, principal_name=low_user, is_default=True)
    with as_user(conn, low_user):
        mail_id = send(conn, body="b")  # no profile: the user's own default
    assert scalar(conn, "SELECT ProfileID FROM mailq.DbMailItem WHERE MailID = ?;", mail_id) == scalar(
        conn, "SELECT ProfileID FROM mailq.DbMailProfile WHERE ProfileName = ?;", private)
    procedures.delete_db_mail_principal_profile(conn, profile_name=private, principal_name=low_user)


# --------------------------------------------------------------------------
# @query
# --------------------------------------------------------------------------


def test_text_format_header_padding_alignment_and_count(conn, setup):
    body = body_of(conn, send(conn, body="Report:", **people()))
    # id INT: width 11 (sqlcmd's display width), numbers right-aligned;
    # name NVARCHAR(10): width 10, left-aligned; separator ' '.
    expected = CRLF.join([
        "Report:",
        "id          name      ",
        "----------- ----------",
        "          1 alice     ",
        "         22 李雷        ",
        "",
        "(2 rows affected)",
    ])
    assert body == expected


def test_text_format_options(conn, setup):
    no_header = body_of(conn, send(conn, **people(query_result_header=False)))
    assert no_header.split(CRLF)[0] == "          1 alice     "
    bare = body_of(conn, send(conn, **people(query_result_no_padding=True, query_result_separator=",")))
    assert bare.split(CRLF)[:4] == ["id,name", "--,----", "1,alice", "22,李雷"]
    wrapped = body_of(conn, send(conn, **people(query_result_width=10)))
    lines = wrapped.split(CRLF)
    assert lines[0] == "id        " and lines[1] == "  name      "[:10]  # 22 characters cut every 10
    assert all(len(line) <= 10 for line in lines[:-1])  # the '(n rows affected)' line is not wrapped
    one = body_of(conn, send(conn, query="SELECT TOP (1) id FROM dbo.People ORDER BY id;"))
    assert one.endswith("(1 row affected)")
    nulls = body_of(conn, send(conn, query="SELECT CAST(NULL AS INT) AS n, CAST(NULL AS NVARCHAR(2)) AS s;"))
    assert nulls.split(CRLF)[2] == "       NULL NULL"


def test_no_truncate_keeps_long_values_and_has_no_header(conn, setup):
    q = "SELECT REPLICATE(CONVERT(NVARCHAR(MAX), N'x'), 300) AS v;"
    cut = body_of(conn, send(conn, query=q, query_result_width=1000))
    assert cut.split(CRLF)[2] == "x" * 256
    whole = body_of(conn, send(conn, query=q, query_no_truncate=True, query_result_width=1000))
    assert whole.split(CRLF)[0] == "x" * 300  # no header, as documented


def test_result_as_attachment(conn, setup):
    mail_id = send(conn, body="see attachment", attach_query_result_as_file=True,
                   query_attachment_filename="people.txt", **people())
    assert body_of(conn, mail_id) == "see attachment"
    name, ctype, content = query(
        conn, "SELECT FileName, ContentType, Content FROM mailq.MailAttachment WHERE MailID = ?;", mail_id)[0]
    assert (name, ctype) == ("people.txt", "text/plain; charset=utf-8")
    assert content.decode("utf-8").startswith("id          name      \r\n")
    default_name = send(conn, attach_query_result_as_file=True, **people())
    assert scalar(conn, "SELECT FileName FROM mailq.MailAttachment WHERE MailID = ?;", default_name) == \
        "QueryResults.txt"


def test_query_in_another_database(conn, setup, fresh_database):
    other_url = fresh_database(deploy=False, broker=False)
    other = other_url.split("/")[-1].split("?")[0]
    from mailq_helpers import connection

    with connection(other_url) as oc:
        execute(oc, "CREATE TABLE dbo.Elsewhere (v INT NOT NULL); INSERT INTO dbo.Elsewhere (v) VALUES (42);")
    body = body_of(conn, send(conn, query="SELECT v FROM dbo.Elsewhere;", execute_query_database=other))
    assert body.split(CRLF)[2] == "         42"
    assert scalar(conn, "SELECT ExecuteQueryDatabase FROM mailq.DbMailItem d JOIN mailq.MailQueue q"
                        " ON q.ID = d.MailID WHERE q.Body = ?;", body) == other


def test_query_error_without_and_with_append_query_error(conn, setup):
    before = scalar(conn, "SELECT COUNT(*) FROM mailq.MailQueue;")
    err = expect_error(50195, send, conn, query="SELECT x FROM dbo.NoSuchTable;")
    assert "NoSuchTable" in err.message
    assert scalar(conn, "SELECT COUNT(*) FROM mailq.MailQueue;") == before
    body = body_of(conn, send(conn, body="b", query="SELECT x FROM dbo.NoSuchTable;", append_query_error=True))
    assert "Msg 208" in body and "NoSuchTable" in body
    runtime = body_of(conn, send(conn, query="SELECT 1 / 0 AS x;", append_query_error=True))
    assert "Msg 8134" in runtime  # divide by zero, raised while running, not while describing


def test_html_and_csv_extension(conn, setup):
    execute(conn, "INSERT INTO dbo.People (id, name) VALUES (3, N'<a&\"b>');")
    try:
        html = body_of(conn, send(conn, body_format="HTML", query_result_format="HTML", **people()))
        assert "<tr><th>id</th><th>name</th></tr>" in html
        assert "<tr><td>3</td><td>&lt;a&amp;&quot;b&gt;</td></tr>" in html
        csv = body_of(conn, send(conn, query_result_format="CSV",
                                 query="SELECT id, name FROM dbo.People WHERE id IN (1, 3) ORDER BY id;"))
        assert csv == CRLF.join(["id,name", "1,alice", '3,"<a&""b>"', ""])
    finally:
        execute(conn, "DELETE FROM dbo.People WHERE id = 3;")


def test_caller_without_rights_to_the_table_gets_nothing(conn, setup, low_user):
    # sa (db_owner) reads dbo.Secret; the user, whose SendDbMail runs in the
    # owner's procedure, must not: the query runs with the caller's rights.
    assert "4711" in body_of(conn, send(conn, query="SELECT pin FROM dbo.Secret;"))
    with as_user(conn, low_user):
        err = expect_error(50195, send, conn, query="SELECT pin FROM dbo.Secret;")
        mail_id = send(conn, query="SELECT pin FROM dbo.Secret;", append_query_error=True)
        allowed = send(conn, query="SELECT name FROM dbo.People WHERE id = 1;")
    assert "denied" in err.message.lower() or "invalid object" in err.message.lower()
    body = body_of(conn, mail_id)  # read back as sa: the user has no right to the queue's tables
    assert "4711" not in body and ("denied" in body.lower() or "invalid object" in body.lower())
    assert "alice" in body_of(conn, allowed)


# --------------------------------------------------------------------------
# Views
# --------------------------------------------------------------------------


def test_sysmail_views_show_database_mails_columns(conn, setup):
    mail_id = send(conn, subject=unique("view"), body="b", importance="High", **people())
    cols = [r[0] for r in query(conn, "SELECT name FROM sys.columns WHERE object_id = OBJECT_ID(N'mailq.sysmail_allitems')"
                                      " ORDER BY column_id;")]
    assert cols[:3] == ["mailitem_id", "profile_id", "recipients"] and cols[-1] == "last_mod_user"
    row = query(conn, "SELECT sent_status, importance, query_result_width, send_request_user"
                      " FROM mailq.sysmail_unsentitems WHERE mailitem_id = ?;", mail_id)
    assert row and row[0][:3] == ("unsent", "HIGH", 256) and row[0][3]
    procedures.cancel_mail(conn, mail_id=mail_id)
    assert scalar(conn, "SELECT sent_status FROM mailq.sysmail_faileditems WHERE mailitem_id = ?;", mail_id) == "failed"
    assert scalar(conn, "SELECT COUNT(*) FROM mailq.sysmail_sentitems WHERE mailitem_id = ?;", mail_id) == 0
    types = dict(query(conn, "SELECT c.name, TYPE_NAME(c.user_type_id) FROM sys.columns AS c"
                             " WHERE c.object_id = OBJECT_ID(N'mailq.sysmail_event_log');"))
    assert types["log_id"] == "int" and types["event_type"] == "varchar" and types["log_date"] == "datetime"


def _documented_columns():
    """The documented (name, type) lists kept in tests/static/test_dbmail_views.py."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "static" / "test_dbmail_views.py"
    spec = importlib.util.spec_from_file_location("dbmail_views_doc", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.ALLITEMS, module.EVENT_LOG


@pytest.mark.parametrize("view", ["sysmail_allitems", "sysmail_sentitems", "sysmail_unsentitems",
                                  "sysmail_faileditems", "sysmail_event_log"])
def test_sysmail_view_types_are_the_documented_ones(conn, view):
    allitems, event_log = _documented_columns()
    documented = event_log if view == "sysmail_event_log" else allitems
    rows = query(
        conn,
        "SELECT c.name, TYPE_NAME(c.user_type_id),"
        " CASE WHEN c.max_length = -1 THEN N'max'"
        "      WHEN TYPE_NAME(c.user_type_id) IN (N'nvarchar', N'nchar') THEN CAST(c.max_length / 2 AS NVARCHAR(10))"
        "      ELSE CAST(c.max_length AS NVARCHAR(10)) END"
        " FROM sys.columns AS c WHERE c.object_id = OBJECT_ID(?) ORDER BY c.column_id;",
        f"mailq.{view}",
    )
    actual = [(name, f"{kind}({length})" if kind in ("varchar", "nvarchar", "char") else kind)
              for name, kind, length in rows]
    assert actual == documented
