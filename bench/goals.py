"""The goal lines of `python -m bench`: each goal a ratio between arms measured in the same run
on this box (issues 28 and 39; issue 25's before/after bound is read by `report.compare_lines`),
with its bound and PASS, FAIL or NOT RUN. Written to `.run/bench/goals.json`.
"""

from __future__ import annotations

# Issue 28's goals: ratios to arms measured in the same run, on this box.
GOAL_PG_OVER_BEST_PEER = 1.0  # lock pairs/s at 8 clients, dlock (pg) ÷ best of ZK / etcd lock API
GOAL_ETCD_OVER_ETCD_LOCK = 0.8  # dlock (etcd) ÷ etcd's own lock API
GOAL_P99_OVER_BEST_PEER = 1.5  # p99 acquire at 8 clients, dlock ÷ the best durable peer (at most)
GOAL_CPU_OVER_FLOOR = 1.25  # server CPU per payout ÷ the like-for-like floor (at most)
GOAL_25_AFTER_OVER_BEFORE = 1.15  # issue 25: server CPU per payout after ÷ before (at most)
# Issue 39 (the lock path): against ZooKeeper/kazoo and etcd's lock API, same run, interleaved.
GOAL_39_PG_OVER_ZK = 1.0  # pairs/s, dlock (pg) ÷ ZooKeeper/kazoo, hot key and own keys, 8 and 32
GOAL_39_P99_OVER_ZK = 1.5  # p99 acquire on a hot key, dlock (pg) ÷ ZooKeeper/kazoo (at most)
GOAL_39_ETCD_OVER_ETCD_LOCK = 0.4  # own keys × 8: dlock (etcd) ÷ etcd's lock API
GOAL_39_LOCKSERVER_CPU_MS = 1.5  # lock-server CPU (its nginx + gunicorn) per pair on pg, ms


def _result(entry: dict | None) -> dict:
    return (entry or {}).get("result") or {}


def _peer_point(peers: dict, workload: str, clients: int) -> dict | None:
    return next(
        (
            p
            for p in peers.get("points", [])
            if p.get("workload") == workload and p.get("clients") == clients
        ),
        None,
    )


def goals(results: dict[str, dict]) -> list[dict]:
    """Issue 28's goal lines: each with its ratio, its arms, the bound and PASS/FAIL (NOT RUN
    when the part that measures it did not run or gave no number)."""
    peers = _result(results.get("peers"))
    e2e = _result(results.get("e2e"))
    # issue 39's lines first: the summary ends with issue 28's four, as it always has
    return _issue39_goals(peers) + _issue28_goals(peers, e2e)


def _goal(name: str, ratio, bound: float, at_most: bool, arms: str, unit: str = "×") -> dict:
    if ratio is None:
        verdict = "NOT RUN"
    else:
        verdict = "PASS" if (ratio <= bound if at_most else ratio >= bound) else "FAIL"
    return {
        "goal": name,
        "ratio": ratio,
        "unit": unit,
        "bound": f"{'<=' if at_most else '>='} {bound}{unit}",
        "arms": arms,
        "verdict": verdict,
    }


def _arm_text(arms: dict, arm: str, field: str, unit: str) -> str:
    row = arms.get(arm)
    return f"{arm} {row[field]}{unit}" if row else f"{arm} —"


