"""The minimum interval between two logins per account (revision 0012, issue 16
point 4) against SQL Server 2022.

* mailq.UpsertSendingAccount @MinLoginIntervalMs: set, changed, cleared by
  NULL; 0, negative and over 24 h refused with 50122, changing nothing.
* mailq.AcquireLoginSlot: without an interval every call is granted and
  stamped; with one, the first call is granted and stamped with the server's
  clock, the next within the interval is refused with 0 < WaitMs <= interval
  and the stamp unchanged; once the stamp is an interval old (moved back by a
  test-only write, nothing is timed) it is granted again; a stamp more than
  one interval in the future (the clock went back) does not lock the account
  out; unknown, missing and over-long account names are refused (50270,
  50123, 50103) and change nothing.
* Many workers at once: eight connections released together by a barrier
  ask for the slot of one account; exactly one is granted.
* Inside a caller's transaction the stamp rolls back with it.
"""

from __future__ import annotations

import threading
import uuid
from datetime import timedelta

import pytest

from mailq_helpers import (
    assert_unchanged,
    connection,
    exec_proc,
    execute,
    expect_error,
    fingerprint,
    new_account,
    scalar,
    server_now,
)
from mailq_db import procedures
from mailq_db.errors import InvalidInputError, MailStateError

pytestmark = pytest.mark.integration


def interval_of(conn, account: str):
    return scalar(conn, "SELECT MinLoginIntervalMs FROM mailq.SendingAccount WHERE AccountName = ?;", account)


def last_login(conn, account: str):
    return scalar(conn, "SELECT LastLoginAtUtc FROM mailq.SendingAccount WHERE AccountName = ?;", account)


def set_interval(conn, account: str, ms: int | None) -> None:
    """Set the interval, or remove it (None): UpsertSendingAccount keeps what it is not given."""
    procedures.upsert_sending_account(conn, account_name=account, default_from_address="noreply@example.org",
                                      min_login_interval_ms=ms, clear=["MinLoginIntervalMs"] if ms is None else [])


def test_upsert_sets_changes_and_clears_the_interval(conn):
    account = new_account(conn, "li")
    assert interval_of(conn, account) is None
    set_interval(conn, account, 10_000)
    assert interval_of(conn, account) == 10_000
    set_interval(conn, account, 250)
    assert interval_of(conn, account) == 250
    set_interval(conn, account, None)
    assert interval_of(conn, account) is None


@pytest.mark.parametrize("bad", [0, -1, 86_400_001])
def test_upsert_refuses_a_bad_interval_and_changes_nothing(conn, bad):
    account = new_account(conn, "libad")
    set_interval(conn, account, 5000)
    before = fingerprint(conn)
    error = expect_error(50122, set_interval, conn, account, bad, cls=InvalidInputError)
    assert "@MinLoginIntervalMs" in error.message
    assert_unchanged(before, fingerprint(conn))
    assert interval_of(conn, account) == 5000


def test_without_an_interval_every_login_is_granted_and_stamped(conn):
    account = new_account(conn, "linone")
    for _ in range(3):
        slot = procedures.acquire_login_slot(conn, account_name=account)
        assert (slot.granted, slot.wait_ms, slot.min_login_interval_ms) == (True, 0, None)
        assert slot.last_login_utc == last_login(conn, account)


def test_a_second_login_within_the_interval_waits_and_is_granted_once_the_interval_passed(conn):
    account = new_account(conn, "liwait")
    set_interval(conn, account, 60_000)
    before = server_now(conn)
    first = procedures.acquire_login_slot(conn, account_name=account)
    assert first.granted and first.wait_ms == 0
    assert first.last_login_utc >= before - timedelta(milliseconds=1)  # the server's clock
    second = procedures.acquire_login_slot(conn, account_name=account)
    assert not second.granted and 0 < second.wait_ms <= 60_000
    assert second.last_login_utc == first.last_login_utc == last_login(conn, account)  # not re-stamped
    # Test-only write: the last login is now 61 s old.
    execute(conn, "UPDATE mailq.SendingAccount SET LastLoginAtUtc = DATEADD(SECOND, -61, SYSUTCDATETIME()) "
                  "WHERE AccountName = ?;", account)
    third = procedures.acquire_login_slot(conn, account_name=account)
    assert third.granted and third.last_login_utc >= first.last_login_utc  # stamped anew, now


