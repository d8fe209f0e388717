"""mailq.SendDbMail keeps sp_send_dbmail's interface (issues 17 and 25).

The table below is sp_send_dbmail's parameter list in msdb's own declaration
order (a public copy of msdb's procedure text: @from_address and @reply_to
come last, after @mailitem_id), which is what a positional call binds to,
with the documented type and
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
CHECK = ROOT / "sql/procedures/mailq.CheckDbMailRequest.sql"
CLAIM = ROOT / "sql/procedures/mailq.ClaimDbMailQuery.sql"
COMPLETE = ROOT / "sql/procedures/mailq.CompleteDbMailQuery.sql"
REFERENCE_URL = (
    "https://learn.microsoft.com/en-us/sql/relational-databases/system-stored-procedures/sp-send-dbmail-transact-sql"
)

# name, documented type, declared default (None = no default), OUTPUT, documented meaning of the default
DOCUMENTED = [
    ("@profile_name", "SYSNAME", "NULL", False, "the caller's default private, else the default public profile"),
    ("@recipients", "VARCHAR(MAX)", "NULL", False, ""),
    ("@copy_recipients", "VARCHAR(MAX)", "NULL", False, ""),
    ("@blind_copy_recipients", "VARCHAR(MAX)", "NULL", False, ""),
    ("@subject", "NVARCHAR(255)", "NULL", False, "'SQL Server Message'"),
    ("@body", "NVARCHAR(MAX)", "NULL", False, ""),
    ("@body_format", "VARCHAR(20)", "NULL", False, "TEXT"),
    ("@importance", "VARCHAR(6)", "'NORMAL'", False, ""),
    ("@sensitivity", "VARCHAR(12)", "'NORMAL'", False, ""),
    ("@file_attachments", "NVARCHAR(MAX)", "NULL", False, ""),
    ("@query", "NVARCHAR(MAX)", "NULL", False, ""),
    ("@execute_query_database", "SYSNAME", "NULL", False, "the current database"),
    ("@attach_query_result_as_file", "BIT", "0", False, ""),
    # msdb declares nvarchar(260); the page says nvarchar(255): the wider one accepts both.
    ("@query_attachment_filename", "NVARCHAR(260)", "NULL", False, "an arbitrary file name"),
    ("@query_result_header", "BIT", "1", False, ""),
    ("@query_result_width", "INT", "256", False, ""),
    ("@query_result_separator", "CHAR(1)", "' '", False, ""),
    ("@exclude_query_output", "BIT", "0", False, ""),
    ("@append_query_error", "BIT", "0", False, ""),
    ("@query_no_truncate", "BIT", "0", False, ""),
    ("@query_result_no_padding", "BIT", "0", False, ""),
    ("@mailitem_id", "INT", "NULL", True, ""),
    ("@from_address", "VARCHAR(MAX)", "NULL", False, "the profile's account"),
    ("@reply_to", "VARCHAR(MAX)", "NULL", False, "the profile's account"),
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


def test_validation_raises_without_aborting_before_the_enqueue():
    """H1: every refusal before the enqueue is RAISERROR + RETURN (never THROW,
    which ends the batch), XACT_ABORT is set only right before the enqueue,
    and msdb's return codes are the ones msdb's procedure text uses."""
    code = _code(SEND)
    body = code[code.index("AS\nBEGIN"):]
    before, _, after = body.partition("SET XACT_ABORT ON;")
    assert after, "XACT_ABORT must be set before the enqueue"
    assert "THROW" not in before and "EXEC mailq.EnqueueMail" not in before
    assert "EXEC mailq.EnqueueMail" in after
    assert "SET NOCOUNT, XACT_ABORT ON" not in code
    # The checks live in mailq.CheckDbMailRequest, called before XACT_ABORT is set; its
    # return code (non-zero: refused, RAISEd already) is SendDbMail's.
    assert re.search(r"EXEC @rc = mailq\.CheckDbMailRequest\b[^;]*;\s*IF @rc IS NULL OR @rc <> 0 RETURN COALESCE\(@rc, 1\);",
                     before)
    check = _code(CHECK)
    assert "THROW" not in check and "XACT_ABORT" not in check and "BEGIN TRAN" not in check
    assert re.search(r"RETURN 0;\s*END;\s*$", check)
    before += check[check.index("AS\nBEGIN"):]
    pairs = re.findall(r"RAISERROR \((\d+), 16, 1[^;]*\);\s*RETURN (\d+);", before)
    assert {(int(n), int(rc)) for n, rc in pairs} >= {
        (14607, 1), (14636, 1), (14626, 13), (14618, 15), (14622, 16), (14618, 17), (14623, 18), (14624, 19),
        (14624, 20), (14613, 1), (14625, 21), (14630, 2), (14633, 1)}
    # Every RAISERROR is followed by a RETURN of a non-zero code.
    assert len(re.findall(r"RAISERROR", before)) == len(re.findall(r"RAISERROR[^;]*;\s*RETURN @?\w+;", before))


def test_enqueues_through_enqueue_mail_with_named_parameters_only():
    text = _code(SEND)
    calls = re.findall(r"EXEC\s+mailq\.EnqueueMail\b(.*?);", text, re.S | re.I)
    assert len(calls) == 1
    args = [a.strip() for a in calls[0].split(",") if a.strip()]
    assert all(re.match(r"@\w+\s*=", a) for a in args), args
    assert "INSERT INTO mailq.MailQueue" not in text  # never around EnqueueMail


@pytest.mark.parametrize("path", [SEND, COMPLETE], ids=lambda p: p.name)
def test_no_savepoint_and_the_one_catch_pattern(path):
    code = _code(path)
    assert not re.search(r"\bSAVE\s+TRAN", code, re.I)
    if "BEGIN TRANSACTION" in code:
        assert "DECLARE @OwnTran BIT = IIF(@@TRANCOUNT = 0, 1, 0);" in code
        assert "IF @OwnTran = 1 AND XACT_STATE() <> 0 ROLLBACK TRANSACTION;" in code


def test_no_module_impersonates():
    """The query never runs inside SendDbMail: the runner impersonates the
    sender ad hoc, with a cookie (mailq_db.dbmail.runner); no module of ours
    has EXECUTE AS, and SendDbMail stores the sender's user and SID."""
    for path in (SEND, CHECK, CLAIM, COMPLETE):
        assert not re.search(r"\bEXECUTE\s+AS\b|\bWITH\s+EXECUTE\b", _code(path), re.I), path.name
    send = _code(SEND)
    assert "USER_NAME(), USER_SID()" in send and "sp_executesql" not in send
    runner = (ROOT / "src/mailq_db/dbmail/runner.py").read_text(encoding="utf-8")
    assert "WITH COOKIE INTO @c" in runner and "REVERT WITH COOKIE" in runner


