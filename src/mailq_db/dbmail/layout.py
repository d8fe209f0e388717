"""The text of a Database Mail ``@query`` result: sqlcmd's layout, which
Database Mail uses, plus the ``@mailq_query_result_format`` extensions (CSV,
HTML).  Pure functions over what the query runner read (:mod:`.runner`); the
only place these rules live (docs/database-mail.md, "Layout").

Model: a query's output is a list of items in the order the server sent them:
:class:`ResultSet` (columns and rows, ``count`` = rows when SET NOCOUNT was
OFF, else None), :class:`Message` (PRINT, RAISERROR below 11), :class:`RowCount`
(a statement without rows, NOCOUNT OFF) and :class:`QueryError`.

Text layout (sqlcmd):
* a column is as wide as the longer of its name and its type's display width
  (:func:`display_width`), and at least 4 when it may hold NULL;
* header line (names), a line of '-' per column, one line per row; columns
  joined by the separator; every column padded with spaces to its width,
  numbers on the right; a value longer than its width is cut;
* after a result set, a blank line and ``(n rows affected)`` unless NOCOUNT;
* ``@query_no_truncate``: large values (the (max) types, xml) are whole and
  their column as wide as the longest value; ``@query_result_no_padding``: no
  padding, no cutting, no wrapping, dashes as long as the name;
* every line longer than ``@query_result_width`` is wrapped into pieces of
  that many characters; lines end with CRLF.
"""

from __future__ import annotations

import datetime as dt
import decimal
import uuid
from dataclasses import dataclass, field
from typing import Any, Sequence

CRLF = "\r\n"
#: the width sqlcmd gives the (max) types, xml, sql_variant and the like (its -y 256)
LARGE_WIDTH = 256
NUMERIC_KINDS = frozenset({"int", "bit", "decimal", "float", "real"})


@dataclass(frozen=True)
class Column:
    """A result column: ``kind`` is one of char, int, bit, decimal, float,
    real, datetime, smalldatetime, datetime2, date, time, datetimeoffset,
    binary, guid, other; ``size`` the ODBC column size (0 for the (max)
    types), ``scale`` the decimal digits (fractional seconds for times)."""

    name: str
    kind: str
    size: int = 0
    scale: int = 0
    nullable: bool = True


@dataclass(frozen=True)
class DateTimeOffset:
    """A datetimeoffset value (pyodbc has no type for it): local time and offset in minutes."""

    value: dt.datetime
    nanoseconds: int
    offset_minutes: int


@dataclass
class ResultSet:
    columns: Sequence[Column]
    rows: Sequence[Sequence[Any]]
    count: int | None = None


@dataclass(frozen=True)
class Message:
    text: str


@dataclass(frozen=True)
class RowCount:
    count: int


@dataclass(frozen=True)
class QueryError:
    """An error the query raised.  The ODBC driver passes the number and
    the text; level, state and line are None when it does not."""

    number: int | None
    text: str
    level: int | None = None
    state: int | None = None
    server: str | None = None
    line: int | None = None


@dataclass(frozen=True)
class Options:
    header: bool = True
    width: int = 256
    separator: str = " "
    no_truncate: bool = False
    no_padding: bool = False


@dataclass
class Output:
    """``stopped``: why reading ended early (None: the query's output is whole)."""

    items: list[Any] = field(default_factory=list)
    stopped: str | None = None


def display_width(col: Column) -> int:
    """sqlcmd's display width of a column's type (before the name and NULL)."""
    k, size = col.kind, col.size
    if k == "char":
        return LARGE_WIDTH if size <= 0 or size > 8000 else size
    if k == "int":
        return {10: 11, 19: 20, 5: 6, 3: 3}.get(size, size + 1)
    if k == "bit":
        return 1
    if k == "decimal":
        return size + 2
    if k == "float":
        return 24
    if k == "real":
        return 14
    if k == "datetime":
        return 23
    if k == "smalldatetime":
        return 19
    if k in ("datetime2", "time", "datetimeoffset"):
        return size
    if k == "date":
        return 10
    if k == "binary":
        return LARGE_WIDTH if size <= 0 or size > 8000 else 2 * size + 2
    if k == "guid":
        return 36
    return LARGE_WIDTH


