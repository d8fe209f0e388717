"""The dashboard's WSGI application against a fake data layer: access, the
confirm step, CSRF, the role check and escaping (the page in a real browser:
tests/browser/test_dashboard_browser.py)."""

from __future__ import annotations

import io
import re
import urllib.parse
from wsgiref.util import setup_testing_defaults

import pytest
from fake_dashboard import FakeDashboardData

from mailq_db.commands.dashboard import read_token
from mailq_db.dashboard.app import Dashboard, is_loopback, make_dashboard_server
from mailq_db.errors import ConfigurationError

TOKEN = "t0ken-for-the-unit-tests-0123456789"


def call(app, path, *, method="GET", form=None, headers=None):
    environ: dict = {}
    setup_testing_defaults(environ)
    path, _, query = path.partition("?")
    body = urllib.parse.urlencode(form or {}).encode()
    environ.update({"REQUEST_METHOD": method, "PATH_INFO": path, "QUERY_STRING": query,
                    "CONTENT_LENGTH": str(len(body)), "wsgi.input": io.BytesIO(body),
                    "CONTENT_TYPE": "application/x-www-form-urlencoded"})
    environ.update(headers or {})
    seen = {}

    def start_response(status, response_headers):
        seen["status"] = int(status.split()[0])
        seen["headers"] = response_headers

    text = b"".join(app(environ, start_response)).decode()
    return seen["status"], dict(seen["headers"]), text


BEARER = {"HTTP_AUTHORIZATION": f"Bearer {TOKEN}"}


def test_every_page_but_login_needs_the_token():
    app = Dashboard(FakeDashboardData(), token=TOKEN)
    status, headers, _ = call(app, "/")
    assert status == 303 and headers["Location"] == "/login"
    assert call(app, "/actions/cancel", method="POST")[0] == 401
    assert call(app, "/", headers={"HTTP_AUTHORIZATION": "Bearer wrong"})[0] == 303
    status, headers, text = call(app, "/", headers=BEARER)
    assert status == 200 and 'data-seconds="754"' in text
    assert "default-src 'none'" in headers["Content-Security-Policy"]


def test_login_sets_a_strict_http_only_cookie_that_opens_the_pages():
    app = Dashboard(FakeDashboardData(), token=TOKEN)
    assert call(app, "/login", method="POST", form={"token": "nope"})[0] == 401
    status, headers, _ = call(app, "/login", method="POST", form={"token": TOKEN})
    assert status == 303
    cookie = headers["Set-Cookie"]
    assert "HttpOnly" in cookie and "SameSite=Strict" in cookie and TOKEN not in cookie
    value = cookie.split(";")[0]
    assert call(app, "/", headers={"HTTP_COOKIE": value})[0] == 200
    other = Dashboard(FakeDashboardData(), token=TOKEN)  # another process: another secret
    assert call(other, "/", headers={"HTTP_COOKIE": value})[0] == 303


def test_the_page_escapes_what_the_database_says():
    app = Dashboard(FakeDashboardData(), token=TOKEN)
    text = call(app, "/", headers=BEARER)[2]
    assert "<script>x</script>" not in text and "&lt;script&gt;x&lt;/script&gt;" in text


def test_actions_are_off_by_default():
    data = FakeDashboardData(admin=True)
    app = Dashboard(data, token=TOKEN)
    assert "Unblock" not in call(app, "/", headers=BEARER)[2]
    status, _, text = call(app, "/actions/cancel?status=UnSent", headers=BEARER)
    assert status == 403 and "--allow-actions" in text
    status, _, _ = call(app, "/actions/unblock", method="POST", headers=BEARER,
                        form={"account": "bulk", "confirm": "yes", "csrf": "x"})
    assert status == 403 and not [c for c in data.calls if c[0] in ("cancel", "unblock")]


def test_without_mailqadmin_the_confirm_step_is_refused():
    data = FakeDashboardData(admin=False)
    app = Dashboard(data, token=TOKEN, allow_actions=True)
    status, _, text = call(app, "/actions/requeue?status=Failed&account=default", headers=BEARER)
    assert status == 403 and "MailqAdmin" in text
    assert ("find_mail", ("Failed", "default", None, 100)) not in data.calls


