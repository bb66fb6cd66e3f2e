"""An operator in headless Chromium against a live payments role under gunicorn, with the
production security headers: log in, find a quarantined payout, see why it is there, resolve it
only the safe way; and the docs pages of every role load without leaving 127.0.0.1."""

from __future__ import annotations

import json
import textwrap
import uuid

import pytest
import requests
from selenium.webdriver.common.by import By

from dlock.roles import SERVICE_NAMES
from tests.browser.conftest import off_loopback, paydb, requested_urls, submit_login_form, wait_for
from tests.conftest import ROLES

pytestmark = pytest.mark.live


def seed_quarantine(live_stack, classification: str | None, refs: list[str]) -> dict:
    """One RAIL_AMBIGUOUS payout (and its reconciliation) in the live paydb, through manage.py."""
    account_id = f"acct-br-{uuid.uuid4().hex[:10]}"
    code = textwrap.dedent(
        f"""
        import json
        from payments import seeding
        from payments.models import Payout, PayoutReconciliation
        seeding.create_account(account_id={account_id!r}, opening_balance_minor=5000)
        p = seeding.create_payout(account_id={account_id!r}, amount_minor=700)
        Payout.objects.filter(payout_id=p.payout_id).update(state="RAIL_AMBIGUOUS")
        if {classification!r}:
            PayoutReconciliation.objects.create(
                payout_id=p.payout_id, classification={classification!r},
                rail_transfer_count={len(refs)}, rail_references={refs!r})
        print(json.dumps({{"payout": str(p.payout_id), "account": {account_id!r}}}))
        """
    )
    out = live_stack.manage("shell", "-c", code).stdout
    return json.loads(out.strip().splitlines()[-1])


def log_in(driver, base: str, user: str, password: str) -> None:
    driver.delete_all_cookies()
    # the login page itself has #site-name: wait for the next page, then for a signed-in one
    submit_login_form(driver, base, user, password)
    wait_for(driver, "#user-tools")


def books(live_stack, account_id: str) -> tuple[int, int]:
    ((balance, ledger_sum),) = paydb(
        live_stack,
        """
        SELECT a.balance_minor,
               COALESCE(SUM(CASE WHEN e.direction = 'CREDIT' THEN e.amount_minor
                                 ELSE -e.amount_minor END), 0)
          FROM account a LEFT JOIN ledger_entry e ON e.account_id = a.account_id
         WHERE a.account_id = %s GROUP BY a.balance_minor
        """,
        (account_id,),
    )
    return int(balance), int(ledger_sum)


@pytest.fixture
def payments_url(admin_url):
    return admin_url  # the admin role (ROLE=admin), no longer payment-resource


def test_an_operator_logs_in_and_the_admin_is_styled_under_the_production_headers(
    browser, live_stack, admin_user, payments_url
):
    headers = requests.get(f"{payments_url}/admin/login/", timeout=10).headers
    assert headers["Referrer-Policy"] == "same-origin"
    assert headers["X-Frame-Options"] == "DENY"
    requested_urls(browser)  # drop what earlier tests left in the log

    log_in(browser, payments_url, *admin_user)

    assert browser.current_url == f"{payments_url}/admin/"
    assert "Site administration" in browser.page_source
    assert "Ledger entries" in browser.page_source
    # base.css arrived and applies: the header is styled, not the browser's default.
    header = browser.find_element(By.ID, "header")
    assert header.value_of_css_property("display") == "flex"
    assert any(u.endswith("/static/admin/css/base.css") for u in requested_urls(browser))
    css = requests.get(f"{payments_url}/static/admin/css/base.css", timeout=10)
    assert css.status_code == 200 and css.headers["Content-Type"].startswith("text/css")


def test_a_wrong_password_is_refused_in_the_browser(browser, live_stack, admin_user, payments_url):
    browser.delete_all_cookies()
    browser.get(f"{payments_url}/admin/login/")
    browser.find_element(By.NAME, "username").send_keys(admin_user[0])
    browser.find_element(By.NAME, "password").send_keys("not-the-password")
    browser.find_element(By.CSS_SELECTOR, "input[type=submit]").click()
    wait_for(browser, ".errornote")
    assert "/admin/login/" in browser.current_url
    assert "CSRF" not in browser.page_source


