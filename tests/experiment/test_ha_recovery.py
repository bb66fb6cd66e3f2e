"""The HA recovery measurement (issue 16, Measure): what a prober's attempts say about one fault,
payouts/s around it, the one-at-a-time schedule, and — for real, on a dev stack with two
replicas per role — probers that keep their own replica's outcome and a client with both URLs
that fails over while one replica is killed -9."""

from __future__ import annotations

import time

import pytest

from devstack.common import ROLES, free_port_block
from devstack.stack import clean, up
from experiment import ha, recovery
from experiment.probes import Attempt, build_probers
from experiment.schedule import (
    ETCD_FOLLOWER_KILL,
    ETCD_LEADER_CUT,
    ETCD_LEADER_KILL,
    PG_KILL,
    QUORUM_LOSS,
    RECOVERY_FAULTS,
    REPLICA_DOWN,
    REPLICA_KILL,
    REPLICA_STALL,
    recovery_duration,
    recovery_schedule,
)
from experiment.stack import from_stack_env
from tests.devstack.conftest import isolated_run


def attempts(*spec: tuple[float, float, bool, str]) -> list[Attempt]:
    return [Attempt(start, end, ok, code) for start, end, ok, code in spec]


def test_the_outage_runs_from_the_fault_to_the_end_of_the_first_success_started_after_it():
    seen = attempts(
        (9.0, 9.1, True, ""),
        (9.9, 10.2, True, ""),  # straddles the fault: it proves nothing about "after"
        (10.3, 10.4, False, "NOT_LEADER"),
        (10.5, 11.5, False, "ServiceUnreachable"),
        (11.6, 11.7, False, "NOT_LEADER"),
        (11.8, 12.4, True, ""),
        (12.5, 12.6, True, ""),
    )
    r = recovery.probe_recovery(seen, at=10.0, healed=11.0, healthy=11.5)
    assert r["last_ok_before"] == 9.1
    assert r["first_ok_after"] == 12.4
    assert r["outage_s"] == pytest.approx(2.4)
    assert r["after_restart_s"] == pytest.approx(1.4)
    assert r["after_healthy_s"] == pytest.approx(0.9)
    assert r["failed_attempts"] == 3
    assert r["failed_codes"] == {"NOT_LEADER": 2, "ServiceUnreachable": 1}


def test_a_prober_that_never_succeeds_again_has_no_recovery_and_counts_every_failure():
    r = recovery.probe_recovery(
        attempts((1.0, 1.1, True, ""), (2.0, 2.1, False, "NOT_FOUND"), (3.0, 3.1, False, "X")),
        at=1.5,
        healed=None,
    )
    assert r["first_ok_after"] is None and r["outage_s"] is None
    assert r["after_restart_s"] is None
    assert r["failed_attempts"] == 2


def test_fault_recovery_uses_the_kill_time_and_rates_payouts_in_the_three_windows():
    windows = [
        {"kind": "pause", "target": "0", "start": 1.0, "end": 4.0},  # not an HA fault
        {
            "kind": REPLICA_KILL,
            "target": "lockserver",
            "start": 20.0,
            "killed": 20.5,
            "restarted": 20.6,
            "end": 24.5,
        },
        {"kind": ETCD_LEADER_KILL, "target": "", "start": 10.0, "killed": 10.0, "end": 12.0},
    ]
    probes = {
        "lockserver/r1": attempts((20.4, 20.45, True, ""), (20.6, 20.7, True, "")),
        "lockserver/r2": attempts((20.4, 20.45, True, ""), (20.6, 24.0, False, "X")),
    }
    posted = [t / 10 for t in range(100, 300)]  # 10/s from 10 s to 30 s
    posted = [t for t in posted if not 21.0 <= t < 24.0]  # none while the replica was down
    out = recovery.fault_recovery(windows, probes, posted, settle_s=4.0)
    assert [f["kind"] for f in out] == [ETCD_LEADER_KILL, REPLICA_KILL]
    kill = out[1]
    assert kill["at"] == 20.5 and kill["killed"] == "lockserver/r2"
    assert kill["probes"]["lockserver/r1"]["outage_s"] == pytest.approx(0.2)
    assert kill["probes"]["lockserver/r2"]["outage_s"] is None
    assert kill["payouts_per_s"]["before"] == pytest.approx(10.0)
    # 20.5..21.0 and 24.0..24.5 of the 4 s: 10 payouts
    assert kill["payouts_per_s"]["during"] == pytest.approx(10 / 4.0)
    assert kill["payouts_per_s"]["after"] == pytest.approx(10.0)
    lines = recovery.recovery_lines(out)
    assert any("lockserver/r2" in line and "the killed replica" in line for line in lines)
    assert any("lockserver/r1" in line and "> goal" not in line for line in lines)


