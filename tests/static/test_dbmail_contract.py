"""mailq.SendDbMail keeps sp_send_dbmail's documented interface (issue 17).

The table below is Microsoft's documented parameter list of sp_send_dbmail,
in the order of the page's Syntax section, with the documented type and
default (``declared`` is the default a caller gets when leaving the parameter
out; where the page documents a meaning rather than a value -- "the default
is 'SQL Server Message'", "the current database", "Defaults to TEXT" -- the
procedure declares NULL and applies that meaning, noted in ``meaning``).
Reference: https://learn.microsoft.com/en-us/sql/relational-databases/system-stored-procedures/sp-send-dbmail-transact-sql

These tests read the procedure's text; they do not claim to test its
behaviour (tests/integration/test_dbmail_send.py does, on SQL Server 2022).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SEND = ROOT / "sql/procedures/mailq.SendDbMail.sql"
RENDER = ROOT / "sql/procedures/mailq.RenderDbMailQuery.sql"
REFERENCE_URL = (
    "https://learn.microsoft.com/en-us/sql/relational-databases/system-stored-procedures/sp-send-dbmail-transact-sql"
)

# name, documented type, declared default (None = no default), OUTPUT, documented meaning of the default
DOCUMENTED = [
    ("@profile_name", "SYSNAME", "NULL", False, "the caller's default private, else the default public profile"),
    ("@recipients", "VARCHAR(MAX)", "NULL", False, ""),
    ("@copy_recipients", "VARCHAR(MAX)", "NULL", False, ""),
    ("@blind_copy_recipients", "VARCHAR(MAX)", "NULL", False, ""),
    ("@from_address", "VARCHAR(MAX)", "NULL", False, "the profile's account"),
    ("@reply_to", "VARCHAR(MAX)", "NULL", False, "the profile's account"),
    ("@subject", "NVARCHAR(255)", "NULL", False, "'SQL Server Message'"),
    ("@body", "NVARCHAR(MAX)", "NULL", False, ""),
    ("@body_format", "VARCHAR(20)", "NULL", False, "TEXT"),
    ("@importance", "VARCHAR(6)", "'NORMAL'", False, ""),
    ("@sensitivity", "VARCHAR(12)", "'NORMAL'", False, ""),
    ("@file_attachments", "NVARCHAR(MAX)", "NULL", False, ""),
    ("@query", "NVARCHAR(MAX)", "NULL", False, ""),
    ("@execute_query_database", "SYSNAME", "NULL", False, "the current database"),
    ("@attach_query_result_as_file", "BIT", "0", False, ""),
    ("@query_attachment_filename", "NVARCHAR(255)", "NULL", False, "an arbitrary file name"),
    ("@query_result_header", "BIT", "1", False, ""),
    ("@query_result_width", "INT", "256", False, ""),
    ("@query_result_separator", "CHAR(1)", "' '", False, ""),
    ("@exclude_query_output", "BIT", "0", False, ""),
    ("@append_query_error", "BIT", "0", False, ""),
    ("@query_no_truncate", "BIT", "0", False, ""),
    ("@query_result_no_padding", "BIT", "0", False, ""),
    ("@mailitem_id", "INT", "NULL", True, ""),
]

_HEADER = re.compile(r"CREATE\s+OR\s+ALTER\s+PROCEDURE\s+mailq\.SendDbMail\s+(?P<params>.*?)\nAS\n", re.S | re.I)
_PARAM = re.compile(
    r"^\s*(?P<name>@\w+)\s+(?P<type>[A-Z]+(?:\(\s*(?:MAX|\d+)\s*\))?)"
    r"(?:\s*=\s*(?P<default>'[^']*'|N'[^']*'|[-\w]+))?(?P<output>\s+OUTPUT)?\s*,?\s*$",
    re.I,
)


def _code(path: Path) -> str:
    """The file without comments."""
    text = re.sub(r"/\*.*?\*/", "", path.read_text(encoding="utf-8"), flags=re.S)
    return re.sub(r"--[^\n]*", "", text)


def declared_parameters(text: str) -> list[tuple[str, str, str | None, bool]]:
    match = _HEADER.search(text)
    assert match, "CREATE OR ALTER PROCEDURE mailq.SendDbMail ... AS not found"
    params = []
    for line in match.group("params").splitlines():
        if not line.strip() or line.strip().startswith("--"):
            continue
        m = _PARAM.match(line)
        assert m, f"cannot read parameter line {line!r}"
        params.append((m.group("name"), m.group("type").upper().replace(" ", ""), m.group("default"),
                       bool(m.group("output"))))
    return params


def test_parameters_match_the_documented_list_in_order():
    declared = declared_parameters(SEND.read_text(encoding="utf-8"))
    documented = [(n, t, d, o) for n, t, d, o, _ in DOCUMENTED]
    assert [p[0] for p in declared[: len(documented)]] == [p[0] for p in documented]
    assert declared[: len(documented)] == documented


def test_extensions_come_after_the_documented_ones_and_are_marked():
    declared = declared_parameters(SEND.read_text(encoding="utf-8"))
    extra = declared[len(DOCUMENTED):]
    assert extra, "the HTML/CSV extension parameter is missing"
    assert all(name.startswith("@mailq_") for name, *_ in extra), extra
    assert all(default is not None for _, _, default, _ in extra), "an extension must never be required"


def test_header_cites_the_reference_page():
    assert REFERENCE_URL in SEND.read_text(encoding="utf-8")


def test_every_documented_parameter_is_described_in_the_header():
    text = SEND.read_text(encoding="utf-8")
    header = text[: text.index("CREATE OR ALTER PROCEDURE")]
    missing = [n for n, *_ in DOCUMENTED if n not in header and n not in (
        # grouped in the header as "@query ... @query_result_no_padding"
        "@query_result_header", "@query_result_width", "@query_result_separator",
        "@exclude_query_output", "@append_query_error",
    )]
    assert missing == []


def test_enqueues_through_enqueue_mail_with_named_parameters_only():
    text = _code(SEND)
    calls = re.findall(r"EXEC\s+mailq\.EnqueueMail\b(.*?);", text, re.S | re.I)
    assert len(calls) == 1
    args = [a.strip() for a in calls[0].split(",") if a.strip()]
    assert all(re.match(r"@\w+\s*=", a) for a in args), args
    assert "INSERT INTO mailq.MailQueue" not in text  # never around EnqueueMail


@pytest.mark.parametrize("path", [SEND, RENDER], ids=lambda p: p.name)
def test_no_savepoint_and_the_one_catch_pattern(path):
    code = _code(path)
    assert not re.search(r"\bSAVE\s+TRAN", code, re.I)
    if "BEGIN TRANSACTION" in code:
        assert "DECLARE @OwnTran BIT = IIF(@@TRANCOUNT = 0, 1, 0);" in code
        assert "IF @OwnTran = 1 AND XACT_STATE() <> 0 ROLLBACK TRANSACTION;" in code


def test_query_runs_as_the_caller_in_a_quoted_database():
    code = _code(RENDER)
    # No EXECUTE AS anywhere: the query must run with the caller's rights.
    assert not re.search(r"\bEXECUTE\s+AS\b|\bWITH\s+EXECUTE\b", code, re.I)
    assert "QUOTENAME(@Database) + N'.sys.sp_executesql'" in code
    # The query text is only ever passed as a parameter value (@q / @tsql).
    assert "@q = @Query" in code and "@tsql = @Query" in code
    send = _code(SEND)
    assert not re.search(r"\bEXECUTE\s+AS\b|\bWITH\s+EXECUTE\b", send, re.I)


def test_the_reader_fails_on_a_changed_signature(tmp_path):
    text = SEND.read_text(encoding="utf-8").replace("@subject NVARCHAR(255) = NULL", "@subject NVARCHAR(200) = NULL")
    declared = declared_parameters(text)
    assert ("@subject", "NVARCHAR(200)", "NULL", False) in declared
    assert declared[: len(DOCUMENTED)] != [(n, t, d, o) for n, t, d, o, _ in DOCUMENTED]
