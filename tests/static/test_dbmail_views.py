"""The mailq.sysmail_* views keep msdb's column names and order (issues 17, 25),
with Unicode text (msdb stores body and query as nvarchar(max); no column is
cast to a code page) and event_log.log_id as the stable BIGINT event ID.

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
    ("mailitem_id", "int"), ("profile_id", "int"), ("recipients", "nvarchar"),
    ("copy_recipients", "nvarchar"), ("blind_copy_recipients", "nvarchar"),
    ("subject", "nvarchar(900)"), ("body", "nvarchar(max)"), ("body_format", "nvarchar(20)"),
    ("importance", "nvarchar(6)"), ("sensitivity", "nvarchar(12)"), ("file_attachments", "nvarchar(max)"),
    ("attachment_encoding", "nvarchar(20)"), ("query", "nvarchar(max)"), ("execute_query_database", "sysname"),
    ("attach_query_result_as_file", "bit"), ("query_result_header", "bit"), ("query_result_width", "int"),
    ("query_result_separator", "nchar(1)"), ("exclude_query_output", "bit"), ("append_query_error", "bit"),
    ("send_request_date", "datetime"), ("send_request_user", "sysname"), ("sent_account_id", "int"),
    ("sent_status", "nvarchar(8)"), ("sent_date", "datetime"), ("last_mod_date", "datetime"),
    ("last_mod_user", "sysname"),
]
EVENT_LOG = [
    ("log_id", "bigint"), ("event_type", "nvarchar(11)"), ("log_date", "datetime"), ("description", "nvarchar(max)"),
    ("process_id", "int"), ("mailitem_id", "int"), ("account_id", "int"), ("last_mod_date", "datetime"),
    ("last_mod_user", "sysname"),
]
CATALOGUE = {
    "sysmail_mailattachments": ["attachment_id", "mailitem_id", "filename", "filesize", "attachment",
                                "last_mod_date", "last_mod_user"],
    "sysmail_profile": ["profile_id", "name", "description", "last_mod_datetime", "last_mod_user"],
    "sysmail_account": ["account_id", "name", "description", "email_address", "display_name", "replyto_address",
                        "last_mod_datetime", "last_mod_user"],
    "sysmail_profileaccount": ["profile_id", "account_id", "sequence_number", "last_mod_datetime", "last_mod_user"],
    "sysmail_principalprofile": ["profile_id", "principal_sid", "is_default", "last_mod_datetime", "last_mod_user",
                                 "principal_name"],
    "sysmail_configuration": ["paramname", "paramvalue", "description", "last_mod_datetime", "last_mod_user"],
}


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


@pytest.mark.parametrize("view", ["sysmail_allitems", "sysmail_event_log", *CATALOGUE])
def test_no_text_is_cast_to_a_code_page(view):
    text = (VIEWS / f"mailq.{view}.sql").read_text(encoding="utf-8").upper()
    code = text[text.index("CREATE OR ALTER VIEW"):]
    assert not re.search(r"\bAS\s+(VAR)?CHAR\s*\(", code), view


@pytest.mark.parametrize("view,columns", list(CATALOGUE.items()))
def test_catalogue_views_have_msdbs_columns(view, columns):
    text = (VIEWS / f"mailq.{view}.sql").read_text(encoding="utf-8")
    body = text[text.index("CREATE OR ALTER VIEW"):]
    body = body[body.index("\nSELECT\n"):body.index("\nFROM ")]
    names = re.findall(r"(?:\bAS\s+|^    c\.)(\w+),?$", body, re.M)
    assert names == columns


def test_event_log_has_one_error_per_final_failure_and_a_stable_log_id():
    code = (VIEWS / "mailq.sysmail_event_log.sql").read_text(encoding="utf-8")
    code = code[code.index("CREATE OR ALTER VIEW"):]
    assert "CAST(e.EventSeq AS BIGINT) AS log_id" in code and "ROW_NUMBER" not in code
    assert "WHEN e.EventType IN (N'Failed', N'Expired') THEN N'error'" in code
    assert "FROM mailq.DbMailItem AS i" in code  # driven by the DbMail items, never a scan of the event stream


def test_items_views_are_keyed_on_stored_columns():
    code = (VIEWS / "mailq.sysmail_allitems.sql").read_text(encoding="utf-8")
    assert "i.MailItemID AS mailitem_id" in code and "i.SendRequestDate AS send_request_date" in code
    assert "FROM mailq.DbMailItem AS i\nINNER JOIN mailq.MailQueue AS q ON i.MailID = q.ID" in code


def test_the_reader_sees_a_renamed_column(tmp_path):
    text = (VIEWS / "mailq.sysmail_allitems.sql").read_text(encoding="utf-8").replace("AS sent_status", "AS status")
    names = select_list(text)
    assert "status" in names and "sent_status" not in names
