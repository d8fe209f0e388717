"""`mailq-db bounces` subcommands, and the bounce sections of `stats` and `doctor`,
with the database layer replaced by FakeBounceQueue (a test double, not a procedure test)."""

from __future__ import annotations

import json

import pytest
from fake_bounces import FakeBounceQueue
from fake_queue import FakeConnection, make_mail

from mailq_db.cli import main


@pytest.fixture
def fake(monkeypatch):
    queue = FakeBounceQueue([make_mail(1, to_address="a@example.org; b@example.org"), make_mail(2)])
    for name in ("bounces", "stats", "doctor"):
        monkeypatch.setattr(f"mailq_db.commands.{name}.procedures", queue)
        monkeypatch.setattr(f"mailq_db.commands.{name}.connect", lambda *a, **k: FakeConnection())
    monkeypatch.setenv("MAILQ_DB_URL", "mssql+pyodbc://u:p@fake/db")
    return queue


def test_suppress_list_unsuppress(fake, capsys):
    assert main(["bounces", "suppress", "--account", "default", "--address", "A@example.org",
                 "--source", "dba:alice", "--detail", "asked by phone"]) == 0
    assert "suppressed a@example.org for default: 1 queued mail(s) lost it, 0 stopped" in capsys.readouterr().out
    assert fake.rows[1].mail.to_address == "b@example.org"
    assert main(["bounces", "list", "--json"]) == 0
    [row] = json.loads(capsys.readouterr().out)
    assert (row["Address"], row["Reason"], row["Source"]) == ("a@example.org", "Manual", "dba:alice")
    assert main(["bounces", "unsuppress", "--account", "default", "--address", "a@example.org",
                 "--source", "dba:alice"]) == 0
    assert "removed 1 suppression(s)" in capsys.readouterr().out and fake.suppressed == {}


def test_stats_shows_suppressions_and_reports(fake, capsys):
    fake.add_suppression(None, account_name="default", address="x@example.org", source="t", reason="Complaint")
    assert main(["stats"]) == 0
    out = capsys.readouterr().out
    assert "Active suppressions:" in out and "Complaint" in out
    assert main(["stats", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["suppressions"] == [{"AccountName": "default", "Reason": "Complaint", "Suppressed": 1}]


def test_doctor_warns_on_a_complaint_rate_above_a_tenth_of_a_percent(fake, capsys, monkeypatch):
    from mailq_db.commands import doctor

    for i in range(3, 103):  # 100 sent mails
        fake.rows[i] = type(fake.rows[1])(make_mail(i), status="Sent")
    fake.record_bounce(None, report_key=b"k" * 32, source="t", account_name="default",
                       recipients=[{"address": "angry@example.org", "kind": "Complaint"}])
    checks = doctor.bounce_checks(FakeConnection())
    account = [c for c in checks if c.name == "Account default"][0]
    assert account.status == "WARN" and "complaint rate 1.00% > 0.1%" in account.detail
    assert checks[0].detail == "active suppressions: 1 Complaint"
