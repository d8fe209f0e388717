"""Shared helpers of the mail-queue integration tests (tests/integration/test_mailq_*.py).

Everything here talks to a real SQL Server through the package's own pieces:
``mailq_db.connection.connect`` for connections (autocommit, as the worker
uses them), ``mailq_db.procedures`` for the public procedures, and
``mailq_db.errors.from_driver_error`` to turn a driver error into the
exception class and THROW number the package promises.

Tests connect as ``sa`` (the fixtures' login).  They read the tables directly
to check state, and a few fast-forward time by moving a mail's
``VisibleAtUtc`` or ``DateProcessed`` instead of sleeping; every such write is
a helper below whose name says so (``make_due_now``, ``age_finished``...).

Isolation inside one module (one database per module, see conftest.py):
every test makes its own sending account and its own application with
:func:`new_account` / :func:`new_app`, and claims with ``app_name=`` that
application, so mail left behind by an earlier test of the module is never
claimed by a later one.  A test that must claim with ``@AppName = NULL``
(competing worker) first calls :func:`quiesce`, which cancels every
claimable mail of the database.
"""

from __future__ import annotations

import threading
import time
import uuid
import xml.etree.ElementTree as ET
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Callable, Iterator, Sequence

import pytest

from mailq_db import procedures
from mailq_db.connection import connect
from mailq_db.errors import DatabaseError, from_driver_error

try:  # the integration folder is skipped without pyodbc, but keep imports safe
    import pyodbc

    DRIVER_ERRORS: tuple[type[BaseException], ...] = (pyodbc.Error,)
except ImportError:  # pragma: no cover - depends on the machine
    DRIVER_ERRORS = ()


# --------------------------------------------------------------------------
# Connections and raw calls
# --------------------------------------------------------------------------


@contextmanager
def connection(url: str) -> Iterator[Any]:
    """An autocommit connection (as sa) that is closed afterwards."""
    conn = connect(url)
    try:
        yield conn
    finally:
        conn.close()


def exec_proc(conn: Any, proc: str, **params: Any) -> Any:
    """``EXEC proc @Name = ?, ...`` with exactly the given named parameters.

    For bad input that a wrapper of :mod:`mailq_db.procedures` would never send
    (a NULL token, an @ID instead of an @IDList, malformed JSON...).  Server
    errors come back as the package's exception classes (``.number`` is the
    THROW number).  Returns the open cursor (result sets unread).
    """
    names = list(params)
    sql = f"EXEC {proc}" + (" " + ", ".join(f"@{n} = ?" for n in names) if names else "") + ";"
    cursor = conn.cursor()
    try:
        if names:
            cursor.execute(sql, [params[n] for n in names])
        else:
            cursor.execute(sql)
    except DRIVER_ERRORS as exc:
        cursor.close()
        raise from_driver_error(exc) from exc
    return cursor


def result_sets(cursor: Any) -> list[list[tuple]]:
    """Every result set left on ``cursor`` (row-count-only results skipped), as tuples."""
    sets: list[list[tuple]] = []
    try:
        while True:
            if cursor.description:
                sets.append([tuple(r) for r in cursor.fetchall()])
            if not cursor.nextset():
                break
    except DRIVER_ERRORS as exc:
        raise from_driver_error(exc) from exc
    return sets


def query(conn: Any, sql: str, *params: Any) -> list[tuple]:
    """Rows of one read-only query, as tuples."""
    cursor = conn.cursor()
    try:
        cursor.execute(sql, *params) if params else cursor.execute(sql)
        return [tuple(r) for r in cursor.fetchall()]
    finally:
        cursor.close()


def scalar(conn: Any, sql: str, *params: Any) -> Any:
    rows = query(conn, sql, *params)
    return rows[0][0] if rows else None


def execute(conn: Any, sql: str, *params: Any) -> None:
    """One statement that returns nothing (test setup as sa)."""
    cursor = conn.cursor()
    try:
        cursor.execute(sql, *params) if params else cursor.execute(sql)
        while cursor.nextset():
            pass
    finally:
        cursor.close()


