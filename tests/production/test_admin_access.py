"""The payments admin: staff login only, CSRF enforced, never an API envelope in its way."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.test import Client

pytestmark = pytest.mark.django_db(databases=["default"])


def login_page(client: Client) -> str:
    response = client.get("/admin/login/")
    assert response.status_code == 200
    return response.cookies["csrftoken"].value


def test_the_admin_sends_anonymous_visitors_to_the_login_page():
    response = Client().get("/admin/")
    assert response.status_code == 302 and response["Location"].startswith("/admin/login/")


def test_a_login_without_the_csrf_token_is_refused():
    User.objects.create_user("ops", password="a-long-passphrase-1", is_staff=True)
    client = Client(enforce_csrf_checks=True)
    login_page(client)
    response = client.post("/admin/login/", {"username": "ops", "password": "a-long-passphrase-1"})
    assert response.status_code == 403
    assert "_auth_user_id" not in client.session


def test_a_non_staff_user_cannot_log_in_and_a_staff_user_can():
    User.objects.create_user("clerk", password="a-long-passphrase-2", is_staff=False)
    User.objects.create_user("ops", password="a-long-passphrase-1", is_staff=True)
    client = Client(enforce_csrf_checks=True)
    token = login_page(client)
    refused = client.post(
        "/admin/login/",
        {"username": "clerk", "password": "a-long-passphrase-2", "csrfmiddlewaretoken": token},
    )
    assert refused.status_code == 200 and "_auth_user_id" not in client.session
    accepted = client.post(
        "/admin/login/",
        {"username": "ops", "password": "a-long-passphrase-1", "csrfmiddlewaretoken": token},
    )
    assert accepted.status_code == 302
    assert client.get("/admin/").status_code == 200


def test_session_and_csrf_cookies_are_http_only_and_same_site_strict():
    client = Client()
    client.get("/admin/login/")
    cookie = client.cookies["csrftoken"]
    assert cookie["samesite"] == "Strict" and cookie["httponly"]
