"""A production role refuses, at start-up and in one line, a database URL that does not verify
the server's certificate (sslmode=verify-full): credentials and payouts never cross a network
in clear text or to an unverified server. Before, such a URL was taken silently."""

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