def test_an_operator_resolves_a_booked_once_payout_from_its_page(
    browser, live_stack, admin_user, payments_url
):
    seeded = seed_quarantine(live_stack, "BOOKED_ONCE", ["RR-BR-1"])
    log_in(browser, payments_url, *admin_user)

    # its own row by its own account (the list holds other tests' payouts, oldest first)
    browser.get(f"{payments_url}/admin/payments/quarantinedpayout/?q={seeded['account']}")
    browser.find_element(By.LINK_TEXT, seeded["payout"]).click()
    wait_for(browser, "#reconciliation")
    assert browser.find_element(By.CSS_SELECTOR, "#reconciliation .classification").text == (
        "BOOKED_ONCE"
    )
    assert "RR-BR-1" in browser.find_element(By.ID, "reconciliation").text
    assert not browser.find_elements(By.NAME, "_save")  # read-only: no misleading Save
    browser.find_element(By.ID, "resolve-link").click()

    wait_for(browser, "#resolve-form")
    browser.find_element(By.CSS_SELECTOR, "select[name=resolution] option[value=POSTED]").click()
    browser.find_element(By.NAME, "rail_reference").send_keys("RR-BR-1")
    browser.find_element(By.NAME, "note").send_keys("statement 2026-12-01 line 7 shows RR-BR-1")
    browser.find_element(By.ID, "resolve-submit").click()

    wait_for(browser, "ul.messagelist")
    assert "resolved as POSTED" in browser.find_element(By.CSS_SELECTOR, "ul.messagelist").text
    assert paydb(
        live_stack,
        "SELECT state, rail_reference FROM payout WHERE payout_id = %s",
        (seeded["payout"],),
    ) == [("POSTED", "RR-BR-1")]
    assert books(live_stack, seeded["account"]) == (4_300, 4_300)
    assert paydb(
        live_stack,
        "SELECT count(*) FROM django_admin_log WHERE object_id = %s",
        (seeded["payout"],),
    ) == [(1,)]
    assert paydb(
        live_stack,
        "SELECT from_state, to_state, owner_id FROM payout_event"
        " WHERE payout_id = %s AND owner_id LIKE 'operator:%%'",
        (seeded["payout"],),
    ) == [("RAIL_AMBIGUOUS", "POSTED", f"operator:{admin_user[0]}")]


def test_posting_a_not_booked_payout_is_refused_in_the_browser_and_nothing_moves(
    browser, live_stack, admin_user, payments_url
):
    seeded = seed_quarantine(live_stack, "NOT_BOOKED", [])
    log_in(browser, payments_url, *admin_user)

    browser.get(f"{payments_url}/admin/payments/quarantinedpayout/{seeded['payout']}/resolve/")
    wait_for(browser, "#resolve-form")
    browser.find_element(By.CSS_SELECTOR, "select[name=resolution] option[value=POSTED]").click()
    browser.find_element(By.NAME, "rail_reference").send_keys("RR-NOPE")
    browser.find_element(By.NAME, "note").send_keys("I think it went through")
    browser.find_element(By.ID, "resolve-submit").click()

    wait_for(browser, "ul.messagelist")
    assert "refused" in browser.find_element(By.CSS_SELECTOR, "ul.messagelist").text
    assert "NOT_BOOKED" in browser.find_element(By.CSS_SELECTOR, "ul.messagelist").text
    assert paydb(
        live_stack, "SELECT state FROM payout WHERE payout_id = %s", (seeded["payout"],)
    ) == [("RAIL_AMBIGUOUS",)]
    assert paydb(
        live_stack, "SELECT count(*) FROM ledger_entry WHERE payout_id = %s", (seeded["payout"],)
    ) == [(0,)]
    # The refusal itself is audited (issue 26): one "refused: …" history row, nothing else.
    (message,) = paydb(
        live_stack,
        "SELECT change_message FROM django_admin_log WHERE object_id = %s",
        (seeded["payout"],),
    )
    assert message[0].startswith("refused: resolve as POSTED")
    assert books(live_stack, seeded["account"]) == (5_000, 5_000)