def confirm(app, path):
    status, _, text = call(app, path, headers=BEARER)
    assert status == 200, text
    ids = re.search(r'name="ids" value="([^"]*)"', text).group(1)
    csrf = re.search(r'name="csrf" value="([0-9a-f]+)"', text).group(1)
    return ids, csrf


def test_a_confirmed_action_changes_exactly_the_mails_listed():
    data = FakeDashboardData(admin=True)
    app = Dashboard(data, token=TOKEN, allow_actions=True)
    ids, csrf = confirm(app, "/actions/cancel?status=UnSent&account=default")
    assert ids == "101,102,103"
    # not confirmed, a forged token, or other IDs than the ones confirmed: nothing happens
    for form in ({"ids": ids, "csrf": csrf}, {"ids": ids, "csrf": "0" * 64, "confirm": "yes"},
                 {"ids": "101,102,103,104", "csrf": csrf, "confirm": "yes"}):
        assert call(app, "/actions/cancel", method="POST", form=form, headers=BEARER)[0] == 403
    assert not [c for c in data.calls if c[0] == "cancel"]
    # the requeue form's token does not cancel
    assert call(app, "/actions/requeue", method="POST", headers=BEARER,
                form={"ids": ids, "csrf": csrf, "confirm": "yes"})[0] == 403
    status, _, text = call(app, "/actions/cancel", method="POST", headers=BEARER,
                           form={"ids": ids, "csrf": csrf, "confirm": "yes"})
    assert status == 200 and "2 mail(s) changed, 1 left alone" in text
    assert data.calls[-1] == ("cancel", [101, 102, 103])


def test_cancel_applies_to_unsent_mail_only():
    app = Dashboard(FakeDashboardData(admin=True), token=TOKEN, allow_actions=True)
    assert call(app, "/actions/cancel?status=Failed", headers=BEARER)[0] == 400
    assert call(app, "/actions/requeue?status=UnSent", headers=BEARER)[0] == 400


def test_the_database_refusing_is_shown_as_refused():
    data = FakeDashboardData(admin=True, refuse_in_database=True)
    app = Dashboard(data, token=TOKEN, allow_actions=True)
    account = "bulk"
    status, _, text = call(app, f"/actions/unblock?account={account}", headers=BEARER)
    csrf = re.search(r'name="csrf" value="([0-9a-f]+)"', text).group(1)
    status, _, text = call(app, "/actions/unblock", method="POST", headers=BEARER,
                           form={"account": account, "csrf": csrf, "confirm": "yes"})
    assert status == 403 and "EXECUTE permission was denied" in text and data.calls[-1] == ("unblock", "bulk")


def test_a_mail_story_shows_the_timeline_and_the_relays_queue_id():
    app = Dashboard(FakeDashboardData(), token=TOKEN)
    status, _, text = call(app, "/mail?id=4711", headers=BEARER)
    assert status == 200 and "&lt;4711.abc@mailq.example&gt;" in text
    assert text.count('class="event"') == 5 and "4XyZ12AbC" in text
    assert call(app, "/mail?id=900001", headers=BEARER)[0] == 404
    assert call(app, "/mail?id=x", headers=BEARER)[0] == 400


def test_without_a_token_only_loopback_is_served():
    app = Dashboard(FakeDashboardData(), token=None)
    assert call(app, "/")[0] == 200
    with pytest.raises(ValueError, match="without a token"):
        make_dashboard_server(app, "0.0.0.0", 0)
    server = make_dashboard_server(app, "127.0.0.1", 0)
    server.server_close()
    assert is_loopback("::1") and is_loopback("localhost") and not is_loopback("10.0.0.1")


def test_the_token_comes_from_the_environment_or_a_file(tmp_path):
    assert read_token(None, {}) is None
    assert read_token(None, {"MAILQ_DASHBOARD_TOKEN": TOKEN}) == TOKEN
    path = tmp_path / "token"
    path.write_text(TOKEN + "\nsecond line\n")
    assert read_token(str(path), {}) == TOKEN
    with pytest.raises(ConfigurationError, match="at least 16"):
        read_token(None, {"MAILQ_DASHBOARD_TOKEN": "short"})
