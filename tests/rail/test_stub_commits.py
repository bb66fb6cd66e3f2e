"""The rail stub's own books commit without waiting for their WAL flush; dlock's roles wait.

The stub stands in for a third-party rail (issue 18, CHANGELOG): its commits are asynchronous,
while every dlock role's connection keeps the cluster's durable `synchronous_commit`.
"""

from __future__ import annotations

import importlib

import psycopg
import pytest

from tests import pgplugin


def _setting(role: str) -> tuple[str, str]:
    """(`synchronous_commit`, where it came from) on a connection opened with the role's
    database options (the test cluster's `postgres` database: the setting is per connection)."""
    module = importlib.import_module(f"settings.{role}")
    options = module.DATABASES["default"]["OPTIONS"]["options"]
    with psycopg.connect(pgplugin.SERVER_URL, options=options, autocommit=True) as conn:
        return conn.execute(
            "SELECT setting, source FROM pg_settings WHERE name = 'synchronous_commit'"
        ).fetchone()


def test_the_rail_stub_commits_asynchronously():
    assert _setting("railstub") == ("off", "client")


@pytest.mark.parametrize("role", ["lockserver", "payments", "railproxy", "ops"])
def test_dlock_roles_keep_the_clusters_durable_commit(role):
    """No dlock role overrides the cluster's setting (on in every durable deployment)."""
    assert _setting(role)[1] != "client"
