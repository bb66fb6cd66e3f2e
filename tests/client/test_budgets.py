"""Budgets shrink inward (issue 16.2, C3 §3.8), checked against the real settings of each role.

Each role's settings module is loaded in a fresh interpreter with the suite's environment (what
the process would run with), and every hop's chain — the inner call, the server's request
deadline, the client's read timeout — must strictly grow outward.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from devstack.common import PROJECT
from dlock.budgets import BUDGETS, Chain, inward_chains

PROBE = """
import importlib, json, sys
from dlock.budgets import inward_chains
settings = importlib.import_module(sys.argv[1])
print(json.dumps([[c.hop, c.stages, c.shrinks_inward()] for c in inward_chains(settings)]))
"""


def _chains(module: str, **env: str) -> list[list]:
    for name in ("ETCD_REQUEST_TIMEOUT_MS", "RAIL_READ_TIMEOUT_MS", "SERVER_QUEUE_DEADLINE_MS"):
        env.setdefault(name, "")
    out = subprocess.run(
        [sys.executable, "-c", PROBE, module],
        cwd=PROJECT,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return json.loads(out)


@pytest.mark.parametrize(
    "module",
    ["settings.lockserver", "settings.railproxy", "settings.payments", "settings.executor"],
)
def test_every_hop_shrinks_inward_with_the_real_settings(module):
    chains = _chains(module)
    assert {hop for hop, _, _ in chains} >= {"lock.heartbeat", "lock.acquire", "rail.submit"}
    bad = [(hop, stages) for hop, stages, ok in chains if not ok]
    assert bad == [], bad


def test_the_etcd_call_is_shorter_than_the_heartbeat_read_timeout_it_serves():
    (heartbeat,) = [c for c in _chains("settings.lockserver") if c[0] == "lock.heartbeat"]
    stages = dict((name, ms) for name, ms in heartbeat[1])
    assert stages["ETCD_REQUEST_TIMEOUT_MS"] < stages["lock-server request deadline"]
    assert stages["lock-server request deadline"] < BUDGETS["lock.heartbeat"].read_s * 1000


def test_the_old_etcd_timeout_breaks_the_chain():
    """ETCD_REQUEST_TIMEOUT_MS 2 000 (the value before issue 16) equals acquire's read timeout."""
    chains = _chains("settings.lockserver", ETCD_REQUEST_TIMEOUT_MS="2000")
    assert {hop for hop, _, ok in chains if not ok} >= {"lock.heartbeat", "lock.acquire"}


def test_a_chain_that_does_not_grow_is_reported():
    assert not Chain("x", (("inner", 2000.0), ("outer", 2000.0))).shrinks_inward()
    assert Chain("x", (("inner", 1.0), ("mid", 2.0), ("outer", 3.0))).shrinks_inward()
    assert inward_chains  # the function the probe runs
