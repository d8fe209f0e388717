"""Issue 10, points 9 and 10 against SQL Server 2022: who may send as whom,
and what each role may do.

Roles (database users WITHOUT LOGIN, impersonated with EXECUTE AS USER):
* a MailqSender member (worker) cannot execute mailq.EnqueueMail (error 229);
* a MailqEnqueuer member cannot execute mailq.ClaimMail, mailq.MarkSent or
  mailq.BindApplication (229), and can enqueue;
* a MailqSender member sees GetInstallationHealth's DelayServiceQueue check
  as WARN "not visible" (least-privilege metadata visibility), not silently
  missing; sa sees it.
Bindings (mailq.BindApplication / UnbindApplication, EnqueueMail 50160/50161):
* an application that is bound to nothing cannot enqueue (50160);
* bound to the account but to no From: 50161;
* a domain binding ('@example.org') allows any address of that exact domain,
  case-insensitively, and not of a subdomain; an address binding allows that
  address only;
* unbinding the account refuses again (50160); mail without @AppName is not
  bound;
* bad binding input: 50164, 50165, 50115, 50114;
* a database user mapped to an application (BindApplication @PrincipalName)
  always enqueues as it: @AppName NULL means it, another is 50168, and the
  application's bindings apply; GetInstallationHealth warns about unmapped
  MailqEnqueuer members; roles cannot be mapped (50169).
GetInstallationHealth quotes names: a blocked account named with a quote gets
a Fix whose literal doubles it.
"""

from __future__ import annotations

import uuid

import pytest

from mailq_helpers import execute, expect_error, new_account, new_app, query, unique
from mailq_db import procedures

pytestmark = pytest.mark.integration

AS_USER = """
EXECUTE AS USER = N'{user}';
BEGIN TRY
    {statement}
    SELECT CAST(0 AS INT) AS Number;
END TRY
BEGIN CATCH
    SELECT ERROR_NUMBER() AS Number;
END CATCH;
REVERT;
"""


def run_as(conn, user: str, statement: str, *params) -> int:
    """The error number ``statement`` raised when run as ``user`` (0: it ran)."""
    cur = conn.cursor()
    cur.execute(AS_USER.format(user=user, statement=statement), *params)
    last = None
    while True:
        if cur.description:
            rows = cur.fetchall()
            if rows and len(rows[0]) == 1 and cur.description[0][0] == "Number":
                last = rows[0][0]
        if not cur.nextset():
            break
    cur.close()
    assert last is not None
    return last


@pytest.fixture(scope="module")
def users(conn):
    names = {}
    for role in ("MailqEnqueuer", "MailqSender"):
        user = unique(role.lower())
        execute(conn, f"CREATE USER [{user}] WITHOUT LOGIN; ALTER ROLE {role} ADD MEMBER [{user}];")
        names[role] = user
    return names


@pytest.fixture(scope="module")
def account(conn):
    return new_account(conn, "roles", from_address="noreply@example.org")


ENQUEUE = ("EXEC mailq.EnqueueMail @ToAddress = N'r@example.com', @Subject = N's', @Body = N'b', "
           "@AccountName = ?;")
CLAIM = "EXEC mailq.ClaimMail @BatchSize = 1, @LockToken = ?, @LeaseSeconds = 60;"


def test_the_worker_role_cannot_enqueue(conn, users, account):
    assert run_as(conn, users["MailqSender"], ENQUEUE, account) == 229


def test_the_enqueue_role_cannot_claim_acknowledge_or_bind(conn, users, account):
    assert run_as(conn, users["MailqEnqueuer"], CLAIM, str(uuid.uuid4())) == 229
    assert run_as(conn, users["MailqEnqueuer"],
                  "EXEC mailq.MarkSent @ID = 1, @LockToken = ?;", str(uuid.uuid4())) == 229
    assert run_as(conn, users["MailqEnqueuer"],
                  "EXEC mailq.BindApplication @AppName = N'x', @AccountName = ?;", account) == 229
    assert run_as(conn, users["MailqEnqueuer"], ENQUEUE, account) == 0


def test_least_privilege_health_says_what_it_cannot_see(conn, users):
    rows = query(conn, AS_USER.format(user=users["MailqSender"], statement="EXEC mailq.GetInstallationHealth;"))
    assert rows  # the first result set: the checks
    queue = [r for r in rows if r[1] == "DelayServiceQueue"]
    assert queue and queue[0][2] == "WARN" and "not visible" in queue[0][3], rows
    as_sa = [r for r in procedures.get_installation_health(conn) if r["CheckName"] == "DelayServiceQueue"]
    assert as_sa and as_sa[0]["Status"] == "OK"


