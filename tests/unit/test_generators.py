"""mailq_db.generators: lazy attachments from entry-point generators (issue 16, point 2)."""

from __future__ import annotations

import csv
import io

import pytest

from mailq_db.generators import (
    GROUP,
    AttachmentError,
    Generated,
    check_attachments,
    csv_from_rows,
    generate_attachment,
    installed_generators,
)
from mailq_db.procedures import Attachment
from mailq_db.templates import Limits


def test_the_builtin_csv_generator_is_installed_as_an_entry_point():
    eps = installed_generators()
    assert "csv" in eps and eps["csv"].value == "mailq_db.generators:csv_from_rows"
    assert eps["csv"].group == GROUP


def test_csv_from_json_rows():
    att = generate_attachment("csv", '{"rows": [{"name": "\u5f20\u4e09", "amount": 12.5}, {"name": "b", "note": "x,y"}]}',
                              file_name="report.csv")
    assert (att.file_name, att.content_type) == ("report.csv", "text/csv")
    rows = list(csv.reader(io.StringIO(att.content.decode("utf-8"))))
    assert rows == [["name", "amount", "note"], ["\u5f20\u4e09", "12.5", ""], ["b", "", "x,y"]]
    assert att.content.endswith(b"\r\n")


def test_csv_options_lists_columns_bom_and_formula_neutralizing():
    out = csv_from_rows({"rows": [["=1+1", -3, "@cmd", None, True]], "columns": ["a", "b", "c", "d", "e"],
                         "delimiter": ";", "excel": True})
    text = out.content.decode("utf-8")
    assert text.startswith("\ufeffa;b;c;d;e\r\n")
    assert text.endswith("'=1+1;-3;'@cmd;;true\r\n")
    raw = csv_from_rows({"rows": [["=1"]], "header": False, "neutralize_formulas": False})
    assert raw.content == b"=1\r\n"
    for bad in ({}, {"rows": "x"}, {"rows": [1]}, {"rows": [[1]], "delimiter": ",,"}, {"rows": [[1]], "columns": [1]}):
        with pytest.raises(ValueError):
            csv_from_rows(bad)


def test_unknown_generator_lists_what_is_installed():
    with pytest.raises(AttachmentError) as info:
        generate_attachment("invoice-pdf", "{}")
    assert "no generator of this name is installed" in str(info.value) and "csv" in str(info.value)
    assert info.value.generator == "invoice-pdf"


def test_bad_arguments_and_generator_failures_are_clear():
    reg = {"boom": lambda args: 1 / 0, "ok": lambda args: b"x", "weird": lambda args: 42}
    with pytest.raises(AttachmentError, match="not valid JSON"):
        generate_attachment("ok", "{", registry=reg)
    with pytest.raises(AttachmentError, match="JSON object"):
        generate_attachment("ok", "[1]", registry=reg)
    with pytest.raises(AttachmentError, match="failed: ZeroDivisionError: division by zero") as info:
        generate_attachment("boom", {}, file_name="a.bin", registry=reg)
    assert "Traceback" not in str(info.value)
    with pytest.raises(AttachmentError, match="must return bytes"):
        generate_attachment("weird", {}, registry=reg)
    with pytest.raises(AttachmentError, match="bare name"):
        generate_attachment("ok", {}, file_name="../etc/passwd", registry=reg)
    with pytest.raises(AttachmentError, match="content type"):
        generate_attachment("ok", {}, content_type="text/plain; charset=x", registry=reg)


def test_output_is_held_to_the_attachment_limit_even_when_streamed():
    limits = Limits(max_attachment_bytes=100)
    produced = []

    def endless(args):
        while True:
            produced.append(1)
            yield b"x" * 10

    with pytest.raises(AttachmentError, match="over 100 bytes"):
        generate_attachment("endless", {}, registry={"endless": endless}, limits=limits)
    assert len(produced) == 11  # stopped at the first chunk over the limit
    with pytest.raises(AttachmentError, match="over 100 bytes"):
        generate_attachment("big", {}, registry={"big": lambda a: "y" * 101}, limits=limits)
    att = generate_attachment("gen", {"n": 3}, registry={
        "gen": lambda a: Generated(content=[b"ab"] * a["n"], content_type="text/plain", file_name="g.txt")})
    assert att == Attachment("g.txt", b"ababab", "text/plain")


def test_per_mail_limits_over_stored_and_generated_attachments():
    limits = Limits(max_attachments=2, max_attachment_bytes=10, max_mail_attachment_bytes=15)
    check_attachments([Attachment("a", b"x" * 10), Attachment("b", b"x" * 5)], limits=limits)
    with pytest.raises(AttachmentError, match="3 attachments"):
        check_attachments([Attachment(str(i), b"") for i in range(3)], limits=limits)
    with pytest.raises(AttachmentError, match="per attachment"):
        check_attachments([Attachment("a", b"x" * 11)], limits=limits)
    with pytest.raises(AttachmentError, match="total 16 bytes"):
        check_attachments([Attachment("a", b"x" * 10), Attachment("b", b"x" * 6)], limits=limits)
