"""Bad inputs to the executor are refused before it touches any service."""

from __future__ import annotations

import os
import subprocess

import pytest

from devstack.common import PROJECT, PYTHON
from executor.pause import PausePlan


def test_pause_plan_parses_phases_aliases_seconds_and_stop():
    plan = PausePlan("after_claim:stop, before_post:1.5")
    assert plan.pending == {"before_submit": "stop", "before_post": 1.5}
    assert not PausePlan(None) and not PausePlan("")


@pytest.mark.parametrize("spec", ["somewhere:1", "before_claim", "before_claim:soon"])
def test_pause_plan_refuses_unknown_phases_and_values(spec):
    with pytest.raises(ValueError, match="DLOCK_EXECUTOR_PAUSE_AT"):
        PausePlan(spec)


def test_pause_fires_once_per_process():
    plan = PausePlan("before_post:0.25")
    waited = []
    plan.at("before_post", wait=lambda s: waited.append(s) or False, payoutId="p")
    plan.at("before_post", wait=lambda s: waited.append(s) or False, payoutId="p")
    plan.at("before_claim", wait=lambda s: waited.append(s) or False, payoutId="p")
    assert waited == [0.25]


def _run_executor(*args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [PYTHON, str(PROJECT / "manage.py"), "run_executor", *args],
        cwd=PROJECT,
        # Nothing listens on these URLs: a refused input must never get as far as a request.
        env={
            **os.environ,
            "ROLE": "executor",
            "LOCK_SERVER_URL": "http://127.0.0.1:9",
            "PAYMENTS_URL": "http://127.0.0.1:9",
            "RAIL_PROXY_URL": "http://127.0.0.1:9",
            **env,
        },
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize(
    ("args", "env", "says"),
    [
        (["--owner-id", "x" * 65], {}, "ownerId"),
        (["--owner-id", "ok", "--max-payouts", "0"], {}, "--max-payouts"),
        (["--owner-id", "ok"], {"DLOCK_EXECUTOR_PAUSE_AT": "nowhere:1"}, "unknown phase"),
    ],
)
def test_run_executor_refuses_bad_arguments(args, env, says):
    result = _run_executor(*args, **env)
    assert result.returncode != 0
    assert says in result.stderr
    assert "executor_started" not in result.stdout
