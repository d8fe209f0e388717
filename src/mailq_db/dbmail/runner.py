"""The query runner of mailq.SendDbMail: runs each waiting ``@query`` as the
database user who sent it, reads every result set and message the way sqlcmd
does, and hands the rendered result back (docs/database-mail.md, "How @query
runs").

One query, one fresh connection of the runner's login (role
MailqDbMailRunner, plus ``IMPERSONATE ON USER::[sender]`` per sender):

1. ``EXECUTE AS USER = N'<sender>' WITH COOKIE INTO @c`` as its own batch
   (not through sp_executesql, where the context would end with the call);
   the SID must be the one SendDbMail stored, else nothing runs;
2. the query as its own batch, exactly as sent (temp tables, INSERT-EXEC,
   dynamic SQL, PRINT and several result sets work as in sqlcmd);
3. ``SELECT @@OPTIONS & 512`` (SET NOCOUNT at the end of the query decides
   the ``(n rows affected)`` lines after result sets);
4. ``REVERT WITH COOKIE``, and the connection is closed.  Without the
   cookie the query itself cannot return to the runner's identity.

Whatever the query does, it can fail only its own mail, never the runner:
an error while rows arrive keeps the rows read so far and the error (as
sqlcmd shows them); reading stops once the result cannot fit the mail (the
queue's limits) or the query has used its time (the lease less a margin, so
that no other runner takes it over while it runs); anything else that goes
wrong fails the mail with the reason.
"""

from __future__ import annotations

import datetime as dt
import decimal
import logging
import re
import struct
import time
import uuid
from typing import Any, Callable

from .. import procedures
from ..errors import DatabaseError, parse_driver_message
from . import layout

log = logging.getLogger("mailq_db.dbmail")

MAX_ATTEMPTS = 3
#: result sets, messages and counts read from one query at most (a loop guard)
MAX_ITEMS = 10_000
#: rows read between two checks of the limits
CHECK_ROWS = 500
#: the queue's limits (mailq.CompleteDbMailQuery): a body of 2,000,000
#: characters, an attachment of 10 MiB; reading stops past them
BODY_LIMIT_CHARS = 2_000_000
ATTACHMENT_LIMIT_BYTES = 10_485_760
TOO_LARGE = "the result is over the queue's limits (2,000,000 characters in the body, 10 MiB attached)"
#: ODBC types pyodbc may not read, and what they are in T-SQL
_UNREADABLE_TYPES = {-150: "sql_variant", -151: "a CLR type (geometry, geography, hierarchyid)"}
_UNSUPPORTED = re.compile(r"ODBC SQL type (-?\d+) is not yet supported\.\s+column-index=(\d+)")
_DRIVER_PREFIX = re.compile(r"^(?:\[[^\]]*\])+")
_SQL_SS_TIMESTAMPOFFSET = -155


class IdentityError(Exception):
    """The runner could not become the sender (no IMPERSONATE grant, the user
    was dropped or recreated): the query did not run."""


def _clean(text: str) -> str:
    return _DRIVER_PREFIX.sub("", str(text)).strip()


def _datetimeoffset(raw: bytes | None) -> layout.DateTimeOffset | None:
    """pyodbc has no type for datetimeoffset: SQL_SS_TIMESTAMPOFFSET_STRUCT."""
    if raw is None:
        return None
    y, mo, d, h, mi, s, ns, tzh, tzm = struct.unpack("<6hI2h", raw[:20])
    # timezone_minute carries the sign of timezone_hour (the struct's rule).
    return layout.DateTimeOffset(dt.datetime(y, mo, d, h, mi, s), ns, tzh * 60 + tzm)


