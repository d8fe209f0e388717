"""Token providers, the token cache and the ``[accounts.NAME.oauth]`` settings (issue 26).

The identity platforms cannot be reached from here: MSAL and google-auth run
for real with their HTTP layer replaced by a fake that answers with the
response shapes the platforms document (Microsoft identity platform: the
client credentials flow and its error response with ``error_codes``; Google:
the token endpoint of the JWT bearer grant and of the refresh grant).  What
goes over the wire is asserted from the fake's record.  The command provider
runs real programs.  The SASL exchange and the real SMTP server are in
test_worker_sasl.py and tests/realmta/test_oauth_postfix.py.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import sys
import threading
import time
import urllib.parse
from pathlib import Path
from typing import Any

import pytest

from mailq_db.errors import ConfigurationError
from mailq_db.worker import oauth
from mailq_db.worker.config import parse_config
from mailq_db.worker.oauth import errors as oauth_errors
from mailq_db.worker.oauth.cache import Token, TokenCache
from mailq_db.worker.oauth.settings import OAuthSettings, Secret

SECRET = "Xq8~client-secret-VALUE-not-the-ID"
AUTHORITY = "https://login.microsoftonline.com"


# --------------------------------------------------------------------------- cache


class Counting:
    """A provider whose tokens live ``lifetime`` seconds of the fake clock."""

    def __init__(self, clock: list[float], lifetime: float = 3600.0, delay: float = 0.0):
        self.clock, self.lifetime, self.delay = clock, lifetime, delay
        self.calls = 0
        self.lock = threading.Lock()

    def fetch(self) -> Token:
        with self.lock:
            self.calls += 1
            n = self.calls
        time.sleep(self.delay)
        return Token(f"token-{n}", self.clock[0] + self.lifetime, self.clock[0])


def test_the_cache_keeps_a_token_until_the_margin_and_then_fetches_a_new_one():
    now = [1000.0]
    cache = TokenCache(clock=lambda: now[0])
    provider = Counting(now)
    assert cache.get("a", provider, margin=300).access_token == "token-1"
    now[0] += 3600 - 301
    assert cache.get("a", provider, margin=300).access_token == "token-1"
    now[0] += 2  # 299 s left: inside the margin
    assert cache.get("a", provider, margin=300).access_token == "token-2"
    assert provider.calls == 2 and cache.fetches == {"a": 2}


def test_a_token_shorter_than_twice_the_margin_is_used_for_half_its_life():
    now = [0.0]
    cache, provider = TokenCache(clock=lambda: now[0]), Counting(now, lifetime=60)
    cache.get("a", provider, margin=300)
    now[0] = 29
    assert cache.get("a", provider, margin=300).access_token == "token-1"
    now[0] = 31
    assert cache.get("a", provider, margin=300).access_token == "token-2"


def test_invalidate_drops_only_the_token_that_is_still_cached():
    now = [0.0]
    cache, provider = TokenCache(clock=lambda: now[0]), Counting(now)
    old = cache.get("a", provider, margin=300)
    assert cache.invalidate("a", old)
    new = cache.get("a", provider, margin=300)
    # a thread that comes late with the old, refused token must not drop the new one
    assert not cache.invalidate("a", old)
    assert cache.get("a", provider, margin=300) is new


def test_one_refresh_at_a_time_per_account_and_accounts_do_not_wait_for_each_other():
    now = [0.0]
    cache = TokenCache(clock=lambda: now[0])
    slow, fast = Counting(now, delay=0.5), Counting(now)
    got: list[str] = []
    threads = [threading.Thread(target=lambda: got.append(cache.get("slow", slow, 300).access_token))
               for _ in range(8)]
    for t in threads:
        t.start()
    time.sleep(0.05)  # the first thread is inside the slow fetch, holding the account's lock
    started = time.monotonic()
    assert cache.get("fast", fast, 300).access_token == "token-1"
    other_account_waited = time.monotonic() - started
    for t in threads:
        t.join()
    assert slow.calls == 1 and got == ["token-1"] * 8
    assert other_account_waited < 0.4  # not blocked behind the slow account's fetch


class CountingLock:
    """The account lock, counting the callers that reached it (before they wait for it)."""

    def __init__(self) -> None:
        self.lock, self.arrived = threading.Lock(), 0

    def __enter__(self) -> None:
        self.arrived += 1
        self.lock.acquire()

    def __exit__(self, *exc: Any) -> None:
        self.lock.release()


class Unreachable:
    """A provider whose identity platform cannot be reached (after ``gate`` opens, if given)."""

    def __init__(self, gate: Any = None, error: Exception | None = None) -> None:
        self.calls, self.gate = 0, gate
        self.error = error or oauth.TokenUnavailable("the Microsoft identity platform could not be reached: "
                                                     "ConnectTimeout")

    def fetch(self) -> Token:
        self.calls += 1
        if self.gate is not None:
            self.gate()
        raise self.error


def test_a_failed_fetch_is_not_repeated_by_the_threads_that_waited_for_it():
    lock = CountingLock()

    class Cache(TokenCache):
        def _lock(self, key: str) -> Any:
            return lock

    cache, waiting = Cache(), 6

    def until_all_arrived() -> None:  # the fetch ends only when every caller waits behind it
        while lock.arrived < waiting:
            time.sleep(0.01)

    provider = Unreachable(until_all_arrived)
    errors: list[BaseException] = []

    def call() -> None:
        try:
            cache.get("a", provider, 300)
        except oauth.TokenUnavailable as exc:
            errors.append(exc)

    threads = [threading.Thread(target=call) for _ in range(waiting)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert provider.calls == 1 and len(errors) == waiting
    assert len({id(e) for e in errors}) == waiting and {str(e) for e in errors} == {str(provider.error)}
    with pytest.raises(oauth.TokenUnavailable):  # a caller that comes afterwards asks again
        cache.get("a", provider, 300)
    assert provider.calls == 2


def test_an_unreachable_platform_does_not_throw_away_a_token_that_still_lasts(caplog):
    now = [0.0]
    cache = TokenCache(clock=lambda: now[0])
    good = Counting(now)
    first = cache.get("a", good, 300)
    now[0] = 3600 - 200  # inside the margin: time to refresh
    down = Unreachable()
    with caplog.at_level(logging.WARNING, logger="mailq_db"):
        assert cache.get("a", down, 300) is first
    [line] = caplog.records
    assert "could not be refreshed; the current one is used while it lasts (200 s)" in line.getMessage()
    assert first.access_token not in caplog.text
    now[0] += 10
    assert cache.get("a", down, 300) is first and down.calls == 1  # not asked again right away
    now[0] += 30
    assert cache.get("a", good, 300).access_token == "token-2"  # asked again, and it answers


def test_a_refusal_or_a_token_about_to_expire_is_not_hidden_by_the_cached_token():
    now = [0.0]
    cache = TokenCache(clock=lambda: now[0])
    cache.get("a", Counting(now), 300)
    now[0] = 3600 - 200
    refused = Unreachable(error=oauth.TokenError("invalid_grant", "sign the mailbox in again"))
    with pytest.raises(oauth.TokenError):
        cache.get("a", refused, 300)
    now[0] = 3600 - 20  # 20 s left: too little to sign in with
    with pytest.raises(oauth.TokenUnavailable):
        cache.get("a", Unreachable(), 300)


def test_a_token_that_is_not_a_bearer_token_is_refused_and_not_cached():
    class Odd:
        calls = 0

        def fetch(self) -> Token:
            Odd.calls += 1
            return Token("abc\x01user=someone-else@example.com", 3600.0, 0.0)

    cache = TokenCache(clock=lambda: 0.0)
    for _ in range(2):
        with pytest.raises(oauth.TokenError, match="characters a bearer token cannot have") as info:
            cache.get("a", Odd(), 300)
        assert "someone-else" not in str(info.value)
    assert Odd.calls == 2 and cache.fetches == {}


def test_a_token_never_shows_in_its_repr():
    token = Token("eyJ0eXAiOiJKV1QiLCJ-secret-part-abcd", 10.0, 0.0)
    assert "secret-part" not in repr(token) and token.hint == "…abcd"
    assert "s3cr3t" not in repr(Secret(env="X", value="s3cr3t"))


# --------------------------------------------------------------------------- MSAL (Microsoft identity platform)


class Response:
    """What MSAL reads from its http_client: status_code, text, headers, raise_for_status()."""

    def __init__(self, status: int, body: dict[str, Any]):
        self.status_code, self.text, self.headers = status, json.dumps(body), {}

    def raise_for_status(self) -> None:
        if self.status_code >= 400:
            raise RuntimeError(f"HTTP {self.status_code}")


def discovery(tenant: str) -> dict[str, Any]:
    """The shape of https://login.microsoftonline.com/{tenant}/v2.0/.well-known/openid-configuration."""
    base = f"{AUTHORITY}/{tenant}"
    return {"token_endpoint": f"{base}/oauth2/v2.0/token", "authorization_endpoint": f"{base}/oauth2/v2.0/authorize",
            "device_authorization_endpoint": f"{base}/oauth2/v2.0/devicecode",
            "issuer": f"https://login.microsoftonline.com/{tenant}/v2.0", "token_endpoint_auth_methods_supported":
            ["client_secret_post", "private_key_jwt", "client_secret_basic"]}


