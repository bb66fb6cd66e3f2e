"""The admin's own password change form, in headless Chromium, refuses a short password with
the validator's message and keeps the old one (AUTH_PASSWORD_VALIDATORS, minimum length 12)."""

from __future__ import annotations

import textwrap
import uuid

import pytest
from selenium.webdriver.common.by import By

from tests.browser.conftest import submit_login_form, wait_for

pytestmark = pytest.mark.live


def test_the_password_change_form_refuses_a_short_password_in_the_browser(
    browser, live_stack, admin_url
):
    user, old = f"pw-{uuid.uuid4().hex[:8]}", f"The-old-one-{uuid.uuid4().hex[:12]}"
    live_stack.manage(
        "shell",
        "-c",
        textwrap.dedent(
            f"""
            from django.contrib.auth.models import User
            User.objects.create_superuser({user!r}, password={old!r})
            """
        ),
    )
    browser.delete_all_cookies()
    submit_login_form(browser, admin_url, user, old)
    browser.get(f"{admin_url}/admin/password_change/")
    browser.find_element(By.NAME, "old_password").send_keys(old)
    browser.find_element(By.NAME, "new_password1").send_keys("1")
    browser.find_element(By.NAME, "new_password2").send_keys("1")
    browser.find_element(By.CSS_SELECTOR, "input[type=submit]").click()
    wait_for(browser, ".errorlist")
    assert "/admin/password_change/" in browser.current_url
    assert "This password is too short" in browser.page_source
    checked = live_stack.manage(
        "shell",
        "-c",
        f"from django.contrib.auth.models import User; "
        f"print(User.objects.get(username={user!r}).check_password({old!r}))",
    )
    assert checked.stdout.strip().splitlines()[-1] == "True"
