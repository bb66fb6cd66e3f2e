"""A local role's log is capped: the pod writes gunicorn's output through logging's
RotatingFileHandler, so the file never grows past DLOCK_LOG_MAX_BYTES and at most three older
files (.1 .. .3) are kept. Before, `.run/logs/<role>.log` grew without end (~0.7 GB an hour at
soak rates)."""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path

import pytest
import requests

from devstack.common import free_port
from devstack.roles import RoleProcess
from tests.conftest import migrated_db

pytestmark = [pytest.mark.live]

CAP = 8 * 1024


def submit(url: str) -> None:
    body = {"clientRef": f"ref-{uuid.uuid4()}", "amountMinor": 990, "currency": "EUR"}
    assert requests.post(f"{url}/submit", json=body, timeout=10).status_code == 200


def test_a_roles_log_rotates_at_its_cap_and_keeps_three_older_files(tmp_path):
    raildb = migrated_db(f"logcap_{uuid.uuid4().hex[:8]}", "railstub", "RAIL_DATABASE_URL")
    log = tmp_path / "railstub.log"
    env = {
        "RAIL_DATABASE_URL": raildb,
        "DJANGO_SECRET_KEY": os.environ["DJANGO_SECRET_KEY"],
        "DJANGO_DEBUG": "false",
        "DLOCK_LOG_MAX_BYTES": str(CAP),
    }
    proc = RoleProcess("railstub", free_port(), env, log).start()
    try:
        rotated = [Path(f"{log}.{n}") for n in (1, 2, 3, 4)]
        for _ in range(2_000):  # every call logs a line; until the third backup exists
            submit(proc.url)
            if rotated[2].exists():
                break
        submit(proc.url)
    finally:
        proc.stop()
    assert rotated[2].exists() and not rotated[3].exists()
    for path in [log, *rotated[:3]]:
        assert path.stat().st_size <= CAP, path
    last = log.read_text().splitlines()[-1]
    assert json.loads(last)["service"] == "rail-stub"