def entra_error(code: int, error: str, text: str) -> dict[str, Any]:
    """The documented error shape (reference-error-codes: error, error_description, error_codes, ...)."""
    return {"error": error, "error_description": f"AADSTS{code}: {text}\r\nTrace ID: 0000aaaa-11bb-cccc-dd22-"
            "eeeeee333333\r\nCorrelation ID: aaaa0000-bb11-2222-33cc-444444dddddd\r\nTimestamp: 2026-11-26 "
            "02:02:12Z", "error_codes": [code], "timestamp": "2026-11-26 02:02:12Z",
            "trace_id": "0000aaaa-11bb-cccc-dd22-eeeeee333333",
            "correlation_id": "aaaa0000-bb11-2222-33cc-444444dddddd",
            "error_uri": f"https://login.microsoftonline.com/error?code={code}"}


class FakeEntra:
    """MSAL's http_client: answers discovery and the token endpoint from a script."""

    def __init__(self, *token_answers: tuple[int, dict[str, Any]]):
        self.answers = list(token_answers)
        self.posts: list[dict[str, Any]] = []
        self.gets: list[str] = []

    def get(self, url: str, params: Any = None, headers: Any = None, **kw: Any) -> Response:
        self.gets.append(url)
        if "/discovery/instance" in url:  # instance discovery (aliases of the authority host)
            return Response(200, {"tenant_discovery_endpoint": f"{AUTHORITY}/common/v2.0/.well-known/"
                                  "openid-configuration", "api-version": "1.1", "metadata": [
                                      {"preferred_network": "login.microsoftonline.com",
                                       "preferred_cache": "login.windows.net",
                                       "aliases": ["login.microsoftonline.com", "login.windows.net",
                                                   "login.microsoft.com", "sts.windows.net"]}]})
        tenant = urllib.parse.urlsplit(url).path.split("/")[1]
        return Response(200, discovery(tenant))

    def post(self, url: str, params: Any = None, data: Any = None, headers: Any = None, **kw: Any) -> Response:
        self.posts.append(dict(data or {}))
        status, body = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        return Response(status, body)

    def close(self) -> None:
        pass


