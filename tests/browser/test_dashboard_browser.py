"""The dashboard in a real browser (headless Chromium from Debian): what an
operator looks for is on the page, the page works without JavaScript and
loads nothing from elsewhere, a mail's timeline reads in order, and an
action is refused without MailqAdmin and confirmed with it.  The data layer
is faked (fake_dashboard.py); the procedures are tested against SQL Server."""

from __future__ import annotations

from urllib.parse import urlparse

import pytest
from fake_dashboard import FakeDashboardData
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

from mailq_db.dashboard.app import Dashboard

pytestmark = pytest.mark.browser

TOKEN = "browser-test-token-0123456789abcdef"


def log_in(browser, base: str, token: str = TOKEN) -> None:
    browser.delete_all_cookies()
    browser.get(base + "/")
    assert urlparse(browser.current_url).path == "/login"
    browser.find_element(By.ID, "token").send_keys(token)
    browser.find_element(By.ID, "login").click()
    # the login POST and its redirect complete before the test goes on (the cookie is set)
    WebDriverWait(browser, 20).until(
        lambda b: urlparse(b.current_url).path == "/" or b.find_elements(By.ID, "login-failed"))


def find(browser, element_id: str):
    """The element with this ID, once the page that has it has loaded (after a click)."""
    WebDriverWait(browser, 20).until(lambda b: b.find_elements(By.ID, element_id))
    return browser.find_element(By.ID, element_id)


def row(browser, table: str, account: str, run_mode: str | None = None):
    selector = f'#{table} tr[data-account="{account}"]'
    if run_mode:
        selector += f'[data-run-mode="{run_mode}"]'
    return browser.find_element(By.CSS_SELECTOR, selector)


def cell(tr, cls: str) -> str:
    return tr.find_element(By.CSS_SELECTOR, f"td.{cls}").text


def test_the_overview_shows_depth_age_throughput_failures_blocks_and_tasks(browser, serve_dashboard, screenshot):
    base = serve_dashboard(Dashboard(FakeDashboardData(), token=TOKEN))
    log_in(browser, base)
    assert urlparse(browser.current_url).path == "/"
    prod = row(browser, "queue", "default", "prod")
    assert (cell(prod, "unsent"), cell(prod, "sending"), cell(prod, "sendable")) == ("42", "3", "40")
    assert cell(prod, "age") == "12 min 34 s"
    bulk = row(browser, "queue", "bulk", "prod")
    assert cell(bulk, "due") == "12" and cell(bulk, "sendable") == "0" and "blocked" in bulk.text
    account = row(browser, "accounts", "bulk")
    assert cell(account, "blocked") == "yes"
    assert cell(account, "reason") == "421 4.7.0 Too many connections <script>x</script>"  # shown, not run
    sent = [int(td.text) for td in browser.find_elements(By.CSS_SELECTOR, "#throughput td.sent")]
    assert sorted(sent) == [0, 0, 0, 20, 21, 22]  # per minute: default 20, 21, 22; bulk only waited
    classes = [td.text for td in browser.find_elements(By.CSS_SELECTOR, "#failures td.class")]
    assert classes[0] == "4xx" and "5xx" in classes
    assert browser.find_element(By.CSS_SELECTOR, "#delay td.overdue").text == "2"
    assert browser.find_element(By.CSS_SELECTOR, "#delay td.pending").text == "7"
    # what an operator reads first is on top, in the first screen, marked as the alerts judge it
    summary = browser.find_element(By.ID, "summary")
    assert summary.location["y"] + summary.size["height"] < browser.get_window_size()["height"] / 2
    assert browser.find_element(By.CSS_SELECTOR, "#sum-oldest .value").text == "12 min 34 s"
    assert browser.find_element(By.CSS_SELECTOR, "#sum-failures .value").text == "26 %"
    assert browser.find_element(By.CSS_SELECTOR, "#sum-blocked .detail").text == "bulk"
    assert browser.find_element(By.CSS_SELECTOR, "#sum-delay .value").text == "2"
    alerting = {e.get_attribute("id") for e in browser.find_elements(By.CSS_SELECTOR, "#summary .card.alert")}
    assert alerting == {"sum-failures", "sum-blocked", "sum-delay"}
    screenshot("overview")


def test_the_page_needs_no_javascript_and_nothing_from_elsewhere(browser, serve_dashboard):
    base = serve_dashboard(Dashboard(FakeDashboardData(), token=TOKEN))
    log_in(browser, base)
    assert browser.find_elements(By.TAG_NAME, "script") == []
    origin = urlparse(base).netloc
    for tag, attr in (("link", "href"), ("img", "src"), ("a", "href"), ("form", "action")):
        for element in browser.find_elements(By.TAG_NAME, tag):
            assert urlparse(element.get_attribute(attr)).netloc == origin, element.get_attribute(attr)
    # the stylesheet loaded (same origin): the header is laid out as a flex row
    header = browser.find_element(By.TAG_NAME, "header")
    assert header.value_of_css_property("display") == "flex"


