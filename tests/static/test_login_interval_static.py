"""Static checks of the minimum interval between logins (revision 0012, issue 16
point 4): the table's shape and the in-place upgrade agree, the upgrade is
guarded and its downgrade undoes it, bad input is refused before any
transaction, the grant is decided in the same UPDATE that stamps it (one
statement under the row's lock, not a read then a write), and the worker's
role may call it.  The behaviour is tested by
tests/integration/test_mailq_login_interval.py (SQL Server) and
tests/unit/test_worker_login_interval.py (the worker)."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SQL = ROOT / "sql"
TABLE = (SQL / "tables/mailq.SendingAccount.sql").read_text(encoding="utf-8")
UPGRADE = (SQL / "upgrades/mailq.0012.SendingAccount.sql").read_text(encoding="utf-8")
ACQUIRE = (SQL / "procedures/mailq.AcquireLoginSlot.sql").read_text(encoding="utf-8")
UPSERT = (SQL / "procedures/mailq.UpsertSendingAccount.sql").read_text(encoding="utf-8")
CHECK = "MinLoginIntervalMs IS NULL OR MinLoginIntervalMs BETWEEN 1 AND 86400000"


def code(text: str) -> str:
    """The text without comments, white space collapsed."""
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    text = re.sub(r"--[^\n]*", " ", text)
    return re.sub(r"\s+", " ", text)


def test_the_table_and_the_upgrade_define_the_same_columns_and_rule():
    table, upgrade = code(TABLE), code(UPGRADE)
    for column in ("MinLoginIntervalMs INT NULL", "LastLoginAtUtc DATETIME2(3) NULL"):
        assert column in table and f"ADD {column}" in upgrade
    assert f"CONSTRAINT CK_SendingAccount_LoginInterval CHECK ( {CHECK} )" in table
    assert f"CONSTRAINT CK_SendingAccount_LoginInterval CHECK ({CHECK})" in upgrade


def test_every_step_of_the_upgrade_is_guarded():
    statements = re.findall(r"(IF [^;]*?)(ALTER TABLE|EXEC sys\.sp_executesql)", code(UPGRADE))
    assert len(statements) == 3
    assert all(guard.startswith(("IF COL_LENGTH(", "IF OBJECT_ID(")) and "IS NULL" in guard
               for guard, _ in statements)


def test_the_downgrade_drops_what_the_upgrade_added():
    [path] = (ROOT / "alembic/versions").glob("0012_*.py")
    spec = importlib.util.spec_from_file_location("rev0012", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.revision == "0012" and module.down_revision == "0011"  # chained after 0011 at the merge
    assert module.PLAN.drop_overrides == {"upgrades/mailq.0012.SendingAccount.sql": module.DOWNGRADE_0012}
    down = " ".join(code(s) for s in module.DOWNGRADE_0012)
    for dropped in ("DROP CONSTRAINT CK_SendingAccount_LoginInterval", "DROP COLUMN LastLoginAtUtc",
                    "DROP COLUMN MinLoginIntervalMs"):
        assert dropped in down
    # the constraint goes before the column it checks (ALTER TABLE DROP COLUMN refuses otherwise)
    assert down.index("DROP CONSTRAINT") < down.index("DROP COLUMN MinLoginIntervalMs")


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
        "tables/mailq.SendingAccount.sql", "upgrades/mailq.0012.SendingAccount.sql",
        "procedures/mailq.UpsertSendingAccount.sql", "procedures/mailq.AcquireLoginSlot.sql",
        "security/MailqSender.grants.sql")}
    assert pos["tables/mailq.SendingAccount.sql"] < pos["upgrades/mailq.0012.SendingAccount.sql"]
    assert pos["upgrades/mailq.0012.SendingAccount.sql"] < pos["procedures/mailq.UpsertSendingAccount.sql"]
    assert pos["upgrades/mailq.0012.SendingAccount.sql"] < pos["procedures/mailq.AcquireLoginSlot.sql"]
    assert pos["procedures/mailq.AcquireLoginSlot.sql"] < pos["security/MailqSender.grants.sql"]
