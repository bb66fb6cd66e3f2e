"""The experiment counts only fenced-outs its fault schedule explains (issues 20 §4, 16 §3).

A synthetic schedule of faults as injected and synthetic `executor_fenced_out` events: the
classifier must tell a stale writer (paused past its lease, revoked, slowed by a rail window)
from a writer a lock server fenced out with a fresh grant — and the verdict must fail on one.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest

from experiment.fenced_outs import Fault, FencedOutEvent, classify, events_from_logs
from experiment.ha import is_ha, time_to_next_posted
from experiment.schedule import HA_FAULTS, build_schedule
from experiment.verdict import verdict

LEASE_S = 1.5
SCHEDULE = [
    Fault(kind="pause", start=4.0, end=9.0, owner="fenced-w1-r1"),
    Fault(kind="revoke", start=4.5, end=4.6, key="payout:acct-0", token=40),
    Fault(kind="rail_latency", start=12.0, end=15.0, target='{"latency_ms": 2400}'),
    Fault(kind="restart", start=20.0, end=22.0, target="lockserver"),
]


def event(**overrides) -> FencedOutEvent:
    fields = {
        "at": 9.2,
        "owner": "fenced-w1-r1",
        "token": 41,
        "resource": "account",
        "key": "payout:acct-1",
        "granted_at": 3.9,
        "valid_from": 3.9,
    }
    return FencedOutEvent(**{**fields, **overrides})


def test_a_writer_paused_past_its_lease_is_explained_by_its_pause():
    result = classify([event()], SCHEDULE, lease_s=LEASE_S)
    assert (result["explained"], result["unexplained"]) == (1, 0)
    assert "pause fenced-w1-r1" in result["explained_events"][0]["why"]


def test_another_workers_pause_does_not_explain_a_stale_write():
    result = classify([event(owner="fenced-w0")], SCHEDULE, lease_s=LEASE_S)
    assert (result["explained"], result["unexplained"]) == (0, 1)
    assert "no scheduled fault overlapped" in result["unexplained_events"][0]["why"]


def test_a_revoked_grant_is_explained_even_when_young():
    young = event(owner="fenced-w2", key="payout:acct-0", token=40, at=4.8, granted_at=4.4)
    result = classify([young], SCHEDULE, lease_s=LEASE_S)
    assert result["explained"] == 1
    assert "revoked" in result["explained_events"][0]["why"]
    # A later token on the same key was not revoked: the revoke explains nothing about it.
    later = event(owner="fenced-w2", key="payout:acct-0", token=55, at=5.0, granted_at=4.9)
    assert classify([later], SCHEDULE, lease_s=LEASE_S)["unexplained"] == 1


def test_a_section_slowed_past_its_lease_by_a_rail_window_is_explained():
    slow = event(owner="fenced-w0", at=14.9, granted_at=12.5, valid_from=12.5)
    assert classify([slow], SCHEDULE, lease_s=LEASE_S)["explained"] == 1


def test_a_fresh_grant_fenced_out_after_a_lock_server_restart_is_unexplained():
    # Issue 20: the lock server came back on another backend and issued tokens below the
    # fences; every writer after that was fenced out with a grant 0.3 s old.
    fresh = [
        event(owner=f"fenced-w{i}", at=23.0 + i, granted_at=22.7 + i, valid_from=22.7 + i)
        for i in range(3)
    ]
    result = classify(fresh, SCHEDULE, lease_s=LEASE_S)
    assert (result["explained"], result["unexplained"]) == (0, 3)
    assert all("not stale" in e["why"] for e in result["unexplained_events"])


def test_a_renewal_makes_an_old_section_young_again():
    renewed = event(owner="fenced-w0", at=14.0, granted_at=11.0, valid_from=13.6)
    result = classify([renewed], SCHEDULE, lease_s=LEASE_S)
    assert result["unexplained"] == 1
    assert "not stale" in result["unexplained_events"][0]["why"]


def test_server_side_fenced_outs_no_executor_logged_need_a_kill_each():
    result = classify([], SCHEDULE, lease_s=LEASE_S, unseen={"rail": 3}, kills=2)
    assert (result["explained"], result["unexplained"]) == (2, 1)
    assert result["unexplained_events"][0]["resource"] == "rail"


def test_events_are_read_from_the_executors_logs_with_their_grant_and_renewal(tmp_path):
    wall0 = datetime(2026, 12, 1, 10, 0, tzinfo=UTC)

    def line(name: str, seconds: float, **fields) -> str:
        ts = (wall0 + timedelta(seconds=seconds)).isoformat()
        return json.dumps({"event": name, "ts": ts, "ownerId": "fenced-w0", **fields})

    (tmp_path / "fenced-w0.log").write_text(
        "\n".join(
            [
                "not json",
                line("executor_section_started", 1.0, token=7, key="payout:a"),
                line("executor_renewed", 2.0, token=7),
                line(
                    "executor_fenced_out",
                    4.5,
                    token=7,
                    payoutId="p1",
                    details={"resourceType": "rail"},
                ),
            ]
        )
    )
    (found,) = events_from_logs(tmp_path, wall0=wall0.timestamp())
    assert (found.owner, found.token, found.key, found.resource) == (
        "fenced-w0",
        7,
        "payout:a",
        "rail",
    )
    assert (found.granted_at, found.valid_from, found.at) == (1.0, 2.0, 4.5)


def test_a_concurrent_executors_sections_are_told_apart_and_attributed_to_its_pause(tmp_path):
    """Issue 17: one process, one owner id, several sections at once, their lines interleaved.
    Each fenced-out gets its own section's grant and renewal; the process's pause explains the
    stale one, and the young one (renewed just before) stays unexplained."""
    wall0 = datetime(2026, 12, 1, 10, 0, tzinfo=UTC)
    owner = "fenced-w1-r1"

    def line(name: str, seconds: float, **fields) -> str:
        ts = (wall0 + timedelta(seconds=seconds)).isoformat()
        return json.dumps({"event": name, "ts": ts, "ownerId": owner, **fields})

    (tmp_path / f"{owner}.log").write_text(
        "\n".join(
            [
                line("executor_section_started", 3.0, token=50, key="payout:a", payoutId="p1"),
                line("executor_section_started", 3.1, token=51, key="payout:b", payoutId="p2"),
                line("executor_section_started", 3.2, token=52, key="payout:c", payoutId="p3"),
                line("executor_renewed", 8.9, token=52, payoutId="p3"),
                line("executor_fenced_out", 9.2, token=51, payoutId="p2", details={}),
                line("executor_fenced_out", 9.3, token=52, payoutId="p3", details={}),
            ]
        )
    )
    found = {e.token: e for e in events_from_logs(tmp_path, wall0=wall0.timestamp())}
    assert set(found) == {51, 52}
    assert found[51].key == "payout:b" and found[52].key == "payout:c"
    assert found[51].granted_at == found[51].valid_from == pytest.approx(3.1)
    assert (found[52].granted_at, found[52].valid_from) == (pytest.approx(3.2), pytest.approx(8.9))
    result = classify(found.values(), SCHEDULE, lease_s=LEASE_S)
    assert (result["explained"], result["unexplained"]) == (1, 1)
    assert result["explained_events"][0]["token"] == 51
    assert "pause fenced-w1-r1" in result["explained_events"][0]["why"]
    assert result["unexplained_events"][0]["token"] == 52
    assert "not stale" in result["unexplained_events"][0]["why"]


def test_a_killed_concurrent_executor_explains_one_unlogged_fenced_out_per_slot():
    result = classify([], SCHEDULE, lease_s=LEASE_S, unseen={"rail": 5}, kills=1, per_kill=4)
    assert (result["explained"], result["unexplained"]) == (4, 1)


def fenced_arm(classification: dict, **overrides) -> dict:
    arm = {
        "arm": "fenced",
        "duplicates_caused": 0,
        "invariant_violation_count": 0,
        "reconciler": {"exit_code": 0, "unexplained_violations": []},
        "fenced_out_sum": classification["explained"] + classification["unexplained"],
        "fenced_out_classification": classification,
        "lock_backend": "pg",
        "lock_backend_observed": ["pg"],
        "rail_duplicate_acks": 0,
    }
    return {**arm, **overrides}


def test_one_unexplained_fenced_out_fails_the_run_with_its_reason():
    fresh = classify(
        [event(owner="fenced-w0", at=23.0, granted_at=22.8, valid_from=22.8)], SCHEDULE, lease_s=1.5
    )
    stale = classify([event()], SCHEDULE, lease_s=LEASE_S)
    mixed = {
        "explained": 84,
        "unexplained": 1,
        "explained_events": stale["explained_events"],
        "unexplained_events": fresh["unexplained_events"],
    }
    code, lines = verdict({"fenced": fenced_arm(mixed), "naive": {"duplicates_caused": 3}})
    assert code == 1
    assert any(
        line.startswith("FAIL: 1 fenced-outs the fault schedule does not explain") for line in lines
    )
    assert any("not stale" in line for line in lines)
    assert not any("stale writes fenced out" in line for line in lines)
    code, lines = verdict({"fenced": fenced_arm(stale), "naive": {"duplicates_caused": 3}})
    assert code == 0
    assert lines[0].startswith("ok: 1 stale writes fenced out (every one explained")


def test_a_lock_server_serving_on_another_backend_fails_the_run():
    stale = classify([event()], SCHEDULE, lease_s=LEASE_S)
    arm = fenced_arm(stale, lock_backend="etcd", lock_backend_observed=["etcd", "pg"])
    code, lines = verdict({"fenced": arm})
    assert code == 1
    assert any(
        "served acquires on etcd, pg" in line and "configured for etcd" in line for line in lines
    )


def test_fenced_outs_that_were_never_classified_fail_the_run():
    arm = fenced_arm({"explained": 0, "unexplained": 0}, fenced_out_classification=None)
    assert verdict({"fenced": arm})[0] == 1


def test_the_ha_schedule_adds_leader_kill_quorum_loss_and_a_replica_kill_per_role():
    plain = build_schedule(seed=9, duration=60, workers=4, lease_ms=2000)
    with_ha = build_schedule(seed=9, duration=60, workers=4, lease_ms=2000, ha=True)
    added = [e for e in with_ha if e.kind in HA_FAULTS]
    assert [e for e in with_ha if e.kind not in HA_FAULTS] == plain  # the rest is unchanged
    assert [e.kind for e in added].count("etcd_leader_kill") == 1
    (quorum,) = [e for e in added if e.kind == "quorum_loss"]
    assert quorum.seconds >= 5
    assert sorted(e.target for e in added if e.kind == "replica_kill") == [
        "lockserver",
        "payments",
        "railproxy",
    ]
    assert all(0 < e.at < 60 for e in added)


def test_an_ha_fault_that_slowed_a_stale_writer_explains_its_fenced_out():
    quorum = Fault(kind="quorum_loss", start=10.0, end=16.0)
    stale = event(owner="fenced-w3", at=16.5, granted_at=9.5, valid_from=9.5)
    assert classify([stale], [quorum], lease_s=LEASE_S)["explained"] == 1


def test_the_time_to_the_next_posted_payout_is_read_from_the_series():
    series = [{"t": 0.5, "POSTED": 3}, {"t": 1.0, "POSTED": 4}, {"t": 1.5, "POSTED": 4}]
    series += [{"t": 2.0, "POSTED": 4}, {"t": 4.5, "POSTED": 6}]
    assert time_to_next_posted(series, 1.2) == 3.3
    assert time_to_next_posted(series, 0.7) == 0.3
    assert time_to_next_posted(series, 5.0) is None


def test_the_ha_experiment_refuses_a_stack_without_three_members_and_two_replicas():
    from devstack.common import URL_ENV

    single = {"LOCK_BACKEND": "etcd", "DLOCK_ETCD_PORTS": "2379:2380"}
    single |= {URL_ENV[r]: "http://127.0.0.1:8081" for r in ("lockserver", "payments", "railproxy")}
    assert not is_ha(single)
    assert not is_ha({**single, "DLOCK_ETCD_PORTS": "1:2,3:4,5:6"})
    both = {URL_ENV[r]: "http://127.0.0.1:8081,http://127.0.0.1:8181" for r in URL_ENV}
    assert is_ha({**single, **both, "DLOCK_ETCD_PORTS": "1:2,3:4,5:6"})
    assert not is_ha({**single, **both, "DLOCK_ETCD_PORTS": "1:2,3:4,5:6", "LOCK_BACKEND": "pg"})


def test_the_lock_a_paused_concurrent_executor_holds_is_the_section_it_paused_in(tmp_path):
    """Issue 17: the revoke goes to the stopped section's key and token, not to whichever
    section the process started last (it has several; some already ended)."""
    from types import SimpleNamespace

    from experiment.arms import ArmContext
    from experiment.arms.fenced import FencedArm
    from experiment.config import ExperimentConfig

    owner = "fenced-w0-r1"

    def line(name: str, **fields) -> str:
        return json.dumps({"event": name, "ownerId": owner, **fields})

    log = tmp_path / f"{owner}.log"
    ctx = ArmContext(stack=None, config=ExperimentConfig(), run_id="r", logdir=tmp_path)  # type: ignore[arg-type]
    worker = SimpleNamespace(owner_id=owner)
    log.write_text(
        "\n".join(
            [
                line("executor_section_started", token=60, key="payout:a"),
                line("executor_section_started", token=61, key="payout:b"),
                line("executor_paused", token=60, phase="before_submit"),
                line("executor_section_started", token=62, key="payout:c"),
                line("payout_executed", token=62, outcome="posted"),
            ]
        )
    )
    assert FencedArm().held_lock(ctx, worker) == ("payout:a", 60)
    log.write_text(
        "\n".join(
            [
                line("executor_section_started", token=70, key="payout:a"),
                line("executor_section_started", token=71, key="payout:b"),
                line("payout_executed", token=71, outcome="posted"),
            ]
        )
    )
    assert FencedArm().held_lock(ctx, worker) == ("payout:a", 70)