def column_from_description(desc: tuple) -> layout.Column:
    """A result column from one entry of pyodbc's ``cursor.description``
    (name, Python type, display size, column size, precision, scale, nullable)."""
    name, kind_type, _display, size, precision, scale, nullable = desc[:7]
    size = int(size or precision or 0)
    scale = int(scale or 0)
    if kind_type is bool:
        kind = "bit"
    elif kind_type is int:
        kind = "int"
    elif kind_type is decimal.Decimal:
        kind = "decimal"
        size = int(precision or size)
    elif kind_type is float:
        kind = "real" if size and size <= 24 else "float"
    elif kind_type is dt.datetime:
        kind = "smalldatetime" if size == 16 else "datetime" if (size, scale) == (23, 3) else "datetime2"
    elif kind_type is dt.date:
        kind = "date"
    elif kind_type is dt.time:
        kind = "time"
    elif kind_type in (bytes, bytearray):
        kind = "binary"
    elif kind_type is uuid.UUID:
        kind = "guid"
    elif kind_type is str:
        kind = "char"
    else:
        kind = "other"
    return layout.Column(name=name or "", kind=kind, size=size, scale=scale, nullable=bool(nullable))


def _error(exc: Exception, server: str | None) -> layout.QueryError:
    # pyodbc passes (SQLSTATE, message), except for its own errors, which
    # are (message, SQLSTATE): the message is the longer one.
    texts = [str(a) for a in exc.args] or [str(exc)]
    number, message = parse_driver_message(max(texts, key=len))
    unsupported = _UNSUPPORTED.search(message)
    if unsupported:
        kind = _UNREADABLE_TYPES.get(int(unsupported.group(1)), f"ODBC type {unsupported.group(1)}")
        message = (f"column {int(unsupported.group(2)) + 1} of the result is {kind}, which the query runner "
                   "cannot read: CAST it to a character or numeric type in the query")
    return layout.QueryError(number=number, text=_clean(message), server=server)


class _Reader:
    """Reads one batch's results, messages and errors in the order they come."""

    def __init__(self, cursor: Any, server: str | None, driver_errors: tuple, max_chars: int | None,
                 deadline: float | None, clock: Callable[[], float]):
        self.cursor, self.server, self.driver_errors = cursor, server, driver_errors
        self.max_chars, self.deadline, self.clock = max_chars, deadline, clock
        self.out = layout.Output()
        self.chars = 0

    def messages(self) -> None:
        for _state, text in getattr(self.cursor, "messages", None) or []:
            self.out.items.append(layout.Message(_clean(text)))

    def error(self, exc: Exception) -> None:
        self.messages()
        self.out.items.append(_error(exc, self.server))

    def must_stop(self) -> bool:
        """True (once the reason is recorded) when the result cannot fit the
        mail or the query's time is up; the server is told to stop."""
        if self.out.stopped is None and self.max_chars is not None and self.chars > self.max_chars:
            self.out.stopped = TOO_LARGE
        elif self.out.stopped is None and self.deadline is not None and self.clock() > self.deadline:
            self.out.stopped = "time"
            self.out.items.append(layout.QueryError(
                number=None, server=self.server,
                text="the query ran longer than the query runner's lease allows and was cancelled "
                     "(mailq-db dbmail-runner --lease-seconds, at most 3600)"))
        if self.out.stopped is None:
            return False
        try:
            self.cursor.cancel()
        except self.driver_errors:  # the connection is closed next anyway
            pass
        return True

    def rows(self) -> bool:
        """The current result set; False when reading must stop."""
        columns = [column_from_description(d) for d in self.cursor.description]
        rows: list[tuple] = []
        try:
            # Row by row: an error among the rows loses none read before it
            # (fetchmany would drop the rows of the call that failed).
            while (row := self.cursor.fetchone()) is not None:
                rows.append(tuple(row))
                self.chars += sum(len(str(v)) + 1 for v in row) + 2
                if len(rows) % CHECK_ROWS == 0 and self.must_stop():
                    self.out.items.append(layout.ResultSet(columns, rows, count=None))
                    return False
        except self.driver_errors as exc:
            # sqlcmd shows the rows that came before the error, then the error.
            self.out.items.append(layout.ResultSet(columns, rows, count=None))
            self.error(exc)
            return True
        self.out.items.append(layout.ResultSet(columns, rows, count=len(rows)))
        return True

    def read(self, query: str) -> layout.Output:
        failures = 0
        try:
            self.cursor.execute(query)
            ready = True
        except self.driver_errors as exc:
            self.error(exc)
            ready, failures = False, 1
        while len(self.out.items) < MAX_ITEMS:
            if ready:
                self.messages()
                if self.cursor.description:
                    if not self.rows():
                        break
                elif self.cursor.rowcount is not None and self.cursor.rowcount >= 0:
                    self.out.items.append(layout.RowCount(self.cursor.rowcount))
            if self.must_stop():
                break
            try:
                if not self.cursor.nextset():
                    break
                ready, failures = True, 0
            except self.driver_errors as exc:
                self.error(exc)
                ready, failures = False, failures + 1
                if failures > 1:  # the driver keeps failing at the same place: the batch ended
                    break
        return self.out


