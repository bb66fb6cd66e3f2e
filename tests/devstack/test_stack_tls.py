"""`make up TLS=1`: every hop on TLS, PostgreSQL included (issue 38 item 5). The private
cluster serves TLS only (a clear-text connection is refused), every database URL verifies it
(sslmode=verify-full against the stack's CA), and the roles' own connections are encrypted."""

from __future__ import annotations

import psycopg
import pytest
import requests

from devstack.envfile import read_env
from devstack.stack import up
from tests.devstack.test_stack_env_file import sourced

pytestmark = [pytest.mark.live, pytest.mark.slow]

DATABASE_URLS = ("LOCK_DATABASE_URL", "PAY_DATABASE_URL", "RAIL_DATABASE_URL")


def test_make_up_tls_serves_https_and_postgresql_over_verified_tls_only(run_dir, stack_ports):
    up(run=run_dir, ports=stack_ports, tls=True)
    env = read_env(run_dir / "stack.env")
    # bash sources the file as written: every variable as the Python reader has it
    bash = sourced(run_dir / "stack.env")
    assert {key: bash.get(key) for key in env} == env
    ca = env["DLOCK_CA_BUNDLE"]
    for var in ("LOCK_SERVER_URL", "PAYMENTS_URL", "RAIL_PROXY_URL", "RAIL_STUB_URL"):
        assert env[var].startswith("https://127.0.0.1:"), var
        assert requests.get(f"{env[var]}/health/ready", verify=ca, timeout=30).status_code == 200
    # the staff admin under TLS: its cookies Secure, HSTS from its proxy
    login = requests.get(f"{env['ADMIN_URL']}/admin/login/", verify=ca, timeout=30)
    assert login.status_code == 200 and login.headers["Strict-Transport-Security"]
    assert login.cookies and all(cookie.secure for cookie in login.cookies), login.headers
    for var in DATABASE_URLS:
        assert "sslmode=verify-full" in env[var] and f"sslrootcert={ca}" in env[var], var
    url = env["PAY_DATABASE_URL"]
    plain = url.split("?")[0] + "?sslmode=disable"
    with pytest.raises(psycopg.OperationalError):
        psycopg.connect(plain, connect_timeout=5).close()
    with psycopg.connect(url, autocommit=True) as conn:
        assert conn.info.pgconn.ssl_in_use
        # the roles' pooled connections (application_name = ROLE) are all encrypted
        rows = conn.execute(
            "SELECT a.application_name, s.ssl FROM pg_stat_activity a JOIN pg_stat_ssl s "
            "USING (pid) WHERE a.application_name IN ('lockserver', 'payments', 'railproxy', "
            "'railstub')"
        ).fetchall()
    assert {name for name, _ in rows} >= {"payments", "railstub"}, rows
    assert all(ssl for _, ssl in rows), rows


def test_make_up_tls_with_etcd_verifies_both_ways(run_dir, stack_ports):
    """LOCK_BACKEND=etcd under TLS=1: etcd on https://, verifying the lock server's client
    certificate; a lock is granted through it."""
    env = up("etcd", run=run_dir, ports=stack_ports, tls=True)
    assert env["ETCD_URL"].startswith("https://127.0.0.1:")
    ca = env["DLOCK_CA_BUNDLE"]
    member = env["ETCD_URL"].split(",")[0]
    try:  # no client certificate: the handshake or the request is refused
        refused = (
            requests.post(
                f"{member}/v3/kv/range", json={"key": "eA=="}, verify=ca, timeout=10
            ).status_code
            != 200
        )
    except requests.exceptions.RequestException:
        refused = True
    assert refused
    lock = requests.get(f"{env['LOCK_SERVER_URL']}/health/ready", verify=ca, timeout=30)
    assert lock.status_code == 200, lock.text