def test_health_fix_text_quotes_account_names(conn):
    name = new_account(conn, "o'q")
    execute(conn, "UPDATE mailq.SendingAccount SET BlockedUntilUtc = DATEADD(HOUR, 1, SYSUTCDATETIME()), "
                  "BlockReason = N'test' WHERE AccountName = ?;", name)
    fix = [r["Fix"] for r in procedures.get_installation_health(conn) if r["CheckName"] == f"Blocked {name}"]
    assert fix and f"N'{name.replace(chr(39), chr(39) * 2)}'" in fix[0]
    procedures.unblock_sending_account(conn, account_name=name)


def enqueue_as(conn, app, account, from_address=None):
    return procedures.enqueue_mail(conn, to_address="r@example.com", subject="s", body="b",
                                   account_name=account, app_name=app, from_address=from_address)


def test_an_unbound_application_cannot_enqueue_until_bound(conn, account):
    app = new_app(conn, "unbound_app")
    expect_error(50160, lambda: enqueue_as(conn, app, account))
    procedures.bind_application(conn, app_name=app, account_name=account)
    expect_error(50161, lambda: enqueue_as(conn, app, account))                  # no From bound yet
    procedures.bind_application(conn, app_name=app, from_address="@Example.ORG")
    assert enqueue_as(conn, app, account).created                                # the account's default From
    assert enqueue_as(conn, app, account, "Billing@EXAMPLE.org").created         # case-insensitive
    expect_error(50161, lambda: enqueue_as(conn, app, account, "x@sub.example.org"))  # not a subdomain
    expect_error(50161, lambda: enqueue_as(conn, app, account, "x@example.com"))
    procedures.bind_application(conn, app_name=app, from_address="sales@shop.example.net")
    assert enqueue_as(conn, app, account, "sales@shop.example.net").created
    expect_error(50161, lambda: enqueue_as(conn, app, account, "other@shop.example.net"))
    procedures.bind_application(conn, app_name=app, account_name=account)        # binding twice: no change
    assert query(conn, "SELECT COUNT(*) FROM mailq.ApplicationAccount WHERE AppName = ?;", app)[0][0] == 1
    procedures.unbind_application(conn, app_name=app, account_name=account)
    expect_error(50160, lambda: enqueue_as(conn, app, account))
    assert enqueue_as(conn, None, account).created                               # no application: not bound


def test_bind_refuses_bad_input(conn, account):
    app = new_app(conn, "unbound_bad")
    expect_error(50164, lambda: procedures.bind_application(conn, app_name=app))
    expect_error(50165, lambda: procedures.bind_application(conn, app_name=app, from_address="not-an-address"))
    expect_error(50165, lambda: procedures.bind_application(conn, app_name=app, from_address="Name <a@b.org>"))
    expect_error(50115, lambda: procedures.bind_application(conn, app_name="no_such_app", account_name=account))
    expect_error(50114, lambda: procedures.bind_application(conn, app_name=app, account_name="no_such_account"))
    expect_error(50164, lambda: procedures.unbind_application(conn, app_name=app))


def test_a_mapped_database_user_always_enqueues_as_its_application(conn, account):
    user = unique("mapped")
    execute(conn, f"CREATE USER [{user}] WITHOUT LOGIN; ALTER ROLE MailqEnqueuer ADD MEMBER [{user}];")
    app, other = new_app(conn, "unbound_mapped"), new_app(conn, "unbound_other")
    unmapped = [r for r in procedures.get_installation_health(conn) if r["CheckName"] == "UnmappedEnqueuers"]
    assert unmapped and unmapped[0]["Status"] == "WARN"
    procedures.bind_application(conn, app_name=app, account_name=account, from_address="@example.org",
                                principal_name=user)
    subject = f"mapped {uuid.uuid4()}"
    sql = ("EXEC mailq.EnqueueMail @ToAddress = N'r@example.com', @Subject = ?, @Body = N'b', "
           "@AccountName = ?;")
    assert run_as(conn, user, sql, subject, account) == 0                  # @AppName NULL: the mapped one
    assert query(conn, "SELECT AppName FROM mailq.MailQueue WHERE Subject = ?;", subject) == [(app,)]
    assert run_as(conn, user, sql.replace("@AccountName = ?;", "@AccountName = ?, @AppName = ?;"),
                  subject, account, other) == 50168
    assert run_as(conn, user, sql.replace("@AccountName = ?;", "@AccountName = ?, @FromAddress = N'x@example.com';"),
                  subject, account) == 50161                              # the application's bindings apply
    expect_error(50169, lambda: procedures.bind_application(conn, app_name=app, principal_name="MailqEnqueuer"))
    procedures.unbind_application(conn, app_name=app, principal_name=user)
    assert run_as(conn, user, sql.replace("@AccountName = ?;", "@AccountName = ?, @AppName = ?;"),
                  subject, account, other) == 50160                       # unmapped: other is simply unbound
