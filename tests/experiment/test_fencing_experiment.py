"""The fencing experiment, CI-sized: both arms on a private stack under one seeded schedule.

The fenced arm (the real executors, lock server, payments and rail proxy) must produce stale
writers and fence them out without paying anything twice; the naive arm (lease-only, no tokens)
must pay some payout twice under the same faults — otherwise the faults proved nothing.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import psycopg
import pytest
from django.core.management import CommandError, call_command

from experiment.config import CI_PRESET, ExperimentConfig
from experiment.measure import CounterScraper
from experiment.report import table
from experiment.runner import run
from experiment.schedule import PAUSE, RAIL_LATENCY, build_schedule, rail_config_at
from experiment.stack import private_stack
from experiment.verdict import verdict

SEED = 7


@pytest.fixture(scope="module")
def private():
    base = Path(tempfile.mkdtemp(prefix="dlock-experiment-"))
    base.chmod(0o755)  # as root the private cluster runs as `postgres`
    stack, stop = private_stack(base / "stack")
    try:
        yield base, stack
    finally:
        stop()
        shutil.rmtree(base / "stack", ignore_errors=True)  # the reports and logs stay


@pytest.fixture(scope="module")
def ci_run(private):
    base, stack = private
    config = ExperimentConfig(seed=SEED, arm="both", out=base / "out", **CI_PRESET)
    code, report = run(stack, config)
    return code, report, config


# A broken lock server, simulated: one account's fence jumps far above every token the lock
# server will issue (what a lock server restarted on another backend does, issue 20).
JUMP_FENCE = """
UPDATE account SET fence = fence + 1000000000
 WHERE account_id = (SELECT account_id FROM payout WHERE state = 'PENDING'
                      ORDER BY account_id LIMIT 1)