def expect_error(number: int, fn: Callable[..., Any], *args: Any, cls: type = DatabaseError, **kwargs: Any):
    """Call ``fn`` and assert it raises ``cls`` with SQL Server error ``number``; returns the error."""
    with pytest.raises(cls) as info:
        result = fn(*args, **kwargs)
        # A cursor-returning call may raise only when its result sets are read.
        if hasattr(result, "nextset"):
            result_sets(result)
    assert info.value.number == number, f"expected THROW {number}, got {info.value!r}"
    return info.value


def server_now(conn: Any) -> datetime:
    """SYSUTCDATETIME() of the server (naive UTC): the clock the procedures use."""
    return scalar(conn, "SELECT CAST(SYSUTCDATETIME() AS DATETIME2(3));")


def as_uuid(value: Any) -> uuid.UUID | None:
    return None if value is None else uuid.UUID(str(value))


# --------------------------------------------------------------------------
# Accounts, applications, mail
# --------------------------------------------------------------------------


def unique(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:10]}"


def new_account(conn: Any, prefix: str = "acct", *, from_address: str = "noreply@example.org",
                from_name: str | None = None, per_minute: int | None = None, per_hour: int | None = None,
                per_day: int | None = None) -> str:
    """A new sending account (through mailq.UpsertSendingAccount); returns its name."""
    name = unique(prefix)
    procedures.upsert_sending_account(
        conn, account_name=name, default_from_address=from_address, default_from_name=from_name,
        per_minute_limit=per_minute, per_hour_limit=per_hour, per_day_limit=per_day,
    )
    bind_test_apps(conn)
    return name


def new_app(conn: Any, prefix: str = "app") -> str:
    """A new application (through mailq.UpsertApplication); returns its name."""
    name = unique(prefix)
    procedures.upsert_application(conn, app_name=name, description=f"integration test {name}")
    if not prefix.startswith(UNBOUND_PREFIX):
        bind_test_apps(conn)
    return name


#: Applications whose name starts with this are left unbound by the helpers
#: (tests of mailq.BindApplication and EnqueueMail's 50160/50161 use them).
UNBOUND_PREFIX = "unbound"

#: The From domains the suite's mails use.
TEST_FROM_DOMAINS = ("@example.org", "@example.com", "@shop.example.net", "@例え.jp")


def bind_test_apps(conn: Any) -> None:
    """Test setup as sa (applications are bound to accounts and From
    domains): every application of the database except the ``unbound*`` ones may
    use every account and the suite's From domains, so tests written before the
    binding existed keep testing what they test."""
    execute(conn, f"""
        INSERT INTO mailq.ApplicationAccount (AppName, AccountName)
        SELECT p.AppName, a.AccountName
        FROM mailq.Application AS p CROSS JOIN mailq.SendingAccount AS a
        WHERE p.AppName NOT LIKE N'{UNBOUND_PREFIX}%'
          AND NOT EXISTS (SELECT 1 FROM mailq.ApplicationAccount AS b
                          WHERE b.AppName = p.AppName AND b.AccountName = a.AccountName);""")
    values = ", ".join(f"(N'{d}')" for d in TEST_FROM_DOMAINS)
    execute(conn, f"""
        INSERT INTO mailq.ApplicationFrom (AppName, FromPattern)
        SELECT p.AppName, d.Pattern
        FROM mailq.Application AS p CROSS JOIN (VALUES {values}) AS d(Pattern)
        WHERE p.AppName NOT LIKE N'{UNBOUND_PREFIX}%'
          AND NOT EXISTS (SELECT 1 FROM mailq.ApplicationFrom AS f
                          WHERE f.AppName = p.AppName AND f.FromPattern = d.Pattern);""")


