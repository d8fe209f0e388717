"""The sender worker against SQL Server 2022 (fixture ``mssql_url`` from conftest.py)
and an aiosmtpd sink on loopback: many workers, no duplicate delivery, rate limits
across workers, and a killed worker's mails delivered after its lease expires."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from email import message_from_bytes, policy

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "unit"))

from smtp_sink import SmtpSink, wait_for  # noqa: E402

import mailq_db  # noqa: E402
from mailq_db import procedures  # noqa: E402
from mailq_db.connection import connect  # noqa: E402
from mailq_db.worker.config import AccountConfig, Config, WorkerConfig  # noqa: E402
from mailq_db.worker.runner import run_workers  # noqa: E402

pytestmark = pytest.mark.integration

SRC = os.path.dirname(os.path.dirname(os.path.abspath(mailq_db.__file__)))


def account(sink: SmtpSink, name: str) -> AccountConfig:
    return AccountConfig(name=name, host="127.0.0.1", port=sink.port, tls="none", allow_plaintext=True,
                         connect_timeout_seconds=5, command_timeout_seconds=10)


def config(sink: SmtpSink, names: list[str], **worker) -> Config:
    settings = dict(batch_size=25, lease_seconds=60, lease_safety_margin_seconds=10, worker_name="it",
                    concurrency=4, idle_backoff_min_seconds=0.1, idle_backoff_max_seconds=0.5)
    settings.update(worker)
    return Config(worker=WorkerConfig(**settings), accounts={n: account(sink, n) for n in names})


def enqueue(url: str, account_name: str, n: int, prefix: str) -> dict[str, int]:
    """Enqueue n mails; returns Message-ID -> mail ID."""
    conn = connect(url)
    try:
        ids = {}
        for i in range(n):
            r = procedures.enqueue_mail(conn, to_address=f"{prefix}{i}@example.com", subject=f"{prefix} {i} 你好",
                                        body=f"body {i}", account_name=account_name)
            ids[r.message_id] = r.mail_id
        return ids
    finally:
        conn.close()


def setup_account(url: str, name: str, per_minute: int | None = None) -> None:
    conn = connect(url)
    try:
        procedures.upsert_sending_account(conn, account_name=name, default_from_address=f"{name}@example.com",
                                          per_minute_limit=per_minute, is_default=(name == "bulk"))
    finally:
        conn.close()


def delivered_ids(sink: SmtpSink) -> list[str]:
    return [message_from_bytes(m.data, policy=policy.default)["Message-ID"] for m in sink.messages]


def status_counts(url: str) -> dict[tuple[str, str], int]:
    """Mail queued now (UnSent, Sending) and mail finished in the last 24 hours, per
    (status, account), from mailq.GetQueueStats."""
    conn = connect(url)
    try:
        stats = procedures.get_queue_stats(conn)
    finally:
        conn.close()
    counts = {(r["Status"], r["AccountName"]): r["MailCount"] for r in stats.queued}
    for row in stats.finished_per_hour:
        for status in ("Sent", "Failed", "Expired", "Cancelled", "Stopped"):
            key = (status, row["AccountName"])
            counts[key] = counts.get(key, 0) + row[status]
    return counts


def run_in_thread(cfg: Config, url: str):
    stop = threading.Event()
    thread = threading.Thread(target=run_workers, args=(cfg, lambda: connect(url)),
                              kwargs=dict(stop=stop, install_signals=False, progress_seconds=3600))
    thread.start()
    return stop, thread


def test_four_workers_send_1000_mails_once_each(mssql_url):
    setup_account(mssql_url, "bulk")
    expected = enqueue(mssql_url, "bulk", 1000, "bulk")
    with SmtpSink() as sink:
        stop, thread = run_in_thread(config(sink, ["bulk"]), mssql_url)
        try:
            assert wait_for(lambda: sink.message_count >= 1000, timeout=300)
            time.sleep(2)  # acknowledgements of the last batches
        finally:
            stop.set()
            thread.join(60)
        ids = delivered_ids(sink)
    assert len(ids) == 1000 and len(set(ids)) == 1000, "a mail was delivered twice"
    assert set(ids) == set(expected)
    assert status_counts(mssql_url).get(("Sent", "bulk")) == 1000


def test_rate_limit_holds_across_workers(mssql_url):
    setup_account(mssql_url, "limited", per_minute=20)
    enqueue(mssql_url, "limited", 60, "limited")
    with SmtpSink() as sink:
        stop, thread = run_in_thread(config(sink, ["limited"], batch_size=10), mssql_url)
        try:
            time.sleep(20)  # well inside one minute
        finally:
            stop.set()
            thread.join(60)
        sent = sink.message_count
    assert 0 < sent <= 20, f"{sent} mails in 20 s with a limit of 20 per minute across 4 workers"


def test_killed_worker_mails_are_delivered_after_lease_expiry(mssql_url, tmp_path):
    setup_account(mssql_url, "crash")
    expected = enqueue(mssql_url, "crash", 40, "crash")

    class SlowSink(SmtpSink):
        async def delay(self) -> None:
            import asyncio

            await asyncio.sleep(0.1)

    with SlowSink() as sink:
        toml = tmp_path / "worker.toml"
        toml.write_text(
            "[worker]\nbatch_size = 40\nlease_seconds = 20\nlease_safety_margin_seconds = 5\n"
            "ack_interval_seconds = 0\n"  # acknowledge each mail before the next: one duplicate at most
            f'[accounts.crash]\nhost = "127.0.0.1"\nport = {sink.port}\ntls = "none"\nallow_plaintext = true\n',
            encoding="utf-8")
        env = dict(os.environ, PYTHONPATH=SRC, MAILQ_DB_URL=mssql_url)
        proc = subprocess.Popen([sys.executable, "-m", "mailq_db", "worker", "--config", str(toml)], env=env)
        try:
            assert wait_for(lambda: sink.message_count >= 5, timeout=60)
            proc.send_signal(signal.SIGKILL)  # no goodbye: its leases must expire
            proc.wait(10)
        finally:
            if proc.poll() is None:
                proc.kill()
        before = sink.message_count
        assert before < 40
        assert status_counts(mssql_url).get(("Sending", "crash"), 0) > 0
        stop, thread = run_in_thread(config(sink, ["crash"], concurrency=1, lease_seconds=60), mssql_url)
        try:
            assert wait_for(lambda: len(set(delivered_ids(sink))) >= 40, timeout=120)
            time.sleep(2)
        finally:
            stop.set()
            thread.join(60)
        ids = delivered_ids(sink)
    assert set(ids) == set(expected)
    # only the mail(s) in flight at the kill may have been delivered twice
    assert len(ids) - len(set(ids)) <= 1
    assert status_counts(mssql_url).get(("Sent", "crash")) == 40


def test_deferred_recipient_is_retried_alone_through_the_real_procedures(mssql_url):
    """Issue 14 point 1 end to end: a greylisted recipient (450 once) is recorded
    Deferred by mailq.RecordRecipientOutcomes, the mail is a Retry, and the next
    attempt (mailq.GetRecipientOutcomes) sends to that recipient only."""
    setup_account(mssql_url, "greylist")
    conn = connect(mssql_url)
    try:
        r = procedures.enqueue_mail(conn, to_address="ok@example.com; grey@example.com", subject="grey",
                                    body="b", account_name="greylist")
    finally:
        conn.close()
    with SmtpSink() as sink:
        sink.replies[("rcpt", "grey@example.com")] = "once:450 4.2.0 Greylisted, try again later"
        cfg = config(sink, ["greylist"], concurrency=1)
        assert run_workers(cfg, lambda: connect(mssql_url), once=True, install_signals=False) == 0
        conn = connect(mssql_url)
        try:
            cursor = conn.cursor()
            rows = cursor.execute("SELECT Address, Outcome FROM mailq.RecipientOutcomes WHERE ID = ? "
                                  "ORDER BY Address;", r.mail_id).fetchall()
            assert [tuple(x) for x in rows] == [("grey@example.com", "Deferred"), ("ok@example.com", "Delivered")]
            assert cursor.execute("SELECT Status FROM mailq.MailQueue WHERE ID = ?;", r.mail_id).fetchone()[0] == "UnSent"
            # the Retry's backoff is the database's business: make the next attempt due now
            cursor.execute("UPDATE mailq.MailQueue SET VisibleAtUtc = SYSUTCDATETIME() WHERE ID = ?;", r.mail_id)
            conn.commit()
        finally:
            conn.close()
        assert run_workers(cfg, lambda: connect(mssql_url), once=True, install_signals=False) == 0
        assert [m.rcpt_tos for m in sink.messages] == [["ok@example.com"], ["grey@example.com"]]
    conn = connect(mssql_url)
    try:
        assert conn.cursor().execute("SELECT Status FROM mailq.MailQueue WHERE ID = ?;",
                                     r.mail_id).fetchone()[0] == "Sent"
    finally:
        conn.close()