@pytest.mark.parametrize("role", ROLES)
def test_swagger_ui_and_redoc_render_from_loopback_only_and_name_the_role(
    browser, live_stack, role
):
    base = live_stack.url(role)
    requested_urls(browser)
    browser.get_log("browser")  # drop what earlier tests left in the console
    browser.get(f"{base}/v1/docs")
    wait_for(browser, ".swagger-ui .info .title", timeout=60)
    assert SERVICE_NAMES[role] in browser.title
    assert SERVICE_NAMES[role] in browser.find_element(By.CSS_SELECTOR, ".info .title").text
    browser.get(f"{base}/v1/redoc")
    wait_for(browser, ".api-content", timeout=60)
    assert SERVICE_NAMES[role] in browser.title
    # both render under their hash-based CSP without a single violation (issue 38 item 6)
    console = [e["message"] for e in browser.get_log("browser")]
    assert not [m for m in console if "Content Security Policy" in m], console
    for page in ("/v1/docs", "/v1/redoc"):
        policy = requests.get(f"{base}{page}", timeout=10).headers["Content-Security-Policy"]
        assert "default-src 'none'" in policy and "'sha256-" in policy, (page, policy)
        assert "'unsafe-inline'" not in policy.split("script-src")[1].split(";")[0]
    urls = requested_urls(browser)
    assert any("/static/drf_spectacular_sidecar/redoc/" in u for u in urls)
    assert any("/static/drf_spectacular_sidecar/swagger-ui-dist/" in u for u in urls)
    assert off_loopback(urls) == []


def test_v1_stays_json_next_to_the_static_files(live_stack):
    for role in ROLES:
        base = live_stack.url(role)
        missing = requests.get(f"{base}/v1/no-such-route", headers={"Accept": "text/html"})
        assert missing.status_code == 404
        assert missing.headers["Content-Type"] == "application/json; charset=utf-8"
        asset = requests.get(f"{base}/static/rest_framework/css/bootstrap.min.css", timeout=10)
        assert asset.status_code == 200 and asset.headers["Content-Type"].startswith("text/css")
        sneaky = requests.get(f"{base}/static/../settings/base.py", timeout=10)
        assert sneaky.status_code == 404 and sneaky.headers["Content-Type"].startswith(
            "application/json"
        )


def test_the_changelist_search_action_and_logout_forms_work_in_the_browser(
    browser, live_stack, admin_user, payments_url
):
    seeded = seed_quarantine(live_stack, "NOT_BOOKED", [])
    log_in(browser, payments_url, *admin_user)
    browser.get(f"{payments_url}/admin/payments/quarantinedpayout/")
    search = browser.find_element(By.ID, "searchbar")
    search.send_keys(seeded["account"])
    search.submit()
    wait_for(browser, "#result_list")
    rows = browser.find_elements(By.CSS_SELECTOR, "#result_list tbody tr")
    assert len(rows) == 1 and seeded["payout"] in rows[0].text

    rows[0].find_element(By.CSS_SELECTOR, "input.action-select").click()
    browser.find_element(
        By.CSS_SELECTOR, "select[name=action] option[value=resolve_selected]"
    ).click()
    browser.find_element(By.CSS_SELECTOR, "button[name=index]").click()
    wait_for(browser, "#resolve-form")
    browser.find_element(By.CSS_SELECTOR, "select[name=resolution] option[value=FAILED]").click()
    browser.find_element(By.NAME, "note").send_keys("reconciler: no transfer for this payout")
    browser.find_element(By.ID, "resolve-submit").click()

    wait_for(browser, "ul.messagelist")
    assert "resolved as FAILED" in browser.find_element(By.CSS_SELECTOR, "ul.messagelist").text
    assert paydb(
        live_stack, "SELECT state FROM payout WHERE payout_id = %s", (seeded["payout"],)
    ) == [("FAILED",)]
    assert books(live_stack, seeded["account"]) == (5_000, 5_000)

    browser.find_element(By.CSS_SELECTOR, "#logout-form button").click()
    wait_for(browser, "#content")
    browser.get(f"{payments_url}/admin/")
    assert "/admin/login/" in browser.current_url
