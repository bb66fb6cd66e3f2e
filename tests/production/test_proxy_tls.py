"""TLS at the proxy (issue 25 item 6): given a certificate, a role's nginx speaks https; a
client verifying against the stack's CA (DLOCK_CA_BUNDLE) is served, one verifying against
anything else is refused, and plain HTTP on the TLS port gets the envelope, never a page."""

from __future__ import annotations

import os
import socket
import ssl
import uuid

import pytest
import requests

from devstack.common import free_port
from devstack.roles import RoleProcess
from devstack.tls import ensure_tls
from tests.conftest import _create_db
from tests.production.probe_urls import SCHEMA

pytestmark = [pytest.mark.live, pytest.mark.slow]


@pytest.fixture(scope="module")
def tls_role(tmp_path_factory):
    import psycopg

    base = tmp_path_factory.mktemp("tls")
    files = ensure_tls(base / "tls")
    db_url = _create_db(f"probe_tls_{uuid.uuid4().hex[:10]}")
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute(SCHEMA)
    env = {
        "RAIL_DATABASE_URL": db_url,
        "DJANGO_SECRET_KEY": os.environ["DJANGO_SECRET_KEY"],
        "DJANGO_DEBUG": "false",
        "DLOCK_CA_BUNDLE": str(files.ca),
    }
    role = RoleProcess(
        "railstub",
        free_port(),
        env,
        base / "probe.log",
        app="tests.production.probe_wsgi",
        tls=(str(files.certificate), str(files.key)),
    ).start()
    yield role, files
    role.stop()


def test_a_client_verifying_against_the_stack_ca_is_served(tls_role):
    role, files = tls_role
    assert role.url.startswith("https://127.0.0.1:")
    answer = requests.get(f"{role.url}/health/live", verify=str(files.ca), timeout=30)
    assert answer.status_code == 200
    bump = requests.post(
        f"{role.url}/probe/bump/1", json={"tag": "tls"}, verify=str(files.ca), timeout=30
    )
    assert bump.status_code == 200, bump.text


def test_a_client_that_does_not_trust_the_certificate_is_refused(tls_role):
    role, _ = tls_role
    with pytest.raises(requests.exceptions.SSLError):
        requests.get(f"{role.url}/health/live", verify=True, timeout=30)  # the system CAs
    context = ssl.create_default_context()  # the same with the standard library
    with socket.create_connection(("127.0.0.1", role.port), timeout=30) as raw:
        with pytest.raises(ssl.SSLCertVerificationError):
            context.wrap_socket(raw, server_hostname="127.0.0.1")


def test_plain_http_on_the_tls_port_is_a_400_envelope(tls_role):
    role, _ = tls_role
    answer = requests.get(f"http://127.0.0.1:{role.port}/v1/x", timeout=30)
    assert answer.status_code == 400
    assert answer.headers["Content-Type"] == "application/json; charset=utf-8"
    assert answer.json()["code"] == "VALIDATION_FAILED"


def test_the_rail_forward_verifies_the_rail_against_the_ca_bundle(tls_role, monkeypatch):
    """The one-shot connection of the rail forward (dlock.http.send_once) verifies too: served
    against DLOCK_CA_BUNDLE; against the system store the handshake fails before any request
    byte left, so the submission is provably not sent (NOT_SENT), never ambiguous."""
    from dlock.http import TransportError, send_once

    role, files = tls_role
    one_shot = {
        "connect_s": 5.0,
        "read_s": 30.0,
        "body": b'{"tag":"forward"}',
        "headers": {"Content-Type": "application/json"},
    }
    monkeypatch.setenv("DLOCK_CA_BUNDLE", str(files.ca))
    status, _, body = send_once("POST", f"{role.url}/probe/bump/1", **one_shot)
    assert status == 200, body

    monkeypatch.delenv("DLOCK_CA_BUNDLE")
    with pytest.raises(TransportError) as refused:
        send_once("POST", f"{role.url}/probe/bump/1", **one_shot)
    assert refused.value.sent is False
    assert isinstance(refused.value.cause, ssl.SSLCertVerificationError)


@pytest.mark.parametrize(
    "ciphers",
    ["ECDHE-ECDSA-AES128-SHA:ECDHE-ECDSA-AES256-SHA", "ECDHE-ECDSA-AES128-SHA256"],
    ids=["CBC with SHA-1", "CBC with SHA-256"],
)
def test_tls_1_2_with_a_cbc_suite_is_refused(tls_role, ciphers):
    """Mozilla "intermediate": TLS 1.2 offers forward-secret AEAD suites only."""
    role, files = tls_role
    context = ssl.create_default_context(cafile=str(files.ca))
    context.maximum_version = ssl.TLSVersion.TLSv1_2
    context.set_ciphers(ciphers + ":@SECLEVEL=0")
    with socket.create_connection(("127.0.0.1", role.port), timeout=30) as raw:
        with pytest.raises(ssl.SSLError):
            context.wrap_socket(raw, server_hostname="127.0.0.1")


def test_tls_1_2_with_an_aead_suite_is_served(tls_role):
    role, files = tls_role
    context = ssl.create_default_context(cafile=str(files.ca))
    context.maximum_version = ssl.TLSVersion.TLSv1_2
    context.set_ciphers("ECDHE-ECDSA-AES128-GCM-SHA256")
    with socket.create_connection(("127.0.0.1", role.port), timeout=30) as raw:
        with context.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
            assert tls.version() == "TLSv1.2"
            assert tls.cipher()[0] == "ECDHE-ECDSA-AES128-GCM-SHA256"


def test_an_executor_that_cannot_verify_its_server_exits_non_zero_and_says_why(tls_role):
    """A certificate the executor cannot verify is a misconfiguration, not an idle queue: exit 1
    at once with one line naming the URL (it used to wait the outage out and exit 0)."""
    from devstack.roles import manage

    role, files = tls_role
    env = {
        "LOCK_SERVER_URL": role.url,
        "PAYMENTS_URL": role.url,
        "RAIL_PROXY_URL": role.url,
        "DLOCK_CA_BUNDLE": "",  # the system store, which does not hold the stack's CA
    }
    args = ["run_executor", "--owner-id", "tls-test", "--until-idle", "--idle-timeout-s", "1"]
    done = manage(args, env, role="executor", check=False, capture=True)
    assert done.returncode != 0, done.stderr
    said = [line for line in done.stderr.splitlines() if "cannot verify" in line]
    assert len(said) == 1 and role.url in said[0], done.stderr

    trusted = manage(
        args, {**env, "DLOCK_CA_BUNDLE": str(files.ca)}, role="executor", check=False, capture=True
    )
    assert "cannot verify" not in trusted.stderr