def _issue28_goals(peers: dict, e2e: dict) -> list[dict]:
    own8 = _peer_point(peers, "own", 8) if peers else None
    arms8 = (own8 or {}).get("arms", {})
    ratios8 = (own8 or {}).get("ratios", {})

    def rate(arm: str) -> str:
        return _arm_text(arms8, arm, "pairs_per_s", "/s")

    def p99(arm: str) -> str:
        return _arm_text(arms8, arm, "acquire_p99_ms", " ms")

    floor = e2e.get("floor") or {}
    mine = ((floor.get("dlock") or {}).get("cpu_ms_per_payout") or {}).get("total")
    base = (floor.get("cpu_ms_per_payout") or {}).get("total")
    return [
        _goal(
            "lock pairs/s at 8 clients (own keys): dlock (pg) ÷ best of ZooKeeper/kazoo,"
            " etcd lock API",
            ratios8.get("pg_over_best_peer"),
            GOAL_PG_OVER_BEST_PEER,
            False,
            f"{rate('dlock-pg')}; {rate('zookeeper')}, {rate('etcd-lock')}",
        ),
        _goal(
            "lock pairs/s at 8 clients (own keys): dlock (etcd) ÷ etcd lock API",
            ratios8.get("etcd_over_etcd_lock"),
            GOAL_ETCD_OVER_ETCD_LOCK,
            False,
            f"{rate('dlock-etcd')}; {rate('etcd-lock')}",
        ),
        _goal(
            "p99 acquire at 8 clients (own keys): dlock (pg) ÷ best durable peer",
            ratios8.get("pg_p99_over_best_peer"),
            GOAL_P99_OVER_BEST_PEER,
            True,
            f"{p99('dlock-pg')}; {p99('zookeeper')}, {p99('etcd-lock')}",
        ),
        _goal(
            "server CPU per payout: dlock ÷ like-for-like floor (median of interleaved rounds)",
            floor.get("dlock_over_floor_median"),
            GOAL_CPU_OVER_FLOOR,
            True,
            f"dlock {mine} ms; floor {base} ms (every role gunicorn + psycopg + the same SQL)"
            if floor
            else "e2e with its floor not run",
        ),
    ]


def _issue39_goals(peers: dict) -> list[dict]:
    out: list[dict] = []
    for workload, clients in (("hot", 8), ("hot", 32), ("own", 8), ("own", 32)):
        point = _peer_point(peers, workload, clients) if peers else None
        arms, ratios = (point or {}).get("arms", {}), (point or {}).get("ratios", {})
        where = "one hot key" if workload == "hot" else "own keys"
        out.append(
            _goal(
                f"issue 39, {where} × {clients}: pairs/s dlock (pg) ÷ ZooKeeper/kazoo",
                ratios.get("pg_over_zookeeper"),
                GOAL_39_PG_OVER_ZK,
                False,
                f"{_arm_text(arms, 'dlock-pg', 'pairs_per_s', '/s')};"
                f" {_arm_text(arms, 'zookeeper', 'pairs_per_s', '/s')}",
            )
        )
        if workload == "hot":
            out.append(
                _goal(
                    f"issue 39, {where} × {clients}: p99 acquire dlock (pg) ÷ ZooKeeper/kazoo",
                    ratios.get("pg_p99_over_zookeeper"),
                    GOAL_39_P99_OVER_ZK,
                    True,
                    f"{_arm_text(arms, 'dlock-pg', 'acquire_p99_ms', ' ms')};"
                    f" {_arm_text(arms, 'zookeeper', 'acquire_p99_ms', ' ms')}",
                )
            )
    own8 = _peer_point(peers, "own", 8) if peers else None
    arms8 = (own8 or {}).get("arms", {})
    pg8 = arms8.get("dlock-pg") or {}
    store_cpu = (pg8.get("server_cpu_ms_per_pair") or 0) - (
        pg8.get("lockserver_cpu_ms_per_pair") or 0
    )
    out.append(
        _goal(
            "issue 39, own keys × 8: pairs/s dlock (etcd) ÷ etcd lock API",
            ((own8 or {}).get("ratios", {})).get("etcd_over_etcd_lock"),
            GOAL_39_ETCD_OVER_ETCD_LOCK,
            False,
            f"{_arm_text(arms8, 'dlock-etcd', 'pairs_per_s', '/s')};"
            f" {_arm_text(arms8, 'etcd-lock', 'pairs_per_s', '/s')}",
        )
    )
    out.append(
        _goal(
            "issue 39, own keys × 8: lock-server CPU per pair on pg (its nginx + gunicorn)",
            pg8.get("lockserver_cpu_ms_per_pair"),
            GOAL_39_LOCKSERVER_CPU_MS,
            True,
            f"dlock-pg; PostgreSQL's own CPU per pair {store_cpu:.3f} ms" if pg8 else "dlock-pg —",
            unit=" ms",
        )
    )
    return out


def goal_lines(found: list[dict]) -> list[str]:
    lines = ["", "Goals (issues 28 and 39; ratios within this run)", "-" * 48]
    for g in found:
        lines.append(
            f"  GOAL {g['goal']}: {g['ratio']}{g.get('unit', '×')} | {g['bound']}"
            f" | {g['verdict']}  ({g['arms']})"
        )
    return lines