def enqueue(conn: Any, account: str, app: str | None, n: int = 1, **kwargs: Any) -> list[procedures.EnqueueResult]:
    """n mails through mailq.EnqueueMail (recipient rcpt<i>@example.com)."""
    out = []
    for i in range(n):
        params = dict(to_address=f"rcpt{i}@example.com", subject=f"test {i} 你好", body=f"body {i}",
                      account_name=account, app_name=app)
        params.update(kwargs)
        out.append(procedures.enqueue_mail(conn, **params))
    return out


def claim(conn: Any, app: str | None, batch_size: int = 10, lease_seconds: int = 300,
          token: uuid.UUID | None = None, worker_name: str = "it") -> tuple[uuid.UUID, list[procedures.ClaimedMail]]:
    """mailq.ClaimMail with a new token (or ``token``); returns (token, mails)."""
    token = token or uuid.uuid4()
    mails = procedures.claim_mail(conn, batch_size=batch_size, lock_token=token, lease_seconds=lease_seconds,
                                  app_name=app, worker_name=worker_name)
    return token, mails


def mail_row(conn: Any, mail_id: int) -> dict[str, Any] | None:
    """The mutable columns of one mail, by name (None when it does not exist)."""
    cursor = conn.cursor()
    try:
        cursor.execute(
            "SELECT ID, Status, ThreadLock, VisibleAtUtc, DateToProcess, DateProcessed, AttemptsRemaining, "
            "AttemptCount, PossibleDuplicate, LastError, SentAtUtc, DryRun, ExpiresAtUtc, MessageID, "
            "AccountName, AppName, Priority FROM mailq.MailQueue WHERE ID = ?;", mail_id)
        row = cursor.fetchone()
        if row is None:
            return None
        return {d[0]: v for d, v in zip(cursor.description, row)}
    finally:
        cursor.close()


def attempts(conn: Any, mail_id: int) -> list[dict[str, Any]]:
    """The mail's rows of mailq.MailAttempt, by AttemptNo."""
    cursor = conn.cursor()
    try:
        cursor.execute(
            "SELECT MailID, AttemptNo, LockToken, WorkerName, StartedAtUtc, EndedAtUtc, Outcome, SmtpCode, "
            "ErrorText FROM mailq.MailAttempt WHERE MailID = ? ORDER BY AttemptNo;", mail_id)
        return [{d[0]: v for d, v in zip(cursor.description, r)} for r in cursor.fetchall()]
    finally:
        cursor.close()


def statuses(conn: Any, ids: Sequence[int]) -> dict[int, str]:
    if not ids:
        return {}
    rows = query(conn, "SELECT q.ID, q.Status FROM mailq.MailQueue AS q "
                       "INNER JOIN OPENJSON(?) AS j ON q.ID = CAST(j.[value] AS BIGINT);",
                 procedures.id_list(ids))
    return {int(r[0]): r[1] for r in rows}


#: Every column a procedure may change, per table: an exact picture of the state.
_FINGERPRINT = {
    "MailQueue": "SELECT ID, Status, ThreadLock, VisibleAtUtc, DateToProcess, DateProcessed, AttemptsRemaining, "
                 "AttemptCount, PossibleDuplicate, LastError, SentAtUtc, DryRun, ExpiresAtUtc "
                 "FROM mailq.MailQueue ORDER BY ID;",
    "MailAttachment": "SELECT MailID, AttachmentNo, FileName, DATALENGTH(Content) "
                      "FROM mailq.MailAttachment ORDER BY MailID, AttachmentNo;",
    "MailAttempt": "SELECT MailID, AttemptNo, LockToken, StartedAtUtc, EndedAtUtc, Outcome, SmtpCode, ErrorText "
                   "FROM mailq.MailAttempt ORDER BY MailID, AttemptNo;",
    "SendingAccount": "SELECT AccountName, BlockedUntilUtc, BlockReason, PerMinuteLimit, IsDefault "
                      "FROM mailq.SendingAccount ORDER BY AccountName;",
    "RateBudget": "SELECT AccountName, MinuteStartUtc, MinuteCount, HourStartUtc, HourCount, DayStartUtc, DayCount "
                  "FROM mailq.RateBudget ORDER BY AccountName;",
    "Application": "SELECT AppName, Description FROM mailq.Application ORDER BY AppName;",
}


