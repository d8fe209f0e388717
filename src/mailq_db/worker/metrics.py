"""Prometheus metrics: the worker's counters and the queue's own metrics.

Exposition, escaping and types come from ``prometheus_client`` (the
Prometheus project's Python client).  Every :class:`Metrics` owns its own
``CollectorRegistry`` (never the library's global one), so two workers of
one test, or a worker and an exporter in one process, never share a series.

* :class:`Metrics`: counters and histograms of one worker process
  (``mailq_worker_*``), served by ``mailq-db worker --metrics-port``.
* :class:`QueueMetricsCache` and :class:`QueueCollector`: the queue's
  metrics from ``mailq.GetQueueMetrics`` (and ``delay.GetTaskMetrics``),
  read at most once per interval whatever the scrape rate, served by
  ``mailq-db exporter`` (``mailq_queue_*``, ``mailq_delay_*``,
  ``mailq_exporter_*``).

Names and labels: docs/monitoring/README.md.
"""

from __future__ import annotations

import logging
import socketserver
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Iterable, Iterator

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

log = logging.getLogger("mailq_db.metrics")

# No "<name>_created" series next to each counter and histogram: a scrape
# shows the values an operator alerts on, nothing the dashboards never read.
disable_created_metrics()

#: name -> help text; every counter is exposed as ``mailq_worker_<name>_total``.
COUNTERS = {
    "claims": "ClaimMail calls",
    "claimed": "mails leased by ClaimMail",
    "sent": "mails acknowledged as Sent (dry-run included)",
    "failed": "mails marked Failed at once (Stop)",
    "retried": "mails given back for a later attempt (Retry)",
    "waited": "mails given back because the account is throttled or locked (Wait)",
    "released": "unsent mails released (shutdown or lease too short)",
    "lease_extensions": "ExtendLease calls",
    "lease_lost": "mails whose lease was lost before the acknowledgement",
    "smtp_connections": "SMTP connections opened",
    "login_sleeps": "sleeps for the account's minimum interval between logins (mailq.AcquireLoginSlot)",
    "login_deferrals": "account batches deferred (Wait, no attempt spent) for the minimum login interval",
    "errors": "unexpected worker errors (batch abandoned, leases left to expire)",
    "lazy_content_errors": "mails stopped or deferred because their template or a lazy attachment failed",
    "ack_retries": "acknowledgement writes that failed with a transient error and were kept to retry",
    "acks_abandoned": "acknowledgements never written: the mail was left to lease expiry (PossibleDuplicate)",
    "escalations": "repeated temporary failures of an account turned into an account pause",
    "sender_pauses": "From addresses paused on an account after a temporary refusal of the sender",
    "budget_releases": "claimed mails given back at once because the batch memory budget was full",
}
#: the label names of the counters that carry labels (the others carry none)
OUTCOME_LABELS = ("account", "code")
COUNTER_LABELS: dict[str, tuple[str, ...]] = {
    "sent": OUTCOME_LABELS,
    "failed": OUTCOME_LABELS,
    "retried": OUTCOME_LABELS,
    "waited": OUTCOME_LABELS,
    "smtp_connections": ("account",),
    "login_sleeps": ("account",),
    "login_deferrals": ("account",),
}
#: upper bounds, in seconds, of the claim latency histogram
CLAIM_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
#: upper bounds, in seconds, of the SMTP send latency histogram (MAIL FROM to the final reply)
SEND_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


def _label(value: object) -> str:
    return "" if value is None else str(value)


