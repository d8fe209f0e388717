"""Run N worker threads with signal handling, progress logs and optional metrics.

SIGTERM/SIGINT set one stop event: each thread finishes the mail in flight,
writes its acknowledgements, releases what it has not sent, and the process
exits 0.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from typing import Any, Callable

from .. import procedures
from ..connection import ReconnectingConnection
from .account import SenderPauses
from .classify import Escalation
from .config import Config
from .logs import event
from .loop import Worker
from .metrics import Metrics, serve

log = logging.getLogger("mailq_db.worker")


def install_signal_handlers(stop: threading.Event) -> None:
    """SIGTERM and SIGINT ask every worker to stop gracefully (main thread only)."""

    def handler(signum: int, frame: Any) -> None:
        if not stop.is_set():
            event(log, logging.INFO, "stopping: finishing the mail in flight, releasing the rest",
                  signal=signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)


def run_workers(
    config: Config,
    open_connection: Callable[[], Any],
    *,
    procs: Any = procedures,
    once: bool = False,
    concurrency: int | None = None,
    dry_run: bool | None = None,
    stop: threading.Event | None = None,
    metrics: Metrics | None = None,
    metrics_port: int | None = None,
    metrics_host: str = "127.0.0.1",
    progress_seconds: float = 30.0,
    install_signals: bool = True,
    worker_factory: Callable[..., Worker] = Worker,
) -> int:
    """Run the workers until stopped (or, with ``once``, until nothing is due).

    Each thread gets its own connection from ``open_connection`` (wrapped in a
    :class:`ReconnectingConnection`) and its own lock token.  Returns the exit
    code: 0, or 1 when a worker ended on an error.
    """
    stop = stop or threading.Event()
    metrics = metrics or Metrics()
    if install_signals:
        install_signal_handlers(stop)
    server = serve(metrics, metrics_port, metrics_host) if metrics_port is not None else None
    n = concurrency or config.worker.concurrency
    errors: list[BaseException] = []
    # One memory per process of each account's failures and of paused From addresses.
    escalation = Escalation(config.escalation)
    pauses = SenderPauses()

    def body(index: int) -> None:
        db = ReconnectingConnection(open_connection)
        worker = worker_factory(config, db, procs=procs, stop=stop, metrics=metrics,
                                name=f"{config.worker.worker_name}/{index}", dry_run=dry_run,
                                escalation=escalation, sender_pauses=pauses)
        try:
            worker.run(once=once)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
            log.exception("worker %d ended on an error", index)
        finally:
            db.close()

    threads = [threading.Thread(target=body, args=(i,), name=f"worker-{i}") for i in range(n)]
    event(log, logging.INFO, "worker started", concurrency=n, dry_run=bool(dry_run or config.worker.dry_run),
          app_name=config.worker.app_name, batch_size=config.worker.batch_size,
          accounts=sorted(config.accounts))
    for t in threads:
        t.start()
    last = time.monotonic()
    try:
        while any(t.is_alive() for t in threads):
            for t in threads:
                t.join(0.2)
            if time.monotonic() - last >= progress_seconds:
                last = time.monotonic()
                event(log, logging.INFO, "progress", **metrics.snapshot())
    finally:
        stop.set()
        for t in threads:
            t.join()
        if server is not None:
            server.shutdown()
    event(log, logging.INFO, "worker stopped", **metrics.snapshot())
    return 1 if errors else 0
