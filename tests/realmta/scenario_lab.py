"""The independent scenarios' lab: tests/realmta/lab.py's Lab plus two scriptable ports.

:class:`ScenarioLab` is :class:`lab.Lab` (lab.py is not changed) with two more
``smtpd`` services whose RCPT and end-of-data decisions come from a Postfix
policy service (SMTPD_POLICY_README) that each test scripts with a function
(:attr:`ScenarioLab.decide`, ``attrs -> action or None``):

* ``hooked``: STARTTLS offered, no AUTH, sender rules at MAIL FROM
  (``smtpd_delay_reject = no``);
* ``qq``: the same, but the server calls itself ``newxmesmtplogicsvrsza5.qq.com``
  in its greeting and EHLO reply, as QQ Mail's servers do, so that the worker
  resolves the provider from the server and not from its configuration.

:class:`SwallowingProxy` sits between the worker and a port and drops the
connection instead of passing on chosen final replies ("250 ... queued as"):
the server has the mail, the client never hears it (outcome unknown).
"""

from __future__ import annotations

import socket
import socketserver
import threading
from typing import Callable

from lab import Lab, free_port, read_policy_request

#: what the hook answers: a Postfix access(5) action, or None for DUNNO
Decide = Callable[[dict[str, str]], "str | None"]
QQ_HOST = "newxmesmtplogicsvrsza5.qq.com"


class _Hook(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self) -> None:
        self.decide: Decide = lambda attrs: None
        self.requests: list[dict[str, str]] = []
        self.lock = threading.Lock()
        super().__init__(("127.0.0.1", 0), _HookHandler)


class _HookHandler(socketserver.StreamRequestHandler):
    def handle(self) -> None:
        server: _Hook = self.server  # type: ignore[assignment]
        while True:
            attrs = read_policy_request(self.rfile)
            if attrs is None:
                return
            with server.lock:
                server.requests.append(attrs)
            action = server.decide(attrs) or "DUNNO"
            self.wfile.write(f"action={action}\n\n".encode())
            self.wfile.flush()


class ScenarioLab(Lab):
    PORTS = (*Lab.PORTS, "hooked", "qq")

    def start(self) -> "ScenarioLab":
        self.hook = _Hook()
        threading.Thread(target=self.hook.serve_forever, name="scenario-hook", daemon=True).start()
        super().start()
        return self

    def script(self, decide: Decide | None) -> None:
        """The policy decisions from now on (None: accept everything)."""
        with self.hook.lock:
            self.hook.decide = decide or (lambda attrs: None)
            self.hook.requests.clear()

    def _extra_services(self) -> str:
        policy = f"check_policy_service,inet:127.0.0.1:{self.hook.server_address[1]}"
        sender = f"check_sender_access,texthash:{self.postfix_dir}/sender_access"
        out = ""
        for name, extra in (("hooked", ""), ("qq", f"\n  -o myhostname={QQ_HOST}")):
            out += f"""127.0.0.1:{self.ports[name]} inet n - n - - smtpd
  -o syslog_name=postfix/{name}
  -o smtpd_delay_reject=no
  -o smtpd_sender_restrictions={sender}
  -o smtpd_recipient_restrictions={policy},reject_unauth_destination
  -o smtpd_end_of_data_restrictions={policy}{extra}
"""
        return out

    def stop(self) -> None:
        try:
            super().stop()
        finally:
            if getattr(self, "hook", None) is not None:
                self.hook.shutdown()
                self.hook.server_close()


class SwallowingProxy:
    """A TCP proxy to ``127.0.0.1:upstream`` that, for the final replies whose
    ordinal (1, 2, ... over all its connections) is in ``swallow``, closes both
    sides instead of passing the reply on.  Plaintext SMTP only (it reads the
    server's replies)."""

    def __init__(self, upstream: int, swallow: set[int]):
        self.upstream = upstream
        self.swallow = swallow
        self.final_replies = 0
        self.swallowed: list[bytes] = []
        self.lock = threading.Lock()
        self.listener = socket.socket()
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind(("127.0.0.1", free_port()))
        self.listener.listen(8)
        self.port = self.listener.getsockname()[1]
        self.closed = False
        threading.Thread(target=self._accept, name="swallowing-proxy", daemon=True).start()

    def _accept(self) -> None:
        while not self.closed:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server = socket.create_connection(("127.0.0.1", self.upstream))
            threading.Thread(target=self._up, args=(client, server), daemon=True).start()
            threading.Thread(target=self._down, args=(server, client), daemon=True).start()

    @staticmethod
    def _up(client: socket.socket, server: socket.socket) -> None:
        try:
            while data := client.recv(65536):
                server.sendall(data)
        except OSError:
            pass
        finally:
            _close(server)

    def _down(self, server: socket.socket, client: socket.socket) -> None:
        buf = b""
        try:
            while data := server.recv(65536):
                buf += data
                while b"\r\n" in buf:
                    line, buf = buf.split(b"\r\n", 1)
                    if line.startswith(b"250 ") and b"queued as" in line:
                        with self.lock:
                            self.final_replies += 1
                            drop = self.final_replies in self.swallow
                            if drop:
                                self.swallowed.append(line)
                        if drop:
                            return  # the finally closes both sides: the reply never arrives
                    client.sendall(line + b"\r\n")
        except OSError:
            pass
        finally:
            _close(client)
            _close(server)

    def close(self) -> None:
        self.closed = True
        _close(self.listener)


def _close(s: socket.socket) -> None:
    try:
        s.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    s.close()
