"""mailq-db exporter: one database read per interval whatever the scrape rate,
the queue's figures as Prometheus metrics, delayed execution optional."""

from __future__ import annotations

import threading
import urllib.request
from dataclasses import replace

from fake_dashboard import delay_row, queue_metrics
from prometheus_client.parser import text_string_to_metric_families

from mailq_db.errors import DatabaseError
from mailq_db.worker.metrics import DELAY_PROBE_SECONDS, Metrics, QueueMetricsCache, queue_registry, serve


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Reads:
    def __init__(self, delay_error: Exception | None = None) -> None:
        self.queue_calls = 0
        self.delay_calls = 0
        self.fail = False
        self.delay_error = delay_error

    def queue(self):
        self.queue_calls += 1
        if self.fail:
            raise DatabaseError(-1, "connection lost")
        return queue_metrics()

    def delay(self):
        self.delay_calls += 1
        if self.delay_error:
            raise self.delay_error
        return delay_row()


def samples(text: str) -> dict[tuple[str, tuple], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def scrape(port: int) -> str:
    return urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()


def test_a_hundred_scrapes_read_the_database_once():
    reads, clock = Reads(), Clock()
    cache = QueueMetricsCache(reads.queue, reads.delay, interval=30, clock=clock)
    server = serve(queue_registry(cache), 0)
    try:
        port = server.server_address[1]
        bodies = [scrape(port) for _ in range(100)]
        assert reads.queue_calls == 1 and reads.delay_calls == 1
        assert len(set(bodies)) == 1
        clock.now += 30
        scrape(port)
        assert reads.queue_calls == 2
    finally:
        server.shutdown()


def test_concurrent_scrapes_share_one_read():
    reads, clock = Reads(), Clock()
    gate = threading.Event()
    slow = reads.queue

    def queue():
        gate.wait(5)
        return slow()

    cache = QueueMetricsCache(queue, reads.delay, interval=30, clock=clock)
    registry = queue_registry(cache)
    from prometheus_client import generate_latest

    threads = [threading.Thread(target=generate_latest, args=(registry,)) for _ in range(20)]
    for t in threads:
        t.start()
    gate.set()
    for t in threads:
        t.join()
    assert reads.queue_calls == 1


def test_the_queue_figures_as_metrics():
    reads = Reads()
    cache = QueueMetricsCache(reads.queue, reads.delay, interval=30, clock=Clock())
    from prometheus_client import generate_latest

    s = samples(generate_latest(queue_registry(cache)).decode())
    key = (("account", "default"), ("run_mode", "prod"))
    assert s[("mailq_queue_oldest_sendable_age_seconds", key)] == 754
    assert s[("mailq_queue_sendable_mails", key)] == 40
    # the blocked account's due mail is not sendable and has no age
    blocked = (("account", "bulk"), ("run_mode", "prod"))
    assert s[("mailq_queue_due_mails", blocked)] == 12 and s[("mailq_queue_sendable_mails", blocked)] == 0
    assert s[("mailq_queue_oldest_sendable_age_seconds", blocked)] == 0
    assert s[("mailq_queue_mails", key + (("status", "UnSent"),))] == 42
    assert s[("mailq_queue_account_blocked", (("account", "bulk"),))] == 1
    assert s[("mailq_queue_account_blocked_remaining_seconds", (("account", "bulk"),))] == 1800
    # 20 + 21 + 22 sent over a window of 3 minutes
    sent = (("account", "default"), ("outcome", "sent"), ("reply_class", "2xx"))
    assert s[("mailq_queue_attempts_per_minute", sent)] == 21
    assert s[("mailq_queue_attempts_window_seconds", ())] == 180
    assert s[("mailq_delay_tasks", (("state", "overdue"),))] == 2
    assert s[("mailq_delay_queue_receive_enabled", ())] == 1
    assert s[("mailq_exporter_up", ())] == 1 and s[("mailq_exporter_queries_total", ())] == 1


def test_a_failed_read_keeps_the_last_figures_for_three_intervals_then_drops_them():
    reads, clock = Reads(), Clock()
    cache = QueueMetricsCache(reads.queue, reads.delay, interval=30, clock=clock)
    from prometheus_client import generate_latest

    registry = queue_registry(cache)
    generate_latest(registry)
    reads.fail = True
    sendable = ("mailq_queue_sendable_mails", (("account", "default"), ("run_mode", "prod")))
    for failed in (1, 2, 3):  # one failed read does not make every queue series vanish
        clock.now += 30
        s = samples(generate_latest(registry).decode())
        assert s[("mailq_exporter_up", ())] == 0 and s[("mailq_exporter_query_errors_total", ())] == failed
        assert s[sendable] == 40 and s[("mailq_delay_tasks", (("state", "overdue"),))] == 2
    clock.now += 30  # 120 s old: no longer repeated as if current
    s = samples(generate_latest(registry).decode())
    assert s[("mailq_exporter_up", ())] == 0 and s[("mailq_exporter_queries_total", ())] == 5
    assert sendable not in s and not [k for k in s if k[0].startswith(("mailq_queue_", "mailq_delay_"))]
    assert ("mailq_exporter_last_success_timestamp_seconds", ()) in s
    reads.fail = False
    clock.now += 30
    assert samples(generate_latest(registry).decode())[sendable] == 40


def test_the_delay_reads_health_is_exported():
    from prometheus_client import generate_latest

    reads = Reads()
    s = samples(generate_latest(queue_registry(QueueMetricsCache(reads.queue, reads.delay, 30, clock=Clock())))
                .decode())
    assert s[("mailq_exporter_delay_up", ())] == 1
    # a failure other than "not deployed" (a timeout, a missing grant): the delay alerts cannot fire, so say so
    reads = Reads(delay_error=DatabaseError(229, "The EXECUTE permission was denied"))
    s = samples(generate_latest(queue_registry(QueueMetricsCache(reads.queue, reads.delay, 30, clock=Clock())))
                .decode())
    assert s[("mailq_exporter_delay_up", ())] == 0 and s[("mailq_exporter_up", ())] == 1
    assert not [k for k in s if k[0].startswith("mailq_delay_")]
    # the queue's state not visible to the login (no VIEW DEFINITION): incomplete
    blind = dict(delay_row(), QueueReceiveEnabled=None)
    s = samples(generate_latest(queue_registry(QueueMetricsCache(reads.queue, lambda: blind, 30, clock=Clock())))
                .decode())
    assert s[("mailq_exporter_delay_up", ())] == 0 and ("mailq_delay_queue_receive_enabled", ()) not in s


def test_the_delay_call_is_skipped_where_delayed_execution_is_absent():
    reads = Reads(delay_error=DatabaseError(2812, "Could not find stored procedure 'delay.GetTaskMetrics'."))
    clock = Clock()
    cache = QueueMetricsCache(reads.queue, reads.delay, interval=30, clock=clock)
    from prometheus_client import generate_latest

    registry = queue_registry(cache)
    text = generate_latest(registry).decode()
    assert "mailq_delay_tasks" not in text and "mailq_queue_mails" in text
    assert "mailq_exporter_delay_up" not in text  # not deployed is not a failure
    for _ in range(5):
        clock.now += 30
        generate_latest(registry)
    assert reads.queue_calls == 6 and reads.delay_calls == 1
    clock.now += DELAY_PROBE_SECONDS
    generate_latest(registry)
    assert reads.delay_calls == 2  # asked again later: it may have been deployed since


def test_suppressions_are_exported_once_the_procedure_returns_them():
    with_suppressions = replace(queue_metrics(), suppressions=[
        {"AccountName": "default", "Reason": "HardBounce", "Suppressed": 17}])
    cache = QueueMetricsCache(lambda: with_suppressions, None, interval=30, clock=Clock())
    from prometheus_client import generate_latest

    s = samples(generate_latest(queue_registry(cache)).decode())
    assert s[("mailq_queue_suppressions", (("account", "default"), ("reason", "HardBounce")))] == 17
    cache = QueueMetricsCache(queue_metrics, None, interval=30, clock=Clock())
    assert "mailq_queue_suppressions" not in generate_latest(queue_registry(cache)).decode()


def test_each_metrics_object_has_its_own_registry():
    a, b = Metrics(), Metrics()
    a.inc("sent", 2, account="x", code=250)
    assert 'mailq_worker_sent_total{account="x",code="250"} 2.0' in a.render()
    assert 'account="x"' not in b.render()


def test_label_values_are_escaped_by_the_library():
    m = Metrics()
    m.set_blocked('we"ird\\acc\nount', True)
    s = samples(m.render())
    assert s[("mailq_worker_account_blocked", (("account", 'we"ird\\acc\nount'),))] == 1
