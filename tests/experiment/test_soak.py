"""The soak tool (`make soak`, bench.soak): a short run on a private stack writes a summary with
every field the on-call reads, nothing presented twice; and its growth fit tells a leak from a
flat line, and its log meter counts what a rotation dropped."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from bench.soak_probe import LogMeter, pod_kind, process_stats
from bench.soak_report import growth, slope_per_minute
from devstack.common import PROJECT

FIELDS = (
    "payouts_seeded",
    "payouts_done",
    "presented_twice",
    "stuck",
    "quarantined",
    "quarantine_reasons",
    "books_balance",
    "growth",
    "growing",
    "tables",
    "logs",
    "cpu_ms_per_payout",
    "samples",
)


@pytest.mark.live
@pytest.mark.slow
def test_a_short_soak_writes_a_summary_and_presents_nothing_twice(tmp_path):
    out = tmp_path / "soak"
    argv = [sys.executable, "-m", "bench.soak", "--minutes", "0.4", "--rate", "4"]
    argv += ["--executors", "1", "--concurrency", "2", "--sample-s", "3", "--drain-s", "40"]
    argv += ["--out", str(out)]
    result = subprocess.run(
        argv, cwd=PROJECT, capture_output=True, text=True, timeout=240, check=False
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert set(FIELDS) <= set(summary)
    assert summary["presented_twice"] == 0
    assert summary["stuck"] == 0
    assert summary["books_balance"] is True
    assert summary["payouts_done"] > 0
    assert summary["events"]["pg_restart"]["at_s"] > 0  # the fault ran
    series = summary["growth"]
    for role in ("lockserver", "payments", "railproxy", "railstub"):
        for kind in ("gunicorn-master", "gunicorn-workers", "nginx-master", "nginx-workers"):
            assert f"{role}/{kind}/rss_kib" in series, (role, kind)
    assert "soak-e0/fds" in series and "soak-e0/threads" in series
    assert any(name.startswith("pg/connections/") for name in series)
    assert summary["logs"]["railproxy"]["bytes"] > 0
    assert "presented to the rail more than once: 0" in (out / "summary.md").read_text()


def _samples(values: list[float], *, step: float = 10.0) -> list[dict]:
    return [{"t": i * step, "executor/rss_kib": v} for i, v in enumerate(values)]


def test_a_steady_rise_after_warm_up_is_growth_and_a_warm_up_step_is_not():
    rising = [50_000 + 2_000 * i for i in range(20)]  # 12 MB/min: a leak
    warm_then_flat = [10_000 * min(i, 5) + 50_000 for i in range(20)]
    leak = growth(_samples(rising), warmup_until=95, load_end=190)["executor/rss_kib"]
    flat = growth(_samples(warm_then_flat), warmup_until=95, load_end=190)["executor/rss_kib"]
    assert leak["grows"] and leak["per_minute"] == pytest.approx(12_000)
    assert not flat["grows"] and flat["per_minute"] == 0


def test_the_slope_is_per_minute_and_needs_three_points():
    assert slope_per_minute([0, 30, 60], [0, 1, 2]) == pytest.approx(2.0)
    assert slope_per_minute([0, 60], [0, 100]) == 0.0


def test_the_log_meter_counts_what_was_written_across_rotations(tmp_path):
    log = tmp_path / "role.log"
    log.write_bytes(b"x" * 100)
    meter = LogMeter(log)
    with log.open("ab") as handle:
        handle.write(b"x" * 200)
    assert meter.written() == 200
    log.rename(tmp_path / "role.log.1")  # a rotation: the file moves, a new one starts
    log.write_bytes(b"y" * 30)
    assert meter.written() == 230
    (tmp_path / "role.log.1").unlink()  # the oldest dropped: what it took in still counts
    with log.open("ab") as handle:
        handle.write(b"y" * 5)
    assert meter.written() == 235


def test_a_process_is_read_from_proc_and_a_pod_child_named_by_its_command():
    stats = process_stats(os.getpid())
    assert stats is not None and stats["fds"] > 0 and stats["threads"] >= 1
    assert process_stats(2**22 + 1) is None
    assert pod_kind(os.getpid(), os.getpid()) == "pod"
