"""``mailq-db exporter``: the queue's own metrics for Prometheus."""

from __future__ import annotations

import argparse
import logging
import threading
from typing import Any, Callable

from .. import procedures
from ..connection import ENV_URL, Backoff, ReconnectingConnection, connect
from ..worker import logs
from ..worker.metrics import QueueMetricsCache, queue_registry, serve
from . import serve_until_stopped

HELP = f"""\
Serve the queue's own metrics on http://HOST:PORT/metrics for Prometheus:
depth by account, run mode and status; the age of the oldest sendable mail
(scheduled, backed-off and blocked mail left out); attempts per minute by
account, outcome and SMTP reply class; blocked accounts; delayed tasks
(pending, overdue, held, failed) where delayed execution is deployed.

One call of mailq.GetQueueMetrics (and one of delay.GetTaskMetrics) per
--interval, whatever the scrape rate: scrapes in between get the cached
figures.  The login needs the role MailqMonitor (read only).  Names, alert
rules and a Grafana dashboard: docs/monitoring/.

The database URL comes from --db, else ${ENV_URL}.

examples:
  mailq-db exporter                                  # 127.0.0.1:9469, every 30 s
  mailq-db exporter --host 0.0.0.0 --port 9469 --interval 15
"""

DEFAULT_PORT = 9469


def register(subparsers) -> None:
    p = subparsers.add_parser("exporter", help="serve the queue's metrics for Prometheus",
                              description=HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--db", help=f"database URL (default: ${ENV_URL})")
    p.add_argument("--host", default="127.0.0.1",
                   help="address to listen on (default 127.0.0.1; 0.0.0.0 for remote scraping)")
    p.add_argument("--port", type=_port, default=DEFAULT_PORT,
                   help=f"port (default {DEFAULT_PORT}; 0: one the OS chooses)")
    p.add_argument("--interval", type=_seconds, default=30.0, metavar="SECONDS",
                   help="read the database at most this often (default 30; 1-3600)")
    p.add_argument("--window-minutes", type=_minutes, default=5, metavar="N",
                   help="complete minutes averaged by mailq_queue_attempts_per_minute (default 5; 1-60)")
    p.add_argument("--log-format", choices=("text", "json"), default="text")
    p.add_argument("--log-level", choices=("DEBUG", "INFO", "WARNING", "ERROR"), default="INFO")
    p.set_defaults(func=run)


def _number(text: str, kind: type, low: float, high: float) -> Any:
    try:
        value = kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not low <= value <= high:
        raise argparse.ArgumentTypeError(f"must be {low:g}-{high:g}, got {text}")
    return value


def _port(text: str) -> int:
    return int(_number(text, int, 0, 65535))


def _seconds(text: str) -> float:
    return float(_number(text, float, 1, 3600))


def _minutes(text: str) -> int:
    return int(_number(text, int, 1, 60))


def make_cache(open_connection: Callable[[], Any], *, interval: float, window_minutes: int) -> QueueMetricsCache:
    """The exporter's cache over one database connection (reopened when it drops)."""
    db = ReconnectingConnection(open_connection, retries=1, backoff=Backoff(0.5, 2.0))
    lock = threading.Lock()  # one connection: the two calls never overlap

    def read_queue() -> procedures.QueueMetrics:
        with lock:
            return db.call(procedures.get_queue_metrics, window_minutes=window_minutes)

    def read_delay() -> dict[str, Any]:
        with lock:
            return db.call(procedures.get_delay_task_metrics)

    return QueueMetricsCache(read_queue, read_delay, interval)


def run(args: argparse.Namespace) -> int:
    logs.setup(args.log_format, args.log_level)
    url = args.db

    def open_connection() -> Any:
        return connect(url, query_timeout=max(5, int(args.interval)))

    open_connection().close()  # fail fast on a missing driver, a wrong URL or login
    cache = make_cache(open_connection, interval=args.interval, window_minutes=args.window_minutes)
    server = serve(queue_registry(cache), args.port, args.host)
    host, port = str(server.server_address[0]), int(server.server_address[1])
    logs.event(logging.getLogger("mailq_db.exporter"), logging.INFO, "exporter started",
               url=f"http://{host}:{port}/metrics", interval_seconds=args.interval)
    print(f"serving http://{host}:{port}/metrics (Ctrl-C stops)", flush=True)
    serve_until_stopped(server)
    return 0
