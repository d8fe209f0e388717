"""The dashboard's WSGI application against a fake data layer: access, the
confirm step, CSRF, the role check and escaping (the page in a real browser:
tests/browser/test_dashboard_browser.py)."""

from __future__ import annotations

import io
import re
import urllib.parse
from pathlib import Path
from wsgiref.util import setup_testing_defaults

import pytest
from fake_dashboard import FakeDashboardData

from mailq_db.commands.dashboard import read_token
from mailq_db.dashboard.app import (
    FAILURE_RATIO_ALERT, OLDEST_SENDABLE_ALERT_SECONDS, Dashboard, is_loopback, make_dashboard_server, relative_root,
)
from mailq_db.errors import ConfigurationError

TOKEN = "t0ken-for-the-unit-tests-0123456789"
ROOT = Path(__file__).resolve().parents[2]


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
    assert status == 303 and headers["Location"] == "./login"
    assert call(app, "/actions/cancel")[1]["Location"] == "../login"  # relative: works under a proxy's prefix
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


def test_without_a_token_a_rebound_host_name_is_refused():
    """DNS rebinding: a page at http://evil.example:8470/ whose name now resolves to
    127.0.0.1 reaches the loopback dashboard through the operator's browser, with its
    own Host.  Without a token only loopback Hosts (and names allowed) are answered."""
    data = FakeDashboardData(admin=True)
    app = Dashboard(data, token=None, allow_actions=True)
    for host in ("evil.example:8470", "evil.example", "127.0.0.1.evil.example:8470", "[::2]:8470"):
        for path in ("/", "/mail?id=1", "/actions/cancel?status=UnSent"):
            status, _, text = call(app, path, headers={"HTTP_HOST": host})
            assert status == 403 and "--allow-host" in text, (host, path)
    assert data.calls == []  # nothing was read for them
    for host in ("127.0.0.1:8470", "localhost:8470", "LOCALHOST", "[::1]:8470", "127.0.0.2"):
        assert call(app, "/", headers={"HTTP_HOST": host})[0] == 200, host
    allowed = Dashboard(FakeDashboardData(), token=None, allowed_hosts=["mailq.internal.example"])
    assert call(allowed, "/", headers={"HTTP_HOST": "mailq.internal.example:443"})[0] == 200
    assert call(allowed, "/", headers={"HTTP_HOST": "evil.example"})[0] == 403
    # with a token the token guards the page, whatever the Host
    assert call(Dashboard(FakeDashboardData(), token=TOKEN), "/",
                headers={"HTTP_HOST": "mailq.example", **BEARER})[0] == 200


def test_every_link_form_and_redirect_is_relative():
    """Behind `location /mailq/ { proxy_pass http://127.0.0.1:8470/; }` a link to
    /find would leave the prefix: every URL the pages carry is relative."""
    assert (relative_root("/"), relative_root("/mail"), relative_root("/actions/cancel")) == ("./", "./", "../")
    app = Dashboard(FakeDashboardData(admin=True), token=TOKEN, allow_actions=True)
    pages = ["/", "/mail?id=4711", "/find?status=UnSent", "/actions/cancel?status=UnSent", "/actions/unblock?account=b",
             "/nowhere"]
    for path in pages:
        text = call(app, path, headers=BEARER)[2]
        urls = re.findall(r'(?:href|action|src)="([^"]*)"', text)
        assert urls and not [u for u in urls if u.startswith("/") or "//" in u], (path, urls)
        assert f'<base href="{relative_root(path.split("?")[0])}">' in text
    assert "Path=" not in call(app, "/login", method="POST", form={"token": TOKEN})[1]["Set-Cookie"]


def test_the_page_may_not_be_framed():
    headers = call(Dashboard(FakeDashboardData(), token=TOKEN), "/", headers=BEARER)[1]
    assert headers["X-Frame-Options"] == "DENY" and "frame-ancestors 'none'" in headers["Content-Security-Policy"]


def test_the_summary_on_top_judges_as_the_alerts_do():
    text = call(Dashboard(FakeDashboardData(), token=TOKEN), "/", headers=BEARER)[2]
    assert text.index('id="summary"') < text.index('id="queue"')
    cards = {card: marked for marked, card in re.findall(r'<div class="card( alert)?" id="(sum-[a-z]+)">', text)}
    # 12 min 34 s is under 15 minutes; 22 of 85 attempts failed, bulk 15 of 15 (5 a minute);
    # bulk is blocked; 2 delayed tasks are overdue
    assert cards == {"sum-oldest": "", "sum-queued": "", "sum-failures": " alert", "sum-blocked": " alert",
                     "sum-delay": " alert"}
    assert "12 min 34 s" in text and "default / prod" in text and "26 %" in text and "worst: bulk 100 %" in text