def test_the_recovery_schedule_is_every_ha_fault_alone_each_after_a_settle():
    events = recovery_schedule(settle_s=6.0)
    assert [(e.kind, e.target) for e in events] == list(RECOVERY_FAULTS)
    assert {e.kind for e in events} == {
        ETCD_LEADER_KILL,
        ETCD_FOLLOWER_KILL,
        ETCD_LEADER_CUT,
        QUORUM_LOSS,
        REPLICA_KILL,
        REPLICA_STALL,
        REPLICA_DOWN,
        PG_KILL,
    }
    stall = next(e for e in events if e.kind == REPLICA_STALL)
    assert (stall.target, stall.seconds) == ("lockserver", 15.0)
    down = next(e for e in events if e.kind == REPLICA_DOWN)
    assert (down.target, down.seconds) == ("lockserver", 5.0)
    assert {e.target for e in events if e.kind == REPLICA_KILL} == {
        "lockserver",
        "payments",
        "railproxy",
    }
    assert all(e.params == {"settle": 6.0} for e in events)
    assert next(e for e in events if e.kind == QUORUM_LOSS).seconds >= 5.0
    gaps = [b.at - a.at for a, b in zip(events, events[1:], strict=False)]
    assert all(gap >= 6.0 for gap in gaps)
    assert recovery_duration(6.0) > events[-1].at


@pytest.fixture
def replicated_stack(tmp_path, monkeypatch):
    run = isolated_run(tmp_path, monkeypatch)
    (run / "pids").mkdir(parents=True)
    base = free_port_block(len(ROLES), replicas=2)
    try:  # a start that fails half-way leaves roles running: clean up either way
        up("pg", replicas=2, run=run, ports={role: base + n for n, role in enumerate(ROLES, 1)})
        yield from_stack_env(run)
    finally:
        clean(run=run)


@pytest.mark.live
@pytest.mark.slow
def test_probers_see_the_killed_replica_down_and_the_failover_client_carry_on(replicated_stack):
    stack = replicated_stack
    t0 = time.monotonic()
    probers = build_probers(
        stack.env, run_id="t1", account_id="acct-none", clock=lambda: time.monotonic() - t0
    )
    names = sorted(p.name for p in probers)
    assert names == sorted(
        [
            f"{role}/{replica}"
            for role in ("lockserver", "payments", "railproxy")
            for replica in ("r1", "r2", "both")
        ]
        + ["lockserver/fwd"]  # the executors' order: r1 first (no etcd prober on pg)
    )
    by_name = {p.name: p for p in probers}
    lock_probers = [by_name[f"lockserver/{r}"] for r in ("r1", "r2", "both")]
    try:
        for prober in lock_probers:
            prober.start()
        deadline = time.monotonic() + 30
        while not all(p.attempts and p.attempts[-1].ok for p in lock_probers):
            assert time.monotonic() < deadline, [p.attempts[-1:] for p in lock_probers]
            time.sleep(0.1)
        marks: dict[str, float] = {}

        def mark(what: str) -> None:
            marks[what] = time.monotonic() - t0

        ha.kill_replica(stack, "lockserver", mark=mark)  # kill -9 lockserver-2, restart it
        # attempts against the restarted replica, on the record
        answered_since(by_name["lockserver/r2"], marks["restarted"])
    finally:
        for prober in lock_probers:
            prober.stop()
    at = marks["killed"]
    killed = by_name["lockserver/r2"].attempts
    failover = by_name["lockserver/both"].attempts
    survivor = by_name["lockserver/r1"].attempts
    # `both` lists the replica that dies first: it was on it before the kill
    assert failover and failover[0].ok
    # the killed replica's own prober saw it gone (nothing sent: connect refused), then back;
    # while the restarted process warms up under load it may shed a request (503 OVERLOADED,
    # retry-safe), never answer anything else
    down = [a for a in killed if a.start >= at and not a.ok]
    codes = {a.code for a in down}
    assert down and "ServiceUnreachable" in codes, down[:3]
    assert codes <= {"ServiceUnreachable", "OVERLOADED", "NOT_LEADER"}, down
    assert recovery.probe_recovery(killed, at=at, healed=marks["restarted"])["first_ok_after"]
    # the survivor never failed; the client with both URLs moved to it on connect refused
    # (at most the one acquire in flight when the process died is lost, not the outage)
    assert all(a.ok for a in survivor), [a for a in survivor if not a.ok][:3]
    after = [a for a in failover if a.start >= at]
    assert sum(1 for a in after if not a.ok) <= 1, [a for a in after if not a.ok]
    assert sum(1 for a in after if a.ok) > len(down) // 2


