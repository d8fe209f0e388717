"""Benchmark: the sender worker against a loopback SMTP sink with a simulated round-trip time.

    python bench/worker_smtp.py [--rtt-ms 10] [--mails 200] [--concurrent-mails 2000]
                                [--rss-mails 20000] [--concurrency 8] [--lab] [--lab-mails 200]

The real worker code runs with the database layer replaced by the unit tests'
FakeQueue test double (tests/unit/fake_queue.py); the sink is aiosmtpd in a
separate process that requires STARTTLS and AUTH, offers PIPELINING, and
delivers every reply ``--rtt-ms`` after the server wrote it (a one-way delay:
each client round trip costs one delay, pipelined commands share one; TLS
handshake packets are not delayed).

Scenarios:
  (1) the article's pattern: a new connection + STARTTLS + AUTH for every mail,
      one mail at a time;
  (2) the worker: one connection per account batch, one thread, PIPELINING
      not used (the worker before issue 14);
  (2p) the same with PIPELINING (RFC 2920): MAIL, RCPT and DATA in one round trip;
  (3) the worker with --concurrency threads (default 8).
With --lab (root, Postfix and Dovecot installed): the realmta lab's Postfix
(tests/realmta/lab.py, STARTTLS + Dovecot AUTH on loopback, no added delay)
runs (1) and (2p) side by side for --lab-mails mails.
DKIM (issue 26; --dkim-mails, default 300): the CPU time per mail of building
the message and of signing it (dkimpy, RSA-2048, relaxed/relaxed, the
default header list; a plain mail and one with a 100 KB attachment), and
(2p) again with every mail signed, beside the unsigned (2p).
Then peak RSS of this process while the worker sends --rss-mails mails with no
delay (default 20,000 so a run takes well under 3 minutes; pass
--rss-mails 100000 for the figure the issue asks for; RSS is sampled during
the run to show whether it stays flat).

Prints mails/s, SMTP round trips per mail and the ratio to (1) for each
scenario; the last line is ``worker/article ratio: <(3)/(1)>``.  A benchmark:
it prints figures and asserts nothing.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import resource
import smtplib
import ssl
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "unit"))
sys.path.insert(0, os.path.join(HERE, "..", "src"))

from fake_queue import FakeConnection, FakeQueue, Row, make_mail  # noqa: E402
from smtp_sink import PASSWORD, USER, SmtpSink  # noqa: E402

from mailq_db.worker.config import AccountConfig, Config, WorkerConfig  # noqa: E402
from mailq_db.worker.message import build  # noqa: E402
from mailq_db.worker.runner import run_workers  # noqa: E402


def sink_process(conn, rtt: float, cert_dir: str) -> None:
    sink = SmtpSink(starttls=True, auth=True, reply_delay=rtt, cert_dir=cert_dir, keep_messages=False)
    sink.start()
    conn.send((sink.port, sink.cert))
    while True:
        command = conn.recv()
        if command == "stats":
            conn.send((sink.replies_sent, sink.message_count, sink.connections))
        elif command == "delay":
            sink.reply_delay = conn.recv()
            conn.send("ok")
        elif command == "stop":
            sink.stop()
            conn.send("ok")
            return


class Sink:
    def __init__(self, rtt: float, cert_dir: str):
        self.conn, child = multiprocessing.Pipe()
        self.proc = multiprocessing.Process(target=sink_process, args=(child, rtt, cert_dir), daemon=True)
        self.proc.start()
        self.port, self.cert = self.conn.recv()

    def stats(self) -> tuple[int, int, int]:
        self.conn.send("stats")
        return self.conn.recv()

    def set_delay(self, rtt: float) -> None:
        self.conn.send("delay")
        self.conn.send(rtt)
        self.conn.recv()

    def stop(self) -> None:
        self.conn.send("stop")
        self.conn.recv()
        self.proc.join(5)


def account(sink: Sink, pipelining: bool = True) -> AccountConfig:
    return AccountConfig(name="default", host="127.0.0.1", port=sink.port, tls="starttls", ca_file=sink.cert,
                         user=USER, password=PASSWORD, password_env="BENCH_PASSWORD",
                         connect_timeout_seconds=10, command_timeout_seconds=30, pipelining=pipelining,
                         local_hostname="bench.example.com")


def mails(n: int, start: int = 1, prefix: str = "") -> list:
    if prefix:
        return [make_mail(i, subject=f"benchmark mail {i} 你好", from_address="mailer@lab.test",
                          to_address=f"{prefix}-{i}@lab.test", message_id=f"<{prefix}.{i}@bench.lab.test>")
                for i in range(start, start + n)]
    return [make_mail(i, subject=f"benchmark mail {i} 你好") for i in range(start, start + n)]


def measure(sink: Sink, n: int, run) -> tuple[float, float]:
    replies0, sent0, _ = sink.stats()
    started = time.perf_counter()
    run()
    elapsed = time.perf_counter() - started
    replies, sent, _ = sink.stats()
    delivered = sent - sent0
    if delivered != n:
        print(f"  note: {delivered} of {n} mails delivered", flush=True)
    return delivered / elapsed, (replies - replies0) / max(delivered, 1)


def article(sink, n: int, user: str = USER, password: str = PASSWORD, prefix: str = "") -> None:
    """A new connection, STARTTLS and AUTH for every mail, one at a time (the article's loop)."""
    context = ssl.create_default_context(cafile=sink.cert)
    for mail in mails(n, prefix=prefix):
        out = build(mail)
        smtp = smtplib.SMTP("127.0.0.1", sink.port, timeout=30, local_hostname="bench.example.com")
        smtp.ehlo()
        smtp.starttls(context=context)
        smtp.ehlo()
        smtp.login(user, password)
        smtp.sendmail(out.envelope_from, list(out.recipients), out.data)
        smtp.quit()


def config(sink: Sink, concurrency: int, batch_size: int = 50, pipelining: bool = True,
           acct: AccountConfig | None = None) -> Config:
    return Config(worker=WorkerConfig(batch_size=batch_size, lease_seconds=300, lease_safety_margin_seconds=30,
                                      worker_name="bench", concurrency=concurrency,
                                      idle_backoff_min_seconds=0.01, idle_backoff_max_seconds=0.05),
                  accounts={"default": acct or account(sink, pipelining)})


def worker(sink: Sink, n: int, concurrency: int, pipelining: bool = True) -> None:
    queue = FakeQueue(mails(n))
    code = run_workers(config(sink, concurrency, pipelining=pipelining), FakeConnection, procs=queue, once=True,
                       install_signals=False, progress_seconds=3600)
    assert code == 0


def lab_run(n: int) -> None:
    """(1) and (2p) against the realmta lab's Postfix, side by side."""
    sys.path.insert(0, os.path.join(HERE, "..", "tests", "realmta"))
    import shutil
    import tempfile
    from pathlib import Path

    from lab import PASSWORD as LAB_PASSWORD, USER as LAB_USER, Lab, missing

    reason = missing()
    if reason:
        print(f"lab: not run: {reason}", flush=True)
        return
    root = Path(tempfile.mkdtemp(prefix="mailq-bench-lab-"))
    lab = Lab(root)
    try:
        started = time.perf_counter()
        lab.start()
        print(f"lab: Postfix {postfix_version()} + Dovecot on loopback, STARTTLS + AUTH (submission port), "
              f"no added delay; started in {time.perf_counter() - started:.1f} s", flush=True)

        class Target:
            port, cert = lab.ports["submission"], lab.ca_file

        acct = AccountConfig(name="default", host="127.0.0.1", port=lab.ports["submission"], tls="starttls",
                             ca_file=lab.ca_file, user=LAB_USER, password=LAB_PASSWORD, password_env="LAB",
                             local_hostname="bench.example.com", command_timeout_seconds=30)
        t0 = time.perf_counter()
        article(Target, n, LAB_USER, LAB_PASSWORD, prefix="article")
        r1 = n / (time.perf_counter() - t0)
        queue = FakeQueue(mails(n, prefix="worker"))
        t0 = time.perf_counter()
        run_workers(config(None, 1, acct=acct), FakeConnection, procs=queue, once=True,
                    install_signals=False, progress_seconds=3600)
        r2 = n / (time.perf_counter() - t0)
        got = (len(lab.wait_delivered("article-", n, 60)), len(lab.wait_delivered("worker-", n, 60)))
        sent = sum(1 for r in queue.rows.values() if r.status == "Sent")
        print(f"lab (1) article, connection per mail : {r1:8.1f} mails/s  (delivered {got[0]}/{n})", flush=True)
        print(f"lab (2p) worker, one connection       : {r2:8.1f} mails/s  (delivered {got[1]}/{n}, "
              f"Sent {sent})  {r2 / r1:4.2f}x", flush=True)
    finally:
        lab.stop()
        shutil.rmtree(root, ignore_errors=True)


def postfix_version() -> str:
    import subprocess

    out = subprocess.run(["postconf", "-d", "mail_version"], capture_output=True, text=True).stdout
    return out.split("=")[-1].strip() or "?"


class StreamingQueue(FakeQueue):
    """FakeQueue that makes mails as they are claimed and forgets them once sent,
    so the RSS figure is the worker's, not the test double's."""

    def __init__(self, total: int):
        super().__init__()
        self.total, self.next_id = total, 1

    def claim_mail(self, conn, **kw):
        with self.lock:
            take = min(kw["batch_size"], self.total - self.next_id + 1)
            for m in mails(take, self.next_id):
                self.rows[m.id] = Row(m)
            self.next_id += take
            self.calls.clear()
        return super().claim_mail(conn, **kw)

    def mark_sent(self, conn, **kw):
        result = super().mark_sent(conn, **kw)
        with self.lock:
            for r in result:
                self.rows.pop(r.mail_id, None)
        return result


def dkim_run(sink: Sink, n: int, unsigned_rate: float) -> None:
    """Signing cost per mail beside unsigned: CPU per mail, then the worker's rate with signing."""
    try:
        import dkim  # noqa: F401 - dkimpy, the optional extra
    except ImportError:
        print("dkim: not run: pip install 'mailq-db[dkim]'", flush=True)
        return
    from dataclasses import replace

    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    from mailq_db.procedures import Attachment
    from mailq_db.worker import dkim as signing

    pem = rsa.generate_private_key(public_exponent=65537, key_size=2048).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.TraditionalOpenSSL, serialization.NoEncryption())
    settings = signing.DkimSettings("bench.example.com", "bench", "generated", pem, signing.SIGNED_HEADERS, 2048)
    attachment = Attachment(file_name="report.csv", content_type="text/csv", content=os.urandom(50_000).hex().encode())
    for label, batch in (("plain mail", mails(n)),
                         ("100 KB attachment", [replace(m, attachments=[attachment]) for m in mails(n)])):
        started = time.perf_counter()
        outs = [build(m) for m in batch]
        built = (time.perf_counter() - started) / n
        started = time.perf_counter()
        for out in outs:
            signing.sign(settings, out.data)
        signed = (time.perf_counter() - started) / n
        print(f"DKIM, {label:<17}: build {built * 1e6:7.0f} us/mail, sign {signed * 1e6:7.0f} us/mail "
              f"(+{100 * signed / built:.0f} % of the build; {len(outs[0].data) // 1000} KB message)", flush=True)
    acct = replace(account(sink), dkim=settings)
    queue = FakeQueue(mails(n))
    rate, trips = measure(sink, n, lambda: run_workers(config(sink, 1, acct=acct), FakeConnection, procs=queue,
                                                       once=True, install_signals=False, progress_seconds=3600))
    print(f"(2p) worker, PIPELINING, DKIM-signed : {rate:8.1f} mails/s  {trips:5.1f} round trips/mail  "
          f"(unsigned (2p): {unsigned_rate:.1f} mails/s)", flush=True)


