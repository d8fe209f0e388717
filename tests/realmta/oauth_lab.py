"""The realmta lab with OAuth 2.0 sign-in and a DKIM verifier (issue 26).

:class:`TokenServer` is a small OAuth 2.0 authorization server on
127.0.0.1 (a random port) that the tests start:

* ``POST /token`` issues access tokens: the client credentials grant (RFC 6749
  4.4; the client's mailbox is fixed) and the refresh token grant (section 6,
  optionally rotating the refresh token), answers as in 5.1 / 5.2;
* ``GET /tokeninfo?access_token=`` (Google's tokeninfo shape: ``email``,
  ``expires_in``, ``scope``; 401 ``invalid_token`` for an unknown, expired or
  revoked token) and ``POST /introspect`` (RFC 7662: ``active``, ``email``,
  ``exp``), which Dovecot's oauth2 passdb calls for every AUTH.

Tokens can be revoked, and can expire on the server earlier than the
``expires_in`` the client was told (a token that "expires mid-batch").

:class:`OAuthLab` is :class:`lab.Lab` whose Dovecot also authenticates XOAUTH2
and OAUTHBEARER with ``passdb { driver = oauth2 }`` against that server
(tokeninfo, then introspection), and whose Postfix has three more
submission ports (STARTTLS + AUTH required, like ``submission``):

* ``oauth``: for the OAuth tests;
* ``oauth_idle``: the same with ``smtpd_timeout`` of IDLE_TIMEOUT_SECONDS, so
  a connection the worker leaves idle is closed and the worker signs in again;
* ``dkim``: the same with OpenDKIM as a milter in verify mode
  (``Mode v``), the public keys read from a file (``TestPublicKeys``, no DNS):
  it adds ``Authentication-Results: mx.lab.test; dkim=pass ...`` to every
  message it verified, which the tests read in the Maildir.  Started only
  when ``opendkim`` is installed (Debian package ``opendkim``).

Nothing leaves 127.0.0.1; every process is stopped in :meth:`OAuthLab.stop`.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import threading
import time
import urllib.parse
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from lab import IDLE_TIMEOUT_SECONDS, Lab, free_port

CLIENT_ID, CLIENT_SECRET = "mailq-lab-client", "lab-client-secret-9f3a7c"
SCOPE = "https://mail.lab.test/smtp"


@dataclass
class Issued:
    user: str
    expires_at: float  # when the server stops accepting it (time.time())
    revoked: bool = False


@dataclass
class Client:
    secret: str
    user: str  # the mailbox its client-credentials tokens are for


class TokenServer(ThreadingHTTPServer):
    """An OAuth 2.0 token endpoint and token validator on 127.0.0.1 (see the module docstring)."""

    daemon_threads = True

    def __init__(self, lifetime: float = 3600.0) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.lock = threading.Lock()
        self.tokens: dict[str, Issued] = {}
        self.clients: dict[str, Client] = {}
        self.refresh_tokens: dict[str, tuple[str, str]] = {}  # refresh token -> (client id, user)
        self.lifetime = lifetime  # expires_in told to the client, and the token's life on the server
        self.rotate_refresh = False
        self.issued: list[str] = []  # every access token issued, in order
        self.validations: list[tuple[str, bool]] = []  # (endpoint, valid) per check by Dovecot
        self.refuse_all = False  # every validation says invalid (a server that keeps refusing)
        self.thread = threading.Thread(target=self.serve_forever, name="token-server", daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def add_client(self, client_id: str, secret: str, user: str) -> None:
        with self.lock:
            self.clients[client_id] = Client(secret, user)

    def add_refresh_token(self, client_id: str, user: str) -> str:
        token = "rt-" + secrets.token_urlsafe(24)
        with self.lock:
            self.refresh_tokens[token] = (client_id, user)
        return token

    def issue(self, user: str) -> dict[str, Any]:
        token = secrets.token_urlsafe(32)
        with self.lock:
            self.tokens[token] = Issued(user, time.time() + self.lifetime)
            self.issued.append(token)
        return {"access_token": token, "token_type": "Bearer", "expires_in": int(self.lifetime), "scope": SCOPE}

    def revoke(self, token: str) -> None:
        with self.lock:
            self.tokens[token].revoked = True

    def expire(self, token: str) -> None:
        """End the token's life on the server now, whatever expires_in said (clock skew, a policy)."""
        with self.lock:
            self.tokens[token].expires_at = time.time()

    def check(self, token: str, endpoint: str) -> Issued | None:
        with self.lock:
            issued = self.tokens.get(token)
            valid = (issued is not None and not issued.revoked and issued.expires_at > time.time()
                     and not self.refuse_all)
            self.validations.append((endpoint, valid))
            return issued if valid else None

    def stop(self) -> None:
        self.shutdown()
        self.server_close()
        self.thread.join(5)


