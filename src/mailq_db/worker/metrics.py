"""Counters of the worker and an optional Prometheus text endpoint (http.server, no dependency)."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

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
#: upper bounds, in seconds, of the claim latency histogram
CLAIM_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
#: upper bounds, in seconds, of the SMTP send latency histogram (MAIL FROM to the final reply)
SEND_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


def _label(value: object) -> str:
    return str(value if value is not None else "").replace("\\", "\\\\").replace('"', '\\"').replace("\n", " ")


class Metrics:
    """Thread-safe counters shared by every worker thread of a process."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.counts = {name: 0 for name in COUNTERS}
        self.claim_buckets = [0] * len(CLAIM_BUCKETS)
        self.claim_count = 0
        self.claim_sum = 0.0
        #: name -> (account, code) -> count, for counters incremented with labels
        self.labelled: dict[str, dict[tuple[str, str], int]] = {}
        #: account -> [bucket counts..., count, sum]
        self.send: dict[str, list[float]] = {}
        self.blocked: dict[str, bool] = {}

    def inc(self, name: str, n: int = 1, *, account: str | None = None, code: int | None = None) -> None:
        """Add ``n``; with ``account``/``code`` the series is labelled (the total stays in snapshot())."""
        if name not in self.counts:
            raise KeyError(name)
        with self._lock:
            self.counts[name] += n
            if account is not None or code is not None:
                key = (_label(account), _label(code))
                series = self.labelled.setdefault(name, {})
                series[key] = series.get(key, 0) + n

    def observe_send(self, seconds: float, account: str, code: int | None = None) -> None:
        with self._lock:
            h = self.send.setdefault(account, [0.0] * (len(SEND_BUCKETS) + 2))
            for i, bound in enumerate(SEND_BUCKETS):
                if seconds <= bound:
                    h[i] += 1
            h[-2] += 1
            h[-1] += seconds

    def set_blocked(self, account: str, blocked: bool) -> None:
        with self._lock:
            self.blocked[account] = blocked

    def observe_claim(self, seconds: float) -> None:
        with self._lock:
            self.claim_count += 1
            self.claim_sum += seconds
            for i, bound in enumerate(CLAIM_BUCKETS):
                if seconds <= bound:
                    self.claim_buckets[i] += 1

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self.counts)

    def render(self) -> str:
        """The Prometheus text exposition format (version 0.0.4)."""
        lines = []
        with self._lock:
            for name, text in COUNTERS.items():
                metric = f"mailq_worker_{name}_total"
                lines += [f"# HELP {metric} {text}", f"# TYPE {metric} counter"]
                series = self.labelled.get(name)
                if series:
                    rest = self.counts[name] - sum(series.values())
                    for (account, code), count in sorted(series.items()):
                        lines.append(f'{metric}{{account="{account}",code="{code}"}} {count}')
                    if rest:
                        lines.append(f'{metric}{{account="",code=""}} {rest}')
                else:
                    lines.append(f"{metric} {self.counts[name]}")
            metric = "mailq_worker_claim_seconds"
            lines += [f"# HELP {metric} ClaimMail latency", f"# TYPE {metric} histogram"]
            for bound, count in zip(CLAIM_BUCKETS, self.claim_buckets, strict=True):
                lines.append(f'{metric}_bucket{{le="{bound}"}} {count}')
            lines += [f'{metric}_bucket{{le="+Inf"}} {self.claim_count}',
                      f"{metric}_sum {self.claim_sum:.6f}", f"{metric}_count {self.claim_count}"]
            metric = "mailq_worker_send_seconds"
            lines += [f"# HELP {metric} SMTP send latency per mail (MAIL FROM to the final reply)",
                      f"# TYPE {metric} histogram"]
            for account, h in sorted(self.send.items()):
                a = _label(account)
                for bound, seen in zip(SEND_BUCKETS, h[:len(SEND_BUCKETS)], strict=True):
                    lines.append(f'{metric}_bucket{{account="{a}",le="{bound}"}} {int(seen)}')
                lines += [f'{metric}_bucket{{account="{a}",le="+Inf"}} {int(h[-2])}',
                          f'{metric}_sum{{account="{a}"}} {h[-1]:.6f}', f'{metric}_count{{account="{a}"}} {int(h[-2])}']
            metric = "mailq_worker_blocked_accounts"
            lines += [f"# HELP {metric} accounts this process last saw throttled or refused (a Wait, until a send succeeds)",
                      f"# TYPE {metric} gauge", f"{metric} {sum(self.blocked.values())}"]
            metric = "mailq_worker_account_blocked"
            lines += [f"# HELP {metric} 1 while the account is blocked by a Wait of this process",
                      f"# TYPE {metric} gauge"]
            for account, blocked in sorted(self.blocked.items()):
                lines.append(f'{metric}{{account="{_label(account)}"}} {int(blocked)}')
        return "\n".join(lines) + "\n"


def serve(metrics: Metrics, port: int, host: str = "127.0.0.1") -> ThreadingHTTPServer:
    """Serve ``GET /metrics`` in a daemon thread; ``server.shutdown()`` stops it."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            if self.path.split("?")[0] not in ("/metrics", "/"):
                self.send_error(404)
                return
            body = metrics.render().encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:  # quiet
            pass

    server = ThreadingHTTPServer((host, port), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="metrics", daemon=True).start()
    return server
