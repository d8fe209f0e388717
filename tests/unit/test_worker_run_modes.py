"""Run modes and per-application dry-run in the worker (issue 16 point 3,
revision 0015; docs/run-modes.md).

FakeQueue is a test double of the DATABASE LAYER that follows ClaimMail's and
MarkSent's documented contract (claim only the run modes served, default
["prod"]; DryRun stamped per mail from the application; MarkSent keeps the
stamp); the procedures themselves are tested against SQL Server by
tests/integration/test_mailq_run_modes.py.  The SMTP side is real: the
tests' SMTP sink (aiosmtpd on loopback) counts connections and messages, so
"a dry-run application never opens SMTP" is observed, not assumed."""

from __future__ import annotations

import pytest
from worker_helpers import FakeQueue, account_for, make_mail, make_worker

from mailq_db.errors import ConfigurationError
from mailq_db.worker.config import check_run_modes, parse_config


def test_worker_claims_with_its_run_modes_and_sends_only_those(sink):
    queue = FakeQueue([make_mail(1), make_mail(2, run_mode="staging"), make_mail(3, run_mode="test")])
    worker = make_worker(queue, {"default": account_for(sink)}, run_modes=("staging",))
    worker.run(once=True)
    assert queue.calls_to("claim_mail")[0]["run_modes"] == ["staging"]
    assert queue.statuses() == {1: "UnSent", 2: "Sent", 3: "UnSent"}
    assert len(sink.messages) == 1


def test_default_worker_serves_prod_only(sink):
    queue = FakeQueue([make_mail(1), make_mail(2, run_mode="staging")])
    worker = make_worker(queue, {"default": account_for(sink)})
    worker.run(once=True)
    assert queue.calls_to("claim_mail")[0]["run_modes"] == ["prod"]
    assert queue.statuses() == {1: "Sent", 2: "UnSent"}


def test_dry_run_application_never_opens_smtp_while_others_send(sink):
    queue = FakeQueue([make_mail(1, app_name="billing"), make_mail(2, app_name="alerts"),
                       make_mail(3, app_name="billing")])
    queue.dry_run_apps.add("billing")
    worker = make_worker(queue, {"default": account_for(sink)})
    before = sink.connections  # aiosmtpd's controller connects once itself at start
    worker.run(once=True)
    assert queue.statuses() == {1: "Sent", 2: "Sent", 3: "Sent"}
    assert {i: r.dry_run for i, r in queue.rows.items()} == {1: True, 2: False, 3: True}
    # one real message, on one connection, for the application that sends
    assert len(sink.messages) == 1 and sink.connections - before == 1
    assert worker.metrics.snapshot()["smtp_connections"] == 1
    acks = queue.calls_to("mark_sent")
    assert {tuple(a["ids"]): a["dry_run"] for a in acks} == {(1, 3): True, (2,): False}


def test_only_dry_run_mail_opens_no_connection_and_asks_no_login_slot(sink):
    queue = FakeQueue([make_mail(1, app_name="billing"), make_mail(2, app_name="billing")])
    queue.dry_run_apps.add("billing")
    asked = []
    queue.acquire_login_slot = lambda conn, **kw: asked.append(kw)  # must never be called
    worker = make_worker(queue, {"default": account_for(sink)})
    before = sink.connections
    worker.run(once=True)
    assert queue.statuses() == {1: "Sent", 2: "Sent"}
    assert sink.connections == before and sink.messages == [] and asked == []
    assert worker.metrics.snapshot()["smtp_connections"] == 0


def test_dry_run_follows_the_claim_not_a_stale_flag(sink):
    queue = FakeQueue([make_mail(1, app_name="billing")])
    queue.dry_run_apps.add("billing")
    make_worker(queue, {"default": account_for(sink)}).run(once=True)
    assert queue.rows[1].dry_run and sink.messages == []
    # dry-run turned off: the next mail of the application is sent for real
    queue.dry_run_apps.clear()
    queue.rows[2] = type(queue.rows[1])(make_mail(2, app_name="billing"))
    make_worker(queue, {"default": account_for(sink)}).run(once=True)
    assert queue.rows[2].status == "Sent" and not queue.rows[2].dry_run
    assert len(sink.messages) == 1


def _toml(modes) -> str:
    import json

    body = "" if modes is None else f"run_modes = {json.dumps(modes)}\n"
    return "[worker]\n" + body + '[accounts.default]\nhost = "127.0.0.1"\nport = 25\ntls = "none"\nallow_plaintext = true\n'


def test_config_run_modes_parsed_and_validated():
    cfg = parse_config(_toml(["staging", "test", "staging"]))
    assert cfg.worker.run_modes == ("staging", "test")
    assert parse_config(_toml(None)).worker.run_modes == ("prod",)
    for bad in ([], ["Prod"], ["9x"], ["a" * 33], ["ok", ""], "prod"):
        with pytest.raises(ConfigurationError, match="run_modes"):
            parse_config(_toml(bad))
    assert check_run_modes(["prod", "qa-eu_1"]) == []
    assert check_run_modes([f"m{i}" for i in range(17)])


def test_worker_flag_replaces_config_run_modes():
    from mailq_db.commands.worker import with_run_modes

    cfg = parse_config(_toml(["prod"]))
    assert with_run_modes(cfg, ["staging", "staging"]).worker.run_modes == ("staging",)
    assert with_run_modes(cfg, []) is cfg
    with pytest.raises(ConfigurationError, match="--run-mode"):
        with_run_modes(cfg, ["Staging"])


def test_cli_enqueue_passes_the_run_mode(monkeypatch, tmp_path):
    from fake_queue import FakeConnection

    from mailq_db.cli import main

    queue = FakeQueue()
    monkeypatch.setattr("mailq_db.commands.enqueue.procedures", queue)
    monkeypatch.setattr("mailq_db.commands.enqueue.connect", lambda *a, **k: FakeConnection())
    (tmp_path / "b.txt").write_text("body", encoding="utf-8")
    assert main(["enqueue", "--to", "qa@example.com", "--subject", "s", "--text-file", str(tmp_path / "b.txt"),
                 "--run-mode", "staging"]) == 0
    assert queue.calls_to("enqueue_mail")[0]["run_mode"] == "staging"


def test_cli_batch_refuses_a_run_mode_flag(tmp_path, capsys):
    from mailq_db.cli import main

    (tmp_path / "m.json").write_text("[]", encoding="utf-8")
    with pytest.raises(SystemExit):
        main(["enqueue", "--batch", str(tmp_path / "m.json"), "--run-mode", "staging"])
    assert "--run-mode" in capsys.readouterr().err