def test_a_mails_story_is_its_timeline_attempts_and_recipients(browser, serve_dashboard, screenshot):
    base = serve_dashboard(Dashboard(FakeDashboardData(), token=TOKEN))
    log_in(browser, base)
    browser.find_element(By.ID, "mail-id").send_keys("4711")
    browser.find_element(By.ID, "show-mail").click()
    assert find(browser, "mail-status").text == "Sent"
    assert browser.find_element(By.ID, "message-id").text == "<4711.abc@mailq.example>"
    events = [td.text for td in browser.find_elements(By.CSS_SELECTOR, "#timeline tr.event td.type")]
    assert events == ["Enqueued", "Claimed", "RetryScheduled", "Claimed", "Sent"]
    assert [td.text for td in browser.find_elements(By.CSS_SELECTOR, "#attempts td.outcome")] == ["Retry", "Sent"]
    assert [td.text for td in browser.find_elements(By.CSS_SELECTOR, "#attempts td.queue-id")] == ["", "4XyZ12AbC"]
    assert "ann@example.org" in browser.find_element(By.ID, "recipients").text
    screenshot("mail-story")


def test_a_wrong_token_is_refused(browser, serve_dashboard):
    base = serve_dashboard(Dashboard(FakeDashboardData(), token=TOKEN))
    log_in(browser, base, token="not-the-token-at-all")
    assert find(browser, "login-failed").is_displayed()
    browser.get(base + "/mail?id=1")
    assert urlparse(browser.current_url).path == "/login"


def test_an_action_is_refused_without_mailqadmin(browser, serve_dashboard, screenshot):
    data = FakeDashboardData(admin=False)
    base = serve_dashboard(Dashboard(data, token=TOKEN, allow_actions=True))
    log_in(browser, base)
    browser.get(base + "/find?status=Failed&account=default")
    assert len(browser.find_elements(By.CSS_SELECTOR, "#found tbody tr")) == 2
    browser.find_element(By.ID, "action-requeue").click()
    error = find(browser, "error")
    assert "Refused" in error.text and "MailqAdmin" in error.text
    assert not [c for c in data.calls if c[0] == "requeue"]
    screenshot("action-refused")


@pytest.mark.parametrize("admin_by_role", [True])
def test_an_action_is_listed_confirmed_then_done(browser, serve_dashboard, screenshot, admin_by_role):
    data = FakeDashboardData(admin=admin_by_role)
    base = serve_dashboard(Dashboard(data, token=TOKEN, allow_actions=True))
    log_in(browser, base)
    browser.get(base + "/find?status=UnSent&account=default")
    browser.find_element(By.ID, "action-cancel").click()
    assert find(browser, "confirm-title").text == "Cancel 3 UnSent mail(s) of default?"
    assert not [c for c in data.calls if c[0] == "cancel"]  # listing changes nothing
    screenshot("action-confirm")
    browser.find_element(By.ID, "confirm").click()
    assert find(browser, "done").text == "Cancel: 2 mail(s) changed, 1 left alone"
    assert [c for c in data.calls if c[0] == "cancel"] == [("cancel", [101, 102, 103])]
    screenshot("action-done")


class Mounted:
    """What `location /mailq/ { proxy_pass http://127.0.0.1:8470/; }` does to the
    path: the browser asks for /mailq/..., the application sees /...; anything
    outside the prefix is not the dashboard's (nginx would serve it elsewhere)."""

    prefix = "/mailq"

    def __init__(self, app: Dashboard) -> None:
        self.app, self.token = app, app.token

    def __call__(self, environ, start_response):
        path = environ.get("PATH_INFO", "")
        if not path.startswith(self.prefix + "/"):
            start_response("404 Not Found", [("Content-Type", "text/plain")])
            return [b"not the dashboard's path\n"]
        environ["PATH_INFO"] = path[len(self.prefix):]
        return self.app(environ, start_response)


def test_the_page_works_under_a_proxys_path_prefix(browser, serve_dashboard, screenshot):
    data = FakeDashboardData(admin=True)
    base = serve_dashboard(Mounted(Dashboard(data, token=TOKEN, allow_actions=True))) + "/mailq"
    browser.delete_all_cookies()
    browser.get(base + "/")
    assert urlparse(browser.current_url).path == "/mailq/login"
    browser.find_element(By.ID, "token").send_keys(TOKEN)
    browser.find_element(By.ID, "login").click()
    WebDriverWait(browser, 20).until(lambda b: b.find_elements(By.ID, "summary"))
    assert urlparse(browser.current_url).path == "/mailq/"
    # the stylesheet came through the prefix: the header is laid out as a flex row
    assert browser.find_element(By.TAG_NAME, "header").value_of_css_property("display") == "flex"
    browser.find_element(By.LINK_TEXT, "Find mail").click()
    WebDriverWait(browser, 20).until(lambda b: urlparse(b.current_url).path == "/mailq/find")
    browser.get(base + "/find?status=UnSent&account=default")
    browser.find_element(By.LINK_TEXT, "101").click()
    assert find(browser, "mail-status").text == "Sent" and urlparse(browser.current_url).path == "/mailq/mail"
    browser.get(base + "/find?status=UnSent&account=default")
    browser.find_element(By.ID, "action-cancel").click()
    find(browser, "confirm")
    assert urlparse(browser.current_url).path == "/mailq/actions/cancel"
    browser.find_element(By.ID, "confirm").click()
    assert find(browser, "done").text == "Cancel: 2 mail(s) changed, 1 left alone"
    browser.find_element(By.LINK_TEXT, "Back to the queue").click()
    WebDriverWait(browser, 20).until(lambda b: b.find_elements(By.ID, "summary"))
    assert urlparse(browser.current_url).path == "/mailq/"
    screenshot("behind-a-proxy-prefix")
