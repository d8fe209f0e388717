"""OAuth 2.0 sign-in and DKIM through the lab's real Postfix + Dovecot (issue 26).

Postfix's submission ports hand XOAUTH2 / OAUTHBEARER to Dovecot, whose
oauth2 passdb asks the test suite's token server (tests/realmta/oauth_lab.py)
about every token: the worker's tokens are checked by a real SASL server, not
by the test.  What the server saw is read back from Postfix's log (one
``disconnect`` line per connection, with ``auth=1`` or ``auth=0/1``), from
the token server's counters, and from the Maildir.

DKIM: messages signed by the worker go through the ``dkim`` port, where
OpenDKIM runs as a milter in verify mode with the public key from a file;
its ``Authentication-Results`` header in the delivered message is the
verdict, checked again with ``opendkim -t`` on the delivered file.
"""

from __future__ import annotations

import base64
import logging
import re
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest
from lab import IDLE_TIMEOUT_SECONDS, USER, in_ci, running_lab
from oauth_lab import CLIENT_ID, CLIENT_SECRET, Issued, OAuthLab, opendkim_binary, opendkim_missing
from realmta_helpers import FakeQueue, mails, worker

from mailq_db.worker import oauth
from mailq_db.worker.config import AccountConfig, parse_config
from mailq_db.worker.probe import probe_account

HERE = Path(__file__).resolve().parent
COMMAND = str(HERE / "lab_token_command.py")


@pytest.fixture(scope="module")
def olab():
    yield from running_lab(OAuthLab, "mailq-oauthlab-")


@pytest.fixture(autouse=True)
def fresh_tokens(monkeypatch):
    """Each test starts with an empty token cache; the token command's secret comes from the environment."""
    oauth.TOKENS.clear()
    monkeypatch.setenv("LAB_CLIENT_SECRET", CLIENT_SECRET)
    yield
    oauth.TOKENS.clear()


@pytest.fixture
def server(olab):
    """The token server, reset after the test."""
    tokens = olab.tokens
    yield tokens
    tokens.lifetime, tokens.refuse_all, tokens.rotate_refresh = 3600.0, False, False


def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, list):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    raise TypeError(value)


def account(olab: OAuthLab, oauth_table: dict[str, Any] | None = None, *, port: str = "oauth",
            auth: str = "xoauth2", env: dict[str, str] | None = None, dkim: dict[str, Any] | None = None,
            **extra: Any) -> AccountConfig:
    """An account parsed from TOML the way the worker reads its configuration."""
    values = dict(host="127.0.0.1", port=olab.ports[port], tls="starttls", ca_file=olab.ca_file, user=USER,
                  auth=auth, local_hostname="worker.lab.test", command_timeout_seconds=20.0, **extra)
    lines = ["[accounts.default]", *(f"{k} = {_toml(v)}" for k, v in values.items())]
    if oauth_table is not None:
        lines += ["[accounts.default.oauth]", *(f"{k} = {_toml(v)}" for k, v in oauth_table.items())]
    if dkim is not None:
        lines += ["[accounts.default.dkim]", *(f"{k} = {_toml(v)}" for k, v in dkim.items())]
    return parse_config("\n".join(lines) + "\n", env=env or {}).accounts["default"]


def command_provider(olab: OAuthLab, *args: str) -> dict[str, Any]:
    return {"provider": "command", "command": [sys.executable, COMMAND, f"{olab.tokens.url}/token", CLIENT_ID, *args]}


def _settled_log(olab: OAuthLab, service: str) -> list[str]:
    """The disconnect lines of ``service`` once no new one came for 0.2 s (at most 5 s):
    smtpd logs a disconnect just after QUIT, so an earlier test's may still be on its way."""
    deadline = time.monotonic() + 5
    lines = olab.auth_log(service)
    while time.monotonic() < deadline:
        time.sleep(0.2)
        more = olab.auth_log(service)
        if more == lines:
            break
        lines = more
    return lines


def log_mark(olab: OAuthLab, service: str) -> int:
    """How many disconnect lines ``service`` has logged so far (settled), for :func:`disconnects`."""
    return len(_settled_log(olab, service))


def disconnects(olab: OAuthLab, service: str, since: int) -> list[str]:
    """Postfix's ``auth=...`` per connection of ``service`` after the first ``since`` lines."""
    lines = _settled_log(olab, service)[since:]
    return [m.group(0) if (m := re.search(r"auth=\S+", line)) else "no auth" for line in lines]


class PausingQueue(FakeQueue):
    """FakeQueue whose first acknowledgement takes ``pause`` seconds (a slow database),
    after running ``during`` - long enough for the server to close the idle connection."""

    def __init__(self, mails_: list, pause: float, during: Any = None):
        super().__init__(mails_)
        self.pause, self.during, self.paused = pause, during, False

    def mark_sent(self, conn: Any, **kw: Any) -> Any:
        result = super().mark_sent(conn, **kw)
        if not self.paused:
            self.paused = True
            if self.during:
                self.during()
            time.sleep(self.pause)
        return result