def test_the_reader_fails_on_a_changed_signature(tmp_path):
    text = SEND.read_text(encoding="utf-8").replace("@subject NVARCHAR(255) = NULL", "@subject NVARCHAR(200) = NULL")
    declared = declared_parameters(text)
    assert ("@subject", "NVARCHAR(200)", "NULL", False) in declared
    assert declared[: len(DOCUMENTED)] != [(n, t, d, o) for n, t, d, o, _ in DOCUMENTED]


def test_messages_get_the_arguments_msdb_passes():
    """sys.messages texts of msdb's errors have as many %s as msdb passes
    arguments; one left out prints '(null)'.  msdb's sp_RunMailQuery raises
    14630 with the file name and the prohibited list."""
    code = _code(CHECK)
    assert "RAISERROR (14630, 16, 1, @query_attachment_filename, N'exe,dll,vbs,js');" in code
    # the same list as mailq.sysmail_configuration's ProhibitedExtensions
    assert "N'exe,dll,vbs,js'" in (ROOT / "sql/views/mailq.sysmail_configuration.sql").read_text(encoding="utf-8")


def test_callers_read_their_attachments_as_in_msdb():
    """msdb grants DatabaseMailUserRole sysmail_mailattachments (each member
    sees the attachments of its own mail: the view filters on the sender);
    the grant runs after the view is created."""
    order = [line.strip() for line in (ROOT / "sql/BuildOrder.txt").read_text(encoding="utf-8").splitlines()]
    grants = {
        line: (ROOT / "sql" / line).read_text(encoding="utf-8") for line in order if line.endswith(".grants.sql")
    }
    granting = [f for f, text in grants.items()
                if "GRANT SELECT ON OBJECT::mailq.sysmail_mailattachments TO MailqDbMailUser;" in text]
    assert granting and order.index(granting[0]) > order.index("views/mailq.sysmail_mailattachments.sql")
    view = (ROOT / "sql/views/mailq.sysmail_mailattachments.sql").read_text(encoding="utf-8")
    assert "i.SendRequestUser = COALESCE(SUSER_SNAME(), USER_NAME())" in view


def test_the_checks_get_every_parameter_with_its_declared_type():
    """mailq.CheckDbMailRequest takes SendDbMail's parameters under the same names
    and types (no conversion on the way), and SendDbMail passes each one by name;
    OUTPUT exactly for the values the checks normalize and what they resolve."""
    send = {n: t for n, t, _, _ in declared_parameters(SEND.read_text(encoding="utf-8"))}
    text = CHECK.read_text(encoding="utf-8").replace("PROCEDURE mailq.CheckDbMailRequest", "PROCEDURE mailq.SendDbMail")
    check = declared_parameters(text)
    normalized = {"@subject", "@body_format", "@importance", "@sensitivity", "@query_attachment_filename"}
    for name, typ, default, output in check:
        assert default is None, name  # every one passed explicitly
        if name in ("@ProfileID", "@AccountName"):
            assert output, name
            continue
        assert send[name] == typ, name
        assert output == (name in normalized), name
    call = re.search(r"EXEC @rc = mailq\.CheckDbMailRequest(.*?);", _code(SEND), re.S).group(1)
    passed = [re.match(r"\s*(@\w+) = (@\w+)( OUTPUT)?\s*$", a).groups() for a in call.split(",")]
    assert [(n, n, " OUTPUT" if o else None) for n, _, _, o in check] == passed