class Metrics:
    """Thread-safe counters shared by every worker thread of a process.

    ``registry`` is this instance's own: pass it to :func:`serve` (or add
    more collectors to it, e.g. a :class:`QueueCollector`)."""

    def __init__(self, *, process_metrics: bool = False) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self._lock = threading.Lock()
        self._totals = {name: 0 for name in COUNTERS}
        self._counters: dict[str, Counter] = {
            name: Counter(f"mailq_worker_{name}", text, COUNTER_LABELS.get(name, ()), registry=self.registry)
            for name, text in COUNTERS.items()
        }
        self._claim = Histogram("mailq_worker_claim_seconds", "ClaimMail latency",
                                buckets=CLAIM_BUCKETS, registry=self.registry)
        self._send = Histogram("mailq_worker_send_seconds",
                               "SMTP send latency per mail (MAIL FROM to the final reply)", ["account"],
                               buckets=SEND_BUCKETS, registry=self.registry)
        self._blocked_total = Gauge(
            "mailq_worker_blocked_accounts",
            "accounts this process last saw throttled or refused (a Wait, until a send succeeds)",
            registry=self.registry)
        self._blocked = Gauge("mailq_worker_account_blocked",
                              "1 while the account is blocked by a Wait of this process", ["account"],
                              registry=self.registry)
        self._last_claim = Gauge("mailq_worker_last_claim_timestamp_seconds",
                                 "Unix time of the last ClaimMail call of any worker thread of this process",
                                 registry=self.registry)
        self.blocked: dict[str, bool] = {}
        if process_metrics:
            from prometheus_client import PlatformCollector, ProcessCollector

            ProcessCollector(registry=self.registry)
            PlatformCollector(registry=self.registry)

    def inc(self, name: str, n: int = 1, *, account: str | None = None, code: int | None = None) -> None:
        """Add ``n`` to counter ``name``.  A counter with labels takes ``account``
        (and ``code``, the SMTP reply code) as given, "" when not; a counter
        without labels counts them in its single series."""
        if name not in self._totals:
            raise KeyError(name)
        counter = self._counters[name]
        names = COUNTER_LABELS.get(name, ())
        with self._lock:
            self._totals[name] += n
        if names:
            values = {"account": _label(account), "code": _label(code)}
            counter.labels(*(values[label] for label in names)).inc(n)
        else:
            counter.inc(n)

    def observe_send(self, seconds: float, account: str, code: int | None = None) -> None:
        self._send.labels(_label(account)).observe(seconds)

    def set_blocked(self, account: str, blocked: bool) -> None:
        with self._lock:
            self.blocked[account] = blocked
            self._blocked.labels(_label(account)).set(1 if blocked else 0)
            self._blocked_total.set(sum(self.blocked.values()))

    def observe_claim(self, seconds: float) -> None:
        self._claim.observe(seconds)
        self._last_claim.set_to_current_time()

    def snapshot(self) -> dict[str, int]:
        """Every counter's total over its labels (for the progress log)."""
        with self._lock:
            return dict(self._totals)

    def render(self) -> str:
        """The Prometheus text exposition format (version 0.0.4) of this registry."""
        return generate_latest(self.registry).decode("utf-8")


class _Server(ThreadingHTTPServer):
    def server_bind(self) -> None:
        # HTTPServer.server_bind asks socket.getfqdn(), a DNS lookup that can
        # take seconds; the endpoint never uses the name.
        socketserver.TCPServer.server_bind(self)
        host, port = self.server_address[:2]
        self.server_name, self.server_port = str(host), int(port)


def serve(metrics: Metrics | CollectorRegistry, port: int, host: str = "127.0.0.1") -> ThreadingHTTPServer:
    """Serve ``GET /metrics`` of ``metrics`` (a :class:`Metrics` or a registry)
    in a daemon thread; ``server.shutdown()`` stops it.  Port 0: one the OS chooses."""
    registry = metrics.registry if isinstance(metrics, Metrics) else metrics

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            if self.path.split("?")[0] not in ("/metrics", "/"):
                self.send_error(404)
                return
            try:
                body = generate_latest(registry)
            except Exception:  # noqa: BLE001 - a collector failed: say so, keep serving
                log.exception("collecting the metrics failed")
                self.send_error(500, "collecting the metrics failed (see the log)")
                return
            self.send_response(200)
            self.send_header("Content-Type", CONTENT_TYPE_LATEST)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:  # quiet
            pass

    server = _Server((host, port), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="metrics", daemon=True).start()
    return server


# --------------------------------------------------------------------------
# The queue's own metrics (mailq-db exporter)
# --------------------------------------------------------------------------