def test_a_quorum_loss_is_split_into_etcds_time_and_dlocks_share_per_prober():
    windows = [
        {
            "kind": QUORUM_LOSS,
            "target": "",
            "start": 10.0,
            "killed": 10.0,
            "restarted": 15.0,
            "end": 17.0,
        }
    ]
    probes = {
        "etcd/cluster": attempts(
            (9.0, 9.1, True, ""), (10.5, 16.0, False, "x"), (16.1, 16.4, True, "")
        ),
        "lockserver/r1": attempts(
            (9.0, 9.1, True, ""), (10.1, 16.5, False, "NOT_LEADER"), (16.6, 16.9, True, "")
        ),
        "lockserver/r2": attempts((9.0, 9.1, True, ""), (16.2, 18.0, True, "")),
    }
    (fault,) = recovery.fault_recovery(windows, probes, [], settle_s=5.0)
    split = fault["split"]
    assert split["etcd_first_ok"] == 16.4 and split["etcd_s"] == pytest.approx(1.4)
    assert split["dlock_s"] == {"lockserver/r1": pytest.approx(0.5), "lockserver/r2": 1.6}
    text = "\n".join(recovery.recovery_lines([fault]))
    assert "split: etcd's first ok 1.40s after the restart" in text
    assert "r2 1.60s > goal" in text and "r1 0.50s," in text


def test_what_the_executors_logged_while_a_replica_was_down_is_counted_per_second(tmp_path):
    import json as _json
    from datetime import UTC, datetime

    wall0 = 1_000_000.0

    def line(at: float, level: str, event: str) -> str:
        ts = datetime.fromtimestamp(wall0 + at, tz=UTC).isoformat()
        return _json.dumps({"ts": ts, "level": level, "event": event})

    (tmp_path / "fenced-w0.log").write_text(
        "\n".join(
            [line(1.0, "INFO", "executor_posted")]
            + [line(10.0 + i / 10, "WARNING", "executor_lock_failed") for i in range(20)]
            + [line(13.0, "INFO", "executor_posted"), "not json"]
        )
    )
    lines = recovery.executor_log_lines(tmp_path, wall0=wall0)
    counts = recovery.log_counts(lines, 10.0, 14.0)
    assert counts["warnings"] == 20 and counts["warnings_per_s"] == 5.0
    assert counts["lock_failed_per_s"] == 5.0
    assert counts["events"] == {"executor_lock_failed": 20, "executor_posted": 1}
    windows = [
        {
            "kind": REPLICA_DOWN,
            "target": "lockserver",
            "start": 10.0,
            "killed": 10.0,
            "restarted": 14.0,
            "end": 15.0,
        }
    ]
    (fault,) = recovery.fault_recovery(windows, {}, [], settle_s=5.0, executor_logs=lines)
    assert fault["killed"] == "lockserver/r1" and fault["executor_log"] == counts
    assert "executors logged 20 WARNING lines in 4.0s (5.0/s)" in "\n".join(
        recovery.recovery_lines([fault])
    )


def test_a_pg_kill_reports_what_make_up_replaced():
    windows = [
        {
            "kind": PG_KILL,
            "target": "",
            "start": 5.0,
            "killed": 5.0,
            "restarted": 5.2,
            "end": 25.0,
            "outcome": {"make_up_exit": 0, "replaced": [], "make_up_tail": ""},
        }
    ]
    (fault,) = recovery.fault_recovery(windows, {}, [], settle_s=5.0)
    assert fault["role"] == "lockserver"
    assert "  make up after the restart: exit 0, replaced nothing" in recovery.recovery_lines(
        [fault]
    )


# -- issue 27's cases, for real at a small size: a lock-server stack on etcd (one member), two
# replicas of every role, probers per replica; the stalled replica, the replica kept down and
# PostgreSQL's postmaster killed -9 (then `make up`, which must replace nothing).


@pytest.fixture(scope="module")
def etcd_replicated_stack(tmp_path_factory):
    with pytest.MonkeyPatch.context() as monkeypatch:
        run = isolated_run(tmp_path_factory.mktemp("ha27"), monkeypatch)
        (run / "pids").mkdir(parents=True)
        base = free_port_block(len(ROLES), replicas=2)
        ports = {role: base + n for n, role in enumerate(ROLES, 1)}
        try:
            up("etcd", etcd_members=1, replicas=2, run=run, ports=ports)
            yield from_stack_env(run)
        finally:
            clean(run=run)


def lock_probers(stack, run_id: str):
    t0 = time.monotonic()
    clock = lambda: time.monotonic() - t0  # noqa: E731
    probers = {
        p.name: p
        for p in build_probers(stack.env, run_id=run_id, account_id="acct-none", clock=clock)
        if p.role == "lockserver"
    }
    for prober in probers.values():
        prober.start()
    deadline = time.monotonic() + 30
    while not all(p.attempts and p.attempts[-1].ok for p in probers.values()):
        assert time.monotonic() < deadline, {n: p.attempts[-1:] for n, p in probers.items()}
        time.sleep(0.1)
    return probers, clock


