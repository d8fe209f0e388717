"""SASL XOAUTH2 / OAUTHBEARER in the worker's SMTP session (issue 26).

The exact bytes are checked against the documented formats (Google's XOAUTH2
example; RFC 7628 3.1 for OAUTHBEARER), the exchange against a recording
fake, and the session's refresh-once discipline against a real SMTP server
(aiosmtpd with XOAUTH2/OAUTHBEARER handlers that accept only the tokens the
test says).  Postfix + Dovecot do the same for real in
tests/realmta/test_oauth_postfix.py.
"""

from __future__ import annotations

import base64
import json
import logging
import smtplib
import socket
from typing import Any

import pytest
from aiosmtpd.controller import Controller
from aiosmtpd.smtp import AuthResult
from worker_helpers import FakeQueue, make_mail, make_worker

from mailq_db.worker import oauth, sasl
from mailq_db.worker.classify import SetupError, classify_reply
from mailq_db.worker.config import AccountConfig
from mailq_db.worker.oauth.cache import Token
from mailq_db.worker.oauth.settings import OAuthSettings
from mailq_db.worker.smtp import SmtpSession

logging.getLogger("mail.log").setLevel(logging.ERROR)  # aiosmtpd logs every line it reads at DEBUG


# --------------------------------------------------------------------------- bytes


def test_xoauth2_initial_response_is_googles_documented_example():
    raw = sasl.initial_response("XOAUTH2", "someuser@example.com", "ya29.vF9dft4qmTc2Nvb3RlckBhdHRhdmlzdGEuY29tCg",
                                "smtp.gmail.com", 587)
    # https://developers.google.com/workspace/gmail/imap/xoauth2-protocol (the encoded example)
    assert base64.b64encode(raw).decode() == (
        "dXNlcj1zb21ldXNlckBleGFtcGxlLmNvbQFhdXRoPUJlYXJlciB5YTI5LnZGOWRmdDRxbVRjMk52YjNSbGNrQmhkSFJoZG1semRHRXVZMjl0Q2cBAQ==")


def test_oauthbearer_initial_response_follows_rfc_7628():
    raw = sasl.initial_response("OAUTHBEARER", "user@example.com", "vF9dft4qmTc2Nvb3RlckBhbHRhdmlzdGEuY29tCg==",
                                "server.example.com", 587)
    assert raw == (b"n,a=user@example.com,\x01host=server.example.com\x01port=587\x01"
                   b"auth=Bearer vF9dft4qmTc2Nvb3RlckBhbHRhdmlzdGEuY29tCg==\x01\x01")
    # RFC 5801 saslname: "," and "=" escaped in the authzid
    escaped = sasl.initial_response("OAUTHBEARER", "a,b=c@x.example", "t", "h", 1)
    assert escaped.startswith(b"n,a=a=2Cb=3Dc@x.example,\x01")


@pytest.mark.parametrize("user,token", [("u@example.com\x01auth=Bearer x", "tok"), ("u@example.com", "tok\x01\x01"),
                                        ("u@example.com", "tok en"), ("u@example.com\r\nRSET", "tok")])
def test_nothing_that_would_end_a_field_early_is_sent(user, token):
    for mechanism in ("XOAUTH2", "OAUTHBEARER"):
        with pytest.raises(SetupError) as info:
            sasl.initial_response(mechanism, user, token, "smtp.example.com", 587)
        assert token not in str(info.value) or token == "tok"


class FakeSmtp:
    """Records docmd() calls and answers from a script."""

    def __init__(self, *replies: tuple[int, bytes], offered: str = "PLAIN LOGIN XOAUTH2 OAUTHBEARER"):
        self.replies, self.sent = list(replies), []
        self.esmtp_features = {"auth": " " + offered}

    def has_extn(self, name: str) -> bool:
        return name in self.esmtp_features

    def docmd(self, cmd: str, args: str = "") -> tuple[int, bytes]:
        self.sent.append(f"{cmd} {args}" if args else cmd)
        return self.replies.pop(0)


def b64json(data: dict[str, Any]) -> bytes:
    return base64.b64encode(json.dumps(data).encode())


def test_one_auth_command_with_the_initial_response():
    smtp = FakeSmtp((235, b"2.7.0 Accepted"))
    sasl.authenticate(smtp, "XOAUTH2", "u@example.com", "tok", "smtp.example.com", 587)
    [line] = smtp.sent
    assert line.startswith("AUTH XOAUTH2 ") and base64.b64decode(line.split()[2]) == \
        b"user=u@example.com\x01auth=Bearer tok\x01\x01"