def ok(token: str = "eyJ0eXAiOiJKV1QiLCJub25jZSI6Ik-access-token-1", expires_in: int = 3599) -> tuple[int, dict]:
    return 200, {"token_type": "Bearer", "expires_in": expires_in, "ext_expires_in": expires_in,
                 "access_token": token}


def microsoft(**overrides: Any) -> OAuthSettings:
    values: dict[str, Any] = dict(provider="microsoft", scopes=("https://outlook.office365.com/.default",),
                                  tenant="contoso.onmicrosoft.com", client_id="11111111-2222-3333-4444-555555555555",
                                  client_secret=Secret(env="M365_SECRET", value=SECRET))
    values.update(overrides)
    return OAuthSettings(**values)


def test_microsoft_client_credentials_ask_for_the_exchange_scope_with_the_secret():
    from mailq_db.worker.oauth.microsoft import ClientCredentials

    now = [100.0]
    http = FakeEntra(ok())
    token = ClientCredentials(microsoft(), http_client=http, clock=lambda: now[0]).fetch()
    assert token.access_token.startswith("eyJ0eXAi") and token.expires_at == 100.0 + 3599
    assert http.gets == [f"{AUTHORITY}/contoso.onmicrosoft.com/v2.0/.well-known/openid-configuration"]
    [post] = http.posts
    assert post["grant_type"] == "client_credentials" and post["client_secret"] == SECRET
    assert post["scope"] == "https://outlook.office365.com/.default"


def test_a_forced_refresh_asks_the_identity_platform_again_not_msals_cache():
    from mailq_db.worker.oauth.microsoft import ClientCredentials

    http = FakeEntra(ok("eyJ-first-token"), ok("eyJ-second-token"))
    provider = ClientCredentials(microsoft(), http_client=http)
    assert provider.fetch().access_token == "eyJ-first-token"
    assert provider.fetch().access_token == "eyJ-second-token"  # MSAL alone would answer from its cache
    assert len(http.posts) == 2


def test_a_rotated_secret_file_is_used_without_a_restart(tmp_path):
    from mailq_db.worker.oauth.microsoft import ClientCredentials

    secret = tmp_path / "secret"
    secret.write_text("old-secret-value\n")
    http = FakeEntra(ok("eyJ-one"), ok("eyJ-two"))
    provider = ClientCredentials(microsoft(client_secret=Secret(file=str(secret))), http_client=http)
    provider.fetch()
    secret.write_text("new-secret-value\n")
    provider.fetch()
    assert [p["client_secret"] for p in http.posts] == ["old-secret-value", "new-secret-value"]


@pytest.mark.parametrize("kind", ["client_secret_file", "certificate_file", "pfx"])
def test_a_secret_file_removed_after_loading_is_a_token_error_naming_it(tmp_path, kind):
    from mailq_db.worker.classify import classify_exception
    from mailq_db.worker.oauth.microsoft import ClientCredentials

    gone = str(tmp_path / ("app.pfx" if kind == "pfx" else "gone"))
    settings = microsoft(client_secret=Secret(file=gone)) if kind == "client_secret_file" else \
        microsoft(client_secret=None, certificate_file=gone)
    with pytest.raises(oauth.TokenError) as info:
        ClientCredentials(settings, http_client=FakeEntra(ok())).fetch()
    assert f"{gone} cannot be read (No such file or directory)" in str(info.value)
    assert "readable by the worker's user" in info.value.fix
    assert classify_exception(info.value, "auth").rule == "account setup failed"  # not "server unreachable"


@pytest.mark.parametrize("code,error,text,expect", [
    (7000215, "invalid_client", "Invalid client secret provided. Ensure the secret being sent in the request is the "
     "client secret value, not the client secret ID", "Value, not its ID"),
    (7000222, "invalid_client", "The provided client secret keys for app '1111' are expired.", "has expired"),
    (700016, "unauthorized_client", "Application with identifier '1111' was not found in the directory 'Contoso'.",
     "consented to the application"),
    (65001, "invalid_grant", "The user or administrator has not consented to use the application with ID '1111'.",
     "SMTP.SendAsApp"),
    (500011, "invalid_resource", "The resource principal named https://outlook.office365.com was not found in the "
     "tenant named Contoso.", "https://outlook.office365.com/.default"),
    (7000112, "unauthorized_client", "Application '1111' is disabled.", "Enterprise applications"),
    (700024, "invalid_client", "Client assertion is not within its valid time range. Current time: "
     "2026-11-26T10:00:00Z, assertion valid from 2026-11-26T10:20:00Z", "clock is wrong"),
])
def test_microsoft_refusals_name_the_missing_permission_or_consent(code, error, text, expect):
    from mailq_db.worker.oauth.microsoft import ClientCredentials

    http = FakeEntra((400 if code != 7000215 else 401, entra_error(code, error, text)))
    with pytest.raises(oauth.TokenError) as info:
        ClientCredentials(microsoft(), http_client=http).fetch()
    assert info.value.code == f"AADSTS{code}"
    assert expect in info.value.fix and f"AADSTS{code}" in str(info.value)
    assert "Trace ID" not in str(info.value) and SECRET not in str(info.value)


def test_an_unknown_aadsts_code_points_to_the_error_lookup_page():
    from mailq_db.worker.oauth.microsoft import ClientCredentials

    http = FakeEntra((400, entra_error(9999999, "invalid_request", "Something new.")))
    with pytest.raises(oauth.TokenError, match=r"error\?code=9999999"):
        ClientCredentials(microsoft(), http_client=http).fetch()


class EntraDown(FakeEntra):
    """Discovery answers 503 with an HTML page (an outage of the identity platform)."""

    def get(self, url: str, params: Any = None, headers: Any = None, **kw: Any) -> Response:
        self.gets.append(url)
        page = Response(503, {})
        page.text = "<html><body>Service Unavailable</body></html>"
        return page