def answered_since(prober, since: float, limit_s: float = 60.0) -> None:
    """Wait until `prober` has a successful attempt that started at or after `since` (its
    clock): the victim is serving again, by the record, however long its client's back-off or
    its own start took. `limit_s` only ends a hung run."""
    give_up = time.monotonic() + limit_s
    while not any(a.ok and a.start >= since for a in list(prober.attempts)):
        assert time.monotonic() < give_up, (prober.name, prober.attempts[-3:])
        time.sleep(0.05)


def stop_all(probers) -> None:
    for prober in probers.values():
        prober.stop()


def marker(clock, marks: dict):
    def mark(what: str) -> None:
        marks[what] = clock()

    return mark


@pytest.mark.live
@pytest.mark.slow
@pytest.mark.etcd
def test_a_stalled_replica_stops_answering_and_resumes_as_the_same_process(
    etcd_replicated_stack,
):
    stack = etcd_replicated_stack
    pid = ha.role_pids(stack)["lockserver"]
    probers, clock = lock_probers(stack, "st")
    marks: dict[str, float] = {}
    try:
        ha.stall_replica(stack, "lockserver", 2.0, mark=marker(clock, marks))
        answered_since(probers["lockserver/r1"], marks["restarted"])
    finally:
        stop_all(probers)
    at, resumed = marks["killed"], marks["restarted"]
    stalled = probers["lockserver/r1"].attempts
    # nothing r1 answered between the stop and the SIGCONT
    assert not [a for a in stalled if a.ok and at + 0.1 < a.end < resumed]
    assert recovery.probe_recovery(stalled, at=at, healed=resumed)["first_ok_after"] > resumed
    # the other replica never noticed, and the stalled one was not replaced
    assert all(a.ok for a in probers["lockserver/r2"].attempts if a.start >= at)
    assert ha.role_pids(stack)["lockserver"] == pid


@pytest.mark.live
@pytest.mark.slow
@pytest.mark.etcd
def test_a_replica_kept_down_refuses_connections_until_it_is_started_again(
    etcd_replicated_stack,
):
    stack = etcd_replicated_stack
    pid = ha.role_pids(stack)["lockserver"]
    probers, clock = lock_probers(stack, "dn")
    marks: dict[str, float] = {}
    try:
        ha.down_replica(stack, "lockserver", 1.5, mark=marker(clock, marks))
        answered_since(probers["lockserver/r1"], marks["restarted"])
    finally:
        stop_all(probers)
    at = marks["killed"]
    down = [a for a in probers["lockserver/r1"].attempts if a.start >= at and not a.ok]
    assert down and "ServiceUnreachable" in {a.code for a in down}
    assert recovery.probe_recovery(
        probers["lockserver/r1"].attempts, at=at, healed=marks["restarted"]
    )["first_ok_after"]
    assert all(a.ok for a in probers["lockserver/r2"].attempts if a.start >= at)
    assert ha.role_pids(stack)["lockserver"] != pid  # started again from its record


@pytest.mark.live
@pytest.mark.slow
@pytest.mark.etcd
def test_a_postgres_kill_leaves_the_etcd_lock_servers_serving_and_make_up_replaces_nothing(
    etcd_replicated_stack,
):
    stack = etcd_replicated_stack
    probers, clock = lock_probers(stack, "pg")
    marks: dict[str, float] = {}
    try:
        outcome = ha.kill_postmaster(stack, mark=marker(clock, marks))
    finally:
        stop_all(probers)
    assert outcome["make_up_exit"] == 0, outcome["make_up_tail"]
    assert outcome["replaced"] == [], outcome
    assert stack.pg_cluster is not None and stack.pg_cluster.running()
    # both etcd-backed lock-servers kept granting while PostgreSQL was down and restarting
    for name in ("lockserver/r1", "lockserver/r2"):
        during = [a for a in probers[name].attempts if a.start >= marks["killed"]]
        assert during and all(a.ok for a in during), [a for a in during if not a.ok][:3]


class _Grant:
    def release(self) -> bool:
        return False  # what dlock.client's Grant.release answers when its DELETE timed out


class _Session:
    lost = None

    def acquire(self, *_args, **_kwargs):
        return _Grant()


def test_a_lock_probe_whose_release_did_not_complete_failed():
    """A stalled lock server can answer the acquire and then stall the release: that attempt
    did not succeed (the release's failure is only logged by the client)."""
    from experiment.probes import LockProbe, ReleaseFailed

    probe = LockProbe("http://127.0.0.1:20001", owner_id="probe-t", key="probe:t")
    probe.session = _Session()
    with pytest.raises(ReleaseFailed):
        probe()