def fingerprint(conn: Any) -> dict[str, list[tuple]]:
    """Every row of the mail-queue tables (their mutable columns): compare before/after
    a refused call to prove that it wrote nothing."""
    return {name: query(conn, sql) for name, sql in _FINGERPRINT.items()}


def assert_unchanged(before: dict[str, list[tuple]], after: dict[str, list[tuple]]) -> None:
    for table in before:
        assert after[table] == before[table], f"a refused call changed mailq.{table}"


# --------------------------------------------------------------------------
# Test-only writes (fast-forwarding time, clearing the field)
# --------------------------------------------------------------------------


def make_due_now(conn: Any, ids: Sequence[int]) -> None:
    """Fast-forward: UnSent mails become due now (instead of waiting out a backoff)."""
    execute(conn, "UPDATE q SET q.VisibleAtUtc = SYSUTCDATETIME() FROM mailq.MailQueue AS q "
                  "INNER JOIN OPENJSON(?) AS j ON q.ID = CAST(j.[value] AS BIGINT) WHERE q.Status = N'UnSent';",
            procedures.id_list(ids))


def age_finished(conn: Any, ids: Sequence[int], days: int) -> None:
    """Fast-forward: finished mails look finished ``days`` days ago (for PurgeMail)."""
    execute(conn, "UPDATE q SET q.DateProcessed = DATEADD(DAY, -?, SYSUTCDATETIME()) FROM mailq.MailQueue AS q "
                  "INNER JOIN OPENJSON(?) AS j ON q.ID = CAST(j.[value] AS BIGINT);",
            days, procedures.id_list(ids))


def quiesce(conn: Any) -> None:
    """Cancel every claimable mail of the database (for tests that claim with @AppName NULL)."""
    execute(conn, "UPDATE mailq.MailQueue SET Status = N'Cancelled', ThreadLock = NULL, "
                  "DateProcessed = SYSUTCDATETIME() WHERE Status IN (N'UnSent', N'Sending');")
    execute(conn, "UPDATE mailq.MailAttempt SET EndedAtUtc = SYSUTCDATETIME(), Outcome = N'Released' "
                  "WHERE EndedAtUtc IS NULL;")


def wait_out_minute_boundary(conn: Any, latest_second: int = 50) -> None:
    """Sleep into the next UTC minute when the server's clock is at or past ``latest_second``,
    so that a test of the fixed per-minute window never straddles two windows."""
    now = server_now(conn)
    if now.second >= latest_second:
        time.sleep(60 - now.second - now.microsecond / 1e6 + 0.5)


# --------------------------------------------------------------------------
# Bulk fill (set-based, as sa)
# --------------------------------------------------------------------------

