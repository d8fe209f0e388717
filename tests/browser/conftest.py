"""Headless Chromium from Debian (chromium + chromium-driver) driving the
dashboard through selenium, with no browser download (the system
chromedriver is given by path; SE_OFFLINE keeps Selenium Manager off the
network).  In CI (.ci/run installs both packages) a missing browser fails
the run; elsewhere these tests skip with the reason."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import threading
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit"))  # fake_dashboard

ROOT = Path(__file__).resolve().parents[2]
#: where the screenshots go (CI keeps them as artifacts; git ignores artifacts/)
SCREENSHOTS = Path(os.environ.get("MAILQ_ARTIFACTS", ROOT / "artifacts")) / "screenshots"
CHROMIUM = ("/usr/bin/chromium", "/usr/bin/chromium-browser")
CHROMEDRIVER = ("/usr/bin/chromedriver", "/usr/lib/chromium/chromedriver")
FLAGS = ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--no-first-run", "--disable-sync", "--window-size=1400,1000")


def _first(paths: tuple[str, ...], name: str) -> str | None:
    found = [p for p in paths if os.path.exists(p)]
    return found[0] if found else shutil.which(name)


def _missing(reason: str) -> None:
    if os.environ.get("CI"):
        pytest.fail(f"{reason}: .ci/run installs chromium and chromium-driver")
    pytest.skip(reason)


@pytest.fixture(scope="session")
def browser():
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        _missing("selenium is not installed (pip install -e '.[test]')")
    binary = _first(CHROMIUM, "chromium")
    driver_path = _first(CHROMEDRIVER, "chromedriver")
    if not binary or not driver_path:
        _missing("Debian's chromium and chromium-driver are not installed")
    os.environ["SE_OFFLINE"] = "true"  # never let Selenium Manager download anything
    profile = tempfile.mkdtemp(prefix="mailq-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = binary
    for flag in (*FLAGS, f"--user-data-dir={profile}"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(driver_path), options=options)
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


@pytest.fixture
def serve_dashboard():
    """serve_dashboard(app) -> base URL; every server started is stopped after the test."""
    from mailq_db.dashboard.app import make_dashboard_server

    servers = []

    def start(app) -> str:
        server = make_dashboard_server(app, "127.0.0.1", 0)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.server_address[1]}"

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


@pytest.fixture
def screenshot(browser):
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)

    def take(name: str) -> Path:
        path = SCREENSHOTS / f"{name}.png"
        assert browser.save_screenshot(str(path)), path
        return path

    return take
