"""A real browser against the live stack: Debian's chromium + chromedriver, headless, driven by
Selenium, with Chrome's performance log on so a test can list every request a page made."""

from __future__ import annotations

import json
import shutil
import textwrap
from pathlib import Path
from urllib.parse import urlsplit

import psycopg
import pytest
from selenium import webdriver
from selenium.common.exceptions import WebDriverException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions as ec
from selenium.webdriver.support.ui import WebDriverWait

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
ADMIN_USER = "ops-browser"
ADMIN_PASSWORD = "a-long-browser-passphrase-1"


@pytest.fixture(scope="session")
def browser():
    for binary in (CHROMIUM, CHROMEDRIVER):
        if not Path(binary).exists():
            pytest.fail(f"{binary} is missing: scripts/sysdeps.sh installs chromium + driver")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"):
        options.add_argument(arg)
    options.add_argument("--window-size=1280,1000")
    # No background traffic of the browser's own (updates, safe browsing) in the request list.
    options.add_argument("--disable-background-networking")
    options.add_argument("--disable-component-update")
    options.add_argument("--no-first-run")
    # performance: every request a page made; browser: the console (CSP violations land there)
    options.set_capability("goog:loggingPrefs", {"performance": "ALL", "browser": "ALL"})
    driver = webdriver.Chrome(
        service=Service(shutil.which(CHROMEDRIVER) or CHROMEDRIVER), options=options
    )
    driver.set_page_load_timeout(60)
    yield driver
    driver.quit()


def wait_for(driver, css: str, timeout: float = 30):
    return WebDriverWait(driver, timeout).until(
        ec.presence_of_element_located((By.CSS_SELECTOR, css))
    )


def submit_login_form(driver, base: str, user: str, password: str) -> None:
    """Fill the admin login form and submit it; return once the browser holds the answer.

    The old form going stale is the signal. While chromium swaps documents, asking about the
    old node can also fail with an inspector error ("Node with given id does not belong to the
    document") instead of a stale-element one; that is the same swap under way, so the wait
    polls again rather than failing."""
    driver.get(f"{base}/admin/login/?next=/admin/")
    driver.find_element(By.NAME, "username").send_keys(user)
    driver.find_element(By.NAME, "password").send_keys(password)
    submit = driver.find_element(By.CSS_SELECTOR, "input[type=submit]")
    submit.click()
    WebDriverWait(driver, 30, ignored_exceptions=(WebDriverException,)).until(
        ec.staleness_of(submit)
    )


def requested_urls(driver) -> list[str]:
    """Every URL the page asked the network for since the last call (CDP Network events)."""
    urls = []
    for entry in driver.get_log("performance"):
        message = json.loads(entry["message"])["message"]
        if message["method"] == "Network.requestWillBeSent":
            urls.append(message["params"]["request"]["url"])
    return urls


def off_loopback(urls: list[str]) -> list[str]:
    return [
        u
        for u in urls
        if urlsplit(u).scheme not in ("data", "blob", "about")
        and urlsplit(u).hostname != "127.0.0.1"
    ]


@pytest.fixture(scope="session")
def admin_user(live_stack):
    """A staff superuser in the live paydb, created the way an operator does (manage.py)."""
    live_stack.manage(
        "shell",
        "-c",
        textwrap.dedent(
            f"""
            from django.contrib.auth.models import User
            User.objects.filter(username={ADMIN_USER!r}).delete()
            User.objects.create_superuser({ADMIN_USER!r}, password={ADMIN_PASSWORD!r})
            """
        ),
    )
    return ADMIN_USER, ADMIN_PASSWORD


def paydb(live_stack, statement: str, params: tuple = ()) -> list[tuple]:
    with psycopg.connect(live_stack.env["PAY_DATABASE_URL"], autocommit=True) as conn:
        cur = conn.execute(statement, params)
        return cur.fetchall() if cur.description else []