#: mailq.MailAttempt outcomes as label values
OUTCOMES = {"Sent": "sent", "DryRun": "dry_run", "Retry": "retry", "Wait": "wait", "Stop": "stop",
            "Released": "released", "Abandoned": "abandoned"}
#: the outcomes that count as failed attempts in the failure ratio (docs/monitoring/README.md)
FAILED_OUTCOMES = ("retry", "wait", "stop", "abandoned")
#: how often the exporter asks again whether delayed execution is deployed, once it found it absent
DELAY_PROBE_SECONDS = 600.0
#: SQL Server's "Could not find stored procedure": delayed execution is not deployed here
NO_SUCH_PROCEDURE = 2812
#: after a failed read, the last figures are still served while they are at most this many
#: intervals old, then dropped: a single failed read does not restart every alert's ``for:``,
#: and figures the database can no longer confirm are never repeated as current for long
STALE_INTERVALS = 3


@dataclass
class QueueSnapshot:
    """One read of the queue's metrics."""

    queue: Any  # procedures.QueueMetrics; None before the first successful read or once stale
    delay: dict[str, Any] | None  # delay.GetTaskMetrics' row; None: not deployed or not readable
    ok: bool
    error: str | None
    read_at: float  # time.time() of the last successful read (0.0: none yet)
    duration: float  # seconds the read took
    #: whether delay.GetTaskMetrics' last read was complete; None: not deployed (or not asked)
    delay_ok: bool | None = None


class QueueMetricsCache:
    """Reads the queue's metrics at most once per ``interval`` seconds.

    ``read_queue()`` calls mailq.GetQueueMetrics, ``read_delay()``
    delay.GetTaskMetrics (the second call, skipped while delayed execution is
    absent: error 2812 marks it absent, asked again every
    DELAY_PROBE_SECONDS).  Concurrent scrapes share one read (a lock), so the
    database sees one query per interval whatever the scrape rate.  A failed
    read says so (``mailq_exporter_up 0``) and keeps the previous figures
    while they are at most STALE_INTERVALS intervals old, then drops them
    (only the ``mailq_exporter_*`` metrics remain)."""

    def __init__(self, read_queue: Callable[[], Any], read_delay: Callable[[], dict[str, Any]] | None,
                 interval: float = 30.0, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.read_queue = read_queue
        self.read_delay = read_delay
        self.interval = interval
        self.clock = clock
        self._lock = threading.Lock()
        self._at: float | None = None
        self._delay_absent_until: float | None = None
        self._ok_at: float | None = None  # clock() of the last successful read
        self.snapshot = QueueSnapshot(None, None, False, "not read yet", 0.0, 0.0)
        self.queries = 0
        self.errors = 0

    def get(self) -> QueueSnapshot:
        with self._lock:
            now = self.clock()
            if self._at is None or now - self._at >= self.interval:
                self._at = now
                self.snapshot = self._read(now)
            return self.snapshot

    def _read(self, now: float) -> QueueSnapshot:
        started = time.perf_counter()
        self.queries += 1
        try:
            queue = self.read_queue()
        except Exception as exc:  # noqa: BLE001 - reported as mailq_exporter_up 0
            self.errors += 1
            log.warning("mailq.GetQueueMetrics failed: %s", exc)
            old = self.snapshot
            took = time.perf_counter() - started
            if self._ok_at is None or now - self._ok_at > STALE_INTERVALS * self.interval:
                return QueueSnapshot(None, None, False, str(exc), old.read_at, took, None)
            return QueueSnapshot(old.queue, old.delay, False, str(exc), old.read_at, took, old.delay_ok)
        self._ok_at = now
        delay, delay_ok = self._read_delay(now)
        return QueueSnapshot(queue, delay, True, None, time.time(), time.perf_counter() - started, delay_ok)

    def _read_delay(self, now: float) -> tuple[dict[str, Any] | None, bool | None]:
        """(the row, whether it is complete); (None, None) where delayed execution is absent."""
        if self.read_delay is None or (self._delay_absent_until is not None and now < self._delay_absent_until):
            return None, None
        try:
            row = self.read_delay()
        except Exception as exc:  # noqa: BLE001 - delayed execution is optional
            if getattr(exc, "number", None) == NO_SUCH_PROCEDURE:
                self._delay_absent_until = now + DELAY_PROBE_SECONDS
                return None, None
            log.warning("delay.GetTaskMetrics failed: %s", exc)
            return None, False
        self._delay_absent_until = None
        # NULL states: the login may not see the queue (VIEW DEFINITION), so its alerts cannot fire
        complete = row is not None and all(row.get(c) is not None for c in ("QueueReceiveEnabled", "BrokerEnabled"))
        return row, complete


def _gauge(name: str, text: str, labels: Iterable[str] = ()) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, text, labels=list(labels))