def test_an_identity_platform_outage_is_transient_not_a_configuration_error():
    from mailq_db.worker.classify import classify_exception
    from mailq_db.worker.oauth.microsoft import ClientCredentials

    with pytest.raises(oauth.TokenUnavailable) as info:
        ClientCredentials(microsoft(), http_client=EntraDown(ok())).fetch()
    outcome = classify_exception(info.value, "auth")
    assert (outcome.disposition, outcome.rule, outcome.retry_after_seconds) == ("Wait", "server unreachable", 60)
    # the token endpoint's HTML error page (not JSON) is transient too
    page = Response(502, {})
    page.text = "<html>Bad Gateway</html>"
    http = FakeEntra(ok())
    http.post = lambda *a, **k: page  # type: ignore[method-assign]
    with pytest.raises(oauth.TokenUnavailable):
        ClientCredentials(microsoft(), http_client=http).fetch()


def test_a_certificate_signs_a_client_assertion_and_sends_no_secret(tmp_path):
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import rsa
    from cryptography.x509.oid import NameOID

    from mailq_db.worker.oauth.microsoft import ClientCredentials

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "mailq-db")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(1).not_valid_before(now).not_valid_after(now + datetime.timedelta(days=1))
            .sign(key, hashes.SHA256()))
    pem = tmp_path / "app.pem"
    pem.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                      serialization.NoEncryption()) + cert.public_bytes(serialization.Encoding.PEM))
    http = FakeEntra(ok())
    ClientCredentials(microsoft(client_secret=None, certificate_file=str(pem)), http_client=http).fetch()
    [post] = http.posts
    assert "client_secret" not in post
    assert post["client_assertion_type"] == "urn:ietf:params:oauth:client-assertion-type:jwt-bearer"
    assertion = post["client_assertion"]
    assertion = assertion.decode() if isinstance(assertion, bytes) else assertion
    header = json.loads(base64.urlsafe_b64decode(assertion.split(".")[0] + "=="))
    assert header["alg"] in ("RS256", "PS256") and ("x5t#S256" in header or "x5t" in header)


def test_a_delegated_refresh_token_is_redeemed_with_msal_and_its_rotation_written_back(tmp_path):
    from mailq_db.worker.oauth.microsoft import RefreshToken

    stored = tmp_path / "rt"
    stored.write_text("0.AAAA-refresh-token-one\n")
    stored.chmod(0o600)
    http = FakeEntra((200, {"token_type": "Bearer", "scope": "https://outlook.office.com/SMTP.Send",
                            "expires_in": 4000, "access_token": "eyJ-delegated", "refresh_token": "0.AAAA-two"}))
    settings = OAuthSettings("refresh_token", ("https://outlook.office.com/SMTP.Send",), issuer="microsoft",
                             tenant="organizations", client_id="cid", refresh_token=Secret(file=str(stored)))
    token = RefreshToken(settings, http_client=http).fetch()
    assert token.access_token == "eyJ-delegated"
    [post] = http.posts
    assert post["grant_type"] == "refresh_token" and post["refresh_token"] == "0.AAAA-refresh-token-one"
    assert "https://outlook.office.com/SMTP.Send" in post["scope"]
    assert stored.read_text() == "0.AAAA-two\n" and stored.stat().st_mode & 0o777 == 0o600


def delegated(source: Secret) -> OAuthSettings:
    return OAuthSettings("refresh_token", ("https://outlook.office.com/SMTP.Send",), issuer="microsoft",
                         tenant="organizations", client_id="cid", refresh_token=source)


def rotating(*refresh_tokens: str) -> FakeEntra:
    """Entra answering each refresh grant with a new access token and the next refresh token."""
    return FakeEntra(*[(200, {"token_type": "Bearer", "expires_in": 4000, "access_token": f"eyJ-{i}",
                              "refresh_token": rt}) for i, rt in enumerate(refresh_tokens)])


def test_a_refresh_token_stored_after_signing_in_again_is_used_without_a_restart(tmp_path):
    from mailq_db.worker.oauth.microsoft import RefreshToken

    stored = tmp_path / "rt"
    stored.write_text("rt-one\n")
    http = rotating("rt-two", "rt-three")
    provider = RefreshToken(delegated(Secret(file=str(stored))), http_client=http)
    provider.fetch()  # rt-one redeemed, rt-two written back
    stored.write_text("rt-after-signing-in-again\n")  # the operator's new sign-in (e.g. after AADSTS50173)
    provider.fetch()
    assert [p["refresh_token"] for p in http.posts] == ["rt-one", "rt-after-signing-in-again"]


def test_a_rotated_refresh_token_file_is_0600_and_its_symlink_is_kept(tmp_path):
    from mailq_db.worker.oauth.microsoft import RefreshToken

    real = tmp_path / "secrets" / "sales.rt"
    real.parent.mkdir()
    real.write_text("rt-one\n")
    real.chmod(0o644)  # readable by everyone: the rotated token must not be
    link = tmp_path / "sales.rt"
    link.symlink_to(real)
    RefreshToken(delegated(Secret(file=str(link))), http_client=rotating("rt-two")).fetch()
    assert link.is_symlink() and real.read_text() == "rt-two\n"
    assert real.stat().st_mode & 0o777 == 0o600
    assert [p.name for p in real.parent.iterdir()] == ["sales.rt"]  # no temporary file left


@pytest.mark.skipif(os.geteuid() != 0, reason="changing a file's owner needs root")
def test_a_rotation_written_by_root_keeps_the_workers_ownership(tmp_path):
    from mailq_db.worker.oauth.microsoft import RefreshToken

    stored = tmp_path / "rt"
    stored.write_text("rt-one\n")
    os.chown(stored, 4321, 4322)  # the worker's user; root runs check-config --probe
    RefreshToken(delegated(Secret(file=str(stored))), http_client=rotating("rt-two")).fetch()
    info = stored.stat()
    assert stored.read_text() == "rt-two\n" and (info.st_uid, info.st_gid, info.st_mode & 0o777) == (4321, 4322, 0o600)


