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
