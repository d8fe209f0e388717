"""Static checks of the minimum interval between logins (issue 16 point 4):
the table's shape, bad input is refused before any
transaction, the grant is decided in the same UPDATE that stamps it (one
statement under the row's lock, not a read then a write), and the worker's
role may call it.  The behaviour is tested by
tests/integration/test_mailq_login_interval.py (SQL Server) and
tests/unit/test_worker_login_interval.py (the worker)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SQL = ROOT / "sql"
TABLE = (SQL / "tables/mailq.SendingAccount.sql").read_text(encoding="utf-8")
ACQUIRE = (SQL / "procedures/mailq.AcquireLoginSlot.sql").read_text(encoding="utf-8")
UPSERT = (SQL / "procedures/mailq.UpsertSendingAccount.sql").read_text(encoding="utf-8")
CHECK = "MinLoginIntervalMs IS NULL OR MinLoginIntervalMs BETWEEN 1 AND 86400000"


def code(text: str) -> str:
    """The text without comments, white space collapsed."""
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    text = re.sub(r"--[^\n]*", " ", text)
    return re.sub(r"\s+", " ", text)


def test_the_table_defines_the_columns_and_the_rule():
    table = code(TABLE)
    for column in ("MinLoginIntervalMs INT NULL", "LastLoginAtUtc DATETIME2(3) NULL"):
        assert column in table
    assert f"CONSTRAINT CK_SendingAccount_LoginInterval CHECK ( {CHECK} )" in table


def test_a_bad_interval_is_refused_before_the_transaction():
    upsert = code(UPSERT)
    assert "@MinLoginIntervalMs INT = NULL" in upsert
    assert upsert.index("THROW 50122") < upsert.index("BEGIN TRANSACTION")
    assert "IF @MinLoginIntervalMs NOT BETWEEN 1 AND 86400000" in upsert
    # an update sets it when given, keeps it when NULL, removes it with @Clear (issue 24 M6)
    assert "COALESCE(@MinLoginIntervalMs, a.MinLoginIntervalMs)" in upsert
    assert upsert.count("@MinLoginIntervalMs") >= 5  # parameter, check, message, update, insert


def test_acquire_decides_and_stamps_in_one_update_by_key():
    body = code(ACQUIRE.split("CREATE OR ALTER PROCEDURE", 1)[1])
    # the only access to the table is the UPDATE (no read-then-write race)
    assert body.count("mailq.SendingAccount") == 1
    update = re.search(r"UPDATE a SET a\.LastLoginAtUtc = IIF\((.*?), @Now, a\.LastLoginAtUtc \) OUTPUT "
                       r"inserted\.MinLoginIntervalMs, deleted\.LastLoginAtUtc, inserted\.LastLoginAtUtc "
                       r"INTO @Slot .*? FROM mailq\.SendingAccount AS a WHERE a\.AccountName = @AccountName;",
                       body)
    assert update, "the grant must be decided inside the stamping UPDATE, by primary key"
    # the result's Granted is the same rule on the values the UPDATE read
    decided = re.search(r"CAST\(IIF\((.*?), 1, 0 \) AS BIT\) AS Granted", body)
    assert decided
    normalise = lambda rule: re.sub(r"\s+", " ", rule.replace("( ", "(").replace(" )", ")")).strip()  # noqa: E731
    assert normalise(update.group(1).replace("a.LastLoginAtUtc", "X").replace("a.", "")) == \
        normalise(decided.group(1).replace("s.PreviousLoginAtUtc", "X").replace("s.", ""))
    assert body.index("THROW 50123") < body.index("BEGIN TRANSACTION")
    assert "THROW 50270" in body


def test_the_worker_role_may_call_it():
    grants = (SQL / "security/MailqSender.grants.sql").read_text(encoding="utf-8")
    assert "GRANT EXECUTE ON OBJECT::mailq.AcquireLoginSlot TO MailqSender;" in grants


def test_the_files_are_in_the_build_order_after_what_they_need():
    order = [line.strip() for line in (SQL / "BuildOrder.txt").read_text(encoding="utf-8").splitlines()]
    pos = {name: order.index(name) for name in (
        "tables/mailq.SendingAccount.sql",
        "procedures/mailq.UpsertSendingAccount.sql", "procedures/mailq.AcquireLoginSlot.sql",
        "security/MailqSender.grants.sql")}
    assert pos["tables/mailq.SendingAccount.sql"] < pos["procedures/mailq.UpsertSendingAccount.sql"]
    assert pos["tables/mailq.SendingAccount.sql"] < pos["procedures/mailq.AcquireLoginSlot.sql"]
    assert pos["procedures/mailq.AcquireLoginSlot.sql"] < pos["security/MailqSender.grants.sql"]