def test_another_user_does_not_take_the_workers_token_file(tmp_path, monkeypatch, caplog):
    from mailq_db.worker.oauth import refresh
    from mailq_db.worker.oauth.microsoft import RefreshToken

    stored = tmp_path / "rt"
    stored.write_text("rt-one\n")
    owner = stored.stat().st_uid
    monkeypatch.setattr(refresh.os, "geteuid", lambda: owner + 1000)  # a user that is neither its owner nor root
    with caplog.at_level(logging.WARNING, logger="mailq_db"):
        RefreshToken(delegated(Secret(file=str(stored))), http_client=rotating("rt-two")).fetch()
    assert stored.read_text() == "rt-one\n" and "belongs to another user" in caplog.text


def test_a_rotated_token_that_cannot_be_written_is_kept_until_the_file_changes(tmp_path, caplog, monkeypatch):
    import errno

    from mailq_db.worker.oauth import refresh
    from mailq_db.worker.oauth.microsoft import RefreshToken

    def read_only(*args: Any, **kwargs: Any) -> Any:
        raise OSError(errno.EROFS, "Read-only file system")

    stored = tmp_path / "rt"
    stored.write_text("rt-one\n")
    monkeypatch.setattr(refresh.tempfile, "mkstemp", read_only)
    http = rotating("rt-two", "rt-three", "rt-four")
    provider = RefreshToken(delegated(Secret(file=str(stored))), http_client=http)
    with caplog.at_level(logging.INFO, logger="mailq_db"):
        provider.fetch()
        provider.fetch()
    assert "could not be rewritten (Read-only file system)" in caplog.text and "rt-t" not in caplog.text
    stored.write_text("rt-new-sign-in\n")  # the operator stores a new token: it wins over the kept one
    provider.fetch()
    assert [p["refresh_token"] for p in http.posts] == ["rt-one", "rt-two", "rt-new-sign-in"]


def test_a_refresh_token_from_the_environment_rotates_in_memory_and_says_so_once(caplog):
    from mailq_db.worker.oauth.microsoft import RefreshToken

    http = rotating("rt-two", "rt-three", "rt-four")
    provider = RefreshToken(delegated(Secret(env="SALES_RT", value="rt-one")), http_client=http)
    with caplog.at_level(logging.INFO, logger="mailq_db"):
        for _ in range(3):
            provider.fetch()
    assert [p["refresh_token"] for p in http.posts] == ["rt-one", "rt-two", "rt-three"]
    assert caplog.text.count("kept in memory") == 1 and "rt-t" not in caplog.text


def test_msal_logs_neither_the_secret_nor_the_token(caplog):
    from mailq_db.worker.oauth.microsoft import ClientCredentials

    with caplog.at_level(logging.DEBUG):
        token = ClientCredentials(microsoft(), http_client=FakeEntra(ok())).fetch()
        with pytest.raises(oauth.TokenError):
            ClientCredentials(microsoft(), http_client=FakeEntra(
                (401, entra_error(7000215, "invalid_client", "Invalid client secret provided.")))).fetch()
    text = "\n".join(r.getMessage() for r in caplog.records)
    assert caplog.records and SECRET not in text and token.access_token not in text


# --------------------------------------------------------------------------- google-auth


class GoogleResponse:
    def __init__(self, status: int, body: dict[str, Any]):
        self.status, self.headers, self.data = status, {"content-type": "application/json"}, json.dumps(body).encode()


class FakeGoogle:
    """google-auth's transport: request(url, method, body, headers, timeout) -> response."""

    def __init__(self, *answers: tuple[int, dict[str, Any]]):
        self.answers = list(answers)
        self.calls: list[dict[str, Any]] = []

    def __call__(self, url: str, method: str = "GET", body: Any = None, headers: Any = None,
                 timeout: Any = None, **kw: Any) -> GoogleResponse:
        form = urllib.parse.parse_qs(body.decode() if isinstance(body, bytes) else body or "")
        self.calls.append({"url": url, "method": method, "timeout": timeout, **{k: v[0] for k, v in form.items()}})
        status, answer = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        return GoogleResponse(status, answer)


@pytest.fixture(scope="module")
def service_account_key(tmp_path_factory) -> Path:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption()).decode()
    path = tmp_path_factory.mktemp("sa") / "service-account.json"
    path.write_text(json.dumps({
        "type": "service_account", "project_id": "mailq-lab", "private_key_id": "0123456789abcdef",
        "private_key": pem, "client_email": "mailer@mailq-lab.iam.gserviceaccount.com",
        "client_id": "104356789012345678901", "token_uri": "https://oauth2.googleapis.com/token"}))
    return path


def google(path: Path, **overrides: Any) -> OAuthSettings:
    values: dict[str, Any] = dict(provider="google", scopes=("https://mail.google.com/",),
                                  service_account=Secret(file=str(path)), subject="sales@example.com",
                                  timeout_seconds=7.0)
    values.update(overrides)
    return OAuthSettings(**values)


def test_google_service_account_signs_a_jwt_for_the_mailbox_with_the_mail_scope(service_account_key):
    from mailq_db.worker.oauth.google import ServiceAccount

    request = FakeGoogle((200, {"access_token": "ya29.c.service-account-token", "expires_in": 3599,
                                "token_type": "Bearer"}))
    now = [50.0]
    token = ServiceAccount(google(service_account_key), request=request, clock=lambda: now[0]).fetch()
    assert token.access_token == "ya29.c.service-account-token"
    assert 50.0 + 3590 < token.expires_at <= 50.0 + 3600
    [call] = request.calls
    assert call["url"] == "https://oauth2.googleapis.com/token" and call["timeout"] == 7.0
    assert call["grant_type"] == "urn:ietf:params:oauth:grant-type:jwt-bearer"
    claims = json.loads(base64.urlsafe_b64decode(call["assertion"].split(".")[1] + "=="))
    assert claims["sub"] == "sales@example.com" and claims["scope"] == "https://mail.google.com/"
    assert claims["iss"] == "mailer@mailq-lab.iam.gserviceaccount.com"


