"""An executor's /metrics (EXECUTOR_METRICS_PORT): its own series only, scrapable from start-up
until it exits, and for --metrics-linger-s after a short --until-idle run is done."""

from __future__ import annotations

import re
import signal
import uuid

import requests

from devstack.common import free_port, wait_until
from tests.executor.conftest import payout_ids, seed, start_executor, states


def test_a_short_until_idle_run_keeps_its_final_counters_scrapable(
    exec_stack, tmp_path, monkeypatch
):
    seeded = seed(exec_stack, accounts=1, per_account=1, balance=5_000, amount=1_000)
    (pid,) = payout_ids(seeded)
    port = free_port()
    monkeypatch.setenv("EXECUTOR_METRICS_PORT", str(port))
    proc = start_executor(
        exec_stack,
        f"exec-metrics-{uuid.uuid4().hex[:6]}",
        "--until-idle",
        "--idle-timeout-s",
        "5",
        "--metrics-addr",
        "127.0.0.1",
        "--metrics-linger-s",
        "60",
        log_dir=tmp_path,
    )
    wait_until(lambda: proc.events("executor_stopped"), timeout=60, what="the run to finish")
    assert states(exec_stack, [pid]) == {pid: "POSTED"}

    text = requests.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text

    assert proc.process.poll() is None  # lingering, still scrapable
    posted = re.search(r'^payout_execute_total\{outcome="posted"\} (\S+)$', text, re.M)
    assert posted and float(posted.group(1)) >= 1
    assert "payout_backlog_age_seconds" in text
    samples = [line for line in text.splitlines() if line and not line.startswith("#")]
    for foreign in ("lock_fenced_out", "rail_", "lock_acquire", "payouts_in_state", "dlock_"):
        assert not [line for line in samples if line.startswith(foreign)], foreign
    proc.process.send_signal(signal.SIGTERM)
    assert proc.wait(10) == 0  # a SIGTERM ends the linger at once
