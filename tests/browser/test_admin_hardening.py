"""The staff admin under a security review, in headless Chromium against the live admin role
(ROLE=admin; issues 24 and 38): a Content-Security-Policy on every admin page with the styled
admin intact (no violation in the console), a password guesser locked out (django-axes) with an
audit line and an unlock, and a staff user without a permission shown a 403 page, not JSON."""

from __future__ import annotations

import json
import textwrap
import uuid

import pytest
import requests
from selenium.webdriver.common.by import By

from devstack.roles import manage
from devstack.secrets_env import role_environment
from tests.browser.conftest import paydb, submit_login_form, wait_for
from tests.browser.test_admin_browser import log_in

pytestmark = pytest.mark.live

CSP = "Content-Security-Policy"


def make_staff(live_stack, *, superuser: bool) -> tuple[str, str]:
    """A staff user of the test's own (a superuser, or staff with no permission at all)."""
    user, password = f"staff-{uuid.uuid4().hex[:10]}", f"pw-{uuid.uuid4().hex}"
    create = "create_superuser" if superuser else "create_user"
    extra = "" if superuser else ", is_staff=True"
    live_stack.manage(
        "shell",
        "-c",
        textwrap.dedent(
            f"""
            from django.contrib.auth.models import User
            User.objects.{create}({user!r}, password={password!r}{extra})
            """
        ),
    )
    return user, password


def document_responses(driver) -> list[dict]:
    """The HTML documents the browser received since the last call: url, status, headers."""
    docs = []
    for entry in driver.get_log("performance"):
        message = json.loads(entry["message"])["message"]
        if message["method"] == "Network.responseReceived" and message["params"]["type"] == (
            "Document"
        ):
            response = message["params"]["response"]
            headers = {k.lower(): v for k, v in response["headers"].items()}
            docs.append({"url": response["url"], "status": response["status"], "headers": headers})
    return docs


def csp_violations(driver) -> list[str]:
    return [
        e["message"]
        for e in driver.get_log("browser")
        if "Content Security Policy" in e["message"] or "Content-Security-Policy" in e["message"]
    ]


def submit_login(driver, base: str, user: str, password: str) -> None:
    submit_login_form(driver, base, user, password)  # the answer, not the form
    wait_for(driver, "#content")


def admin_log_events(live_stack, event: str) -> list[dict]:
    found = []
    for line in live_stack.procs["admin"].logfile.read_text(errors="replace").splitlines():
        if line.startswith("{") and f'"{event}"' in line:
            record = json.loads(line)
            if record.get("event") == event:
                found.append(record)
    return found


def test_every_admin_page_has_a_csp_and_the_styled_admin_renders_without_violations(
    browser, live_stack
):
    base = live_stack.start_admin().url
    user = make_staff(live_stack, superuser=True)
    browser.delete_all_cookies()
    document_responses(browser), csp_violations(browser)  # drop what earlier tests left

    log_in(browser, base, *user)
    for page in (
        "/admin/",
        "/admin/payments/payout/",
        "/admin/payments/quarantinedpayout/",
        "/admin/payments/account/",
        "/admin/auth/user/",
        "/admin/auth/user/add/",
        "/admin/password_change/",
    ):
        browser.get(f"{base}{page}")
        wait_for(browser, "#content")
        # base.css arrived and applies under the policy: the header is styled
        assert browser.find_element(By.ID, "header").value_of_css_property("display") == "flex"

    docs = document_responses(browser)
    assert {d["url"].removeprefix(base).split("?")[0] for d in docs} >= {
        "/admin/login/",
        "/admin/",
        "/admin/payments/payout/",
        "/admin/auth/user/add/",
    }
    for doc in docs:
        policy = doc["headers"].get(CSP.lower(), "")
        assert "default-src 'none'" in policy, doc["url"]
        assert "script-src 'self'" in policy and "frame-ancestors 'none'" in policy, doc["url"]
        assert "unsafe-inline" not in policy and "unsafe-eval" not in policy
    assert csp_violations(browser) == []

    # the policy is enforced, not only sent: an inline script is refused by the browser
    browser.execute_script(
        "const s = document.createElement('script'); s.textContent = 'window.__ran = 1';"
        "document.head.appendChild(s);"
    )
    assert browser.execute_script("return window.__ran === undefined")
    assert csp_violations(browser)  # and the refusal is reported

    # pages a browser gets without logging in carry it too; the admin serves no /v1 (a JSON 404)
    assert "default-src 'none'" in requests.get(f"{base}/admin/login/", timeout=10).headers[CSP]
    api = requests.get(f"{base}/v1/payouts/{uuid.uuid4()}", timeout=10)
    assert api.status_code == 404 and api.json()["code"] == "NOT_FOUND"