class _Handler(BaseHTTPRequestHandler):
    server: TokenServer

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - BaseHTTPRequestHandler's name
        pass  # quiet: the tests read the server's counters

    def _reply(self, status: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        self.wfile.write(data)

    def _form(self) -> dict[str, str]:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length).decode()
        return {k: v[0] for k, v in urllib.parse.parse_qs(raw).items()}

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        url = urllib.parse.urlsplit(self.path)
        if url.path != "/tokeninfo":
            return self._reply(404, {"error": "not_found"})
        token = urllib.parse.parse_qs(url.query).get("access_token", [""])[0]
        issued = self.server.check(token, "tokeninfo")
        if issued is None:
            return self._reply(401, {"error": "invalid_token", "error_description": "Invalid Value"})
        self._reply(200, {"email": issued.user, "expires_in": int(issued.expires_at - time.time()), "scope": SCOPE})

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        form = self._form()
        if self.path == "/introspect":
            issued = self.server.check(form.get("token", ""), "introspect")
            if issued is None:
                return self._reply(200, {"active": False})
            return self._reply(200, {"active": True, "email": issued.user, "exp": int(issued.expires_at),
                                     "scope": SCOPE, "token_type": "Bearer"})
        if self.path != "/token":
            return self._reply(404, {"error": "not_found"})
        server = self.server
        client = server.clients.get(form.get("client_id", ""))
        if client is None or client.secret != form.get("client_secret"):
            return self._reply(401, {"error": "invalid_client", "error_description": "Client authentication failed."})
        grant = form.get("grant_type")
        if grant == "client_credentials":
            return self._reply(200, server.issue(client.user))
        if grant == "refresh_token":
            with server.lock:
                found = server.refresh_tokens.get(form.get("refresh_token", ""))
            if found is None or found[0] != form["client_id"]:
                return self._reply(400, {"error": "invalid_grant",
                                         "error_description": "Token has been expired or revoked."})
            body = server.issue(found[1])
            if server.rotate_refresh:
                with server.lock:
                    del server.refresh_tokens[form["refresh_token"]]
                body["refresh_token"] = server.add_refresh_token(found[0], found[1])
            return self._reply(200, body)
        self._reply(400, {"error": "unsupported_grant_type"})


def opendkim_missing() -> str | None:
    """Why OpenDKIM cannot verify here, or None."""
    if shutil.which("opendkim") is None and not os.path.exists("/usr/sbin/opendkim"):
        return "opendkim is not installed (apt-get install opendkim)"
    return None


def opendkim_binary() -> str:
    return shutil.which("opendkim") or "/usr/sbin/opendkim"