def rss_mb() -> float:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rtt-ms", type=float, default=10.0, help="reply delay per SMTP command (default 10)")
    parser.add_argument("--mails", type=int, default=200, help="mails for scenarios (1) and (2) (default 200)")
    parser.add_argument("--concurrent-mails", type=int, default=2000, help="mails for scenario (3) (default 2000)")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--lab", action="store_true",
                        help="also run (1) and (2p) against the realmta lab's Postfix (root, postfix, dovecot)")
    parser.add_argument("--lab-mails", type=int, default=200)
    parser.add_argument("--dkim-mails", type=int, default=300, help="mails for the DKIM figures (0: skip)")
    parser.add_argument("--rss-mails", type=int, default=20000,
                        help="mails for the memory run with no delay (default 20000; the issue's figure: 100000)")
    args = parser.parse_args()
    rtt = args.rtt_ms / 1000

    import logging
    import tempfile

    logging.getLogger("mailq_db").setLevel(logging.WARNING)
    with tempfile.TemporaryDirectory() as cert_dir:
        sink = Sink(rtt, cert_dir)
        try:
            print(f"sink: aiosmtpd, STARTTLS + AUTH required, {args.rtt_ms:g} ms per reply; "
                  f"worker database: FakeQueue test double", flush=True)
            r1, t1 = measure(sink, args.mails, lambda: article(sink, args.mails))
            print(f"(1) article, connection per mail     : {r1:8.1f} mails/s  {t1:5.1f} round trips/mail  1.00x",
                  flush=True)
            r2, t2 = measure(sink, args.mails, lambda: worker(sink, args.mails, 1, pipelining=False))
            bound = 1 / (t2 * rtt) if rtt else float("inf")
            print(f"(2) worker, no PIPELINING            : {r2:8.1f} mails/s  {t2:5.1f} round trips/mail  "
                  f"{r2 / r1:4.2f}x  (round-trip bound {bound:.1f} mails/s per connection: "
                  f"{100 * r2 / bound:.0f} %)", flush=True)
            r2p, t2p = measure(sink, args.mails, lambda: worker(sink, args.mails, 1))
            bound = 1 / (t2p * rtt) if rtt else float("inf")
            print(f"(2p) worker, PIPELINING              : {r2p:8.1f} mails/s  {t2p:5.1f} round trips/mail  "
                  f"{r2p / r1:4.2f}x  ({r2p / r2:4.2f}x (2); round-trip bound {bound:.1f} mails/s: "
                  f"{100 * r2p / bound:.0f} %)", flush=True)
            r3, t3 = measure(sink, args.concurrent_mails,
                             lambda: worker(sink, args.concurrent_mails, args.concurrency))
            print(f"(3) worker, concurrency {args.concurrency:<2}          : {r3:8.1f} mails/s  {t3:5.1f} round "
                  f"trips/mail  {r3 / r1:4.2f}x  ({r3 / args.concurrency:.1f} mails/s per connection)", flush=True)

            if args.dkim_mails:
                dkim_run(sink, args.dkim_mails, r2p)

            sink.set_delay(0)
            queue = StreamingQueue(args.rss_mails)
            samples: list[tuple[int, float]] = []
            import threading

            done = threading.Event()

            def sample() -> None:
                while not done.wait(0.5):
                    samples.append((queue.next_id - 1, rss_mb()))

            before = rss_mb()
            sampler = threading.Thread(target=sample, daemon=True)
            sampler.start()
            started = time.perf_counter()
            run_workers(config(sink, args.concurrency, 100), FakeConnection, procs=queue, once=True,
                        install_signals=False, progress_seconds=3600)
            elapsed = time.perf_counter() - started
            done.set()
            sampler.join()
            peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
            shown = samples[len(samples) // 10:: max(1, len(samples) // 5)] if samples else []
            trail = ", ".join(f"{n // 1000}k: {mb:.0f} MB" for n, mb in shown)
            print(f"memory: {args.rss_mails} mails, no delay, concurrency {args.concurrency}: "
                  f"{args.rss_mails / elapsed:.0f} mails/s; RSS before {before:.0f} MB, during [{trail}], "
                  f"peak {peak:.0f} MB", flush=True)
        finally:
            sink.stop()
    if args.lab:
        lab_run(args.lab_mails)
    print(f"pipelining/no-pipelining ratio (one connection): {r2p / r2:.2f}")
    print(f"worker/article ratio: {r3 / r1:.1f}")


if __name__ == "__main__":
    main()
