"""bench.peers (issue 28): the token check every lock arm goes through, against a real
ZooKeeper and kazoo's Lock recipe, and the summary's goal lines."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest

from bench import peers
from bench.peer_clients import ZkLockClient
from bench.peer_rounds import (
    TokenLog,
    TokenOrderError,
    assert_tokens_increase,
    check_tokens,
    ratios,
)
from bench.zookeeper import ZooKeeperServer
from devstack.common import free_port


@pytest.fixture(scope="module")
def zookeeper():
    work = Path(tempfile.mkdtemp(prefix="dlock-test-zk-"))
    server = ZooKeeperServer(work / "zk", free_port(), heap_mb=128).start()
    try:
        yield server
    finally:
        server.stop()
        shutil.rmtree(work, ignore_errors=True)


def test_the_zookeeper_arm_token_check_catches_a_token_that_does_not_increase(zookeeper):
    log = TokenLog()
    first = ZkLockClient(zookeeper.hosts, "tokens.k1")
    second = ZkLockClient(zookeeper.hosts, "tokens.k1")  # another session, same key
    try:
        for client in (first, second, first, second):
            token = client.acquire()
            log.record("zookeeper", "tokens.k1", token)
            client.release()
    finally:
        first.close()
        second.close()
    grants = log.by_key[("zookeeper", "tokens.k1")]
    assert len(grants) == 4 and grants == sorted(set(grants))  # the recipe's own order
    report = assert_tokens_increase(log.by_key)
    assert report["zookeeper"] == {"keys": 1, "grants": 4, "violations": []}

    log.record("zookeeper", "tokens.k1", grants[-1])  # a grant that does not exceed the last one
    with pytest.raises(TokenOrderError, match="tokens.k1"):
        assert_tokens_increase(log.by_key)
    violations = check_tokens(log.by_key)["zookeeper"]["violations"]
    assert violations == [
        {"key": "tokens.k1", "grant": 4, "previous": grants[-1], "token": grants[-1]}
    ]


def _arm(pairs: float, p99: float) -> dict:
    return {"pairs": int(pairs * 3), "pairs_per_s": pairs, "acquire_p99_ms": p99}


def test_the_summary_ends_with_issue_28s_goal_lines_judged_on_per_round_ratios():
    from bench.goals import goals
    from bench.report import summary_lines

    # Two rounds: the goal ratio is the median of the per-round ratios against the round's
    # best peer (round 1: zookeeper is best, round 2: etcd-lock).
    rounds = [
        {
            "arms": {
                "dlock-pg": _arm(300.0, 12.0),
                "dlock-etcd": _arm(160.0, 30.0),
                "zookeeper": _arm(250.0, 20.0),
                "etcd-lock": _arm(200.0, 10.0),
            }
        },
        {
            "arms": {
                "dlock-pg": _arm(220.0, 14.0),
                "dlock-etcd": _arm(150.0, 40.0),
                "zookeeper": _arm(200.0, 20.0),
                "etcd-lock": _arm(275.0, 10.0),
            }
        },
    ]
    found = ratios(rounds)
    assert found["rounds"]["pg_over_best_peer"] == [1.2, 0.8]
    assert found["pg_over_best_peer"] == 1.0  # median of 1.2 and 0.8: PASS (>= 1.0)
    assert found["etcd_over_etcd_lock"] == pytest.approx((0.8 + 150 / 275) / 2, abs=1e-3)
    assert found["pg_p99_over_best_peer"] == 1.3
    point = {
        "workload": "own",
        "clients": 8,
        "arms": {
            arm: {
                **_arm(1, 1),
                "p50_ms": 1,
                "acquire_p50_ms": 1,
                "p99_ms": 1,
                "server_cpu_ms_per_pair": 1,
                "errors": 0,
            }
            for arm in peers.ARMS
        },
        "ratios": found,
    }
    results = {
        "peers": {"status": "ok", "result": {"points": [point], "tokens": {}}},
        "e2e": {
            "status": "ok",
            "result": {"floor": {"dlock_over_floor_median": 1.2, "cpu_ms_per_payout": {}}},
        },
    }
    verdicts = [g["verdict"] for g in goals(results) if not g["goal"].startswith("issue 39")]
    assert verdicts == ["PASS", "FAIL", "PASS", "PASS"]
    tail = summary_lines(results)[-4:]
    assert tail[0].startswith(
        "  GOAL lock pairs/s at 8 clients (own keys): dlock (pg) ÷ best of ZooKeeper/kazoo,"
        " etcd lock API: 1.0× | >= 1.0× | PASS"
    )
    assert " | >= 0.8× | FAIL" in tail[1]
    assert "1.3× | <= 1.5× | PASS" in tail[2]
    assert "1.2× | <= 1.25× | PASS" in tail[3]


def test_a_roles_cpu_is_its_pod_when_a_proxy_holds_the_port():
    """bench.e2e counts a role by the process tree behind its port: behind the serving
    change's per-role nginx that listener is nginx, a child of the pod (`devstack.pod`) whose
    other child is gunicorn — the role is the pod, or gunicorn's CPU would be missed."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from bench.proc import listener_root, role_root

    port = free_port()
    listen = (
        f"import socket, time; s = socket.socket(); s.bind(('127.0.0.1', {port})); s.listen();"
        " time.sleep(60)"
    )
    spawn = "import subprocess, sys; subprocess.run([sys.executable, '-c', sys.argv[1]])"
    for argv, is_pod in (([listen, "devstack.pod"], True), ([listen, "something-else"], False)):
        parent = subprocess.Popen([sys.executable, "-c", spawn, *argv])
        child = None
        try:
            deadline = time.monotonic() + 30
            while listener_root(port) is None and time.monotonic() < deadline:
                time.sleep(0.05)
            child = listener_root(port)
            assert child is not None and child != parent.pid
            assert role_root(port) == (parent.pid if is_pod else child)
        finally:
            if child is not None:
                os.kill(child, signal.SIGKILL)
            parent.kill()
            parent.wait()


