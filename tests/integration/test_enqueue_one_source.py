"""One source of EnqueueMail's rules, and issue 24's enqueue-side points,
against SQL Server 2022 (skipped here without one: conftest.py).

* Issue 21 point 6 / queue reading M4: the same idempotency key once through
  mailq.EnqueueMail (T-SQL defaults omitted, or spelled out) and once through
  mailq.EnqueueMailBatch (JSON and table-valued parameter) is one mail, never
  50116; every bad-input case of test_mailq_bad_input gives the same number
  through a single call, a JSON batch row and a TVP batch row.
* L3: a row whose Attachments or Headers are not JSON rejects that row, never
  the batch (no 13609).
* L4: a session with legacy SET options enqueues (no 1934) and keeps its options.
* M3: a new installation refuses a database user mapped to no application
  (50500) through EnqueueMail, EnqueueMailBatch and SendDbMail, and writes
  nothing; mapping it, or the explicit opt-in, lets it enqueue; only db_owner
  and MailqAdmin set the policy; GetEnqueuePolicy and doctor name the user.
* M6: UpsertSendingAccount changes only what it is given; removing the
  default is explicit; without a default, enqueue without an account is 50114
  before anything is written.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

import pytest

from mailq_helpers import (
    DRIVER_ERRORS,
    assert_unchanged,
    connection,
    exec_proc,
    execute,
    expect_error,
    fingerprint,
    new_account,
    new_app,
    query,
    result_sets,
    scalar,
    unique,
)
from test_mailq_bad_input import ENQUEUE_CASES, enqueue_params

from mailq_db import procedures
from mailq_db.commands import doctor
from mailq_db.errors import BatchRowError, SenderNotAllowedError, from_driver_error

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def account(conn) -> str:
    return new_account(conn, "one")


def batch_row_from_params(params: dict[str, Any]) -> dict[str, Any]:
    """A JSON batch row with the values of an EnqueueMail call (times as ISO 8601)."""
    return {k: (v.isoformat() if isinstance(v, datetime) else v) for k, v in params.items() if v is not None}


TVP_BATCH = """
SET NOCOUNT ON;
DECLARE @R mailq.MailBatchRow;
INSERT INTO @R (RowNo, {columns}) VALUES (1, {marks});
EXEC mailq.EnqueueMailBatch @MailRows = @R, @RejectInvalid = 1;
"""


def tvp_batch(conn: Any, params: dict[str, Any]) -> list[list[tuple]]:
    names = [k for k, v in params.items() if v is not None]
    cursor = conn.cursor()
    cursor.execute(TVP_BATCH.format(columns=", ".join(names), marks=", ".join("?" * len(names))),
                   *[params[n] for n in names])
    return result_sets(cursor)


# -- one source: the same key through both paths is one mail --------------------


def test_a_key_used_once_by_each_path_is_one_mail(conn, account):
    """Queue reading M4: EnqueueMail's omitted defaults and a batch row's omitted
    fields hashed differently, so the second call got a false 50116."""
    key = unique("m4")
    cursor = conn.cursor()
    cursor.execute("SET NOCOUNT ON; DECLARE @ID BIGINT; EXEC mailq.EnqueueMail @ToAddress = N'a@example.org', "
                   "@Subject = N'S', @Body = N'B', @AccountName = ?, @IdempotencyKey = ?, @MailID = @ID OUTPUT; "
                   "SELECT @ID;", account, key)
    first = cursor.fetchone()[0]
    cursor.close()
    row = {"ToAddress": "a@example.org", "Subject": "S", "Body": "B", "AccountName": account, "IdempotencyKey": key}
    result = procedures.enqueue_mail_batch_json(conn, json.dumps([row]))
    assert [(r.mail_id, r.created) for r in result.enqueued] == [(first, False)]
    # the defaults spelled out, through the table-valued parameter
    sets = tvp_batch(conn, dict(row, Priority=5, MaxAttempts=5, BodyFormat="Text", RunMode="prod"))
    assert [(r[1], r[3]) for r in sets[0]] == [(first, False)] and sets[1] == []
    # the Python wrappers (single sends BodyFormat 'Text', the batch omits it)
    again = procedures.enqueue_mail(conn, to_address="a@example.org", subject="S", body="B",
                                    account_name=account, idempotency_key=key)
    assert (again.mail_id, again.created) == (first, False)
    assert scalar(conn, "SELECT COUNT_BIG(*) FROM mailq.MailQueue WHERE IdempotencyKey = ?;", key) == 1


def test_a_batch_first_then_a_single_call_with_the_default_account_spelled_out(conn, account):
    default = new_account(conn, "onedefault", from_address="default@example.org")
    procedures.upsert_sending_account(conn, account_name=default, is_default=True)
    key = unique("m4b")
    [row] = procedures.enqueue_mail_batch(conn, [dict(to_address="a@example.org", subject="S", body="B",
                                                      idempotency_key=key)]).enqueued
    single = procedures.enqueue_mail(conn, to_address="a@example.org", subject="S", body="B", account_name=default,
                                     from_address="default@example.org", priority=5, idempotency_key=key)
    assert (single.mail_id, single.created) == (row.mail_id, False)
    expect_error(50116, lambda: procedures.enqueue_mail(conn, to_address="a@example.org", subject="S", body="B",
                                                        priority=6, idempotency_key=key))


@pytest.mark.parametrize(("overrides", "number"), [c[1:] for c in ENQUEUE_CASES], ids=[c[0] for c in ENQUEUE_CASES])
def test_every_rule_gives_the_same_number_through_every_path(conn, account, overrides, number):
    params = enqueue_params(account, overrides)
    before = fingerprint(conn)
    expect_error(number, lambda: result_sets(exec_proc(conn, "mailq.EnqueueMail", **params)))
    row = batch_row_from_params(params)
    json_result = procedures.enqueue_mail_batch_json(conn, json.dumps([row]), reject_invalid=True)
    assert json_result.enqueued == [] and [r.error_number for r in json_result.rejected] == [number]
    tvp = tvp_batch(conn, params)
    assert tvp[0] == [] and [r[2] for r in tvp[1]] == [number]
    err = expect_error(50220, lambda: procedures.enqueue_mail_batch_json(conn, json.dumps([row])),
                       cls=BatchRowError)
    assert err.rule == number
    assert_unchanged(before, fingerprint(conn))


def test_a_lazy_attachment_is_accepted_by_both_paths_as_one_mail(conn, account):
    app = new_app(conn, "onelazy")
    key = unique("lazy")
    mail = dict(to_address="r@example.com", subject="s", body="b", account_name=account, app_name=app,
                idempotency_key=key, attachments=[procedures.LazyAttachment("r.csv", "csv", {"rows": 3})])
    [row] = procedures.enqueue_mail_batch(conn, [mail]).enqueued
    again = procedures.enqueue_mail(conn, **mail)
    assert (again.mail_id, again.created) == (row.mail_id, False)
    assert query(conn, "SELECT Generator FROM mailq.MailAttachment WHERE MailID = ?;", row.mail_id) == [("csv",)]


# -- L3: no JSON function fails a whole batch ----------------------------------


@pytest.mark.parametrize(("field", "value", "number"), [
    ("Attachments", ["x"], 50117),
    ("Attachments", [{"FileName": "a.txt", "ContentBase64": "not base64!"}], 50117),
    ("Attachments", "not json", 50117),
    ("Headers", "X-Order-Id: 42", 50106),
    ("Headers", {"X-Order-Id": 42}, 50106),
])
def test_one_row_with_bad_json_is_rejected_alone(conn, account, field, value, number):
    good = {"ToAddress": "a@example.org", "Subject": "S", "Body": "B", "AccountName": account}
    bad = dict(good, **{field: value})
    result = procedures.enqueue_mail_batch_json(conn, json.dumps([good, bad, good]), reject_invalid=True)
    assert [r.row_no for r in result.enqueued] == [1, 3]
    assert [(r.row_no, r.field, r.error_number) for r in result.rejected] == [(2, field, number)]


# -- L4: legacy SET options ------------------------------------------------------


LEGACY = ("SET ANSI_WARNINGS OFF; SET ANSI_PADDING OFF; SET CONCAT_NULL_YIELDS_NULL OFF; "
          "SET NUMERIC_ROUNDABORT ON; SET ARITHABORT OFF;")


def test_a_session_with_legacy_set_options_enqueues_and_keeps_its_options(mssql_url, account):
    with connection(mssql_url) as c:
        execute(c, LEGACY)
        mail = procedures.enqueue_mail(c, to_address="a@example.org", subject="legacy", body="B", account_name=account)
        assert mail.created
        rows = procedures.enqueue_mail_batch(c, [dict(to_address="b@example.org", subject="legacy", body="B",
                                                      account_name=account)] * 2)
        assert len(rows.mail_ids) == 2
        procedures.upsert_sending_account(c, account_name=account, per_minute_limit=600)
        options = query(c, "SELECT SESSIONPROPERTY('ANSI_WARNINGS'), SESSIONPROPERTY('ANSI_PADDING'), "
                           "SESSIONPROPERTY('CONCAT_NULL_YIELDS_NULL'), SESSIONPROPERTY('NUMERIC_ROUNDABORT');")
        assert [int(v) for v in options[0]] == [0, 0, 0, 1]   # the procedures' SETs reverted on return


# -- M3: who may send as whom fails closed ---------------------------------------


@pytest.fixture(scope="module")
def closed(fresh_database):
    """A new installation as deployed: no opt-in."""
    with connection(fresh_database(allow_unmapped_enqueuers=False)) as c:
        yield c


AS_USER = "EXECUTE AS USER = N'{user}'; BEGIN TRY {statement} END TRY BEGIN CATCH REVERT; THROW; END CATCH; REVERT;"


def as_user(conn: Any, user: str, statement: str, *params: Any) -> list[list[tuple]]:
    cursor = conn.cursor()
    try:
        cursor.execute(AS_USER.format(user=user, statement=statement), *params)
    except DRIVER_ERRORS as exc:
        raise from_driver_error(exc) from exc
    return result_sets(cursor)


ENQUEUE = ("EXEC mailq.EnqueueMail @ToAddress = N'r@example.com', @Subject = N'closed', @Body = N'b', "
           "@AccountName = ?{app};")


def test_a_new_installation_refuses_unmapped_enqueuers(closed):
    c = closed
    assert scalar(c, "SELECT AllowUnmappedEnqueuers FROM mailq.EnqueuePolicy;") in (0, False)
    account = new_account(c, "closed")
    app = new_app(c, "closed")
    user = unique("enq")
    execute(c, f"CREATE USER [{user}] WITHOUT LOGIN; ALTER ROLE MailqEnqueuer ADD MEMBER [{user}];")
    before = fingerprint(c)
    err = expect_error(50500, lambda: as_user(c, user, ENQUEUE.format(app=""), account), cls=SenderNotAllowedError)
    assert user in err.message and "mailq.BindApplication" in err.message and "@PrincipalName" in err.message
    expect_error(50500, lambda: as_user(c, user, ENQUEUE.format(app=", @AppName = ?"), account, app))
    rows = json.dumps([{"ToAddress": "r@example.com", "Subject": "s", "Body": "b", "AccountName": account}])
    err = expect_error(50220, lambda: as_user(c, user, "EXEC mailq.EnqueueMailBatch @Mails = ?;", rows),
                       cls=BatchRowError)
    assert err.rule == 50500
    expect_error(50500, lambda: procedures.enqueue_mail(c, to_address="r@example.com", subject="s", body="b",
                                                        account_name=account))   # sa is dbo: not mapped either
    assert_unchanged(before, fingerprint(c))
    # mapped: it enqueues, as its application
    procedures.bind_application(c, app_name=app, principal_name=user)
    as_user(c, user, ENQUEUE.format(app=""), account)
    assert query(c, "SELECT AppName FROM mailq.MailQueue WHERE Subject = N'closed';") == [(app,)]


def test_senddbmail_callers_go_through_the_same_rule(closed):
    c = closed
    account = new_account(c, "closeddbm")
    profile = unique("P")
    procedures.upsert_db_mail_profile(c, profile_name=profile)
    procedures.upsert_db_mail_profile_account(c, profile_name=profile, account_name=account, sequence_number=1)
    procedures.upsert_db_mail_principal_profile(c, profile_name=profile, principal_name="public", is_default=True)
    user = unique("dbm")
    execute(c, f"CREATE USER [{user}] WITHOUT LOGIN; ALTER ROLE MailqDbMailUser ADD MEMBER [{user}];")
    before = fingerprint(c)
    expect_error(50500, lambda: as_user(c, user, "EXEC mailq.SendDbMail @recipients = N'r@example.com', "
                                                 "@subject = N's', @body = N'b';"))
    assert_unchanged(before, fingerprint(c))


def test_only_db_owner_and_mailqadmin_open_the_policy_and_doctor_names_the_unmapped(closed):
    c = closed
    user, admin = unique("enqp"), unique("adm")
    execute(c, f"CREATE USER [{user}] WITHOUT LOGIN; ALTER ROLE MailqEnqueuer ADD MEMBER [{user}]; "
               f"GRANT EXECUTE ON OBJECT::mailq.SetEnqueuePolicy TO [{user}]; "
               f"CREATE USER [{admin}] WITHOUT LOGIN; ALTER ROLE MailqAdmin ADD MEMBER [{admin}];")
    expect_error(50502, lambda: as_user(c, user, "EXEC mailq.SetEnqueuePolicy @AllowUnmappedEnqueuers = 1;"))
    expect_error(50501, lambda: result_sets(exec_proc(c, "mailq.SetEnqueuePolicy", AllowUnmappedEnqueuers=None)))
    policy = procedures.get_enqueue_policy(c)
    assert policy.membership_visible and not policy.allow_unmapped_enqueuers
    assert (user, "MailqEnqueuer") in policy.unmapped and ("dbo", "dbo") in policy.unmapped
    checks = {ch.name: ch for ch in doctor.enqueue_policy_checks(c)}
    assert checks["Enqueue policy"].detail.startswith("closed")
    assert checks["Unmapped enqueuers"].status == "WARN" and user in checks["Unmapped enqueuers"].detail
    # a MailqSender member may not see memberships: said so, never OK
    sender = unique("snd")
    execute(c, f"CREATE USER [{sender}] WITHOUT LOGIN; ALTER ROLE MailqSender ADD MEMBER [{sender}];")
    [[row], _] = as_user(c, sender, "EXEC mailq.GetEnqueuePolicy;")
    assert row[3] in (0, False)
    # the administrator opens it; the unmapped user then enqueues unbound
    as_user(c, admin, "EXEC mailq.SetEnqueuePolicy @AllowUnmappedEnqueuers = 1;")
    account = new_account(c, "opened")
    as_user(c, user, ENQUEUE.format(app=", @FromAddress = N'anyone@example.net'"), account)
    assert scalar(c, "SELECT ChangedBy FROM mailq.EnqueuePolicy;") is not None
    procedures.set_enqueue_policy(c, allow_unmapped_enqueuers=False)
    expect_error(50500, lambda: as_user(c, user, ENQUEUE.format(app=""), account))


# -- M6: UpsertSendingAccount changes only what it is given ------------------------


def account_settings(conn, name: str) -> tuple:
    return query(conn, "SELECT DefaultFromAddress, DefaultFromName, PerMinuteLimit, PerHourLimit, PerDayLimit, "
                       "IsDefault, MinLoginIntervalMs FROM mailq.SendingAccount WHERE AccountName = ?;", name)[0]


def test_a_partial_upsert_keeps_the_default_and_the_limits(fresh_database):
    url = fresh_database()
    with connection(url) as c:
        name = unique("m6")
        procedures.upsert_sending_account(c, account_name=name, default_from_address="a@example.org",
                                          default_from_name="A", per_minute_limit=60, per_hour_limit=600,
                                          per_day_limit=6000, is_default=True, min_login_interval_ms=1000)
        procedures.upsert_sending_account(c, account_name=name, per_minute_limit=120)
        assert tuple(account_settings(c, name)) == ("a@example.org", "A", 120, 600, 6000, True, 1000)
        assert procedures.enqueue_mail(c, to_address="r@example.com", subject="s", body="b").created
        procedures.upsert_sending_account(c, account_name=name, clear=["PerHourLimit", "MinLoginIntervalMs"])
        assert tuple(account_settings(c, name)) == ("a@example.org", "A", 120, None, 6000, True, None)
        expect_error(50504, lambda: procedures.upsert_sending_account(c, account_name=name, per_day_limit=1,
                                                                      clear=["PerDayLimit"]))
        expect_error(50504, lambda: result_sets(exec_proc(c, "mailq.UpsertSendingAccount", AccountName=name,
                                                          Clear="PerWeekLimit")))
        expect_error(50503, lambda: procedures.upsert_sending_account(c, account_name=unique("new")))
        # removing the default is an explicit call; then enqueue without an account says so, writing nothing
        procedures.upsert_sending_account(c, account_name=name, is_default=False)
        before = fingerprint(c)
        err = expect_error(50114, lambda: procedures.enqueue_mail(c, to_address="r@example.com", subject="s",
                                                                  body="b"))
        assert "no default sending account" in err.message
        assert_unchanged(before, fingerprint(c))