def test_a_stamp_beyond_one_interval_in_the_future_does_not_lock_the_account_out(conn):
    account = new_account(conn, "liclock")
    set_interval(conn, account, 1000)
    execute(conn, "UPDATE mailq.SendingAccount SET LastLoginAtUtc = DATEADD(DAY, 1, SYSUTCDATETIME()) "
                  "WHERE AccountName = ?;", account)
    assert procedures.acquire_login_slot(conn, account_name=account).granted


def test_a_stamp_within_one_interval_in_the_future_waits_at_most_the_interval(conn):
    account = new_account(conn, "liahead")
    set_interval(conn, account, 60_000)
    execute(conn, "UPDATE mailq.SendingAccount SET LastLoginAtUtc = DATEADD(SECOND, 30, SYSUTCDATETIME()) "
                  "WHERE AccountName = ?;", account)
    slot = procedures.acquire_login_slot(conn, account_name=account)
    assert not slot.granted and slot.wait_ms == 60_000


@pytest.mark.parametrize("name, number, cls", [
    ("no_such_account_li16", 50270, MailStateError),
    ("", 50123, InvalidInputError),
    (None, 50123, InvalidInputError),
    ("x" * 129, 50103, InvalidInputError),
])
def test_bad_account_names_are_refused_and_change_nothing(conn, name, number, cls):
    before = fingerprint(conn)
    expect_error(number, exec_proc, conn, "mailq.AcquireLoginSlot", AccountName=name, cls=cls)
    assert_unchanged(before, fingerprint(conn))


def test_of_eight_workers_asking_at_once_exactly_one_logs_in(conn, mssql_url):
    account = new_account(conn, "lirace")
    set_interval(conn, account, 600_000)
    barrier = threading.Barrier(8)
    results: list[bool] = []
    errors: list[BaseException] = []

    def worker() -> None:
        try:
            with connection(mssql_url) as c:
                barrier.wait(timeout=60)
                results.append(procedures.acquire_login_slot(c, account_name=account).granted)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors
    assert sorted(results) == [False] * 7 + [True]


def test_in_a_callers_transaction_the_stamp_rolls_back_with_it(conn, mssql_url):
    account = new_account(conn, "litran")
    set_interval(conn, account, 600_000)
    with connection(mssql_url) as c:
        c.autocommit = False
        assert procedures.acquire_login_slot(c, account_name=account).granted
        c.rollback()
    assert last_login(conn, account) is None
    assert procedures.acquire_login_slot(conn, account_name=account).granted


AS_USER = """
EXECUTE AS USER = N'{user}';
BEGIN TRY
    EXEC mailq.AcquireLoginSlot @AccountName = ?;
    SELECT CAST(0 AS INT) AS Number;
END TRY
BEGIN CATCH
    SELECT ERROR_NUMBER() AS Number;
END CATCH;
REVERT;
"""


def acquire_as(conn, user: str, account: str) -> int:
    """The error number AcquireLoginSlot raised when run as ``user`` (0: it ran)."""
    cur = conn.cursor()
    cur.execute(AS_USER.format(user=user), account)
    last = None
    while True:
        if cur.description and cur.description[0][0] == "Number":
            last = cur.fetchall()[0][0]
        elif cur.description:
            cur.fetchall()
        if not cur.nextset():
            break
    cur.close()
    return last


def test_the_worker_role_may_ask_for_a_login_and_the_enqueue_role_may_not(conn):
    account = new_account(conn, "lirole")
    users = {}
    for role in ("MailqSender", "MailqEnqueuer"):
        users[role] = f"li_{role.lower()}_{uuid.uuid4().hex[:8]}"
        execute(conn, f"CREATE USER [{users[role]}] WITHOUT LOGIN; ALTER ROLE {role} ADD MEMBER [{users[role]}];")
    assert acquire_as(conn, users["MailqSender"], account) == 0
    assert last_login(conn, account) is not None
    assert acquire_as(conn, users["MailqEnqueuer"], account) == 229  # EXECUTE permission denied