def test_ten_wrong_passwords_lock_the_name_and_the_address_out_until_reset(browser, live_stack):
    base = live_stack.start_admin().url
    user, password = make_staff(live_stack, superuser=True)
    other = make_staff(live_stack, superuser=True)
    browser.delete_all_cookies()
    for attempt in range(10):
        submit_login(browser, base, user, f"guess-{attempt}")
    assert browser.find_elements(By.ID, "locked-out"), browser.page_source[:2000]

    # the right password now: refused with the lockout page, no session
    browser.delete_all_cookies()
    document_responses(browser)
    submit_login(browser, base, user, password)
    assert browser.find_elements(By.ID, "locked-out")
    assert "Too many failed log-ins" in browser.title or "Too many" in browser.page_source
    locked = [d for d in document_responses(browser) if "/admin/login/" in d["url"]]
    assert (
        locked[-1]["status"] == 429 and "default-src 'none'" in locked[-1]["headers"][CSP.lower()]
    )
    browser.get(f"{base}/admin/")
    assert "/admin/login/" in browser.current_url
    assert not browser.find_elements(By.ID, "user-tools")
    # a client without a browser gets the same answer
    with requests.Session() as s:
        s.get(f"{base}/admin/login/", timeout=10)
        reply = s.post(
            f"{base}/admin/login/?next=/admin/",
            data={
                "username": user,
                "password": password,
                "csrfmiddlewaretoken": s.cookies["csrftoken"],
            },
            headers={"Referer": f"{base}/admin/login/"},
            timeout=10,
            allow_redirects=False,
        )
        assert reply.status_code == 429 and "sessionid" not in s.cookies

    # the address is locked too (a sprayer trying other names gets nowhere): another operator
    # logging in from this same address is refused until the reset below
    browser.delete_all_cookies()
    submit_login(browser, base, *other)
    assert browser.find_elements(By.ID, "locked-out")

    # recorded: axes' attempt row, and one JSON audit line per failure and the lockout
    ((failures,),) = paydb(
        live_stack,
        "SELECT max(failures_since_start) FROM axes_accessattempt WHERE username = %s",
        (user,),
    )
    assert failures >= 5
    failed = [
        e for e in admin_log_events(live_stack, "admin_login_failed") if e["username"] == user
    ]
    assert len(failed) >= 5 and all(e["service"] == "admin" for e in failed)
    lockouts = [
        e for e in admin_log_events(live_stack, "admin_locked_out") if e["username"] == user
    ]
    assert lockouts and lockouts[0]["failureLimit"] == 5 and "clientIp" in lockouts[0]
    log_text = live_stack.procs["admin"].logfile.read_text(errors="replace")
    assert password not in log_text and "guess-3" not in log_text

    # an administrator unlocks the name as docs/operations.md prints it (ROLE=admin, no proof
    # ring); its failures were the address's, so both operators log in again
    reset = manage(
        ["axes_reset_username", user],
        role_environment("admin", live_stack.env),
        role="admin",
        capture=True,
    )
    assert reset.returncode == 0, reset.stderr
    log_in(browser, base, *other)
    assert browser.find_elements(By.ID, "user-tools")
    browser.delete_all_cookies()
    log_in(browser, base, user, password)
    assert browser.find_elements(By.ID, "user-tools")
    assert paydb(
        live_stack, "SELECT count(*) FROM axes_accessattempt WHERE username = %s", (user,)
    ) == [(0,)]


def test_a_staff_user_without_permissions_gets_a_403_page_not_json(browser, live_stack):
    base = live_stack.start_admin().url
    user = make_staff(live_stack, superuser=False)
    log_in(browser, base, *user)
    assert "You don’t have permission to view or edit anything" in browser.page_source
    document_responses(browser)

    for page in ("/admin/payments/payout/", "/admin/auth/user/add/"):
        browser.get(f"{base}{page}")
        wait_for(browser, "#permission-denied")
        assert "403" in browser.find_element(By.TAG_NAME, "h1").text
        assert browser.find_element(By.ID, "header").value_of_css_property("display") == "flex"
        assert not browser.page_source.lstrip().startswith("{")
    docs = [d for d in document_responses(browser) if "/admin/" in d["url"]]
    assert [d["status"] for d in docs] == [403, 403]
    assert all(d["headers"]["content-type"].startswith("text/html") for d in docs)
    assert all("default-src 'none'" in d["headers"][CSP.lower()] for d in docs)
    # nothing was shown or changed: the user is still without any permission
    assert paydb(
        live_stack,
        "SELECT count(*) FROM auth_user_user_permissions p JOIN auth_user u ON u.id = p.user_id"
        " WHERE u.username = %s",
        (user[0],),
    ) == [(0,)]
