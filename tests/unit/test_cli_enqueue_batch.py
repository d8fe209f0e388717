"""`mailq-db enqueue --batch FILE.json` (issue 16, point 6): the file goes to
mailq.EnqueueMailBatch unchanged in one call; the output counts what was
queued and lists rejected rows.  The procedure wrapper is replaced by a
recorder (this tests the command's Python, not the procedure)."""

from __future__ import annotations

import json

import pytest

from mailq_db import procedures
from mailq_db.cli import main


class Conn:
    def close(self):
        pass


@pytest.fixture
def calls(monkeypatch):
    seen = []

    def fake(conn, text, *, reject_invalid=False):
        seen.append((text, reject_invalid))
        return procedures.BatchResult(
            [procedures.BatchEnqueued(1, 10, "<a@x>", True), procedures.BatchEnqueued(2, 7, "<b@x>", False)],
            [procedures.BatchRejected(3, "Priority", 50109, "Priority must be 0-9 (9 is sent first); got 10.")]
            if reject_invalid else [],
        )

    monkeypatch.setattr("mailq_db.commands.enqueue.procedures.enqueue_mail_batch_json", fake)
    monkeypatch.setattr("mailq_db.commands.enqueue.connect", lambda *a, **k: Conn())
    monkeypatch.setenv("MAILQ_DB_URL", "mssql+pyodbc://u:p@fake/db")
    return seen


def write(tmp_path, mails) -> str:
    path = tmp_path / "mails.json"
    path.write_text(json.dumps(mails, ensure_ascii=False), encoding="utf-8")
    return str(path)


def test_batch_file_is_sent_unchanged_in_one_call(calls, tmp_path, capsys):
    mails = [{"ToAddress": "a@example.com", "Subject": "你好", "Body": "b"}] * 2
    path = write(tmp_path, mails)
    assert main(["enqueue", "--batch", path]) == 0
    assert calls == [(open(path, encoding="utf-8").read(), False)]
    assert capsys.readouterr().out.strip() == "1 mails queued, 1 already queued (same idempotency key)"


def test_rejected_rows_are_listed_and_exit_1(calls, tmp_path, capsys):
    assert main(["enqueue", "--batch", write(tmp_path, [{"ToAddress": "a@example.com"}]), "--reject-invalid"]) == 1
    out = capsys.readouterr().out
    assert "; 1 rejected" in out and "row 3: Priority [50109] Priority must be 0-9" in out


def test_batch_refuses_single_mail_options_and_non_arrays(calls, tmp_path, capsys):
    with pytest.raises(SystemExit) as info:
        main(["enqueue", "--batch", write(tmp_path, []), "--to", "a@example.com"])
    assert info.value.code == 2 and "leave out --to" in capsys.readouterr().err
    assert main(["enqueue", "--batch", write(tmp_path, {"ToAddress": "a@example.com"})]) == 1
    assert "JSON array of objects" in capsys.readouterr().err
    assert calls == []


def test_reject_invalid_needs_batch(capsys):
    with pytest.raises(SystemExit) as info:
        main(["enqueue", "--to", "a@example.com", "--subject", "x", "--reject-invalid"])
    assert info.value.code == 2 and "--reject-invalid goes with --batch" in capsys.readouterr().err