def is_large(col: Column) -> bool:
    """A column whose values sqlcmd cuts at 256 unless @query_no_truncate."""
    return display_width(col) == LARGE_WIDTH and col.kind in ("char", "binary", "other")


def _fraction(microseconds: int, scale: int, nanoseconds: int | None = None) -> str:
    if scale <= 0:
        return ""
    digits = f"{nanoseconds:09d}" if nanoseconds is not None else f"{microseconds:06d}000"
    return "." + digits[:scale]


def format_value(col: Column, value: Any) -> str:
    """One value as sqlcmd shows it (NULL as NULL)."""
    if value is None:
        return "NULL"
    k = col.kind
    if k == "bit" or isinstance(value, bool):
        return "1" if value else "0"
    if k == "decimal" and isinstance(value, decimal.Decimal):
        return f"{value:.{max(col.scale, 0)}f}"
    if k == "float" and isinstance(value, float):
        return _float_text(value, 17)
    if k == "real" and isinstance(value, float):
        return _float_text(value, 7)
    if isinstance(value, DateTimeOffset):
        v = value.value
        sign = "+" if value.offset_minutes >= 0 else "-"
        off = abs(value.offset_minutes)
        scale = max(col.size - 27, 0) if col.size > 26 else 0
        return (f"{v:%Y-%m-%d %H:%M:%S}{_fraction(0, scale, value.nanoseconds)}"
                f" {sign}{off // 60:02d}:{off % 60:02d}")
    if isinstance(value, dt.datetime):
        if k == "smalldatetime":
            return f"{value:%Y-%m-%d %H:%M:%S}"
        scale = 3 if k == "datetime" else col.scale
        return f"{value:%Y-%m-%d %H:%M:%S}{_fraction(value.microsecond, scale)}"
    if isinstance(value, dt.date):
        return f"{value:%Y-%m-%d}"
    if isinstance(value, dt.time):
        return f"{value:%H:%M:%S}{_fraction(value.microsecond, col.scale)}"
    if isinstance(value, (bytes, bytearray, memoryview)):
        return "0x" + bytes(value).hex().upper()
    if isinstance(value, uuid.UUID):
        return str(value).upper()
    if k == "guid" and isinstance(value, str):
        return value.upper()
    return str(value)


def _float_text(value: float, digits: int) -> str:
    text = f"{value:.{digits}g}"
    if "e" in text:
        mantissa, _, exp = text.partition("e")
        text = f"{mantissa}E{exp[0]}{int(exp[1:]):03d}" if exp[0] in "+-" else text
    return text


def _widths(rs: ResultSet, opts: Options, texts: list[list[str]]) -> list[int]:
    widths = []
    for i, col in enumerate(rs.columns):
        w = display_width(col)
        if opts.no_truncate and is_large(col):
            w = max((len(r[i]) for r in texts), default=0)
        if opts.header:
            w = max(w, len(col.name))
        if col.nullable:
            w = max(w, 4)
        widths.append(w)
    return widths


def _result_lines(rs: ResultSet, opts: Options) -> list[str]:
    texts = [[format_value(c, v) for c, v in zip(rs.columns, row, strict=True)] for row in rs.rows]
    sep = opts.separator
    lines: list[str] = []
    if opts.no_padding:
        if opts.header:
            lines.append(sep.join(c.name for c in rs.columns))
            lines.append(sep.join("-" * len(c.name) for c in rs.columns))
        lines.extend(sep.join(r) for r in texts)
        return lines
    widths = _widths(rs, opts, texts)

    def cell(text: str, width: int, col: Column) -> str:
        text = text[:width]
        return text.rjust(width) if col.kind in NUMERIC_KINDS else text.ljust(width)

    if opts.header:
        lines.append(sep.join(c.name[:w].ljust(w) for c, w in zip(rs.columns, widths, strict=True)))
        lines.append(sep.join("-" * w for w in widths))
    lines.extend(sep.join(cell(t, w, c) for t, w, c in zip(r, widths, rs.columns, strict=True)) for r in texts)
    return lines