@pytest.mark.parametrize("mechanism,ending", [("XOAUTH2", ""), ("OAUTHBEARER", "AQ==")])
def test_the_error_challenge_is_ended_as_each_mechanism_requires_and_decoded(mechanism, ending):
    error = {"status": "401", "schemes": "bearer", "scope": "https://mail.google.com/"}
    smtp = FakeSmtp((334, b64json(error)), (535, b"5.7.8 Username and Password not accepted. - gsmtp"))
    with pytest.raises(sasl.TokenRejected) as info:
        sasl.authenticate(smtp, mechanism, "u@example.com", "tok", "smtp.gmail.com", 587)
    assert smtp.sent[1] == ending and len(smtp.sent) == 2  # one AUTH command, then its ending line
    assert info.value.smtp_code == 535 and info.value.server_error == error
    assert info.value.smtp_error.decode() == ("5.7.8 Username and Password not accepted. - gsmtp (server's OAuth "
                                              "error: status=401, schemes=bearer, scope=https://mail.google.com/)")


def test_a_final_refusal_without_a_challenge_is_a_token_rejection_too():
    smtp = FakeSmtp((535, b"5.7.3 Authentication unsuccessful [SN4PR0201CA0045.namprd02.prod.outlook.com]"))
    with pytest.raises(sasl.TokenRejected) as info:
        sasl.authenticate(smtp, "XOAUTH2", "u@contoso.com", "tok", "smtp.office365.com", 587)
    assert info.value.server_error is None and len(smtp.sent) == 1


def test_a_temporary_failure_is_not_a_token_rejection():
    smtp = FakeSmtp((454, b"4.7.0 Temporary authentication failure"))
    with pytest.raises(smtplib.SMTPAuthenticationError) as info:
        sasl.authenticate(smtp, "XOAUTH2", "u@example.com", "tok", "smtp.example.com", 587)
    assert not isinstance(info.value, sasl.TokenRejected) and info.value.smtp_code == 454


def test_a_long_response_goes_after_the_servers_empty_challenge():
    token = "e" * 2500  # an Entra ID access token is a 1.5-2.5 KB JWT
    smtp = FakeSmtp((334, b""), (235, b"2.7.0 Authentication successful"))
    sasl.authenticate(smtp, "XOAUTH2", "u@contoso.com", token, "smtp.office365.com", 587)
    assert smtp.sent[0] == "AUTH XOAUTH2"
    assert base64.b64decode(smtp.sent[1]) == f"user=u@contoso.com\x01auth=Bearer {token}\x01\x01".encode()
    short = FakeSmtp((235, b"ok"))
    sasl.authenticate(short, "XOAUTH2", "u@contoso.com", "e" * 1400, "smtp.office365.com", 587)
    assert len(short.sent) == 1 and len(short.sent[0]) + 2 <= sasl.MAX_INITIAL_RESPONSE_LINE


def test_a_mechanism_the_server_does_not_offer_names_the_one_it_does():
    smtp = FakeSmtp(offered="LOGIN XOAUTH2")  # Exchange Online's AUTH line
    with pytest.raises(SetupError, match='offers AUTH LOGIN XOAUTH2, not OAUTHBEARER: set auth = "xoauth2"'):
        sasl.authenticate(smtp, "OAUTHBEARER", "u@contoso.com", "tok", "smtp.office365.com", 587)
    assert smtp.sent == []


# --------------------------------------------------------------------------- a real SMTP server


class OAuthHandler:
    """aiosmtpd handler: XOAUTH2 and OAUTHBEARER accept the tokens in ``valid`` (errors as Gmail does)."""

    def __init__(self) -> None:
        self.valid: set[str] = set()
        self.temporary = False  # answer 454 instead of refusing
        self.logins: list[tuple[str, bool]] = []  # (mechanism, accepted) per AUTH command
        self.messages: list[bytes] = []

    async def _token_auth(self, server: Any, args: list[str], mechanism: str) -> AuthResult:
        blob = base64.b64decode(args[1]) if len(args) > 1 else await server.challenge_auth("")
        fields = dict(f.split("=", 1) for f in blob.decode().split("\x01") if "=" in f and not f.startswith("n,"))
        token = fields.get("auth", "").removeprefix("Bearer ")
        ok = token in self.valid
        self.logins.append((mechanism, ok))
        if ok:
            return AuthResult(success=True)
        if self.temporary:
            return AuthResult(success=False, handled=False, message="454 4.7.0 Temporary authentication failure")
        error = {"status": "401", "schemes": "bearer"} if mechanism == "XOAUTH2" else {"status": "invalid_token"}
        await server.challenge_auth(json.dumps(error))
        return AuthResult(success=False, handled=False, message="535 5.7.8 Username and Password not accepted.")

    async def auth_XOAUTH2(self, server: Any, args: list[str]) -> AuthResult:  # noqa: N802 - aiosmtpd's name
        return await self._token_auth(server, args, "XOAUTH2")

    async def auth_OAUTHBEARER(self, server: Any, args: list[str]) -> AuthResult:  # noqa: N802
        return await self._token_auth(server, args, "OAUTHBEARER")

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:  # noqa: N802
        self.messages.append(envelope.content)
        return "250 2.0.0 Ok: queued as T0K3N"


