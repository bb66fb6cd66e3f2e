"""bench.rounds: every comparing part of the bench runs each arm once per round, the order
rotated by one each round, and takes medians over rounds that skip what a round missed."""

from __future__ import annotations

from bench import rounds as bench_rounds


def test_every_arm_runs_once_per_round_in_a_rotated_order():
    rounds = bench_rounds.plan(["a", "b", "c"], 4)
    assert rounds == [["a", "b", "c"], ["b", "c", "a"], ["c", "a", "b"], ["a", "b", "c"]]
    assert bench_rounds.rotated(["base", "other"], 0)[0] == "base"  # round 1: as given
    assert bench_rounds.rotated([], 3) == []


def test_a_median_skips_the_rounds_that_measured_nothing():
    assert bench_rounds.median([0.25, None, 2.0, 0.6]) == 0.6
    assert bench_rounds.median([None, None]) is None
    # a median of round ratios, not a ratio of medians: rounds 0.25, 2.0, 0.6 -> 0.6 (the
    # medians' ratio, 200 / 400, would be 0.5)
    arm, reference = [100, 200, 300], [400, 100, 500]
    assert bench_rounds.median([a / r for a, r in zip(arm, reference, strict=True)]) == 0.6