def _wrap(line: str, width: int) -> list[str]:
    if len(line) <= width:
        return [line]
    return [line[i:i + width] for i in range(0, len(line), width)]


def rows_affected(n: int) -> str:
    return f"({n} row affected)" if n == 1 else f"({n} rows affected)"


def format_error(err: QueryError) -> list[str]:
    """sqlcmd's 'Msg n, Level l, State s, Server x, Line n' line and the text;
    the parts the driver did not pass are left out.  An error with no server
    number (the driver's or the runner's own, such as a time-out) is its text."""
    if not err.number:
        return [err.text]
    parts = [f"Msg {err.number}"]
    for label, value in (("Level", err.level), ("State", err.state), ("Server", err.server),
                         ("Line", err.line)):
        if value is not None:
            parts.append(f"{label} {value}")
    return [", ".join(parts), err.text]


def render_text(output: Output, opts: Options) -> str:
    """The whole output as Database Mail writes it into the body or the file."""
    lines: list[str] = []
    for item in output.items:
        if isinstance(item, ResultSet):
            lines.extend(_result_lines(item, opts))
            if item.count is not None:
                lines.extend(["", rows_affected(item.count)])
        elif isinstance(item, RowCount):
            lines.extend(["", rows_affected(item.count)])
        elif isinstance(item, Message):
            lines.extend(item.text.splitlines() or [""])
        elif isinstance(item, QueryError):
            lines.extend(format_error(item))
    if not opts.no_padding:
        lines = [piece for line in lines for piece in _wrap(line, opts.width)]
    return "".join(line + CRLF for line in lines)


def _csv_field(text: str | None) -> str:
    if text is None:
        return ""
    if any(ch in text for ch in ',"\r\n'):
        return '"' + text.replace('"', '""') + '"'
    return text


def render_csv(output: Output, opts: Options) -> str:
    """RFC 4180 CSV of every result set (comma, CRLF, NULL as an empty field);
    messages and errors are left out, a result set's header when header = 0."""
    lines: list[str] = []
    for item in output.items:
        if isinstance(item, ResultSet):
            if opts.header:
                lines.append(",".join(_csv_field(c.name) for c in item.columns))
            for row in item.rows:
                lines.append(",".join(_csv_field(None if v is None else format_value(c, v))
                                      for c, v in zip(item.columns, row, strict=True)))
    return "".join(line + CRLF for line in lines)


def _html(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace('"', "&quot;")


def render_html(output: Output, opts: Options) -> str:
    """One <table border="1"> per result set (values HTML-escaped, NULL as NULL)."""
    parts: list[str] = []
    for item in output.items:
        if isinstance(item, ResultSet):
            parts.append('<table border="1">')
            if opts.header:
                parts.append("<tr>" + "".join(f"<th>{_html(c.name)}</th>" for c in item.columns) + "</tr>")
            for row in item.rows:
                parts.append("<tr>" + "".join(f"<td>{_html(format_value(c, v))}</td>"
                                              for c, v in zip(item.columns, row, strict=True)) + "</tr>")
            parts.append("</table>")
        elif isinstance(item, Message):
            parts.append(f"<p>{_html(item.text)}</p>")
        elif isinstance(item, QueryError):
            parts.append("<p>" + "<br>".join(_html(x) for x in format_error(item)) + "</p>")
    return CRLF.join(parts) + (CRLF if parts else "")


def encode_attachment(text: str, result_format: str) -> tuple[bytes, str]:
    """The attachment's bytes and content type.  TEXT as Database Mail writes
    its query files: UTF-16LE with a byte-order mark (FF FE); CSV as UTF-8 with
    a byte-order mark, which Excel needs to split the commas and keep
    non-Latin text; HTML as UTF-8."""
    if result_format == "CSV":
        return ("\ufeff" + text).encode("utf-8"), "text/csv"
    if result_format == "HTML":
        return text.encode("utf-8"), "text/html"
    return ("\ufeff" + text).encode("utf-16-le"), "text/plain"


def render(output: Output, opts: Options, result_format: str = "TEXT") -> str:
    if result_format == "CSV":
        return render_csv(output, opts)
    if result_format == "HTML":
        return render_html(output, opts)
    return render_text(output, opts)
