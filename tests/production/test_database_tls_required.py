"""A production role refuses, at start-up and in one line, a database URL that does not verify
the server's certificate (sslmode=verify-full): credentials and payouts never cross a network
in clear text or to an unverified server. Before, such a URL was taken silently. Nothing in the
environment lifts the refusal, and a Unix-socket host is refused too (libpq speaks no TLS on a
socket, and the environment can turn a socket URL into a clear-text TCP one: PGHOSTADDR)."""

from __future__ import annotations

import os
import secrets
import subprocess
import sys

import pytest

from devstack.common import PROJECT

URL = "postgres://dlock@paydb.internal:5432/paydb"


def check(role: str, **env: str) -> subprocess.CompletedProcess:
    base = {
        "PATH": os.environ["PATH"],
        "ROLE": role,
        "DLOCK_ENVIRONMENT": "production",
        "DJANGO_SECRET_KEY": secrets.token_urlsafe(48),
        "RAIL_DATABASE_URL": URL.replace("paydb", "raildb"),
    }
    return subprocess.run(
        [sys.executable, "manage.py", "check"],
        cwd=PROJECT,
        env={**base, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize(
    "query", ["", "?sslmode=disable", "?sslmode=require", "?sslmode=verify-ca&sslrootcert=/ca"]
)
def test_production_refuses_a_database_url_without_verify_full(query):
    result = check("railstub", RAIL_DATABASE_URL=URL.replace("paydb", "raildb") + query)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "RAIL_DATABASE_URL must carry sslmode=verify-full" in lines[0]


def test_production_takes_a_verify_full_url_and_development_any():
    verified = URL.replace("paydb", "raildb") + "?sslmode=verify-full&sslrootcert=/etc/ca.crt"
    assert check("railstub", RAIL_DATABASE_URL=verified).returncode == 0
    plain = check("railstub", DLOCK_ENVIRONMENT="development")
    assert plain.returncode == 0, plain.stderr


@pytest.mark.parametrize(
    "env",
    [
        {"DLOCK_ALLOW_UNVERIFIED_DATABASE": "true"},  # the test-only opt-out that was removed
        {"PGSSLMODE": "verify-full", "PGSSLROOTCERT": "/etc/ca.crt"},  # libpq's defaults
    ],
    ids=["old-opt-out", "libpq-env"],
)
def test_no_environment_variable_lifts_the_refusal(env):
    result = check("railstub", **env)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "RAIL_DATABASE_URL must carry sslmode=verify-full" in lines[0]


VERIFIED = "sslmode=verify-full&sslrootcert=/etc/ca.crt"


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("postgres://dlock@%2Fvar%2Frun%2Fpostgresql/raildb", "sslmode=verify-full"),
        ("postgres://dlock@/raildb?host=/var/run/postgresql", "sslmode=verify-full"),
        # libpq ignores sslmode on a socket: this one would not be verified either
        (f"postgres://dlock@%2Fvar%2Frun%2Fpostgresql/raildb?{VERIFIED}", "not a Unix socket"),
        (f"postgres://dlock@/raildb?host=/var/run/postgresql&{VERIFIED}", "not a Unix socket"),
        (f"postgres://dlock@raildb.internal,%2Ftmp/raildb?{VERIFIED}", "not a Unix socket"),
        (f"postgres://dlock@/raildb?host=@dlock-pg&{VERIFIED}", "not a Unix socket"),
        # no host: libpq would take PGHOST, or its default socket
        (f"postgres:///raildb?{VERIFIED}", "must name the database server's host"),
    ],
    ids=[
        "socket",
        "socket-param",
        "socket-verify",
        "socket-param-verify",
        "list",
        "abstract",
        "none",
    ],
)
def test_production_refuses_a_unix_socket_or_no_host(url, says):
    result = check("railstub", RAIL_DATABASE_URL=url, PGHOST="raildb.internal")
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "RAIL_DATABASE_URL " in lines[0] and says in lines[0], lines[0]


def test_a_tcp_host_with_verify_full_is_taken_with_or_without_hostaddr():
    for query in (VERIFIED, f"{VERIFIED}&hostaddr=10.0.0.5"):
        result = check("railstub", RAIL_DATABASE_URL=f"{URL.replace('paydb', 'raildb')}?{query}")
        assert result.returncode == 0, (query, result.stderr)
