"""The mailq.sysmail_* views keep msdb's documented columns, in order (issue 17).

Documented lists (name, type) from Microsoft's pages:
https://learn.microsoft.com/en-us/sql/relational-databases/system-catalog-views/sysmail-allitems-transact-sql
(sysmail_sentitems, sysmail_unsentitems and sysmail_faileditems have the same
columns) and
https://learn.microsoft.com/en-us/sql/relational-databases/system-catalog-views/sysmail-event-log-transact-sql.
This test reads the views' text (names and the CAST each column gets); the
types as SQL Server reports them are checked in
tests/integration/test_dbmail_send.py::test_sysmail_view_types_are_the_documented_ones.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
VIEWS = ROOT / "sql/views"

ALLITEMS = [
    ("mailitem_id", "int"), ("profile_id", "int"), ("recipients", "varchar(max)"),
    ("copy_recipients", "varchar(max)"), ("blind_copy_recipients", "varchar(max)"),
    ("subject", "nvarchar(510)"), ("body", "varchar(max)"), ("body_format", "varchar(20)"),
    ("importance", "varchar(6)"), ("sensitivity", "varchar(12)"), ("file_attachments", "varchar(max)"),
    ("attachment_encoding", "varchar(20)"), ("query", "varchar(max)"), ("execute_query_database", "sysname"),
    ("attach_query_result_as_file", "bit"), ("query_result_header", "bit"), ("query_result_width", "int"),
    ("query_result_separator", "char(1)"), ("exclude_query_output", "bit"), ("append_query_error", "bit"),
    ("send_request_date", "datetime"), ("send_request_user", "sysname"), ("sent_account_id", "int"),
    ("sent_status", "varchar(8)"), ("sent_date", "datetime"), ("last_mod_date", "datetime"),
    ("last_mod_user", "sysname"),
]
EVENT_LOG = [
    ("log_id", "int"), ("event_type", "varchar(11)"), ("log_date", "datetime"), ("description", "nvarchar(max)"),
    ("process_id", "int"), ("mailitem_id", "int"), ("account_id", "int"), ("last_mod_date", "datetime"),
    ("last_mod_user", "sysname"),
]


def select_list(text: str) -> list[str]:
    """Output names of the view's outer SELECT (one item per line group, 4-space indent)."""
    body = text[text.index("CREATE OR ALTER VIEW"):]
    body = body[body.rindex("\nSELECT\n") + len("\nSELECT\n"):]
    body = body[: body.index("\nFROM ")]
    names = []
    for line in body.splitlines():
        if re.match(r"^    \S", line) or re.match(r"^    \) AS ", line):
            m = re.search(r"(?:\bAS\s+|^    i\.)(\w+),?$", line)
            if m:
                names.append(m.group(1))
    return names


@pytest.mark.parametrize("view,documented", [
    ("sysmail_allitems", ALLITEMS), ("sysmail_sentitems", ALLITEMS), ("sysmail_unsentitems", ALLITEMS),
    ("sysmail_faileditems", ALLITEMS), ("sysmail_event_log", EVENT_LOG),
])
def test_view_has_the_documented_columns_in_order(view, documented):
    text = (VIEWS / f"mailq.{view}.sql").read_text(encoding="utf-8")
    assert select_list(text) == [name for name, _ in documented]
    # The header cites the view's reference page.
    assert f"sysmail-{view.removeprefix('sysmail_').replace('_', '-')}-transact-sql" in text


@pytest.mark.parametrize("view,documented", [("sysmail_allitems", ALLITEMS), ("sysmail_event_log", EVENT_LOG)])
def test_text_columns_are_cast_to_the_documented_type(view, documented):
    text = (VIEWS / f"mailq.{view}.sql").read_text(encoding="utf-8").upper()
    for name, kind in documented:
        if "(" in kind or kind in ("datetime", "sysname"):
            assert re.search(rf"AS {re.escape(kind.upper())}\)\s*(?:\n\s*\)\s*)?AS {name.upper()}\b", text) or \
                re.search(rf"AS {re.escape(kind.upper())}\s*\)\s*AS {name.upper()}\b", text), (name, kind)


def test_the_reader_sees_a_renamed_column(tmp_path):
    text = (VIEWS / "mailq.sysmail_allitems.sql").read_text(encoding="utf-8").replace("AS sent_status", "AS status")
    names = select_list(text)
    assert "status" in names and "sent_status" not in names