def read_output(cursor: Any, query: str, server: str | None, driver_errors: tuple, *,
                max_chars: int | None = None, deadline: float | None = None,
                clock: Callable[[], float] = time.monotonic) -> layout.Output:
    """Run ``query`` as one batch on ``cursor`` and read everything it sends, in
    order, until ``max_chars`` characters of values or the ``deadline`` (on ``clock``)."""
    return _Reader(cursor, server, driver_errors, max_chars, deadline, clock).read(query)


def _literal(name: str) -> str:
    return "N'" + name.replace("'", "''") + "'"


def result_limit(job: procedures.DbMailQuery) -> int:
    """Characters of values past which the result cannot fit the mail."""
    return ATTACHMENT_LIMIT_BYTES if job.attach_results else BODY_LIMIT_CHARS


def _nocount(cursor: Any, driver_errors: tuple) -> bool:
    """SET NOCOUNT as the query left it (False when it cannot be read: a
    query may leave PARSEONLY, NOEXEC or FMTONLY on)."""
    try:
        cursor.execute("SELECT @@OPTIONS & 512;")
        row = cursor.fetchone()
    except driver_errors:
        return False
    return bool(row and row[0])


def run_as_sender(conn: Any, job: procedures.DbMailQuery, driver_errors: tuple, *,
                  seconds: float | None = None, clock: Callable[[], float] = time.monotonic) -> layout.Output:
    """Steps 1-4 of the module docstring on ``conn`` (a fresh autocommit
    connection); the query may take ``seconds`` (None: no limit)."""
    if hasattr(conn, "add_output_converter"):
        conn.add_output_converter(_SQL_SS_TIMESTAMPOFFSET, _datetimeoffset)
    cursor = conn.cursor()
    try:
        cursor.execute("SELECT @@SERVERNAME;")
        server = cursor.fetchone()[0]
        # Its own batch: a parameterised one would run through sp_executesql,
        # and the context would end with that call.
        cursor.execute(
            "SET NOCOUNT ON; DECLARE @c VARBINARY(100); "
            f"EXECUTE AS USER = {_literal(job.request_user)} WITH COOKIE INTO @c; "
            "SELECT @c AS Cookie, USER_SID() AS Sid; SET NOCOUNT OFF;")
        cookie, sid = cursor.fetchone()
    except driver_errors as exc:
        raise IdentityError(
            f"cannot run the query as database user {job.request_user!r}: {_clean(_error(exc, None).text)} "
            f"(GRANT IMPERSONATE ON USER::[{job.request_user}] TO MailqDbMailRunner)") from None
    if job.request_user_sid is not None and bytes(sid or b"") != job.request_user_sid:
        cursor.execute(f"REVERT WITH COOKIE = 0x{bytes(cookie).hex()};")
        raise IdentityError(f"database user {job.request_user!r} is not the one who sent the mail "
                            "(dropped and created again): the query was not run")
    try:
        deadline = None if seconds is None else clock() + seconds
        out = read_output(cursor, job.query, server, driver_errors, max_chars=result_limit(job),
                          deadline=deadline, clock=clock)
        if out.stopped is None and _nocount(cursor, driver_errors):
            for item in out.items:
                if isinstance(item, layout.ResultSet):
                    item.count = None
        return out
    finally:
        try:
            cursor.execute("IF @@TRANCOUNT > 0 ROLLBACK;")
            cursor.execute(f"REVERT WITH COOKIE = 0x{bytes(cookie).hex()};")
        except driver_errors:  # the connection is closed next: the context ends with it
            log.warning("mail item %s: REVERT failed; closing the connection", job.mailitem_id)


