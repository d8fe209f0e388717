"""Test-only entry: run the real worker runner with a FakeQueue instead of the database.

    python fake_worker_main.py --port P --mails N --out result.json [--concurrency C]

Used by test_worker_signals.py (SIGTERM in a subprocess) and bench/worker_smtp.py.
On exit it writes the FakeQueue's final statuses and calls to ``--out`` as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from fake_queue import FakeConnection, FakeQueue, make_mail  # noqa: E402

from mailq_db.worker import logs  # noqa: E402
from mailq_db.worker.config import AccountConfig, Config, WorkerConfig  # noqa: E402
from mailq_db.worker.runner import run_workers  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--mails", type=int, default=10)
    parser.add_argument("--out", required=True)
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=50)
    parser.add_argument("--once", action="store_true")
    args = parser.parse_args()
    logs.setup("json", "INFO")
    queue = FakeQueue([make_mail(i) for i in range(1, args.mails + 1)])
    account = AccountConfig(name="default", host="127.0.0.1", port=args.port, tls="none",
                            allow_plaintext=True, connect_timeout_seconds=5, command_timeout_seconds=10)
    config = Config(worker=WorkerConfig(batch_size=args.batch_size, lease_seconds=120,
                                        lease_safety_margin_seconds=10, worker_name="subprocess",
                                        concurrency=args.concurrency, idle_backoff_min_seconds=0.05,
                                        idle_backoff_max_seconds=0.2),
                    accounts={"default": account})
    print("ready", flush=True)
    code = run_workers(config, FakeConnection, procs=queue, once=args.once)
    with open(args.out, "w") as fh:
        json.dump({"statuses": queue.statuses(),
                   "calls": [[name, {k: v for k, v in kw.items() if k in ("ids", "disposition")}]
                             for name, kw in queue.calls]}, fh)
    return code


if __name__ == "__main__":
    sys.exit(main())
