"""bench.configs (issue 39): several lock-server configurations as arms beside ZooKeeper — the
ratios are medians of per-round ratios and a replicated arm's lock-server CPU is every replica's."""

from __future__ import annotations

from bench import configs


def _row(rate: float, p99: float, by_process: dict[str, float]) -> dict:
    return {
        "pairs": int(rate * 2),
        "pairs_per_s": rate,
        "acquire_p99_ms": p99,
        "server_cpu_ms_per_pair_by_process": by_process,
    }


def test_ratios_to_zookeeper_are_medians_of_rounds_and_replicas_cpu_is_summed():
    rounds = [
        {"arms": {"r2": _row(100, 10, {"lockserver": 1.0, "lockserver-2": 1.0, "postgres": 5}),
                  "zookeeper": _row(200, 20, {})}},
        {"arms": {"r2": _row(300, 30, {"lockserver": 1.5, "lockserver-2": 1.5, "postgres": 5}),
                  "zookeeper": _row(100, 10, {})}},
        {"arms": {"r2": _row(150, 40, {"lockserver": 2.0, "lockserver-2": 2.0, "postgres": 5}),
                  "zookeeper": _row(100, 10, {})}},
    ]  # fmt: skip
    data = {
        "points": [
            {
                "workload": "own",
                "clients": 8,
                "arms": {"r2": dict(rounds[2]["arms"]["r2"], errors=0), "zookeeper": dict(
                    rounds[2]["arms"]["zookeeper"], errors=0)},
                "rounds": rounds,
            }
        ]
    }  # fmt: skip
    configs._over_zookeeper(data)
    point = data["points"][0]
    # per-round ratios: pairs/s 0.5, 3.0, 1.5 -> 1.5; p99 acquire 0.5, 3.0, 4.0 -> 3.0
    assert point["over_zookeeper"]["r2"] == {"pairs_per_s": 1.5, "acquire_p99": 3.0}
    # both replicas' CPU, not the store's: 2.0, 3.0, 4.0 -> 3.0
    assert point["arms"]["r2"]["lockserver_cpu_ms_per_pair_all"] == 3.0
    lines = configs.table(data)
    assert any(line.startswith("r2 ") and " 1.5 " in line for line in lines)


def test_a_median_of_round_ratios_is_not_a_ratio_of_medians():
    rounds = [
        {"arms": {"a": _row(100, 1, {}), "zookeeper": _row(400, 1, {})}},
        {"arms": {"a": _row(200, 1, {}), "zookeeper": _row(100, 1, {})}},
        {"arms": {"a": _row(300, 1, {}), "zookeeper": _row(500, 1, {})}},
    ]
    data = {"points": [{"workload": "hot", "clients": 32, "arms": {"a": {}}, "rounds": rounds}]}
    configs._over_zookeeper(data)
    # rounds: 0.25, 2.0, 0.6 -> 0.6; medians' ratio would be 200 / 400 = 0.5
    assert data["points"][0]["over_zookeeper"]["a"]["pairs_per_s"] == 0.6