#: every metric family QueueCollector can expose: name -> (kind, help, labels)
QUEUE_FAMILIES: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "mailq_queue_mails": ("gauge", "queued mails (UnSent, Sending) by account, run mode and status",
                          ("account", "run_mode", "status")),
    "mailq_queue_due_mails": ("gauge", "mails the claim could take now, blocked accounts included",
                              ("account", "run_mode")),
    "mailq_queue_sendable_mails": ("gauge", "due mails of accounts that are not blocked",
                                   ("account", "run_mode")),
    "mailq_queue_oldest_sendable_age_seconds": (
        "gauge", "age of the oldest sendable mail (due, an attempt left, not expired, account not blocked; "
        "scheduled and backed-off mail excluded); 0 when none", ("account", "run_mode")),
    "mailq_queue_account_blocked": ("gauge", "1 while the account is blocked (a Wait: throttled or locked)",
                                    ("account",)),
    "mailq_queue_account_blocked_remaining_seconds": ("gauge", "seconds until the account's block ends",
                                                      ("account",)),
    "mailq_queue_attempts_per_minute": (
        "gauge", "attempts ended per minute, averaged over the window's complete minutes, by account, "
        "outcome and SMTP reply class", ("account", "outcome", "reply_class")),
    "mailq_queue_attempts_window_seconds": ("gauge", "the window mailq_queue_attempts_per_minute averages",
                                            ()),
    "mailq_queue_suppressions": ("gauge", "suppressed addresses by account and reason", ("account", "reason")),
    "mailq_delay_tasks": ("gauge", "delayed tasks by state: pending, overdue (pending, due over 60 s ago), "
                          "held, failed", ("state",)),
    "mailq_delay_queue_receive_enabled": ("gauge", "0 when dbo.DelayServiceQueue is disabled "
                                          "(poison message handling)", ()),
    "mailq_delay_broker_enabled": ("gauge", "0 when Service Broker is disabled in the database", ()),
    "mailq_exporter_up": ("gauge", "1 when the last read of mailq.GetQueueMetrics succeeded", ()),
    "mailq_exporter_delay_up": ("gauge", "1 when the last read of delay.GetTaskMetrics succeeded and saw the "
                                "queue's state; absent where delayed execution is not deployed", ()),
    "mailq_exporter_last_success_timestamp_seconds": ("gauge", "Unix time of the last successful read", ()),
    "mailq_exporter_query_duration_seconds": ("gauge", "how long the last read took", ()),
    "mailq_exporter_queries": ("counter", "reads of mailq.GetQueueMetrics", ()),
    "mailq_exporter_query_errors": ("counter", "failed reads of mailq.GetQueueMetrics", ()),
}


