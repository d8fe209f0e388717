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
from ..errors import parse_driver_message
from . import layout

log = logging.getLogger("mailq_db.dbmail")

MAX_ATTEMPTS = 3
#: result sets, messages and counts read from one query at most (a loop guard)
MAX_ITEMS = 10_000
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
    text = exc.args[1] if len(exc.args) > 1 else str(exc)
    number, message = parse_driver_message(str(text))
    return layout.QueryError(number=number, text=_clean(message), server=server)


def read_output(cursor: Any, query: str, server: str | None, driver_errors: tuple) -> layout.Output:
    """Run ``query`` as one batch on ``cursor`` and read everything it sends, in order."""
    out = layout.Output()

    def messages() -> None:
        for _state, text in getattr(cursor, "messages", None) or []:
            out.items.append(layout.Message(_clean(text)))

    failures = 0
    try:
        cursor.execute(query)
        ready = True
    except driver_errors as exc:
        messages()
        out.items.append(_error(exc, server))
        ready, failures = False, 1
    while len(out.items) < MAX_ITEMS:
        if ready:
            messages()
            if cursor.description:
                columns = [column_from_description(d) for d in cursor.description]
                rows = [tuple(r) for r in cursor.fetchall()]
                out.items.append(layout.ResultSet(columns, rows, count=len(rows)))
            elif cursor.rowcount is not None and cursor.rowcount >= 0:
                out.items.append(layout.RowCount(cursor.rowcount))
        try:
            if not cursor.nextset():
                break
            ready, failures = True, 0
        except driver_errors as exc:
            messages()
            out.items.append(_error(exc, server))
            ready, failures = False, failures + 1
            if failures > 1:  # the driver keeps failing at the same place: the batch ended
                break
    return out


def _literal(name: str) -> str:
    return "N'" + name.replace("'", "''") + "'"


def run_as_sender(conn: Any, job: procedures.DbMailQuery, driver_errors: tuple) -> layout.Output:
    """Steps 1-4 of the module docstring on ``conn`` (a fresh autocommit connection)."""
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
        out = read_output(cursor, job.query, server, driver_errors)
        cursor.execute("SELECT @@OPTIONS & 512;")
        nocount = bool(cursor.fetchone()[0])
        if nocount:
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


def run_one(control: Any, open_query_connection: Callable[[], Any], *, lease_seconds: int = 300,
            driver_errors: tuple = ()) -> bool:
    """Claim one waiting query, run it, hand it back.  False when none waits."""
    token = uuid.uuid4()
    job = procedures.claim_db_mail_query(control, lock_token=token, lease_seconds=lease_seconds)
    if job is None:
        return False
    if job.attempts > MAX_ATTEMPTS:
        args: dict[str, Any] = {"outcome": "Failed",
                                "error": f"no query runner finished it in {MAX_ATTEMPTS} attempts"}
    else:
        conn = open_query_connection()
        try:
            args = finish(job, run_as_sender(conn, job, driver_errors))
        except IdentityError as exc:
            args = {"outcome": "Failed", "error": str(exc)[:3900]}
        finally:
            conn.close()
    procedures.complete_db_mail_query(control, mailitem_id=job.mailitem_id, lock_token=token, **args)
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