@pytest.fixture
def oauth_server():
    handler = OAuthHandler()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    controller = Controller(handler, hostname="127.0.0.1", port=port, auth_require_tls=False,
                            auth_exclude_mechanism=["LOGIN", "PLAIN"])
    controller.start()
    yield handler, port
    controller.stop()


class Script:
    """A token provider that hands out t1, t2, ... (the test decides which the server accepts)."""

    def __init__(self) -> None:
        self.n = 0

    def fetch(self) -> Token:
        self.n += 1
        return Token(f"tok-{self.n}", 1e12, 0.0)


def token_account(port: int, auth: str = "xoauth2") -> AccountConfig:
    settings = OAuthSettings("command", (), command=("unused",))
    return AccountConfig(name="acct", host="127.0.0.1", port=port, tls="none", allow_plaintext=True, user="u@lab.test",
                         auth=auth, oauth=settings, connect_timeout_seconds=2.0, command_timeout_seconds=2.0)


@pytest.fixture
def tokens(monkeypatch):
    """The process cache, with the account's provider replaced by a Script."""
    oauth.TOKENS.clear()
    script = Script()
    oauth.TOKENS.provider("acct", lambda: script)
    yield script
    oauth.TOKENS.clear()


def test_a_refused_cached_token_is_replaced_once_on_a_new_connection(oauth_server, tokens, caplog):
    handler, port = oauth_server
    handler.valid = {"tok-2"}
    oauth.get_token("acct", token_account(port).oauth)  # tok-1 is cached (and the server no longer takes it)
    session = SmtpSession(token_account(port))
    with caplog.at_level(logging.WARNING, logger="mailq_db"):
        session.open()
    session.close()
    assert handler.logins == [("XOAUTH2", False), ("XOAUTH2", True)]  # one AUTH per connection
    [warning] = caplog.records
    assert "refused the token of account acct" in warning.getMessage()
    assert "tok-" not in warning.getMessage() + str(warning.mailq_fields)


def test_a_token_refused_twice_pauses_the_account_and_says_what_to_check(oauth_server, tokens, caplog):
    handler, port = oauth_server
    queue = FakeQueue([make_mail(1, account_name="acct"), make_mail(2, account_name="acct")])
    with caplog.at_level(logging.INFO, logger="mailq_db"):
        make_worker(queue, {"acct": token_account(port, "oauthbearer")}).run(once=True)
    assert handler.logins == [("OAUTHBEARER", False), ("OAUTHBEARER", False)]
    assert [r.dispositions for r in queue.rows.values()] == [["Wait"], ["Wait"]]
    assert all(r.attempts_remaining == 5 for r in queue.rows.values())  # Wait: the attempts are refunded
    [error] = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert error.mailq_fields["fix"].startswith("the server refused a freshly fetched token for the mailbox "
                                                "u@lab.test as well")
    assert "status=invalid_token" in error.mailq_fields["reply"]


def test_a_token_that_cannot_be_obtained_waits_the_account_without_any_auth(oauth_server, monkeypatch):
    handler, port = oauth_server
    oauth.TOKENS.clear()

    class Refusing:
        def fetch(self) -> Token:
            raise oauth.TokenError("Microsoft identity platform refused the token request: invalid_client "
                                   "(AADSTS7000215: Invalid client secret provided.)", "put the secret's Value")

    oauth.TOKENS.provider("acct", Refusing)
    queue = FakeQueue([make_mail(1, account_name="acct")])
    make_worker(queue, {"acct": token_account(port)}).run(once=True)
    oauth.TOKENS.clear()
    row = queue.rows[1]
    assert row.dispositions == ["Wait"]
    assert "AADSTS7000215" in row.last_error and "fix: put the secret" in row.last_error
    assert handler.logins == []