class QueueCollector(Collector):
    """Turns the cached :class:`QueueSnapshot` into metric families at each scrape."""

    def __init__(self, cache: QueueMetricsCache) -> None:
        self.cache = cache

    def describe(self) -> Iterator[Metric]:
        return iter(())  # families vary with the data; nothing to check at registration

    def collect(self) -> Iterator[Metric]:
        snap = self.cache.get()
        yield from self._exporter(snap)
        if snap.queue is not None:
            yield from self._queue(snap.queue)
        if snap.delay:
            yield from self._delay(snap.delay)

    def _family(self, name: str) -> GaugeMetricFamily | CounterMetricFamily:
        kind, text, labels = QUEUE_FAMILIES[name]
        if kind == "counter":
            return CounterMetricFamily(name, text, labels=list(labels))
        return _gauge(name, text, labels)

    def _exporter(self, snap: QueueSnapshot) -> Iterator[Metric]:
        up = self._family("mailq_exporter_up")
        up.add_metric([], 1 if snap.ok else 0)
        yield up
        if snap.delay_ok is not None:
            delay_up = self._family("mailq_exporter_delay_up")
            delay_up.add_metric([], 1 if snap.delay_ok else 0)
            yield delay_up
        if snap.read_at:
            last = self._family("mailq_exporter_last_success_timestamp_seconds")
            last.add_metric([], snap.read_at)
            yield last
        took = self._family("mailq_exporter_query_duration_seconds")
        took.add_metric([], snap.duration)
        yield took
        for name, value in (("mailq_exporter_queries", self.cache.queries),
                            ("mailq_exporter_query_errors", self.cache.errors)):
            family = self._family(name)
            family.add_metric([], value)
            yield family

    def _queue(self, q: Any) -> Iterator[Metric]:
        depth = self._family("mailq_queue_mails")
        for r in q.depth:
            depth.add_metric([r["AccountName"], r["RunMode"], r["Status"]], int(r["MailCount"]))
        yield depth
        due = self._family("mailq_queue_due_mails")
        sendable = self._family("mailq_queue_sendable_mails")
        age = self._family("mailq_queue_oldest_sendable_age_seconds")
        for r in q.sendable:
            key = [r["AccountName"], r["RunMode"]]
            due.add_metric(key, int(r["DueCount"]))
            sendable.add_metric(key, int(r["SendableCount"]))
            age.add_metric(key, float(r["OldestSendableAgeSeconds"] or 0))
        yield from (due, sendable, age)
        blocked = self._family("mailq_queue_account_blocked")
        left = self._family("mailq_queue_account_blocked_remaining_seconds")
        for r in q.accounts:
            blocked.add_metric([r["AccountName"]], 1 if r["IsBlocked"] else 0)
            left.add_metric([r["AccountName"]], float(r["BlockedSecondsLeft"] or 0))
        yield from (blocked, left)
        yield from self._attempts(q)
        if q.suppressions is not None:
            family = self._family("mailq_queue_suppressions")
            for r in q.suppressions:
                family.add_metric([_label(r.get("AccountName")), _label(r.get("Reason"))], int(r["Suppressed"]))
            yield family

    def _attempts(self, q: Any) -> Iterator[Metric]:
        minutes = 1.0
        if q.window_start_utc is not None and q.window_end_utc is not None:
            minutes = max(1.0, (q.window_end_utc - q.window_start_utc).total_seconds() / 60.0)
        totals: dict[tuple[str, str, str], int] = {}
        for r in q.attempts:
            key = (r["AccountName"], OUTCOMES.get(r["Outcome"], str(r["Outcome"]).lower()), r["ReplyClass"])
            totals[key] = totals.get(key, 0) + int(r["Attempts"])
        family = self._family("mailq_queue_attempts_per_minute")
        for key, count in sorted(totals.items()):
            family.add_metric(list(key), count / minutes)
        yield family
        window = self._family("mailq_queue_attempts_window_seconds")
        window.add_metric([], minutes * 60.0)
        yield window

    def _delay(self, row: dict[str, Any]) -> Iterator[Metric]:
        tasks = self._family("mailq_delay_tasks")
        for state, column in (("pending", "PendingTasks"), ("overdue", "OverdueTasks"),
                              ("held", "HeldTasks"), ("failed", "FailedTasks")):
            if row.get(column) is not None:
                tasks.add_metric([state], int(row[column]))
        yield tasks
        for name, column in (("mailq_delay_queue_receive_enabled", "QueueReceiveEnabled"),
                             ("mailq_delay_broker_enabled", "BrokerEnabled")):
            if row.get(column) is not None:
                family = self._family(name)
                family.add_metric([], int(row[column]))
                yield family


def queue_registry(cache: QueueMetricsCache) -> CollectorRegistry:
    """A registry of its own holding one QueueCollector over ``cache``."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(QueueCollector(cache))
    return registry