def test_the_summary_prints_issue_39s_goal_lines_against_zookeeper():
    from bench.goals import goals
    from bench.report import summary_lines

    def point(workload: str, clients: int, pg: float, zk: float, pg_p99: float, zk_p99: float):
        rounds = [
            {
                "arms": {
                    "dlock-pg": _arm(pg, pg_p99),
                    "dlock-etcd": _arm(50.0, 30.0),
                    "zookeeper": _arm(zk, zk_p99),
                    "etcd-lock": _arm(200.0, 10.0),
                }
            }
        ]
        arms = {
            arm: {
                **row,
                "acquire_p50_ms": 1,
                "p50_ms": 1,
                "p99_ms": 1,
                "errors": 0,
                "lockserver_cpu_ms_per_pair": 1.2,
                "server_cpu_ms_per_pair": 2.0,
                "writes_per_pair": 2.0,
            }
            for arm, row in rounds[0]["arms"].items()
        }
        return {
            "workload": workload,
            "clients": clients,
            "arms": arms,
            "ratios": ratios(rounds),
        }

    points = [
        point("hot", 8, 300.0, 250.0, 30.0, 25.0),  # 1.2× PASS, p99 1.2× PASS
        point("hot", 32, 200.0, 250.0, 90.0, 30.0),  # 0.8× FAIL, p99 3.0× FAIL
        point("own", 8, 400.0, 400.0, 5.0, 5.0),  # 1.0× PASS
        point("own", 32, 300.0, 400.0, 5.0, 5.0),  # 0.75× FAIL
    ]
    results = {"peers": {"status": "ok", "result": {"points": points, "tokens": {}}}}
    found = {g["goal"]: g for g in goals(results) if g["goal"].startswith("issue 39")}
    verdicts = [g["verdict"] for g in found.values()]
    assert verdicts == ["PASS", "PASS", "FAIL", "FAIL", "PASS", "FAIL", "FAIL", "PASS"]
    cpu = found["issue 39, own keys × 8: lock-server CPU per pair on pg (its nginx + gunicorn)"]
    assert (cpu["ratio"], cpu["bound"]) == (1.2, "<= 1.5 ms")
    text = "\n".join(summary_lines(results))
    assert (
        "GOAL issue 39, one hot key × 32: p99 acquire dlock (pg) ÷ ZooKeeper/kazoo: 3.0×"
        " | <= 1.5× | FAIL  (dlock-pg 90.0 ms; zookeeper 30.0 ms)" in text
    )


def test_a_subset_of_points_and_arms_is_chosen_by_name_and_a_wrong_name_is_refused():
    assert peers.chosen_points("own:8, hot:32") == (("own", 8), ("hot", 32))
    assert peers.chosen_points("") == peers.chosen_points(" , ")
    assert ("own", 1) in peers.chosen_points("")  # empty: every point
    assert peers.chosen_arms("dlock-etcd,etcd-lock") == ("dlock-etcd", "etcd-lock")
    assert "zookeeper" in peers.chosen_arms("")  # empty: every arm
    for wrong in ("own", "warm:8", "own:eight"):
        with pytest.raises(ValueError, match="BENCH_PEERS_POINTS"):
            peers.chosen_points(wrong)
    with pytest.raises(ValueError, match="BENCH_PEERS_ARMS"):
        peers.chosen_arms("dlock-etcd,redis")


def test_etcd_arms_report_etcds_own_work_per_pair_and_the_etcd_goal_ratios():
    row = {"pairs": 100, "server_cpu_ms_per_pair_by_process": {"lockserver": 2.0, "etcd": 0.5}}
    before = {"put": 10, "delete": 5, "events": 7}
    after = {"put": 210, "delete": 205, "events": 7}
    worked = peers.with_etcd_work(row, before, after)
    assert worked["etcd_cpu_ms_per_pair"] == 0.5
    assert worked["etcd_put_delete_ops_per_pair"] == 4.0
    assert worked["etcd_watch_events_per_pair"] == 0.0
    unknown = peers.with_etcd_work(row, before, {**after, "events": None})
    assert unknown["etcd_watch_events_per_pair"] is None

    def arm(rate: float, etcd_cpu: float | None = None) -> dict:
        return {"pairs_per_s": rate, "etcd_cpu_ms_per_pair": etcd_cpu}

    rounds = [
        {"arms": {"dlock-etcd": arm(90, 0.6), "dlock-pg": arm(100), "etcd-lock": arm(300),
                  "etcd-lock-grpc": arm(600, 0.4)}},
        {"arms": {"dlock-etcd": arm(80, 0.5), "dlock-pg": arm(100), "etcd-lock": arm(200),
                  "etcd-lock-grpc": arm(400, 0.5)}},
    ]  # fmt: skip
    goals = peers.etcd_ratios(rounds)
    assert goals["rounds"]["etcd_cpu_over_etcd_lock_grpc"] == [1.5, 1.0]
    assert goals["etcd_cpu_over_etcd_lock_grpc"] == 1.25
    assert goals["etcd_over_pg"] == 0.85
    assert goals["etcd_over_etcd_lock"] == pytest.approx((0.3 + 0.4) / 2)