#: Inserts ``n`` due mails in one set-based statement, every NOT NULL column and
#: constraint of mailq.MailQueue satisfied: Status UnSent (default), ThreadLock NULL
#: (CK_MailQueue_Lease), Priority 0-9, AttemptsRemaining 5, ExpiresAtUtc NULL,
#: IdempotencyKey NULL (UX_MailQueue_IdempotencyKey is filtered on NOT NULL),
#: Headers NULL, an existing account (FK) and application (FK, or NULL).
#: Due times are spread over the hour before now (one millisecond apart), so
#: every row is due and VisibleAtUtc values differ.  Numbers come from a
#: cross join of digits (10^7 rows available).
BULK_FILL_SQL = """\
SET NOCOUNT ON;
DECLARE @Base DATETIME2(3) = DATEADD(SECOND, -60, SYSUTCDATETIME());
DECLARE @Count INT = ?, @Offset INT = ?, @Account NVARCHAR(128) = ?;
-- NULLIF: no NULL parameter, whose type some drivers would have to guess.
DECLARE @App NVARCHAR(128) = NULLIF(?, N''), @Tag NVARCHAR(40) = ?;
WITH Digit AS (
    SELECT v.d FROM (VALUES (0), (1), (2), (3), (4), (5), (6), (7), (8), (9)) AS v(d)
),
Number AS (
    SELECT TOP (@Count) @Offset + ROW_NUMBER() OVER (ORDER BY (SELECT NULL)) AS n
    FROM Digit AS d1
    CROSS JOIN Digit AS d2
    CROSS JOIN Digit AS d3
    CROSS JOIN Digit AS d4
    CROSS JOIN Digit AS d5
    CROSS JOIN Digit AS d6
    CROSS JOIN Digit AS d7
)
INSERT INTO mailq.MailQueue (
    DateToProcess, VisibleAtUtc, FromAddress, ToAddress, Subject, Body,
    AttemptsRemaining, Priority, AccountName, AppName, ContentHash, MessageID
)
SELECT
    DATEADD(MILLISECOND, -CAST(n.n % 3600000 AS INT), @Base),
    DATEADD(MILLISECOND, -CAST(n.n % 3600000 AS INT), @Base),
    N'noreply@example.org',
    CONCAT(N'bulk', n.n, N'@example.com'),
    CONCAT(N'bulk ', n.n),
    N'bulk body',
    5,
    CAST(n.n % 10 AS TINYINT),
    @Account,
    @App,
    HASHBYTES('SHA2_256', CONCAT(N'bulk', @Tag, n.n)),
    CONCAT(N'<bulk-', @Tag, N'-', n.n, N'@example.org>')
FROM Number AS n;
"""


def bulk_fill(conn: Any, account: str, n: int, app: str | None = None, chunk: int = 100_000) -> None:
    """Insert ``n`` due mails set-based (in chunks of ``chunk`` rows, one statement each)."""
    tag = uuid.uuid4().hex[:8]
    done = 0
    while done < n:
        count = min(chunk, n - done)
        execute(conn, BULK_FILL_SQL, count, done, account, app or "", tag)
        done += count


# --------------------------------------------------------------------------
# Threads
# --------------------------------------------------------------------------