@pytest.mark.parametrize("status,body,expect", [
    (401, {"error": "unauthorized_client", "error_description": "Client is unauthorized to retrieve access tokens "
           "using this method, or client not authorized for any of the scopes requested."},
     "Domain-wide delegation"),
    (400, {"error": "invalid_grant", "error_description": "Invalid email or User ID"}, "existing mailbox"),
])
def test_google_refusals_name_the_delegation_or_the_subject_to_check(service_account_key, status, body, expect):
    from mailq_db.worker.oauth.google import ServiceAccount

    with pytest.raises(oauth.TokenError) as info:
        ServiceAccount(google(service_account_key), request=FakeGoogle((status, body))).fetch()
    assert info.value.code == body["error"] and expect in info.value.fix
    assert body["error_description"] in str(info.value)


class GooglePage(FakeGoogle):
    """The token endpoint answers with a page that is not JSON (a 503 from a front end)."""

    def __call__(self, url: str, method: str = "GET", body: Any = None, headers: Any = None,
                 timeout: Any = None, **kw: Any) -> GoogleResponse:
        self.calls.append({"url": url})
        page = GoogleResponse(503, {})
        page.data = b"<html><title>503 Service Unavailable</title></html>"
        return page


@pytest.mark.parametrize("request_", [
    GooglePage(),
    FakeGoogle((429, {"error": "rate_limit_exceeded", "error_description": "Rate Limit Exceeded"})),
    FakeGoogle((500, {"error": "internal_failure"})),
], ids=["html-503", "429", "internal_failure"])
def test_google_answers_that_google_auth_calls_retryable_are_transient(service_account_key, request_):
    from mailq_db.worker.oauth.google import ServiceAccount

    with pytest.raises(oauth.TokenUnavailable) as info:
        ServiceAccount(google(service_account_key), request=request_).fetch()
    assert "fix:" not in str(info.value)
    assert len(request_.calls) == 3  # google-auth retried before giving up


def test_a_configured_token_uri_replaces_the_keys_own(service_account_key):
    from mailq_db.worker.oauth.google import ServiceAccount

    request = FakeGoogle((200, {"access_token": "ya29.c.elsewhere", "expires_in": 3599, "token_type": "Bearer"}))
    settings = google(service_account_key, token_uri="https://oauth2.example.test/token")
    assert ServiceAccount(settings, request=request).fetch().access_token == "ya29.c.elsewhere"
    assert [c["url"] for c in request.calls] == ["https://oauth2.example.test/token"]


@pytest.mark.parametrize("table", [
    'provider = "google"\nservice_account_env = "K"\ntoken_uri = "http://oauth2.example.test/token"',
    'provider = "refresh_token"\nissuer = "generic"\nclient_id = "c"\nclient_secret_env = "K"\n'
    'refresh_token_env = "K"\ntoken_uri = "http://127.0.0.1.attacker.example/token"',
    'provider = "refresh_token"\nissuer = "google"\nclient_id = "c"\nclient_secret_env = "K"\n'
    'refresh_token_env = "K"\ntoken_uri = "http://localhost.attacker.example/token"',
])
def test_a_token_endpoint_in_clear_text_is_refused(table):
    with pytest.raises(ConfigurationError, match="token_uri: must be an https:// URL"):
        config(table, {"K": "{}"})


def test_a_loopback_token_endpoint_is_allowed_for_tests():
    acct = config('provider = "refresh_token"\nissuer = "generic"\nclient_id = "c"\nclient_secret_env = "K"\n'
                  'refresh_token_env = "K"\ntoken_uri = "http://127.0.0.1:8080/token"', {"K": "x"})
    assert acct.oauth.token_uri == "http://127.0.0.1:8080/token"


def test_google_auths_debug_request_log_does_not_carry_the_signed_assertion(service_account_key, tmp_path):
    """google-auth's own DEBUG log of the token request, with its real requests transport against a
    token endpoint on 127.0.0.1: the JWT assertion (redeemable for an hour) must not be in it."""
    import http.server

    from mailq_db.worker.oauth.google import ServiceAccount

    class Endpoint(http.server.BaseHTTPRequestHandler):
        bodies: list[str] = []

        def do_POST(self) -> None:  # noqa: N802 - BaseHTTPRequestHandler's name
            Endpoint.bodies.append(self.rfile.read(int(self.headers["Content-Length"])).decode())
            data = json.dumps({"access_token": "ya29.from-the-lab", "expires_in": 3599}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Endpoint)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    google_logger, keep = logging.getLogger("google"), Keep()
    google_logger.addHandler(keep)
    google_logger.setLevel(logging.DEBUG)
    try:
        settings = google(service_account_key, token_uri=f"http://127.0.0.1:{server.server_address[1]}/token")
        assert ServiceAccount(settings).fetch().access_token == "ya29.from-the-lab"
    finally:
        google_logger.removeHandler(keep)
        google_logger.setLevel(logging.NOTSET)
        server.shutdown()
        server.server_close()
    [body] = Endpoint.bodies
    assertion = urllib.parse.parse_qs(body)["assertion"][0]
    logged = [r for r in records if hasattr(r, "httpRequest")]
    assert logged and all(assertion not in str(vars(r)) for r in records)
    assert logged[0].httpRequest["body"]["assertion"] == "[redacted]"