def all_text(records: list[logging.LogRecord]) -> str:
    return "\n".join(f"{r.getMessage()} {getattr(r, 'mailq_fields', '')} {r.exc_text or ''}" for r in records)


# --------------------------------------------------------------------------- sign-in


@pytest.mark.parametrize("auth", ["xoauth2", "oauthbearer"])
def test_both_mechanisms_sign_in_through_postfix_and_dovecot_with_the_command_provider(olab, server, auth, caplog):
    before_log, before_issued = log_mark(olab, "oauth"), len(server.issued)
    queue = FakeQueue(mails(f"mech-{auth}", 3))
    with caplog.at_level(logging.DEBUG):
        worker(queue, {"default": account(olab, command_provider(olab), auth=auth)}).run(once=True)
    assert set(queue.statuses().values()) == {"Sent"}
    assert len(olab.wait_delivered(f"mech-{auth}-", 3)) == 3
    # one connection, one AUTH, accepted by Dovecot after asking the token server
    assert disconnects(olab, "oauth", before_log) == ["auth=1"]
    assert len(server.issued) == before_issued + 1
    assert server.validations[-2:] == [("tokeninfo", True), ("introspect", True)]
    # a second batch reuses the cached token on its new connection
    queue2 = FakeQueue(mails(f"mech2-{auth}", 2))
    worker(queue2, {"default": account(olab, command_provider(olab), auth=auth)}).run(once=True)
    assert set(queue2.statuses().values()) == {"Sent"}
    assert len(server.issued) == before_issued + 1
    assert disconnects(olab, "oauth", before_log) == ["auth=1", "auth=1"]
    assert server.issued[-1] not in all_text(caplog.records)


def test_refresh_token_provider_redeems_and_rotates_through_the_token_endpoint(olab, server, tmp_path):
    server.rotate_refresh = True
    refresh = server.add_refresh_token(CLIENT_ID, USER)
    token_file = tmp_path / "refresh-token"
    token_file.write_text(refresh + "\n")
    token_file.chmod(0o600)
    table = {"provider": "refresh_token", "issuer": "generic", "token_uri": f"{server.url}/token",
             "client_id": CLIENT_ID, "client_secret_env": "LAB_SECRET", "refresh_token_file": str(token_file),
             "scope": "https://mail.lab.test/smtp"}
    queue = FakeQueue(mails("refresh", 2))
    worker(queue, {"default": account(olab, table, env={"LAB_SECRET": CLIENT_SECRET})}).run(once=True)
    assert set(queue.statuses().values()) == {"Sent"}
    rotated = token_file.read_text().strip()
    assert rotated != refresh and rotated in server.refresh_tokens and refresh not in server.refresh_tokens
    assert oct(token_file.stat().st_mode & 0o777) == "0o600"


def test_a_token_that_expires_mid_batch_is_refreshed_before_the_next_login(olab, server):
    """The token lives 3 s; the worker's idle connection is closed by the server
    (smtpd_timeout) while the database is slow; the reconnection finds the token
    expired in the cache and fetches a new one before AUTH: no refused AUTH."""
    server.lifetime = 3.0
    before_log, before_issued = log_mark(olab, "oauth_idle"), len(server.issued)
    queue = PausingQueue(mails("expiry", 3), pause=IDLE_TIMEOUT_SECONDS + 2.0)
    w = worker(queue, {"default": account(olab, command_provider(olab), port="oauth_idle")},
               ack_interval_seconds=0.0)
    w.run(once=True)
    assert set(queue.statuses().values()) == {"Sent"}
    assert len(olab.wait_delivered("expiry-", 3)) == 3
    assert len(server.issued) == before_issued + 2
    assert disconnects(olab, "oauth_idle", before_log) == ["auth=1", "auth=1"]
    assert all(valid for _, valid in server.validations[-4:])