def run_threads(n: int, target: Callable[[int, threading.Barrier], Any], timeout: float = 300) -> list[Any]:
    """Run ``target(i, barrier)`` in n threads started together; re-raise the first error."""
    barrier = threading.Barrier(n)
    results: list[Any] = [None] * n
    errors: list[BaseException] = []

    def run(i: int) -> None:
        try:
            results[i] = target(i, barrier)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
            barrier.abort()

    threads = [threading.Thread(target=run, args=(i,), name=f"mailq-it-{i}") for i in range(n)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + timeout
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    assert not any(t.is_alive() for t in threads), "a worker thread did not finish in time"
    real = [e for e in errors if not isinstance(e, threading.BrokenBarrierError)]
    if real or errors:
        raise (real or errors)[0]
    return results


# --------------------------------------------------------------------------
# Showplan XML
# --------------------------------------------------------------------------

SHOWPLAN_NS = "http://schemas.microsoft.com/sqlserver/2004/07/showplan"
_NS = {"sp": SHOWPLAN_NS}


def showplans(cursor: Any) -> tuple[list[str], list[list[tuple]]]:
    """Split the result sets of a call made under ``SET STATISTICS XML ON`` into
    (showplan XML documents, other result sets)."""
    plans: list[str] = []
    others: list[list[tuple]] = []
    for rows in result_sets(cursor):
        texts = [r[0] for r in rows if len(r) == 1 and r[0] is not None]
        texts = [t.decode("utf-16") if isinstance(t, (bytes, bytearray)) else t for t in texts]
        if texts and all(isinstance(t, str) and "<ShowPlanXML" in t[:500] for t in texts):
            plans.extend(texts)
        else:
            others.append(rows)
    return plans, others


@dataclass
class IndexRead:
    """One operator of a plan that reads an index, and what sits above it."""

    physical_op: str            # 'Index Seek', 'Index Scan', ...
    ordered: bool               # IndexScan/@Ordered
    actual_rows: int | None     # sum of RunTimeCountersPerThread/@ActualRows (actual plans)
    actual_rows_read: int | None
    seek_predicates: int        # number of SeekKeys ranges (0 for a scan)
    ancestors: list[tuple[str, str]] = field(default_factory=list)  # (PhysicalOp, LogicalOp), bottom-up

    def ops_below_top(self) -> list[tuple[str, str]] | None:
        """Ancestors between this read and the nearest Top (None when no Top is above it)."""
        below: list[tuple[str, str]] = []
        for physical, logical in self.ancestors:
            if physical == "Top":
                return below
            below.append((physical, logical))
        return None


@dataclass
class StatementPlan:
    statement_type: str
    text: str
    reads: list[IndexRead]
    element: Any


def _int_sum(values: list[str]) -> int | None:
    return sum(int(v) for v in values) if values else None


def statement_plans(xml_docs: Sequence[str], index: str, table: str = "MailQueue") -> list[StatementPlan]:
    """Statements (StmtSimple) of the given showplans that read ``index`` of ``table``,
    with every operator that reads it and the chain of operators above each."""
    found: list[StatementPlan] = []
    for doc in xml_docs:
        root = ET.fromstring(doc)
        parent = {child: p for p in root.iter() for child in p}
        for stmt in root.iter(f"{{{SHOWPLAN_NS}}}StmtSimple"):
            reads: list[IndexRead] = []
            for relop in stmt.iter(f"{{{SHOWPLAN_NS}}}RelOp"):
                scan = relop.find("sp:IndexScan", _NS)
                if scan is None:
                    continue
                obj = scan.find("sp:Object", _NS)
                if obj is None or obj.get("Index") != f"[{index}]" or obj.get("Table") != f"[{table}]":
                    continue
                chain: list[tuple[str, str]] = []
                node = parent.get(relop)
                while node is not None and node is not stmt:
                    if node.tag == f"{{{SHOWPLAN_NS}}}RelOp":
                        chain.append((node.get("PhysicalOp", ""), node.get("LogicalOp", "")))
                    node = parent.get(node)
                counters = relop.findall("sp:RunTimeInformation/sp:RunTimeCountersPerThread", _NS)
                reads.append(IndexRead(
                    physical_op=relop.get("PhysicalOp", ""),
                    ordered=scan.get("Ordered", "").lower() in ("1", "true"),
                    actual_rows=_int_sum([c.get("ActualRows") for c in counters if c.get("ActualRows")]),
                    actual_rows_read=_int_sum([c.get("ActualRowsRead") for c in counters if c.get("ActualRowsRead")]),
                    seek_predicates=len(scan.findall(".//sp:SeekKeys", _NS)),
                    ancestors=chain,
                ))
            if reads:
                found.append(StatementPlan(stmt.get("StatementType", ""), stmt.get("StatementText", ""), reads, stmt))
    return found


def table_scans(stmt: StatementPlan, table: str = "MailQueue") -> list[str]:
    """Scans (not seeks, not lookups) of ``table`` anywhere in the statement."""
    out = []
    for relop in stmt.element.iter(f"{{{SHOWPLAN_NS}}}RelOp"):
        if relop.get("PhysicalOp") not in ("Table Scan", "Clustered Index Scan", "Index Scan"):
            continue
        for obj in relop.iter(f"{{{SHOWPLAN_NS}}}Object"):
            if obj.get("Table") == f"[{table}]":
                out.append(f"{relop.get('PhysicalOp')} {obj.get('Index')}")
                break
    return out


def utc_floor_seconds(value: datetime) -> datetime:
    return value.replace(microsecond=0)


def seconds(delta: timedelta) -> float:
    return delta.total_seconds()