@dataclass
class OAuthLab(Lab):
    tokens: TokenServer = field(default_factory=TokenServer)
    milter_port: int = 0
    PORTS = (*Lab.PORTS, "oauth", "oauth_idle", "dkim")

    @property
    def dkim_keys(self) -> Path:
        """TestPublicKeys of the OpenDKIM milter: ``selector._domainkey.domain <TXT record>`` per line."""
        return self.root / "opendkim" / "keys.txt"

    def start(self) -> "OAuthLab":
        self.tokens.add_client(CLIENT_ID, CLIENT_SECRET, "mailer@lab.test")
        if opendkim_missing() is None:
            self.milter_port = free_port()
            self._opendkim()
        super().start()
        return self

    def _dovecot_auth(self, d: Path) -> str:
        (d / "oauth2.conf.ext").write_text(f"""\
# Dovecot oauth2 passdb of the mailq-db lab (tests/realmta/oauth_lab.py)
tokeninfo_url = {self.tokens.url}/tokeninfo?access_token=
introspection_url = {self.tokens.url}/introspect
introspection_mode = post
force_introspection = yes
username_attribute = email
active_attribute = active
active_value = true
timeout_msecs = 10000
""")
        return f"""auth_mechanisms = plain login xoauth2 oauthbearer
passdb {{
  driver = oauth2
  mechanisms = xoauth2 oauthbearer
  args = {d}/oauth2.conf.ext
}}
passdb {{
  driver = passwd-file
  mechanisms = plain login
  args = scheme=PLAIN username_format=%u {d}/passwd
}}
"""

    def _extra_services(self) -> str:
        p = self.ports
        submission = """  -o syslog_name=postfix/{name}
  -o smtpd_tls_security_level=encrypt
  -o smtpd_tls_auth_only=yes
  -o smtpd_sasl_auth_enable=yes
  -o smtpd_client_restrictions=
  -o smtpd_recipient_restrictions=permit_sasl_authenticated,reject
  -o smtpd_relay_restrictions=permit_sasl_authenticated,reject
"""
        text = f"127.0.0.1:{p['oauth']} inet n - n - - smtpd\n" + submission.format(name="oauth")
        text += f"127.0.0.1:{p['oauth_idle']} inet n - n - - smtpd\n" + submission.format(name="oauth_idle")
        text += f"  -o smtpd_timeout={IDLE_TIMEOUT_SECONDS}s\n"
        text += f"127.0.0.1:{p['dkim']} inet n - n - - smtpd\n" + submission.format(name="dkim")
        if "milter" in self.started:
            text += (f"  -o smtpd_milters=inet:127.0.0.1:{self.milter_port}\n"
                     "  -o milter_default_action=tempfail\n")
        return text

    def _opendkim(self) -> None:
        d = self.root / "opendkim"
        d.mkdir(parents=True)
        self.dkim_keys.write_text("")
        (d / "opendkim.conf").write_text(f"""\
# OpenDKIM as the lab's verifier (tests/realmta/oauth_lab.py): verify only, keys from a file.
Mode v
Socket inet:{self.milter_port}@127.0.0.1
PidFile {d}/opendkim.pid
AuthservID mx.lab.test
TestPublicKeys {self.dkim_keys}
Syslog no
Background yes
AlwaysAddARHeader yes
UMask 002
""")
        self._run(opendkim_binary(), "-x", str(d / "opendkim.conf"))
        self.started.append("milter")
        deadline = time.monotonic() + 20
        while not (d / "opendkim.pid").exists():
            if time.monotonic() > deadline:
                raise RuntimeError("OpenDKIM did not start")
            time.sleep(0.05)

    def add_dkim_key(self, selector: str, domain: str, public_txt: str) -> None:
        """Publish a public key to the milter (it reads TestPublicKeys for every message)."""
        with open(self.dkim_keys, "a") as fh:
            fh.write(f"{selector}._domainkey.{domain} {public_txt}\n")

    def stop(self) -> None:
        errors = []
        milter = "milter" in self.started
        try:
            super().stop()
        except RuntimeError as exc:
            errors.append(str(exc))
        if milter:
            pid_file = self.root / "opendkim" / "opendkim.pid"
            try:
                pid = int(pid_file.read_text().split()[0])
                os.kill(pid, 15)
                deadline = time.monotonic() + 10
                while time.monotonic() < deadline:
                    os.kill(pid, 0)
                    time.sleep(0.05)
            except (OSError, ValueError):
                pass
        self.tokens.stop()
        if errors:
            raise RuntimeError("; ".join(errors))

    def auth_log(self, service: str) -> list[str]:
        """Postfix's disconnect lines of a service (``... auth=1 ...``): one per connection."""
        return [line for line in self.log().splitlines() if f"postfix/{service}/smtpd" in line
                and " disconnect from " in line]

