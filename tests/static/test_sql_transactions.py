"""Issue 10, points 3, 4 and 7, checked without a server on every file of sql/:

* no ``SAVE TRANSACTION`` anywhere (error 627 under MSDTC; dead code under
  XACT_ABORT ON);
* every module that reads with READPAST or UPDLOCK sets
  ``SET TRANSACTION ISOLATION LEVEL READ COMMITTED`` itself (READPAST is
  refused under SERIALIZABLE, REPEATABLE READ and SNAPSHOT: error 650);
* every mail-queue procedure's header has ``Transaction:``, ``Isolation:`` and
  ``Lock order:`` lines, and every procedure that opens a transaction uses the
  one CATCH pattern (``@OwnTran`` + ``XACT_STATE()``) or commits batch by batch.

``OWNED_ELSEWHERE`` lists files that are not yet held to these rules (none:
every procedure complies).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from mailq_db.deployment import code_only, strip_comments

ROOT = Path(__file__).resolve().parents[2]
SQL = ROOT / "sql"

OWNED_ELSEWHERE: set[str] = set()

SAVE = re.compile(r"\bSAVE\s+TRAN(SACTION)?\b", re.I)
LOCKING_HINT = re.compile(r"\bWITH\s*\([^)]*\b(READPAST|UPDLOCK)\b", re.I)
SETS_RC = re.compile(r"\bSET\s+TRANSACTION\s+ISOLATION\s+LEVEL\s+READ\s+COMMITTED\b", re.I)
MODULE = re.compile(r"\bCREATE\s+OR\s+ALTER\s+(PROCEDURE|PROC|FUNCTION|TRIGGER)\b", re.I)


def sql_files() -> list[Path]:
    return sorted(SQL.rglob("*.sql"))


def rel(path: Path) -> str:
    return path.relative_to(SQL).as_posix()


def mailq_procedures() -> list[Path]:
    return sorted((SQL / "procedures").glob("mailq.*.sql"))


def checked(paths: list[Path], offends) -> list[str]:
    """Offending files, leaving out OWNED_ELSEWHERE files that still offend."""
    return [rel(p) for p in paths if offends(p) and rel(p) not in OWNED_ELSEWHERE]


def header(path: Path) -> str:
    text = path.read_text(encoding="utf-8")
    match = re.match(r"\s*/\*(.*?)\*/", text, re.S)
    return match.group(1) if match else ""


def test_no_savepoints_anywhere():
    offenders = checked(sql_files(), lambda p: SAVE.search(code_only(p.read_text(encoding="utf-8"))))
    assert offenders == []


def test_every_module_with_readpast_or_updlock_sets_read_committed():
    def offends(p: Path) -> bool:
        code = strip_comments(p.read_text(encoding="utf-8"))
        return bool(MODULE.search(code) and LOCKING_HINT.search(code) and not SETS_RC.search(code))

    users = [p for p in sql_files() if LOCKING_HINT.search(strip_comments(p.read_text(encoding="utf-8")))]
    assert users, "no READPAST/UPDLOCK found: the check would pass vacuously"
    assert checked(sql_files(), offends) == []


@pytest.mark.parametrize("line", ["Transaction:", "Isolation:", "Lock order:"])
def test_every_mail_queue_procedure_header_states(line):
    missing = checked(mailq_procedures(), lambda p: line not in header(p))
    assert missing == []


def test_every_owned_transaction_uses_the_one_catch_pattern():
    def offends(p: Path) -> bool:
        code = code_only(p.read_text(encoding="utf-8"))
        if not re.search(r"\bBEGIN\s+TRANSACTION\b", code, re.I):
            return False
        if re.search(r"\bIF\s+@OwnTran\s*=\s*1\s+BEGIN\s+TRANSACTION\b", code, re.I):
            return not re.search(r"IF\s+@OwnTran\s*=\s*1\s+AND\s+XACT_STATE\(\)\s*<>\s*0\s+ROLLBACK\s+TRANSACTION", code, re.I)
        # Batch procedures (PurgeMail) refuse a caller's
        # transaction (50141) and commit per batch.
        return not re.search(r"IF\s+@@TRANCOUNT\s*>\s*0\s+THROW", code, re.I)

    assert checked(mailq_procedures(), offends) == []


def test_checks_catch_a_savepoint_and_a_missing_isolation_level(tmp_path):
    bad = "CREATE OR ALTER PROCEDURE x.P AS BEGIN SELECT 1 FROM t WITH (READPAST, UPDLOCK); SAVE TRANSACTION P; END;"
    assert SAVE.search(code_only(bad))
    code = strip_comments(bad)
    assert MODULE.search(code) and LOCKING_HINT.search(code) and not SETS_RC.search(code)
    # a comment that mentions SAVE TRANSACTION is not code
    assert not SAVE.search(code_only("/* no SAVE TRANSACTION here */ SELECT 1;"))


def test_enqueue_serializes_keys_on_an_applock_not_on_key_ranges():
    """Issue 10, point 5: no HOLDLOCK/SERIALIZABLE hint reads mailq.MailQueue, and
    EnqueueMail takes a transaction-owned application lock whose resource (prefix
    + a key of at most 200 characters) fits sp_getapplock's 255."""
    for path in mailq_procedures():
        code = strip_comments(path.read_text(encoding="utf-8"))
        for hint in re.finditer(r"mailq\.MailQueue\s+AS\s+\w+\s+WITH\s*\(([^)]*)\)", code, re.I):
            assert not re.search(r"\b(HOLDLOCK|SERIALIZABLE)\b", hint.group(1), re.I), rel(path)
    # EnqueueMail and EnqueueMailBatch both write through the one core (docs/enqueue.md)
    code = strip_comments((SQL / "procedures/mailq.EnqueueMailRows.sql").read_text(encoding="utf-8"))
    assert re.search(r"sys\.sp_getapplock[^;]*@LockOwner\s*=\s*N'Transaction'", code, re.S)
    prefix = re.search(r"CONCAT\(N'(mailq\.IdempotencyKey:)', @KeyText\)", code)
    assert prefix and len(prefix.group(1)) + 200 <= 255
    rules = strip_comments((SQL / "functions/mailq.EnqueueMailCheck.sql").read_text(encoding="utf-8"))
    assert "(8, 50103, 10, N'IdempotencyKey', @IdempotencyKey, 200)" in rules  # a longer key never reaches the lock
    assert "RTRIM(@IdempotencyKey) COLLATE Latin1_General_100_BIN2 AS KeyText" in rules