@pytest.mark.parametrize("how", ["revoked", "expired early on the server"])
def test_a_token_refused_mid_batch_is_replaced_once_and_the_batch_goes_on(olab, server, how, caplog):
    """The cached token is still valid for the worker, but the server refuses it:
    one refused AUTH, a new token, one more connection with one AUTH, every mail sent."""
    def during() -> None:
        (server.revoke if how == "revoked" else server.expire)(server.issued[-1])

    before_log, before_issued = log_mark(olab, "oauth_idle"), len(server.issued)
    queue = PausingQueue(mails(f"refused-{how[:3]}", 3), pause=IDLE_TIMEOUT_SECONDS + 2.0, during=during)
    w = worker(queue, {"default": account(olab, command_provider(olab), port="oauth_idle")},
               ack_interval_seconds=0.0)
    with caplog.at_level(logging.DEBUG):
        w.run(once=True)
    assert set(queue.statuses().values()) == {"Sent"}
    assert len(olab.wait_delivered(f"refused-{how[:3]}-", 3)) == 3
    assert len(server.issued) == before_issued + 2
    assert disconnects(olab, "oauth_idle", before_log) == ["auth=1", "auth=0/1", "auth=1"]
    [warning] = [r for r in caplog.records if "refused the token" in r.getMessage()]
    assert warning.levelno == logging.WARNING
    assert "server's OAuth error: status=401, schemes=bearer, scope=mail" in warning.mailq_fields["reply"]
    text = all_text(caplog.records)
    assert not [t for t in server.issued if t in text] and CLIENT_SECRET not in text


def test_a_token_refused_twice_pauses_the_account_with_one_line_naming_what_to_check(olab, server, caplog):
    server.refuse_all = True
    before_log, before_issued = log_mark(olab, "oauth"), len(server.issued)
    queue = FakeQueue(mails("refused-twice", 2))
    with caplog.at_level(logging.DEBUG):
        worker(queue, {"default": account(olab, command_provider(olab))}).run(once=True)
    rows = list(queue.rows.values())
    assert [r.dispositions for r in rows] == [["Wait"], ["Wait"]]  # attempts refunded, the account blocked
    assert all(r.status == "UnSent" and r.attempts_remaining == 5 for r in rows)
    # exactly one AUTH per connection: the cached token, then one fresh token
    assert disconnects(olab, "oauth", before_log) == ["auth=0/1", "auth=0/1"]
    assert len(server.issued) == before_issued + 2
    [error] = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert error.getMessage() == "authentication failed for account default"
    fix = error.mailq_fields["fix"]
    assert "freshly fetched token for the mailbox mailer@lab.test as well" in fix
    assert "the command's token is for mailer@lab.test" in fix
    assert error.mailq_fields["reply"].startswith("5.7.8 Error: authentication failed")
    text = all_text(caplog.records)
    assert not [t for t in server.issued if t in text] and CLIENT_SECRET not in text


def test_a_long_token_the_size_of_an_entra_token_passes_postfix(olab, server, tmp_path):
    """Entra ID access tokens are JWTs of 1.5-2.5 KB: with the initial response
    on the AUTH line, Postfix cut the line at line_length_limit (2048) and
    Dovecot said "Invalid base64 data in initial response"; the worker now
    sends a long response after the server's empty 334."""
    long_token = secrets.token_urlsafe(1900)[:2500]
    with server.lock:
        server.tokens[long_token] = Issued(USER, time.time() + 600)
    script = tmp_path / "print-token"
    script.write_text(f"#!/bin/sh\necho {long_token}\n")
    script.chmod(0o755)
    before_log = log_mark(olab, "oauth")
    queue = FakeQueue(mails("long-token", 1))
    worker(queue, {"default": account(olab, {"provider": "command", "command": [str(script)]})}).run(once=True)
    assert queue.status(1) == "Sent", queue.rows[1].last_error
    assert disconnects(olab, "oauth", before_log) == ["auth=1"]


# --------------------------------------------------------------------------- probe


def test_probe_shows_token_acquisition_as_its_own_step_then_one_auth(olab, server):
    steps = probe_account(account(olab, command_provider(olab)))
    names = [s.name for s in steps]
    assert names[-3:] == ["token", "AUTH", "QUIT"], [s.line() for s in steps]
    assert all(s.ok for s in steps), [s.line() for s in steps]
    assert "command" in steps[-3].detail and "valid for" in steps[-3].detail
    assert steps[-2].detail == "logged in as mailer@lab.test (one attempt) with XOAUTH2"


def test_probe_of_a_refused_token_request_names_the_fix_and_does_not_log_in(olab, server):
    before_log = log_mark(olab, "oauth")
    table = {"provider": "refresh_token", "issuer": "generic", "token_uri": f"{server.url}/token",
             "client_id": CLIENT_ID, "client_secret_env": "LAB_SECRET", "refresh_token_env": "LAB_REFRESH"}
    acct = account(olab, table, env={"LAB_SECRET": "a-wrong-secret", "LAB_REFRESH": "rt-unknown"})
    steps = probe_account(acct)
    token = next(s for s in steps if s.name == "token")
    assert not token.ok and "invalid_client" in token.detail
    assert "check client_id and the client secret" in token.fix
    assert "AUTH" not in [s.name for s in steps]
    assert disconnects(olab, "oauth", before_log) == ["no auth"]  # connected, no AUTH sent
    assert "a-wrong-secret" not in "\n".join(s.line() for s in steps)


