"""CLI: --help and argument errors of enqueue, worker, stats, doctor; their output
with the database layer replaced by FakeQueue (a test double, not a procedure test)."""

from __future__ import annotations

import json
import signal
import urllib.request
from datetime import datetime

import pytest
from worker_helpers import FakeQueue, make_mail
from fake_queue import FakeConnection

from mailq_db.cli import main
from mailq_db.errors import DatabaseError
from mailq_db.procedures import QueueStats

COMMANDS = ("enqueue", "worker", "stats", "doctor")


@pytest.fixture
def fake(monkeypatch):
    queue = FakeQueue()
    for name in COMMANDS:
        monkeypatch.setattr(f"mailq_db.commands.{name}.procedures", queue)
        monkeypatch.setattr(f"mailq_db.commands.{name}.connect", lambda *a, **k: FakeConnection())
    monkeypatch.setenv("MAILQ_DB_URL", "mssql+pyodbc://u:p@fake/db")
    return queue


@pytest.fixture
def restore_signals():
    saved = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    yield
    for s, handler in saved.items():
        signal.signal(s, handler)


@pytest.mark.parametrize("command", COMMANDS)
def test_help_has_examples(command, capsys):
    with pytest.raises(SystemExit) as info:
        main([command, "--help"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    assert "examples:" in out and f"mailq-db {command}" in out


@pytest.mark.parametrize("argv,message", [
    (["enqueue", "--subject", "x", "--text-file", "b.txt"], "at least one recipient: --to, --cc or --bcc"),
    (["enqueue", "--to", "a@example.com", "--text-file", "b.txt"], "--subject"),
    (["enqueue", "--to", "a@example.com", "--subject", "x", "--priority", "10"], "must be 0-9"),
    (["enqueue", "--to", "a@example.com", "--subject", "x", "--priority", "high"], "not a number"),
    (["enqueue", "--to", "a@example.com", "--subject", "x", "--send-at", "tomorrow"], "not an ISO 8601"),
    (["enqueue", "--to", "a@example.com", "--subject", "x", "--max-attempts", "0"], "at least 1"),
    (["worker"], "--config"),
    (["worker", "--config", "w.toml", "--concurrency", "0"], "must be 1-256"),
    (["worker", "--config", "w.toml", "--log-format", "xml"], "invalid choice"),
    (["worker", "--config", "w.toml", "--metrics-port", "99999"], "must be 0-65535"),
    (["stats", "--failures", "-1"], "must be 0-1000"),
    (["doctor", "--bogus"], "unrecognized arguments"),
])
def test_argument_errors(argv, message, capsys):
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    assert message in capsys.readouterr().err


def test_enqueue_passes_everything_to_the_procedure(fake, tmp_path, capsys):
    (tmp_path / "b.txt").write_text("纯文本", encoding="utf-8")
    (tmp_path / "b.html").write_text("<p>你好</p>", encoding="utf-8")
    (tmp_path / "r.pdf").write_bytes(b"%PDF")
    code = main(["enqueue", "--to", "a@example.com;b@example.com", "--to", "张三 <c@example.com>",
                 "--bcc", "h@example.com", "--subject", "季度报告", "--text-file", str(tmp_path / "b.txt"),
                 "--html-file", str(tmp_path / "b.html"), "--attach", str(tmp_path / "r.pdf"),
                 "--account", "billing", "--priority", "9", "--send-at", "2030-01-01T08:00:00+08:00",
                 "--header", "X-Tenant=42", "--idempotency-key", "k1"])
    assert code == 0
    [call] = fake.calls_to("enqueue_mail")
    assert call["to_address"] == "a@example.com;b@example.com;张三 <c@example.com>"
    assert call["bcc"] == "h@example.com" and call["subject"] == "季度报告"
    assert (call["body"], call["body_format"], call["text_body"]) == ("<p>你好</p>", "Html", "纯文本")
    assert call["date_to_process"] == datetime(2030, 1, 1, 0, 0, 0)  # UTC
    assert call["priority"] == 9 and call["account_name"] == "billing" and call["headers"] == {"X-Tenant": "42"}
    assert call["attachments"][0].file_name == "r.pdf" and call["attachments"][0].content_type == "application/pdf"
    assert "mail 1 queued" in capsys.readouterr().out


def test_enqueue_a_bcc_only_mail(fake, tmp_path):
    """A mail with no To (an undisclosed-recipients circular) is queued as the
    procedure accepts it: To NULL, the Bcc list as given."""
    (tmp_path / "b.txt").write_text("body", encoding="utf-8")
    assert main(["enqueue", "--bcc", "a@example.com;b@example.com", "--subject", "x",
                 "--text-file", str(tmp_path / "b.txt")]) == 0
    [call] = fake.calls_to("enqueue_mail")
    assert call["to_address"] is None and call["bcc"] == "a@example.com;b@example.com"


def test_enqueue_with_a_template_passes_name_version_and_model(fake, tmp_path, capsys):
    (tmp_path / "m.json").write_text('{"name": "张三"}', encoding="utf-8")
    assert main(["enqueue", "--to", "a@example.com", "--template", "welcome", "--template-version", "2",
                 "--model", str(tmp_path / "m.json")]) == 0
    [call] = fake.calls_to("enqueue_mail")
    assert (call["template_name"], call["template_version"], call["template_model"]) == ("welcome", 2, '{"name": "张三"}')
    assert call["subject"] is None and call["body"] is None
    assert main(["enqueue", "--to", "a@example.com", "--template", "welcome", "--subject", "x"]) == 1
    assert "--template renders the subject" in capsys.readouterr().err


def test_enqueue_without_a_body_is_refused(fake, capsys):
    assert main(["enqueue", "--to", "a@example.com", "--subject", "x"]) == 1
    assert "give a body" in capsys.readouterr().err
    assert fake.calls_to("enqueue_mail") == []


def test_stats_prints_every_section(fake, capsys):
    fake.stats = QueueStats(
        queued=[{"Status": "UnSent", "AccountName": "default", "MailCount": 12}],
        oldest_due=[{"AccountName": "default", "OldestDueUtc": datetime(2024, 1, 1), "OldestDueAgeSeconds": 75,
                     "DueCount": 9}],
        finished_per_hour=[{"HourUtc": datetime(2024, 1, 1, 10), "AccountName": "default", "Sent": 300,
                            "Failed": 2, "Expired": 4, "Cancelled": 0, "Stopped": 1}],
        failures=[{"ID": 7, "AccountName": "default", "Status": "Failed", "LastError": "550 no\nsuch user",
                   "DateProcessed": datetime(2024, 1, 1, 10, 5)}],
    )
    assert main(["stats", "--failures", "5", "--hours", "72"]) == 0
    out = capsys.readouterr().out
    assert fake.calls_to("get_queue_stats") == [{"recent_failures": 5, "finished_hours": 72}]
    for text in ("UnSent", "12", "75", "300", "Expired", "550 no such user", "Recent failed attempts",
                 "last 72 h"):
        assert text in out
    assert main(["stats", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["queued"][0]["MailCount"] == 12 and data["finished_per_hour"][0]["Expired"] == 4
    assert fake.calls_to("get_queue_stats")[-1] == {"recent_failures": 10, "finished_hours": 24}


@pytest.mark.parametrize("hours", ["0", "169", "x"])
def test_stats_refuses_hours_outside_a_week(fake, capsys, hours):
    with pytest.raises(SystemExit):
        main(["stats", "--hours", hours])
    assert fake.calls_to("get_queue_stats") == []


def test_doctor_prints_each_problem_with_its_fix(fake, monkeypatch, capsys):
    monkeypatch.setattr("mailq_db.connection.find_driver", lambda available=None: "FreeTDS")
    monkeypatch.setattr("mailq_db.connection.pyodbc_problem", lambda: None)
    fake.health = [
        {"Area": "Server", "CheckName": "Compatibility level", "Status": "FAIL", "Detail": "120",
         "Fix": "ALTER DATABASE ... SET COMPATIBILITY_LEVEL = 160"},
        {"Area": "Broker", "CheckName": "Broker enabled", "Status": "OK", "Detail": "on", "Fix": None},
        {"Area": "Queue", "CheckName": "Stuck leases", "Status": "WARN", "Detail": "3", "Fix": "check workers"},
    ]
    assert main(["doctor"]) == 1
    out = capsys.readouterr().out
    assert "[FAIL] Server / Compatibility level: 120" in out and "fix: ALTER DATABASE" in out
    assert "[WARN] Queue / Stuck leases: 3" in out and "fix: check workers" in out
    assert "[OK  ] Broker / Broker enabled" in out


def test_doctor_warnings_fail_only_with_strict(fake, monkeypatch, capsys):
    monkeypatch.setattr("mailq_db.connection.find_driver", lambda available=None: "FreeTDS")
    monkeypatch.setattr("mailq_db.connection.pyodbc_problem", lambda: None)
    monkeypatch.setattr("mailq_db.commands.doctor.head_check",
                        lambda rows: __import__("mailq_db.commands.doctor", fromlist=["Check"]).Check(
                            "Schema", "Revision", "OK", "at head"))
    fake.health = [{"Area": "Queue", "CheckName": "Pending failures", "Status": "WARN", "Detail": "1", "Fix": "x"}]
    assert main(["doctor"]) == 0
    assert main(["doctor", "--strict"]) == 1


def test_doctor_says_when_the_schema_is_not_deployed(fake, monkeypatch, capsys):
    monkeypatch.setattr("mailq_db.connection.find_driver", lambda available=None: "FreeTDS")
    monkeypatch.setattr("mailq_db.connection.pyodbc_problem", lambda: None)

    def missing(conn):
        raise DatabaseError(2812, "Could not find stored procedure 'mailq.GetInstallationHealth'.")

    monkeypatch.setattr(fake, "get_installation_health", missing)
    assert main(["doctor"]) == 1
    out = capsys.readouterr().out
    assert "schema not deployed" in out and "fix: run mailq-db deploy" in out


def test_doctor_compares_the_schema_revision_with_the_package_head(monkeypatch):
    from mailq_db.commands.doctor import head_check

    monkeypatch.setattr("mailq_db.deployment.head_revision", lambda root=None: "0007")
    monkeypatch.setattr("mailq_db.deployment.revisions", lambda root=None: ["0001", "0005", "0007"])
    assert head_check([{"CheckName": "Schema revision", "Detail": "0007"}]).status == "OK"
    old = head_check([{"CheckName": "Schema revision", "Detail": "0005"}])
    assert old.status == "FAIL" and "0007" in old.detail and old.fix.startswith("run mailq-db deploy")
    newer = head_check([{"CheckName": "Schema revision", "Detail": "0009"}])
    assert newer.status == "FAIL" and "does not know" in newer.detail and "newer mailq-db" in newer.fix


def test_doctor_without_a_driver_says_how_to_install_one(monkeypatch, capsys):
    monkeypatch.setattr("mailq_db.connection.installed_drivers", lambda: [])
    assert main(["doctor"]) == 1
    out = capsys.readouterr().out
    assert "[FAIL] Client / ODBC driver" in out
    assert "msodbcsql18" in out and "tdsodbc" in out


def write_config(tmp_path, port: int, extra: str = "") -> str:
    path = tmp_path / "worker.toml"
    path.write_text(
        f"[worker]\nbatch_size = 10\nidle_backoff_min_seconds = 0.01\nidle_backoff_max_seconds = 0.02\n{extra}"
        f'[accounts.default]\nhost = "127.0.0.1"\nport = {port}\ntls = "none"\nallow_plaintext = true\n'
        "command_timeout_seconds = 2\n", encoding="utf-8")
    return str(path)


def test_worker_check_config_ok(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("mailq_db.commands.worker.installed_drivers", lambda: ["FreeTDS"])
    assert main(["worker", "--config", write_config(tmp_path, 2525), "--check-config", "--db", "mssql://h/d"]) == 0
    out = capsys.readouterr().out
    assert "account default: 127.0.0.1:2525 tls=none" in out and "config OK" in out


def test_worker_check_config_explains_problems(tmp_path, capsys):
    path = tmp_path / "bad.toml"
    path.write_text('[accounts.x]\ntls = "none"\n', encoding="utf-8")
    assert main(["worker", "--config", str(path), "--check-config"]) == 1
    err = capsys.readouterr().err
    assert "accounts.x.host: is required" in err and "allow_plaintext" in err


def test_worker_once_sends_and_dry_run_does_not(fake, sink, tmp_path, restore_signals):
    fake.rows.update(FakeQueue([make_mail(1), make_mail(2)]).rows)
    config = write_config(tmp_path, sink.port)
    assert main(["worker", "--config", config, "--once", "--dry-run"]) == 0
    assert sink.messages == [] and fake.statuses() == {1: "Sent", 2: "Sent"}
    assert all(r.dry_run for r in fake.rows.values())
    fake.rows.clear()
    fake.rows.update(FakeQueue([make_mail(3)]).rows)
    assert main(["worker", "--config", config, "--once", "--log-format", "json"]) == 0
    assert [m.rcpt_tos for m in sink.messages] == [["rcpt3@example.com"]]


def test_metrics_endpoint_serves_prometheus_text():
    from mailq_db.worker.metrics import Metrics, serve

    metrics = Metrics()
    metrics.inc("sent", 3)
    metrics.observe_claim(0.02)
    server = serve(metrics, 0)
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/metrics"
        body = urllib.request.urlopen(url, timeout=5).read().decode()
    finally:
        server.shutdown()
    assert 'mailq_worker_sent_total{account="",code=""} 3.0' in body
    assert 'mailq_worker_claim_seconds_bucket{le="0.025"} 1' in body
    assert 'mailq_worker_claim_seconds_bucket{le="0.01"} 0' in body
    assert "mailq_worker_claim_seconds_count 1" in body


def test_doctor_checks_the_owner_login_trustworthy_chaining_and_the_monitor(fake, monkeypatch, capsys):
    """Activation runs EXECUTE AS OWNER (a restore to a server without the
    owner's login stops every delayed task); TRUSTWORTHY and cross-database
    chaining widen what MailqRunner reaches; delay.Monitor runs report-only and
    a Critical finding fails the doctor with its fix."""
    from fake_queue import FakeCatalogCursor

    monkeypatch.setattr("mailq_db.connection.find_driver", lambda available=None: "FreeTDS")
    monkeypatch.setattr("mailq_db.connection.pyodbc_problem", lambda: None)
    fake.health = []
    assert main(["doctor"]) == 0
    out = capsys.readouterr().out
    assert "[OK  ] Broker / Database owner login: owner login sa exists" in out
    assert "[OK  ] Security / TRUSTWORTHY: OFF" in out
    assert "[OK  ] Security / Cross-database ownership chaining: OFF" in out
    assert "[OK  ] Broker / delay.Monitor: delayed execution runs its tasks" in out
    assert fake.calls_to("monitor_delayed_execution") == [{"apply": False, "raise_on_critical": False}]

    monkeypatch.setattr(FakeCatalogCursor, "trustworthy", 1)
    monkeypatch.setattr(FakeCatalogCursor, "server_chaining", 1)
    fake.delay_findings = [
        {"Finding": "HeldTasks", "Severity": "Warning", "Detail": "3 task(s) of dbo.P held",
         "Fix": "EXEC delay.AllowProcedure"},
        {"Finding": "CopyNotEnabled", "Severity": "Critical", "Detail": "a copy",
         "Fix": "EXEC delay.EnableThisDatabase"},
    ]
    assert main(["doctor"]) == 1
    out = capsys.readouterr().out
    assert "[WARN] Security / TRUSTWORTHY: ON" in out and "SET TRUSTWORTHY OFF" in out
    assert "[WARN] Security / Cross-database ownership chaining: ON (server)" in out
    assert "[WARN] Broker / HeldTasks: 3 task(s) of dbo.P held" in out and "fix: EXEC delay.AllowProcedure" in out
    assert "[FAIL] Broker / CopyNotEnabled: a copy" in out and "fix: EXEC delay.EnableThisDatabase" in out

    fake.delay_findings = []
    monkeypatch.setattr(FakeCatalogCursor, "owner_login", None)
    assert main(["doctor"]) == 1
    out = capsys.readouterr().out
    assert "[FAIL] Broker / Database owner login" in out and "ALTER AUTHORIZATION ON DATABASE" in out