#: One IF condition, up to the statement it guards.
IF_CONDITION = re.compile(r"\bIF\b(?P<cond>.*?)\b(?:THROW|SET|BEGIN|RETURN|INSERT|UPDATE|DELETE|EXEC)\b", re.I | re.S)


def json_guard_mixed_with_json_reads(code: str) -> list[str]:
    """IF conditions that test ISJSON and read the same text with OPENJSON or
    JSON_VALUE: an OR does not evaluate its operands in a guaranteed order, so
    the read can meet text that is not JSON and raise 13609 instead of the
    procedure's own numbered error (issue 10, point 9)."""
    return [m.group("cond").strip()[:80] for m in IF_CONDITION.finditer(code)
            if re.search(r"\bISJSON\s*\(", m.group("cond"), re.I)
            and re.search(r"\b(OPENJSON|JSON_VALUE|JSON_QUERY)\s*\(", m.group("cond"), re.I)]


def test_json_guard_mixed_with_json_reads_is_found():
    bad = "IF ISJSON(@L) = 0 OR EXISTS (SELECT 1 FROM OPENJSON(@L) AS j WHERE j.[type] <> 2)\n THROW 50999, N'x', 1;"
    good = ("IF ISJSON(@L) = 0 SET @Ok = 0;\nELSE IF EXISTS (SELECT 1 FROM OPENJSON(@L) AS j)\n SET @Ok = 0;")
    assert json_guard_mixed_with_json_reads(bad)
    assert json_guard_mixed_with_json_reads(good) == []


def test_no_if_tests_isjson_and_reads_the_json_in_one_condition():
    offenders = {rel(p): found for p in sql_files()
                 if (found := json_guard_mixed_with_json_reads(code_only(p.read_text(encoding="utf-8"))))}
    assert offenders == {}