"""


@pytest.fixture(scope="module")
def jumped_run(private, ci_run):
    base, stack = private
    config = ExperimentConfig(
        seed=SEED,
        arm="fenced",
        out=base / "out-jumped",
        executors=2,
        accounts=2,
        payouts=16,
        duration=8.0,
        lease_ms=1500,
        drain_timeout=6.0,
        pg_restart=False,
    )
    jumped: list[float] = []

    def jump_once(_arm, now, _counts, _fenced, _label) -> None:
        if now >= 2.0 and not jumped:
            with psycopg.connect(stack.env["PAY_DATABASE_URL"], autocommit=True) as conn:
                conn.execute(JUMP_FENCE)
            jumped.append(now)

    code, report = run(stack, config, progress=jump_once, schedule=[])
    assert jumped, "the fence was never raised"
    return code, report


@pytest.mark.live
@pytest.mark.slow
class TestCiSizedExperiment:
    def test_fenced_arm_paid_nothing_twice_and_kept_every_invariant(self, ci_run):
        _code, report, _config = ci_run
        fenced = report["arms"]["fenced"]
        assert fenced["duplicates_caused"] == 0, fenced["duplicate_payout_ids"]
        assert fenced["paid_twice_by_us"] == 0
        assert fenced["invariant_violation_count"] == 0, fenced["invariant_violations"]
        assert set(fenced["presented_attempts_histogram"]) <= {"0", "1"}
        # The reconciler may flag the rail's own duplicate acks; nothing else.
        assert fenced["reconciler"]["unexplained_violations"] == []
        assert "report" in fenced["reconciler"], fenced["reconciler"]

    def test_fenced_arm_produced_stale_writers_and_fenced_them_out(self, ci_run):
        _code, report, _config = ci_run
        fenced = report["arms"]["fenced"]
        assert fenced["fenced_out_sum"] > 0, fenced["fenced_out_total"]
        assert fenced["faults"]["pauses"], "no executor was ever paused"
        assert not fenced["faults"]["errors"], fenced["faults"]["errors"]

    def test_naive_arm_paid_some_payout_twice_under_the_same_schedule(self, ci_run):
        _code, report, _config = ci_run
        naive = report["arms"]["naive"]
        assert naive["duplicates_caused"] > 0
        assert naive["presented_attempts_total"] > naive["payouts"] - naive["by_state"].get(
            "PENDING", 0
        )

    def test_every_fenced_payout_settled_and_posted_money_matches_the_ledger(self, ci_run):
        _code, report, _config = ci_run
        fenced = report["arms"]["fenced"]
        assert not fenced["still_in_flight"], fenced["still_in_flight"]
        posted = fenced["by_state"].get("POSTED", 0)
        assert posted > 0
        assert fenced["ledger_debits_minor"] == posted * ExperimentConfig().amount_minor
        assert sum(fenced["by_state"].values()) == fenced["payouts"]

    def test_every_fenced_out_is_explained_by_the_schedule_and_the_backend_is_reported(
        self, ci_run
    ):
        _code, report, _config = ci_run
        fenced = report["arms"]["fenced"]
        classified = fenced["fenced_out_classification"]
        assert classified["unexplained"] == 0, classified["unexplained_events"]
        assert classified["explained"] > 0
        assert classified["explained"] == fenced["fenced_out_sum"]
        assert all(e["why"] for e in classified["explained_events"])
        assert report["lock_backend"] == fenced["lock_backend"] == "pg"
        assert fenced["lock_backend_observed"] == ["pg"]
        assert report["arms"]["naive"]["fenced_out_classification"] is None

    def test_the_fenced_arm_ran_concurrent_executors_whose_sections_overlapped(
        self, private, ci_run
    ):
        """Issue 17 §7: every executor process keeps several payouts in flight (the CI preset's
        --concurrency 2), seen in the payment resource's own payout_event rows: one owner's
        claim→post sections overlap in time, never two of one account, and the claims above
        (0 duplicates, every fenced-out explained, verdict 0) hold for that same run."""
        code, report, config = ci_run
        _base, stack = private
        assert config.executor_concurrency == CI_PRESET["executor_concurrency"] > 1
        assert report["config"]["executor_concurrency"] == config.executor_concurrency
        with psycopg.connect(stack.env["PAY_DATABASE_URL"]) as conn:
            rows = conn.execute(
                "SELECT e.payout_id::text, e.to_state, e.at, e.owner_id, e.token, p.account_id"
                " FROM payout_event e JOIN payout p USING (payout_id)"
                " WHERE e.owner_id LIKE 'fenced-%' AND e.to_state IN ('CLAIMED', 'POSTED')"
                " ORDER BY e.id"
            ).fetchall()
        claimed: dict[tuple[str, str, int], object] = {}
        sections: dict[str, list[tuple[object, object, str]]] = {}
        for payout_id, to_state, at, owner, token, account in rows:
            if to_state == "CLAIMED":
                claimed[(payout_id, owner, token)] = at
            elif (payout_id, owner, token) in claimed:  # claimed and posted in one section
                start = claimed[(payout_id, owner, token)]
                sections.setdefault(owner, []).append((start, at, account))
        assert sections, "no fenced executor claimed and posted a payout in one section"
        deepest = 0
        for owner, spans in sections.items():
            for i, (a_start, a_end, a_account) in enumerate(spans):
                for b_start, b_end, b_account in spans[i + 1 :]:
                    if a_start < b_end and b_start < a_end:
                        assert a_account != b_account, (owner, a_account, "overlapped itself")
            points = sorted([(s, 1) for s, _, _ in spans] + [(e, -1) for _, e, _ in spans])
            depth = 0
            for _, step in points:
                depth += step
                deepest = max(deepest, depth)
        assert 1 < deepest <= config.executor_concurrency, deepest
        fenced = report["arms"]["fenced"]
        assert fenced["duplicates_caused"] == 0
        assert fenced["fenced_out_classification"]["unexplained"] == 0
        assert code == 0, report["verdict"]

    def test_the_verdict_is_success_and_the_report_and_chart_are_written(self, ci_run):
        code, report, config = ci_run
        assert code == 0, report["verdict"]
        on_disk = json.loads((config.out / "report.json").read_text())
        assert on_disk["verdict"]["exit_code"] == 0
        assert on_disk["schedule"] == report["schedule"]
        assert (config.out / "report.png").stat().st_size > 10_000


@pytest.mark.live
@pytest.mark.slow
def test_a_fenced_out_no_fault_explains_fails_the_run_with_the_reason(jumped_run):
    code, report = jumped_run
    fenced = report["arms"]["fenced"]
    classified = fenced["fenced_out_classification"]
    assert classified["unexplained"] > 0, fenced["fenced_out_total"]
    assert classified["explained"] == 0  # no fault was injected: nothing is explained
    assert all(e["resource"] == "account" for e in classified["unexplained_events"])
    assert all("not stale" in e["why"] for e in classified["unexplained_events"])
    assert fenced["duplicates_caused"] == 0
    assert code == 1
    lines = report["verdict"]["lines"]
    assert any("fenced-outs the fault schedule does not explain" in line for line in lines)
    assert not any(line.startswith("ok:") for line in lines)
    assert "does not explain" in table(report)


def test_the_schedule_is_a_pure_function_of_the_seed():
    first = build_schedule(seed=11, duration=30, workers=4, lease_ms=2000)
    again = build_schedule(seed=11, duration=30, workers=4, lease_ms=2000)
    other = build_schedule(seed=12, duration=30, workers=4, lease_ms=2000)
    assert first == again
    assert first != other


def test_the_schedule_pauses_longer_than_the_lease_in_every_phase_and_has_every_fault():
    events = build_schedule(seed=3, duration=40, workers=4, lease_ms=2000)
    kinds = {e.kind for e in events}
    assert kinds == {
        "pause",
        "kill",
        "restart",
        "pg_restart",
        "rail_latency",
        "rail_failures",
        "duplicate_ack",
    }
    pauses = [e for e in events if e.kind == PAUSE]
    assert {e.params["phase"] for e in pauses} == {"locked", "claimed", "submitted", "posted"}
    assert all(e.seconds > 2.0 for e in pauses)
    assert [e.params["revoke"] for e in pauses][:2] == [True, False]
    assert {e.target for e in events if e.kind == "restart"} == {
        "railproxy",
        "payments",
        "lockserver",
    }
    assert all(e.params["latency_ms"] > 2000 for e in events if e.kind == RAIL_LATENCY)


def test_the_rail_config_is_the_merge_of_the_active_windows():
    events = build_schedule(seed=5, duration=30, workers=3, lease_ms=2000)
    latency = next(e for e in events if e.kind == RAIL_LATENCY)
    inside = rail_config_at(events, latency.at + 0.01, base_latency_ms=100)
    after = rail_config_at(events, 1_000, base_latency_ms=100)
    assert inside["latency_ms"] == latency.params["latency_ms"]
    assert after == {"latency_ms": 100, "failure_rate": 0.0, "duplicate_ack_rate": 0.0}


def test_a_counter_scraper_keeps_counting_across_a_restarted_process():
    scraper = CounterScraper("lock_fenced_out_total", "resource")
    line = 'lock_fenced_out_total{resource="rail"} %s\n'
    scraper.observe("railproxy", line % "4.0", baseline=True)  # counted before this arm
    scraper.observe("railproxy", line % "6.0")
    scraper.observe("railproxy", line % "1.0")  # restarted, counted 1 since
    scraper.observe("railproxy", None)  # down right now
    scraper.observe("railproxy", line % "3.0")
    assert scraper.total["rail"] == 2 + 1 + 2


def test_the_verdict_is_inconclusive_when_nothing_was_fenced_or_nothing_paid_twice():
    arm = {
        "duplicates_caused": 0,
        "invariant_violation_count": 0,
        "reconciler": {"exit_code": 0, "unexplained_violations": []},
        "fenced_out_sum": 0,
        "fenced_out_classification": {"explained": 0, "unexplained": 0},
    }
    two = {"explained": 2, "unexplained": 0, "explained_events": [], "unexplained_events": []}
    assert verdict({"fenced": arm, "naive": {"duplicates_caused": 0}})[0] == 3
    assert (
        verdict(
            {
                "fenced": {**arm, "fenced_out_sum": 2, "fenced_out_classification": two},
                "naive": {"duplicates_caused": 1},
            }
        )[0]
        == 0
    )
    assert verdict({"fenced": {**arm, "duplicates_caused": 1}})[0] == 1


def test_the_command_refuses_a_single_executor():
    with pytest.raises(CommandError, match="at least 2"):
        call_command("fencing_experiment", "--executors", "1")


def test_the_command_without_a_stack_says_to_run_make_up(monkeypatch, tmp_path):
    monkeypatch.setenv("DLOCK_RUN_DIR", str(tmp_path))
    with pytest.raises(CommandError, match="make up"):
        call_command("fencing_experiment", "--ci", "--out", str(tmp_path / "out"))


def test_make_demo_without_a_stack_fails_loudly_and_says_what_to_do(tmp_path):
    import subprocess
    import sys

    result = subprocess.run(
        [sys.executable, "-m", "devstack.demo"],
        env={**os.environ, "DLOCK_RUN_DIR": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 1
    assert "make up" in result.stderr


def test_the_bench_summary_puts_every_lock_backend_beside_the_reference():
    from bench.report import summary_lines

    def arm(pairs: float, **etcd) -> dict:
        return {
            "pairs_per_s": pairs,
            "acquire_p50_ms": 1.0,
            "acquire_p99_ms": 2.0,
            "p99_ms": 3.0,
            "server_cpu_ms_per_pair": 2.0,
            "errors": 0,
            **etcd,
        }

    def etcd(cpu: float, ops: float) -> dict:
        return {
            "etcd_cpu_ms_per_pair": cpu,
            "etcd_put_delete_ops_per_pair": ops,
            "etcd_watch_events_per_pair": 0.0,
        }

    point = {
        "workload": "own",
        "clients": 8,
        "arms": {
            "dlock-pg": {**arm(80.0), "lockserver_cpu_ms_per_pair": 1.5, "writes_per_pair": 2.0},
            "dlock-etcd": arm(40.0, **etcd(0.62, 4.0)),
            "zookeeper": arm(90.0),
            "etcd-lock-grpc": arm(160.0, **etcd(0.31, 2.0)),
        },
        "etcd_ratios": {
            "etcd_over_pg": 0.5,
            "etcd_over_etcd_lock": None,
            "etcd_over_etcd_lock_grpc": 0.25,
            "etcd_cpu_over_etcd_lock_grpc": 2.0,
        },
    }
    text = "\n".join(
        summary_lines(
            {
                "peers": {"status": "ok", "result": {"points": [point]}},
                "e2e": {"status": "missing", "error": "bench.e2e is not built yet"},
            }
        )
    )
    table = [line.split() for line in text.splitlines() if line.endswith("       0")]
    assert [(row[-9], float(row[-8])) for row in table] == [
        (name, row["pairs_per_s"]) for name, row in point["arms"].items()
    ]
    # etcd's own counters per pair and the etcd ratios: the etcd bullet of docs/performance.md
    assert "dlock-etcd 0.62 / 4.0 / 0.0, etcd-lock-grpc 0.31 / 2.0 / 0.0" in text
    # the etcd backend beside dlock-pg at 8 clients; a ratio whose arm did not run is a dash
    assert "pairs/s ÷ dlock-pg's 0.5×, ÷ etcd-lock's —, ÷ etcd-lock-grpc's 0.25×" in text
    assert "etcd CPU per pair ÷ etcd-lock-grpc's 2.0×" in text
    assert "missing: bench.e2e is not built yet" in text


def test_the_bench_summary_puts_the_payout_floor_and_every_interleaved_round_beside_dlock():
    from bench.payout_floor import layers
    from bench.report import summary_lines

    by_role = {"lockserver": 3.6, "payments": 5.5, "railproxy": 4.3, "railstub": 2.3}
    dlock_row = {
        "processes": 1,
        "executors": 1,
        "concurrency": 32,
        "rail_latency_ms": 0,
        "payouts_per_s": 47.4,
        "cpu_ms_per_payout": {**by_role, "postgres": 6.5, "total": 22.2},
    }
    floor_cpu = {"lockserver": 1.7, "payments": 2.9, "railproxy": 2.5, "railstub": 1.1}
    floor = {
        "concurrency": 32,
        "payouts": 256,
        "completed": 256,
        "payouts_per_s": 89.7,
        "cpu_ms_per_payout": {**floor_cpu, "postgres": 5.2, "total": 13.4},
        "trivial_app": {"cpu_ms_per_request": 0.4},
    }
    floor["layers"] = layers(floor, floor["trivial_app"], dlock_row)
    # 6 requests per payout × 0.4 ms of gunicorn; the rest of the floor roles' 8.2 ms is psycopg,
    # the SQL functions and JSON; dlock's four roles spend 15.7 ms, 7.5 more than the floor's.
    assert floor["layers"]["gunicorn_ms"] == 2.4
    assert floor["layers"]["psycopg_sql_json_ms"] == 5.8
    assert floor["layers"]["django_drf_ours_ms"] == 7.5
    assert floor["layers"]["above_floor_by_role_ms"]["postgres"] == 1.3
    assert floor["layers"]["dlock_over_floor"] == 1.66
    one_round = {**floor, "round": 1, "dlock": dlock_row, "loadavg_1m_at_start": 5.0}
    floor.update(dlock=dlock_row, rounds=[one_round], dlock_over_floor_median=1.66)

    text = "\n".join(
        summary_lines(
            {
                "e2e": {"status": "ok", "result": {"rows": [dlock_row], "floor": floor}},
            }
        )
    )
    assert (
        "server CPU per payout (median of 1 interleaved rounds): dlock 22.2 ms | floor 13.4 ms"
        " | ratio 1.66× | goal <= 1.25×" in text
    )
    assert "22.2 / 13.4 = 1.66× (47.4 / 89.7, 5.0)" in text
    assert "gunicorn 2.4 ms (0.4 ms/request of a trivial app × 6)" in text
    assert "Django + DRF + our code" in text and "7.5 ms in the four roles" in text
    # issue 28: the summary ends with the goal lines; the CPU one is judged on the floor ratio
    goals = text.splitlines()[-4:]
    assert goals[-1].startswith(
        "  GOAL server CPU per payout: dlock ÷ like-for-like floor (median of interleaved rounds):"
        " 1.66× | <= 1.25× | FAIL"
    )
    assert all(" | NOT RUN " in line for line in goals[:3])  # no bench.peers result given


def test_the_bench_summary_prints_every_etcd_paced_round_and_the_ratios():
    from bench.report import summary_lines

    def row(pairs: float, cpu: float, ops: float) -> dict:
        return {
            "pairs_per_s": pairs,
            "etcd_cpu_ms_per_pair": cpu,
            "etcd_put_delete_ops_per_pair": ops,
        }

    result = {
        "rate": 400.0,
        "clients": 8,
        "rows": {
            "dlock unpaced": [row(1106.0, 0.53, 4.0), row(1264.0, 0.4, 4.0)],
            "recipe unpaced": [row(1493.0, 0.32, 2.0), row(2026.0, 0.28, 2.0)],
        },
        "etcd_cpu_dlock_over_recipe": {"unpaced": 1.43, "paced": 1.02},
    }
    text = "\n".join(summary_lines({"etcd_paced": {"status": "ok", "result": result}}))
    assert "8 threads per arm; paced: 400.0 pairs/s" in text
    assert "dlock unpaced    1106.0/1264.0 | 0.53/0.4 | 4.0/4.0" in text
    assert "recipe unpaced   1493.0/2026.0 | 0.32/0.28 | 2.0/2.0" in text
    assert "dlock ÷ recipe (median of per-round ratios): unpaced 1.43×, paced 1.02×" in text
    failed = summary_lines({"etcd_paced": {"status": "failed", "error": "RuntimeError: no etcd"}})
    assert "  failed: RuntimeError: no etcd" in failed


def test_the_bench_summary_prints_the_transports_cpu_per_call_in_both_trees():
    from bench.report import summary_lines

    result = {
        "trees": {"before": {"commit": "2510dc8" + "0" * 33}, "after": {"commit": "f" * 40}},
        "workload": "15 interleaved rounds x 1000 calls per arm and tree",
        "arms": {
            "exchange": {"before_us": 140.0, "after_us": 153.0, "after_over_before": 1.09},
            "send_once": {"before_us": 205.0, "after_us": 215.0, "after_over_before": 1.05},
        },
        "loadavg_1m": 1.0,
    }
    text = "\n".join(summary_lines({"transport": {"status": "ok", "result": result}}))
    assert "before 2510dc800000, after ffffffffffff; 15 interleaved rounds" in text
    assert "exchange   140.0 → 153.0 µs per call, after ÷ before 1.09×" in text
    assert "send_once  205.0 → 215.0 µs per call, after ÷ before 1.05×" in text


def test_the_bench_summary_prints_the_lock_paths_cpu_by_layer_and_every_cut():
    from bench.report import summary_lines

    result = {
        "backend": "pg",
        "cpu_ms_per_pair": 0.89,
        "cpu_ms_per_pair_by_log_level": {"INFO": 1.0, "WARNING": 0.89},
        "layers_percent": {"django": 27.7, "C built-ins": 19.3, "dlock": 15.9},
        "dlock_functions_percent": {"dlock/x.py:1 f": 0.9},
        "cuts_us_per_pair": {"4 metric updates per request": 116.0},
    }
    text = "\n".join(summary_lines({"lockpath": {"status": "ok", "result": result}}))
    assert "pg: 0.89 ms of CPU per pair" in text
    assert "by layer: django 27.7 %, C built-ins 19.3 %, dlock 15.9 %" in text
    assert "dlock's busiest functions: dlock/x.py:1 f 0.9 %" in text
    assert "cut: 4 metric updates per request: 116.0 µs of CPU per pair" in text
