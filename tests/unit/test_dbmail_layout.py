"""The @query layout (mailq_db.dbmail.layout) byte for byte against published
samples of sqlcmd's output, the layout Database Mail uses.

Sources (each case names its own):
* GO  = microsoft/go-sqlcmd, Microsoft's sqlcmd: pkg/sqlcmd/format_test.go
  (TestFitToScreen: a line is cut every width characters; TestCalcColumnDetails:
  ``select 100 as '123456789ABC', getdate() as '987654321', 'string' as col1``
  gives widths 12 right-justified, 23, 6 left-justified) and
  pkg/sqlcmd/sqlcmd_test.go (``oneRowAffected = "(1 row affected)"``; each result
  set is followed by an empty line and the count, the next one starts at once).
* DBA = dba.stackexchange.com/questions/160498: Database Mail's query files
  are UTF-16 little endian with the byte-order mark FF FE.
* MS  = Microsoft's sp_send_dbmail page: "Binary data in the result is sent in
  hexadecimal format"; @query_result_width is the line width.
Widths of the other types (decimal p+2, float 24, real 14, datetime2(p) 19+p+1,
time(p) 8+p+1, datetimeoffset(p) 26+p+1, binary(n) 2n+2) are sqlcmd's display
sizes; they are checked on a real server by tests/integration/test_dbmail_send.py.
"""

from __future__ import annotations

import datetime as dt
import decimal

import pytest

from mailq_db.dbmail import layout as L

EOL = "\r\n"


def text(items, **opts):
    return L.render_text(L.Output(items=list(items)), L.Options(**opts))


def test_go_sqlcmd_column_details_and_one_row_affected():
    # GO TestCalcColumnDetails: int named '123456789ABC' -> 12 wide, right; getdate() -> 23; 'string' -> 6, left.
    cols = [L.Column("123456789ABC", "int", 10, 0, False), L.Column("987654321", "datetime", 23, 3, False),
            L.Column("col1", "char", 6, 0, False)]
    rs = L.ResultSet(cols, [(100, dt.datetime(2024, 1, 2, 3, 4, 5, 678000), "string")], count=1)
    assert text([rs]) == (
        "123456789ABC 987654321               col1  " + EOL
        + "------------ ----------------------- ------" + EOL
        + "         100 2024-01-02 03:04:05.678 string" + EOL
        + EOL
        + "(1 row affected)" + EOL
    )


def test_go_sqlcmd_two_result_sets_follow_each_other():
    # GO TestIncludeFileNoExecutions: "100" EOL EOL "(1 row affected)" EOL "string" EOL EOL "(1 row affected)" EOL
    a = L.ResultSet([L.Column("num", "int", 10, 0, False)], [(100,)], count=1)
    b = L.ResultSet([L.Column("title", "char", 6, 0, False)], [("string",)], count=1)
    assert text([a, b], header=False, no_padding=True) == (
        "100" + EOL + EOL + "(1 row affected)" + EOL + "string" + EOL + EOL + "(1 row affected)" + EOL)


@pytest.mark.parametrize("width,raw,fit", [
    (9, "12345678", ["12345678"]),
    (9, "123456789", ["123456789"]),
    (9, "123456789A", ["123456789", "A"]),
])
def test_go_sqlcmd_fit_to_screen(width, raw, fit):
    # GO TestFitToScreen (widths below 10 are refused by SendDbMail; the rule is the same).
    out = L.render_text(L.Output([L.Message(raw)]), L.Options(width=width))
    assert out == "".join(x + EOL for x in fit)


def test_nocount_drops_the_count_line_and_dml_counts_stay_separate():
    rs = L.ResultSet([L.Column("n", "int", 10, 0, False)], [(1,)], count=None)
    # Headers stay on the left, numbers go right.
    assert text([L.RowCount(3), rs]) == EOL + "(3 rows affected)" + EOL + "n          " + EOL + "-----------" + EOL \
        + "          1" + EOL


def test_null_widens_a_nullable_column_to_four():
    rs = L.ResultSet([L.Column("b", "bit", 1, 0, True)], [(None,), (True,)], count=2)
    assert text([rs]) == "b   " + EOL + "----" + EOL + "NULL" + EOL + "   1" + EOL + EOL + "(2 rows affected)" + EOL