def test_the_summarys_thresholds_are_the_alert_rules():
    import yaml

    rules = yaml.safe_load((ROOT / "docs/monitoring/alerts.yml").read_text())
    expr = {r["alert"]: r["expr"] for g in rules["groups"] for r in g["rules"]}
    assert f"> {OLDEST_SENDABLE_ALERT_SECONDS}" in expr["MailqOldestSendableMailTooOld"]
    assert f") > {FAILURE_RATIO_ALERT}" in expr["MailqFailureRatioHigh"]
    assert ">= 1" in expr["MailqFailureRatioHigh"]


def test_the_mail_page_escapes_subjects_addresses_and_replies():
    from dataclasses import replace

    import fake_dashboard

    hostile = '"><script>alert(1)</script>'
    story = fake_dashboard.mail_story(7)
    story.history.mail.update(Subject=hostile, ToAddress=f"x{hostile}@example.org", FromAddress=hostile)
    story.history.attempts[1]["ErrorText"] = f"250 ok {hostile}"
    story.history.recipients[0]["SmtpText"] = hostile
    story.events[-1] = replace(story.events[-1], detail=hostile)

    class Data(FakeDashboardData):
        def mail_story(self, mail_id):
            return story

    text = call(Dashboard(Data(), token=TOKEN), "/mail?id=7", headers=BEARER)[2]
    assert "<script>" not in text and text.count("&#34;&gt;&lt;script&gt;alert(1)&lt;/script&gt;") >= 5


def test_the_overview_stops_asking_for_delayed_execution_where_it_is_absent(monkeypatch):
    """DB calls per page view: GetQueueMetrics and GetTaskMetrics; where delayed
    execution is not deployed (2812), GetQueueMetrics alone for the next 10 minutes."""
    import fake_dashboard

    from mailq_db import procedures
    from mailq_db.dashboard.data import DELAY_PROBE_SECONDS, DatabaseData
    from mailq_db.errors import DatabaseError

    calls = []

    def get_queue_metrics(conn, **kwargs):
        calls.append("GetQueueMetrics")
        return fake_dashboard.queue_metrics()

    def get_delay_task_metrics(conn, **kwargs):
        calls.append("GetTaskMetrics")
        raise DatabaseError(2812, "Could not find stored procedure 'delay.GetTaskMetrics'.")

    monkeypatch.setattr(procedures, "get_queue_metrics", get_queue_metrics)
    monkeypatch.setattr(procedures, "get_delay_task_metrics", get_delay_task_metrics)
    now = [1000.0]
    data = DatabaseData(lambda: object(), clock=lambda: now[0])
    app = Dashboard(data, token=TOKEN)
    for _ in range(3):
        status, _, text = call(app, "/", headers=BEARER)
        assert status == 200 and 'id="delay-absent"' in text
    assert calls == ["GetQueueMetrics", "GetTaskMetrics", "GetQueueMetrics", "GetQueueMetrics"]
    now[0] += DELAY_PROBE_SECONDS
    data.overview()
    assert calls[-2:] == ["GetQueueMetrics", "GetTaskMetrics"]  # asked again: it may be deployed since


def test_a_bulk_requeue_skips_a_mail_whose_every_recipient_is_suppressed(monkeypatch):
    """Suppression stops queued mail (Stopped), which the dashboard offers to
    requeue; mailq.RequeueMail refuses such a mail with 50600.  That one mail
    is left alone and said so; the mails after it are still requeued."""
    from mailq_db import procedures
    from mailq_db.dashboard.data import DatabaseData
    from mailq_db.errors import class_for

    done = []

    def requeue_mail(conn, *, mail_id):
        if mail_id == 2:
            raise class_for(50600)(50600, "Mail 2: every recipient is suppressed (mailq.RemoveSuppression first): a@x")
        done.append(mail_id)

    monkeypatch.setattr(procedures, "requeue_mail", requeue_mail)
    outcome = DatabaseData(lambda: object()).requeue([1, 2, 3])
    assert done == [1, 3] and outcome.done == [1, 3]
    assert list(outcome.skipped) == [2] and "suppressed" in outcome.skipped[2]