def test_a_broken_service_account_key_is_explained(tmp_path):
    from mailq_db.worker.oauth.google import ServiceAccount

    bad = tmp_path / "key.json"
    bad.write_text("not json")
    with pytest.raises(oauth.TokenError, match="not readable JSON"):
        ServiceAccount(google(bad), request=FakeGoogle((200, {}))).fetch()


def test_a_standard_refresh_token_endpoint_is_used_through_google_auth(tmp_path):
    from mailq_db.worker.oauth.google import RefreshToken

    request = FakeGoogle((200, {"access_token": "at-1", "expires_in": 600, "token_type": "Bearer",
                                "refresh_token": "rt-2"}))
    stored = tmp_path / "rt"
    stored.write_text("rt-1")
    settings = OAuthSettings("refresh_token", ("mail",), issuer="generic", token_uri="https://idp.example/token",
                             client_id="cid", client_secret=Secret(env="S", value="cs"),
                             refresh_token=Secret(file=str(stored)))
    provider = RefreshToken(settings, request=request)
    assert provider.fetch().access_token == "at-1"
    [call] = request.calls
    assert call["url"] == "https://idp.example/token" and call["grant_type"] == "refresh_token"
    assert call["refresh_token"] == "rt-1" and call["client_secret"] == "cs" and call["scope"] == "mail"
    assert stored.read_text().strip() == "rt-2"
    provider.fetch()
    assert request.calls[1]["refresh_token"] == "rt-2"  # the rotated token is used from now on


def test_an_unreachable_token_endpoint_is_transient(service_account_key):
    from google.auth.exceptions import TransportError

    from mailq_db.worker.oauth.google import ServiceAccount

    def down(*args: Any, **kwargs: Any) -> Any:
        raise TransportError("connection refused")

    with pytest.raises(oauth.TokenUnavailable):
        ServiceAccount(google(service_account_key), request=down).fetch()


# --------------------------------------------------------------------------- command


def command(*argv: str, **overrides: Any) -> OAuthSettings:
    return OAuthSettings("command", (), command=(sys.executable, "-c", *argv), **overrides)


def test_the_command_provider_reads_a_bare_token_or_a_token_response():
    from mailq_db.worker.oauth.command import Command

    now = [10.0]
    bare = Command(command("print('bare-token-123')", token_lifetime_seconds=120), clock=lambda: now[0]).fetch()
    assert (bare.access_token, bare.expires_at) == ("bare-token-123", 130.0)
    response = Command(command("import json; print(json.dumps({'access_token': 'json-token', 'expires_in': 42}))"),
                       clock=lambda: now[0]).fetch()
    assert (response.access_token, response.expires_at) == ("json-token", 52.0)


def test_the_command_runs_without_a_shell(tmp_path):
    from mailq_db.worker.oauth.command import Command

    marker = tmp_path / "pwned"
    argument = f"; touch {marker}; $(touch {marker}) `touch {marker}`"
    token = Command(command("import sys; print(sys.argv[1].encode().hex())", argument)).fetch()
    assert bytes.fromhex(token.access_token).decode() == argument and not marker.exists()


def test_a_failing_command_reports_its_status_and_stderr_but_never_its_output():
    from mailq_db.worker.oauth.command import Command

    script = "import sys; print('half-printed-token'); print('no cached token for sales', file=sys.stderr); sys.exit(3)"
    with pytest.raises(oauth.TokenError) as info:
        Command(command(script)).fetch()
    assert "exited with status 3: no cached token for sales" in str(info.value)
    assert "half-printed-token" not in str(info.value)


def test_a_hanging_command_times_out():
    from mailq_db.worker.oauth.command import Command

    started = time.monotonic()
    with pytest.raises(oauth.TokenUnavailable, match="did not finish within 1 s"):
        Command(command("import time; time.sleep(30)", timeout_seconds=1.0)).fetch()
    assert time.monotonic() - started < 10


def test_a_command_that_prints_nothing_is_refused():
    from mailq_db.worker.oauth.command import Command

    with pytest.raises(oauth.TokenError, match="printed no token"):
        Command(command("pass")).fetch()


def test_a_command_that_prints_too_much_is_stopped():
    from mailq_db.worker.oauth.command import Command

    with pytest.raises(oauth.TokenError, match="printed more than 64 KiB"):
        Command(command("import sys\nwhile True: sys.stdout.write('x' * 65536)", timeout_seconds=60)).fetch()


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/status") as fh:
            return "\nState:\tZ" in fh.read()  # a zombie nobody reaped yet is dead too
    except FileNotFoundError:
        return True


def test_a_child_left_holding_the_output_is_not_waited_for(tmp_path):
    from mailq_db.worker.oauth.command import Command

    pid_file = tmp_path / "helper.pid"
    script = ("import pathlib, subprocess, sys\n"  # a helper that inherits standard output and stays
              "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
              f"pathlib.Path({str(pid_file)!r}).write_text(str(child.pid))\n"
              "print('token-from-a-program-with-a-helper')")
    try:
        # before: the run waited for the helper to close the pipe, and timed out (TokenUnavailable)
        token = Command(command(script, timeout_seconds=20)).fetch()
        assert token.access_token == "token-from-a-program-with-a-helper"
    finally:
        if pid_file.exists():
            os.kill(int(pid_file.read_text()), 9)


def test_a_timeout_kills_the_program_and_what_it_started(tmp_path):
    from mailq_db.worker.oauth.command import Command

    pid_file = tmp_path / "child.pid"
    script = ("import pathlib, subprocess, sys, time\n"
              "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
              f"pathlib.Path({str(pid_file)!r}).write_text(str(child.pid))\ntime.sleep(60)")
    with pytest.raises(oauth.TokenUnavailable, match="did not finish within 5 s"):
        Command(command(script, timeout_seconds=5.0)).fetch()
    child = int(pid_file.read_text())
    for _ in range(500):  # SIGKILL is delivered at once; its parent (init) reaps it when it can
        if _gone(child):
            break
        time.sleep(0.01)
    assert _gone(child)


