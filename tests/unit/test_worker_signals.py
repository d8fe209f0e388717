"""SIGTERM/SIGINT in a real worker process (runner + FakeQueue in place of the database)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest
from smtp_sink import SmtpSink, wait_for

import mailq_db

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.dirname(os.path.dirname(os.path.abspath(mailq_db.__file__)))


class SlowSink(SmtpSink):
    """Waits 50 ms before each MAIL, RCPT and DATA reply, so a signal reliably lands mid-batch."""

    async def delay(self) -> None:
        import asyncio

        await asyncio.sleep(0.05)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_signal_mid_batch_releases_exactly_the_unsent_mails(tmp_path, signum):
    out = tmp_path / "result.json"
    with SlowSink() as sink:
        env = dict(os.environ, PYTHONPATH=SRC + os.pathsep + os.environ.get("PYTHONPATH", ""))
        proc = subprocess.Popen(
            [sys.executable, os.path.join(HERE, "fake_worker_main.py"), "--port", str(sink.port),
             "--mails", "20", "--out", str(out)],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        try:
            assert wait_for(lambda: len(sink.messages) >= 3, timeout=15), proc.stderr.read() if proc.poll() else ""
            proc.send_signal(signum)
            code = proc.wait(timeout=15)
        finally:
            if proc.poll() is None:
                proc.kill()
        stderr = proc.stderr.read()
        assert code == 0, stderr
        delivered = sorted(int(m.rcpt_tos[0][4:].split("@")[0]) for m in sink.messages)
    result = json.loads(out.read_text())
    statuses = {int(k): v for k, v in result["statuses"].items()}
    sent = sorted(i for i, s in statuses.items() if s == "Sent")
    released = [ids for name, kw in result["calls"] if name == "release_mail" for ids in kw["ids"]]
    assert sent == delivered and 3 <= len(sent) < 20
    assert sorted(released) == [i for i in range(1, 21) if i not in sent]
    assert all(statuses[i] == "UnSent" for i in released)
    assert "stopping" in stderr