def test_a_temporary_auth_failure_keeps_the_token_and_waits_briefly(oauth_server, tokens, caplog):
    handler, port = oauth_server
    handler.temporary = True
    queue = FakeQueue([make_mail(1, account_name="acct")])
    with caplog.at_level(logging.INFO, logger="mailq_db"):
        make_worker(queue, {"acct": token_account(port)}).run(once=True)
    assert handler.logins == [("XOAUTH2", False)] and tokens.n == 1  # no refresh, no second connection
    assert queue.rows[1].dispositions == ["Wait"]
    [error] = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert error.mailq_fields["fix"].startswith("the server could not check the token just now")


def test_a_token_account_sends_its_mail(oauth_server, tokens):
    handler, port = oauth_server
    handler.valid = {"tok-1"}
    queue = FakeQueue([make_mail(i, account_name="acct") for i in (1, 2, 3)])
    make_worker(queue, {"acct": token_account(port)}).run(once=True)
    assert set(queue.statuses().values()) == {"Sent"} and len(handler.messages) == 3
    assert handler.logins == [("XOAUTH2", True)] and tokens.n == 1


# --------------------------------------------------------------------------- passwords the provider refuses


@pytest.mark.parametrize("code,text,host,fix", [
    (550, "5.7.30 Basic authentication is not supported for Client Submission.", "smtp.office365.com",
     'switch the account to auth = "xoauth2"'),
    (535, "5.7.139 Authentication unsuccessful, SmtpClientAuthentication is disabled for the Tenant. Visit "
     "https://aka.ms/smtp_auth_disabled for more information.", "smtp.office365.com",
     "SmtpClientAuthenticationDisabled $false"),
    (534, "5.7.9 Application-specific password required. For more information, go to\n534 5.7.9  "
     "https://support.google.com/mail/?p=InvalidSecondFactor - gsmtp", "smtp.gmail.com", "app password"),
    (535, "5.7.8 Username and Password not accepted. For more information, go to\n535 5.7.8  "
     "https://support.google.com/mail/?p=BadCredentials - gsmtp", "smtp.gmail.com", "30 September 2024"),
])
def test_basic_auth_refusals_are_an_account_wait_that_names_the_fix(code, text, host, fix):
    outcome = classify_reply(code, text, "auth", host)
    assert (outcome.disposition, outcome.scope) == ("Wait", "account") and outcome.retry_after_seconds >= 1800
    acct = AccountConfig(name="a", host=host, user="u", password_env="SMTP_PASSWORD")
    assert fix in sasl.auth_fix(acct, outcome)
    assert fix in sasl.password_fix(acct, smtplib.SMTPAuthenticationError(code, text.encode()))


def test_an_ordinary_wrong_password_still_names_the_password_variable():
    outcome = classify_reply(535, "5.7.8 Error: authentication failed: authentication failure", "auth")
    acct = AccountConfig(name="a", host="smtp.example.com", user="u", password_env="SMTP_PASSWORD")
    assert sasl.auth_fix(acct, outcome) == "check the password in $SMTP_PASSWORD and the user name"
    assert sasl.password_fix(acct, smtplib.SMTPAuthenticationError(535, b"5.7.8 Error: authentication failed")) is None


# --------------------------------------------------------------------------- probe


def test_the_probe_names_the_missing_consent_when_entra_refuses(oauth_server, monkeypatch):
    from test_worker_oauth import FakeEntra, entra_error, microsoft

    from mailq_db.worker.oauth.microsoft import ClientCredentials
    from mailq_db.worker.probe import probe_account

    handler, port = oauth_server
    refusal = entra_error(65001, "invalid_grant", "The user or administrator has not consented to use the "
                          "application with ID '11111111-2222-3333-4444-555555555555' named 'mailq-db'.")
    monkeypatch.setattr(oauth, "make_provider",
                        lambda s, **kw: ClientCredentials(s, http_client=FakeEntra((400, refusal))))
    acct = token_account(port)
    acct = AccountConfig(**{**acct.__dict__, "oauth": microsoft()})
    steps = probe_account(acct)
    token = next(s for s in steps if s.name == "token")
    assert not token.ok and token.detail.startswith("Microsoft identity platform refused the token request: "
                                                    "invalid_grant (AADSTS65001: The user or administrator")
    assert "Grant admin consent" in token.fix and "SMTP.SendAsApp" in token.fix
    assert "AUTH" not in [s.name for s in steps] and handler.logins == []
    # the session says goodbye (QUIT) as it gives up; the failed step is reported after it
    assert [(s.name, s.ok) for s in steps][-2:] == [("QUIT", True), ("token", False)]