def test_a_failing_commands_error_line_does_not_repeat_a_token():
    from mailq_db.worker.oauth.command import Command

    script = ("import sys; print('eyJhbGciOiJSUzI1NiJ9.half-token-9f3a7c2e1d')\n"
              "print('refresh failed: refresh_token=1//0gLq3xYz9Kf8AbCdEfGhIjKlMnOp rejected', file=sys.stderr)\n"
              "sys.exit(2)")
    with pytest.raises(oauth.TokenError) as info:
        Command(command(script)).fetch()
    assert "refresh failed: refresh_token=[redacted] rejected" in str(info.value)
    assert "9f3a7c" not in str(info.value) and "0gLq3xYz9" not in str(info.value)


@pytest.mark.parametrize("printed,problem", [
    ("'tok\\x01user=someone-else@example.com'", "characters a bearer token cannot have"),
    ("'tök-en'", "characters a bearer token cannot have"),
    ("json.dumps({'access_token': 't', 'expires_in': -5})", "not a positive number"),
    ("'{\"access_token\": \"t\", \"expires_in\": NaN}'", "not a positive number"),
])
def test_a_token_or_lifetime_that_cannot_be_used_is_refused(printed, problem):
    from mailq_db.worker.oauth.command import Command

    with pytest.raises(oauth.TokenError, match=problem):
        Command(command(f"import json; print({printed})")).fetch()


# --------------------------------------------------------------------------- settings


def config(table: str, env: dict[str, str] | None = None, auth: str = "xoauth2") -> Any:
    text = f"""
[accounts.sales]
host = "smtp.office365.com"
user = "sales@contoso.com"
auth = "{auth}"
[accounts.sales.oauth]
{table}
"""
    return parse_config(text, env=env or {}).accounts["sales"]


def test_a_microsoft_account_parses_with_the_exchange_scope_by_default():
    acct = config('provider = "microsoft"\ntenant = "contoso.onmicrosoft.com"\nclient_id = "cid"\n'
                  'client_secret_env = "M365_SECRET"', {"M365_SECRET": SECRET})
    assert acct.auth == "xoauth2" and acct.password is None and acct.password_env is None
    assert acct.oauth.scopes == ("https://outlook.office365.com/.default",)
    assert acct.oauth.client_secret.read() == SECRET and SECRET not in repr(acct)


@pytest.mark.parametrize("table,env,message", [
    ('provider = "microsft"', {}, "did you mean 'microsoft'"),
    ('provider = "microsoft"\ntenant = "common"\nclient_id = "c"\nclient_secret_env = "S"', {"S": "x"},
     "not 'common'"),
    ('provider = "microsoft"\ntenant = "t"\nclient_id = "c"', {}, "client_secret_env"),
    ('provider = "microsoft"\ntenant = "t"\nclient_id = "c"\nclient_secret_env = "MISSING"', {},
     "MISSING is not set"),
    ('provider = "microsoft"\ntenant = "t"\nclient_id = "c"\nclient_secret_env = "S"\nclient_secet = "x"',
     {"S": "x"}, "did you mean 'client_secret_env'"),
    ('provider = "google"', {}, "service_account_env"),
    ('provider = "refresh_token"\nissuer = "yahoo"', {}, "issuer"),
    ('provider = "command"\ncommand = "get-token --x"', {}, "must be list"),
    ('provider = "command"\ncommand = ["/no/such/program"]', {}, "not an executable file"),
])
def test_oauth_settings_problems_say_what_to_do(table, env, message):
    with pytest.raises(ConfigurationError, match=message):
        config(table, env)


def test_token_auth_needs_a_user_and_refuses_a_password():
    text = """
[accounts.a]
host = "smtp.gmail.com"
auth = "xoauth2"
password_env = "P"
[accounts.a.oauth]
provider = "command"
command = ["/bin/true"]
"""
    with pytest.raises(ConfigurationError) as info:
        parse_config(text, env={"P": "x"})
    assert "signs in with a token, not a password" in str(info.value)
    assert "accounts.a.user: is required with auth" in str(info.value)


def test_an_oauth_table_without_token_auth_and_an_unknown_auth_are_refused():
    with pytest.raises(ConfigurationError, match='set auth = "xoauth2"'):
        parse_config('[accounts.a]\nhost = "h.example.com"\n[accounts.a.oauth]\nprovider = "command"\n'
                     'command = ["/bin/true"]\n', env={})
    with pytest.raises(ConfigurationError, match="must be one of password, xoauth2, oauthbearer"):
        parse_config('[accounts.a]\nhost = "h.example.com"\nauth = "cram-md5"\n', env={})


def test_a_missing_extra_is_one_line_naming_the_extra(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "msal" else real(name, *a))
    with pytest.raises(ConfigurationError) as info:
        config('provider = "microsoft"\ntenant = "t"\nclient_id = "c"\nclient_secret_env = "S"', {"S": "x"})
    [line] = [x for x in str(info.value).splitlines() if "msal" in x]
    assert "pip install 'mailq-db[oauth-microsoft]'" in line
    with pytest.raises(oauth.MissingExtra, match=r"mailq-db\[oauth-microsoft\]"):
        oauth.make_provider(microsoft())


def test_get_token_makes_the_provider_once_per_account_and_caches():
    cache = TokenCache()
    settings = command("print('t-1')")
    first = oauth.get_token("a", settings, cache)
    assert oauth.get_token("a", settings, cache) is first and cache.fetches == {"a": 1}


def test_explanations_never_contain_a_description_beyond_the_first_line():
    exc = oauth_errors.explain_microsoft(entra_error(65001, "invalid_grant", "no consent"))
    assert "Correlation ID" not in str(exc) and "\n" not in str(exc)
