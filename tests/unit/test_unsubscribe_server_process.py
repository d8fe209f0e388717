"""``mailq-db unsubscribe-server`` as a process: it serves, and SIGTERM (systemd's stop) ends it
cleanly with exit code 0 and its port closed, as the dashboard and the exporter do."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import urllib.error
import urllib.request

KEY = "k" * 64


def test_the_unsubscribe_server_serves_and_stops_on_sigterm(tmp_path):
    env = dict(os.environ, MAILQ_BOUNCE_KEY=KEY, MAILQ_DB_URL="mssql+pyodbc://u:p@nowhere.invalid/db")
    proc = subprocess.Popen([sys.executable, "-m", "mailq_db.cli", "unsubscribe-server", "--listen", "127.0.0.1:0"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        line = proc.stdout.readline()
        assert "unsubscribe-server listening on 127.0.0.1:" in line, (line, proc.stderr.read())
        port = int(line.rsplit(":", 1)[1])
        try:  # a link that is not signed with the key: refused, the database never asked
            urllib.request.urlopen(f"http://127.0.0.1:{port}/u/not-a-token", timeout=10)
            raise AssertionError("an unsigned token was accepted")
        except urllib.error.HTTPError as exc:
            assert 400 <= exc.code < 500
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0, proc.stderr.read()
        with socket.socket() as probe:
            assert probe.connect_ex(("127.0.0.1", port)) != 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