def default_file_name(job: procedures.DbMailQuery) -> str:
    ext = {"CSV": "csv", "HTML": "html"}.get(job.result_format, "txt")
    return f"QueryResults{job.mailitem_id}.{ext}"


def finish(job: procedures.DbMailQuery, output: layout.Output) -> dict[str, Any]:
    """The arguments of mailq.CompleteDbMailQuery for a query that ran."""
    if output.stopped == TOO_LARGE:
        return {"outcome": "Failed", "error": TOO_LARGE}
    errors = [i for i in output.items if isinstance(i, layout.QueryError)]
    if errors and not job.append_query_error:
        first = layout.format_error(errors[0])
        return {"outcome": "Failed", "error": " ".join(first)[:3900]}
    opts = layout.Options(header=job.header, width=job.width, separator=job.separator,
                          no_truncate=job.no_truncate, no_padding=job.no_padding)
    text = layout.render(output, opts, job.result_format)
    if job.attach_results:
        content, ctype = layout.encode_attachment(text, job.result_format)
        return {"outcome": "Done", "attachment": content, "content_type": ctype,
                "file_name": job.attachment_filename or default_file_name(job)}
    return {"outcome": "Done", "text": text}


def query_seconds(lease_seconds: int) -> int:
    """The time a query may take: its lease less a margin, so that the
    result is handed back before another runner may take the query over."""
    return max(lease_seconds - max(5, lease_seconds // 10), 1)


def _run_claimed(job: procedures.DbMailQuery, open_query_connection: Callable[[], Any], lease_seconds: int,
                 driver_errors: tuple) -> dict[str, Any]:
    """The arguments of mailq.CompleteDbMailQuery for a claimed query: a
    query can fail its own mail, never stop the runner."""
    if job.attempts > MAX_ATTEMPTS:
        return {"outcome": "Failed", "error": f"no query runner finished it in {MAX_ATTEMPTS} attempts"}
    conn = open_query_connection()
    try:
        return finish(job, run_as_sender(conn, job, driver_errors, seconds=query_seconds(lease_seconds)))
    except IdentityError as exc:
        return {"outcome": "Failed", "error": str(exc)[:3900]}
    except Exception as exc:  # noqa: BLE001 - whatever the query did, only its mail fails
        log.exception("mail item %s: the query could not be run or read", job.mailitem_id)
        return {"outcome": "Failed",
                "error": f"the query runner could not run or read the query: {type(exc).__name__}: {exc}"[:3900]}
    finally:
        conn.close()


def run_one(control: Any, open_query_connection: Callable[[], Any], *, lease_seconds: int = 300,
            driver_errors: tuple = ()) -> bool:
    """Claim one waiting query, run it, hand it back.  False when none waits."""
    token = uuid.uuid4()
    job = procedures.claim_db_mail_query(control, lock_token=token, lease_seconds=lease_seconds)
    if job is None:
        return False
    args = _run_claimed(job, open_query_connection, lease_seconds, driver_errors)
    try:
        procedures.complete_db_mail_query(control, mailitem_id=job.mailitem_id, lock_token=token, **args)
    except DatabaseError as exc:
        if exc.number != 50661:
            raise
        # The lease passed and another runner took the query over: its result counts.
        log.warning("mail item %s: claim lost before the result was handed back; result dropped",
                    job.mailitem_id)
        return True
    log.info("mail item %s (mail %s): query %s", job.mailitem_id, job.mail_id, args["outcome"].lower())
    return True


def run_forever(control: Any, open_query_connection: Callable[[], Any], *, idle_seconds: float = 5.0,
                lease_seconds: int = 300, driver_errors: tuple = (), once: bool = False,
                sleep: Callable[[float], None] = time.sleep) -> int:
    """Run waiting queries until none is left (``once``) or forever; returns how many ran."""
    done = 0
    while True:
        while run_one(control, open_query_connection, lease_seconds=lease_seconds, driver_errors=driver_errors):
            done += 1
        if once:
            return done
        sleep(idle_seconds)