def test_probe_of_a_token_the_server_refuses_shows_the_decoded_error(olab, server):
    server.refuse_all = True
    steps = probe_account(account(olab, command_provider(olab), auth="oauthbearer"))
    auth = next(s for s in steps if s.name == "AUTH")
    assert not auth.ok
    assert auth.detail.startswith("535 5.7.8") and "server's OAuth error: status=invalid_token" in auth.detail
    assert auth.fix.startswith("the server refused the token for the mailbox mailer@lab.test: check")


# --------------------------------------------------------------------------- DKIM


@pytest.fixture(scope="module")
def dkim_key(olab):
    reason = opendkim_missing()
    if reason:
        if in_ci():
            pytest.fail(f"OpenDKIM cannot verify: {reason} (.ci/run installs it)", pytrace=False)
        pytest.skip(f"OpenDKIM cannot verify: {reason}")
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    directory = Path(tempfile.mkdtemp(prefix="mailq-dkim-"))
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    path = directory / "dkim.key"
    path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                       serialization.NoEncryption()))
    public = key.public_key().public_bytes(serialization.Encoding.DER,
                                           serialization.PublicFormat.SubjectPublicKeyInfo)
    txt = "v=DKIM1; k=rsa; p=" + base64.b64encode(public).decode()
    olab.add_dkim_key("lab2026", "lab.test", txt)
    (directory / "keys.txt").write_text(f"lab2026._domainkey.lab.test {txt}\n")
    yield path, txt, directory
    shutil.rmtree(directory, ignore_errors=True)


def opendkim_verdict(raw: bytes, keys: Path) -> str:
    """``opendkim -t`` on a delivered message (OpenDKIM's own test mode, keys from a file)."""
    directory = keys.parent
    (directory / "verify.conf").write_text(f"Mode v\nSyslog no\nTestPublicKeys {keys}\n")
    message = directory / "message.eml"
    message.write_bytes(raw)
    out = subprocess.run([opendkim_binary(), "-x", str(directory / "verify.conf"), "-t", str(message)],
                         capture_output=True, text=True, timeout=30)
    return out.stdout + out.stderr


LIST_HEADERS = {"List-Unsubscribe": "<https://unsubscribe.lab.test/u/0123456789abcdef>, "
                                    "<mailto:unsubscribe+0123456789abcdef@lab.test?subject=unsubscribe>",
                "List-Unsubscribe-Post": "List-Unsubscribe=One-Click"}


def test_dkim_signed_mail_passes_the_opendkim_milter_behind_postfix(olab, dkim_key):
    path, _, directory = dkim_key
    acct = account(olab, port="dkim", auth="password", password_env="LAB_PASSWORD",
                   env={"LAB_PASSWORD": "lab-password-1"},
                   dkim={"domain": "lab.test", "selector": "lab2026", "private_key_file": str(path)})
    queue = FakeQueue(mails("dkim-ok", 2, subject="Grüße — DKIM through Postfix", from_name="Lab 张三",
                            headers=LIST_HEADERS))
    worker(queue, {"default": acct}).run(once=True)
    assert set(queue.statuses().values()) == {"Sent"}
    got = olab.wait_delivered("dkim-ok-", 2)
    assert len(got) == 2
    for d in got:
        results = str(d.message["Authentication-Results"])
        assert re.search(r"^mx\.lab\.test;\s+dkim=pass \(2048-bit key\) header\.d=lab\.test", results), results
        signature = str(d.message["DKIM-Signature"])
        assert "c=relaxed/relaxed" in signature and "s=lab2026" in signature
        signed = re.search(r"h=([^;]+)", signature.replace("\n", "").replace(" ", "")).group(1).lower().split(":")
        assert {"from", "to", "subject", "date", "message-id", "mime-version", "content-type",
                "list-unsubscribe", "list-unsubscribe-post"} <= set(signed)
        assert "cc" not in signed  # absent headers are not signed
        # the delivered file verifies again with OpenDKIM's test mode
        assert "verification (s=lab2026, d=lab.test, 2048-bit key) succeeded" in opendkim_verdict(
            d.raw, directory / "keys.txt")


def test_a_signature_with_the_wrong_key_fails_at_the_milter(olab, dkim_key, tmp_path):
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    other = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    path = tmp_path / "other.key"
    path.write_bytes(other.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.TraditionalOpenSSL,
                                         serialization.NoEncryption()))
    acct = account(olab, port="dkim", auth="password", password_env="LAB_PASSWORD",
                   env={"LAB_PASSWORD": "lab-password-1"},
                   dkim={"domain": "lab.test", "selector": "lab2026", "private_key_file": str(path)})
    queue = FakeQueue(mails("dkim-bad", 1))
    worker(queue, {"default": acct}).run(once=True)
    assert queue.status(1) == "Sent"
    [d] = olab.wait_delivered("dkim-bad-", 1)
    assert re.search(r"dkim=fail", str(d.message["Authentication-Results"]))
