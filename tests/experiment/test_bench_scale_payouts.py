"""bench.scale_payouts (issue 39): payouts/s against the lock server's processes and replicas —
arms rotated per round, each executor starting from its own replica, ratios as medians of the
per-round ratios to the 1-process arm, a replicated arm's lock-server CPU summed over replicas."""

from __future__ import annotations

import pytest

from bench import rounds as bench_rounds
from bench import scale_payouts


def _row(rate: float, total: float, lockserver: float, replica: float | None = None) -> dict:
    cpu = {"lockserver": lockserver, "payments": 5.0, "total": total}
    if replica is not None:
        cpu["lockserver-2"] = replica
    cores = {role: round(ms * rate / 1000, 2) for role, ms in cpu.items() if role != "total"}
    return {"payouts_per_s": rate, "cpu_ms_per_payout": cpu, "cores_busy": cores}


def test_every_arm_runs_once_per_round_in_a_rotated_order():
    rounds = bench_rounds.plan(["a", "b", "c"], 4)
    assert rounds == [["a", "b", "c"], ["b", "c", "a"], ["c", "a", "b"], ["a", "b", "c"]]
    assert bench_rounds.plan(list(scale_payouts.ARMS), 1)[0][0] == scale_payouts.BASE


def test_the_arms_are_one_two_four_processes_and_two_replicas_of_one():
    assert scale_payouts.ARMS == {
        "pg-w1": (1, 1),
        "pg-w2": (2, 1),
        "pg-w4": (4, 1),
        "pg-w1-r2": (1, 2),
    }


def test_each_executor_gets_every_replica_starting_from_its_own():
    urls = ["http://a:1", "http://b:2"]
    assert scale_payouts.endpoint_lists(urls, 3) == [
        "http://a:1,http://b:2",
        "http://b:2,http://a:1",
        "http://a:1,http://b:2",
    ]
    assert scale_payouts.endpoint_lists(["http://a:1"], 2) == ["http://a:1", "http://a:1"]


def test_executors_spec():
    assert scale_payouts.executors("2x16") == (2, 16)
    assert scale_payouts.executors("1X32") == (1, 32)
    with pytest.raises(ValueError):
        scale_payouts.executors("0x32")


def test_ratios_are_medians_of_round_ratios_and_replicas_cpu_is_summed():
    rounds = [
        {"pg-w1": _row(100, 20, 4), "r2": _row(50, 20, 2, replica=1)},
        {"pg-w1": _row(50, 20, 4), "r2": _row(150, 30, 3, replica=2)},
        {"pg-w1": _row(200, 10, 4), "r2": _row(240, 40, 4, replica=3)},
    ]
    by_arm = scale_payouts.summarise(rounds, base="pg-w1")
    r2 = by_arm["r2"]
    # per-round payouts/s ratios 0.5, 3.0, 1.2 -> 1.2 (the medians' ratio would be 150/100 = 1.5)
    assert r2["over_base"]["payouts_per_s"] == 1.2
    # per-round server CPU ratios 1.0, 1.5, 4.0 -> 1.5
    assert r2["over_base"]["server_cpu"] == 1.5
    assert r2["payouts_per_s"] == 150
    # every replica's lock-server CPU: 3, 5, 7 -> 5
    assert r2["cpu_ms_per_payout"]["lockserver"] == 5
    assert by_arm["pg-w1"]["over_base"]["payouts_per_s"] == 1.0
    assert r2["rounds"] == 3
    lines = scale_payouts.table(by_arm)
    assert any(line.startswith("r2 ") and " 1.2 " in line for line in lines)


def test_lockserver_cpu_is_none_without_a_lock_server_sample():
    assert scale_payouts.lockserver_cpu({"payments": 3.0, "total": 3.0}) is None
    assert scale_payouts.lockserver_cpu({"lockserver": 1.25, "lockserver-2": 1.0}) == 2.25