@pytest.mark.parametrize("col,value,shown,width", [
    (L.Column("x", "decimal", 5, 2, False), decimal.Decimal("12.50"), "12.50", 7),
    (L.Column("x", "float", 53, 0, False), 0.1, "0.10000000000000001", 24),
    (L.Column("x", "real", 24, 0, False), 0.1, "0.1", 14),
    (L.Column("x", "datetime2", 19, 0, False), dt.datetime(2024, 1, 2, 3, 4, 5), "2024-01-02 03:04:05", 19),
    (L.Column("x", "datetime2", 27, 7, False), dt.datetime(2024, 1, 2, 3, 4, 5, 123456),
     "2024-01-02 03:04:05.1234560", 27),
    (L.Column("x", "time", 12, 3, False), dt.time(3, 4, 5, 120000), "03:04:05.120", 12),
    (L.Column("x", "smalldatetime", 16, 0, False), dt.datetime(2024, 1, 2, 3, 4), "2024-01-02 03:04:00", 19),
    (L.Column("x", "datetimeoffset", 30, 3, False),
     L.DateTimeOffset(dt.datetime(2024, 1, 2, 3, 4, 5), 123456789, -90), "2024-01-02 03:04:05.123 -01:30", 30),
    (L.Column("x", "binary", 2, 0, False), b"\x0a\xff", "0x0AFF", 6),  # MS: hexadecimal
    (L.Column("x", "date", 10, 0, False), dt.date(2024, 1, 2), "2024-01-02", 10),
])
def test_value_and_width_per_type(col, value, shown, width):
    assert L.format_value(col, value) == shown
    assert L.display_width(col) == width


def test_large_values_are_cut_at_256_unless_no_truncate():
    col = L.Column("v", "char", 0, 0, False)
    long = "a" * 300
    cut = text([L.ResultSet([col], [(long,)])], width=1000).splitlines()
    assert cut[2] == "a" * 256
    whole = text([L.ResultSet([col], [(long,)])], width=1000, no_truncate=True).splitlines()
    assert whole[2] == long and len(whole[1]) == 300


def test_no_padding_and_separator():
    cols = [L.Column("id", "int", 10, 0, False), L.Column("name", "char", 10, 0, True)]
    rs = L.ResultSet(cols, [(1, "李雷"), (22, None)], count=None)
    assert text([rs], separator=",", no_padding=True) == "id,name" + EOL + "--,----" + EOL + "1,李雷" + EOL \
        + "22,NULL" + EOL


def test_messages_and_errors_in_order():
    err = L.QueryError(8134, "Divide by zero error encountered.", level=16, state=1, server="SQL1", line=1)
    assert text([L.Message("Disk report"), err]) == (
        "Disk report" + EOL + "Msg 8134, Level 16, State 1, Server SQL1, Line 1" + EOL
        + "Divide by zero error encountered." + EOL)
    assert L.format_error(L.QueryError(208, "Invalid object name 'x'.", server="SQL1")) == [
        "Msg 208, Server SQL1", "Invalid object name 'x'."]
    # the driver's own errors (a time-out: number 0) and the runner's have no Msg line
    assert L.format_error(L.QueryError(0, "Query timeout expired", server="SQL1")) == ["Query timeout expired"]
    assert L.format_error(L.QueryError(None, "column 1 of the result is sql_variant")) == [
        "column 1 of the result is sql_variant"]


def test_attachment_encoding():
    data, ctype = L.encode_attachment("é" + EOL, "TEXT")
    assert data[:2] == b"\xff\xfe" and data.decode("utf-16") == "é" + EOL and ctype == "text/plain"  # DBA
    data, ctype = L.encode_attachment("名前" + EOL, "CSV")
    assert data[:3] == b"\xef\xbb\xbf" and ctype == "text/csv"


def test_csv_quotes_and_nulls():
    cols = [L.Column("a", "char", 10, 0, True), L.Column("b", "int", 10, 0, True)]
    out = L.render_csv(L.Output([L.ResultSet(cols, [('x,"y"', None)])]), L.Options())
    assert out == "a,b" + EOL + '"x,""y""",' + EOL
