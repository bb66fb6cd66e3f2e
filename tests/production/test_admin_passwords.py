"""Staff passwords pass Django's four validators, minimum length 12: `changepassword`, an
interactive `createsuperuser` (both run exactly as docs/operations.md prints them, on a
terminal) and the admin's own password change form refuse "1" and keep the old password.
Before AUTH_PASSWORD_VALIDATORS was set, each of them took "1"."""

from __future__ import annotations

import uuid

import pytest

from devstack.envfile import write_env
from devstack.roles import manage
from devstack.secrets_env import role_environment, stack_file_env
from tests.production import test_admin_role
from tests.production.test_admin_role import (
    csrf_session,
    documented,
    log_in,
    make_staff,
    run_as_printed,
)

# The admin role's fixtures: a migrated paydb (module) and a fresh admin on it (per test).
paydb = test_admin_role.paydb
admin = test_admin_role.admin

pytestmark = [pytest.mark.live, pytest.mark.slow]

TOO_SHORT = "This password is too short. It must contain at least 12 characters."


def password_is(env: dict[str, str], user: str, password: str) -> bool:
    done = manage(
        [
            "shell",
            "-c",
            "from django.contrib.auth.models import User; "
            f"print(User.objects.get(username={user!r}).check_password({password!r}))",
        ],
        role_environment("admin", env),
        role="admin",
        capture=True,
    )
    return done.stdout.strip().splitlines()[-1] == "True"


@pytest.fixture
def stack_env(paydb, tmp_path):
    path = tmp_path / "stack.env"
    write_env(path, stack_file_env(paydb))
    return path


def test_interactive_createsuperuser_refuses_a_short_password(paydb, stack_env):
    user, good = f"new-{uuid.uuid4().hex[:8]}", f"Long-enough-{uuid.uuid4().hex[:12]}"
    code, out = run_as_printed(
        documented("createsuperuser"),
        stack_env,
        ("Username", user),
        ("Email address", ""),
        ("Password:", "1"),
        ("Password (again)", "1"),
        ("Bypass password validation", "N"),
        ("Password:", good),
        ("Password (again)", good),
    )
    assert code == 0 and TOO_SHORT in out, out
    assert "entirely numeric" in out, out
    assert password_is(paydb, user, good)
    assert not password_is(paydb, user, "1")


def test_changepassword_refuses_a_short_password_and_keeps_the_old_one(paydb, stack_env):
    user, old = f"staff-{uuid.uuid4().hex[:8]}", f"The-old-one-{uuid.uuid4().hex[:12]}"
    make_staff(paydb, user, old)
    code, out = run_as_printed(
        documented("changepassword").replace("<name>", user),
        stack_env,
        *[("Password:", "1"), ("Password (again)", "1")] * 3,
    )
    assert code != 0 and TOO_SHORT in out, out
    assert password_is(paydb, user, old)


def test_the_admin_password_change_form_refuses_a_short_password(paydb, admin):
    user, old = f"form-{uuid.uuid4().hex[:8]}", f"The-old-one-{uuid.uuid4().hex[:12]}"
    make_staff(paydb, user, old)
    session = csrf_session(admin.url)
    assert log_in(session, admin.url, user, old).status_code == 302
    page = f"{admin.url}/admin/password_change/"
    assert session.get(page, timeout=30).status_code == 200
    answer = session.post(
        page,
        data={
            "old_password": old,
            "new_password1": "1",
            "new_password2": "1",
            "csrfmiddlewaretoken": session.cookies["csrftoken"],
        },
        headers={"Referer": page},
        timeout=30,
        allow_redirects=False,
    )
    assert answer.status_code == 200, answer.status_code  # the form again, not the done page
    assert "This password is too short" in answer.text
    assert password_is(paydb, user, old)
