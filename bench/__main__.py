"""`make bench` / `python -m bench`: every benchmark in one run, side by side.

Parts (each writes `.run/bench/<name>.json` and returns a dict): `bench.fsync` (the disk),
`bench.peers` (issue 28: dlock beside ZooKeeper/kazoo and etcd's lock API, interleaved),
`bench.lockserver` (dlock over HTTP vs its SQL sent directly vs a no-framework floor; it runs
`bench.lock_etcd` for the etcd rows), `bench.redis_lock` (python-redis-lock, not durable),
`bench.payments` (claim+post over HTTP vs SQL), `bench.settlement` (posts only: the settlement
row's lock wait, PAY_SETTLEMENT_BUCKETS 1 vs 8), `bench.e2e` (payouts end to end, CPU per
payout by role, the like-for-like floor). `--before REV` adds `bench.compare` (two trees'
stacks, interleaved; issue 25). A part that is not built yet is reported as missing; a part
that fails is reported with its error; the others still run. The summary (printed and written
to `.run/bench/summary.json`) puts the numbers next to each other with ratios and ends with
issue 28's goal lines, PASS or FAIL (also `.run/bench/goals.json`).
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import platform
import secrets
import sys
import time
import traceback
from datetime import UTC, datetime
from pathlib import Path

from devstack import PROJECT

PARTS = ("fsync", "peers", "lockserver", "redis_lock", "payments", "settlement", "e2e")
OPTIONAL = ("compare", "configs", "scale", "lockpath")  # compare needs --before
MODULES = {name: f"bench.{name}" for name in (*PARTS, *OPTIONAL)}


def machine() -> dict:
    cpu = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem_gb = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal"):
                mem_gb = round(int(line.split()[1]) / 1024 / 1024, 1)
    except OSError:
        pass
    return {
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "host": platform.node(),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "cpu": cpu,
        "mem_gb": mem_gb,
        "loadavg_1m_at_start": round(os.getloadavg()[0], 2),
    }


# ----------------------------------------------------------------------------- reading results


def lock_rows(name: str, result: dict) -> list[dict]:
    """Rows {label, clients, pairs_per_s, p50_ms, p99_ms} from any lock-shaped result: a dict
    with `clients` whose values (or itself) carry `pairs_per_s`."""
    rows: list[dict] = []

    def walk(node, context: str) -> None:
        if isinstance(node, dict):
            label = str(node.get("backend") or node.get("name") or context)
            if "clients" in node:
                if "pairs_per_s" in node:
                    rows.append(_row(label, node["clients"], node))
                for key, value in node.items():
                    if isinstance(value, dict) and "pairs_per_s" in value:
                        rows.append(_row(f"{label} {key}", node["clients"], value))
            for key, value in node.items():
                if isinstance(value, (dict, list)) and key != "summary":
                    walk(value, label if key in ("levels", "rows") else f"{label} {key}")
        elif isinstance(node, list):
            for item in node:
                walk(item, context)

    walk(result, name)
    seen = set()
    unique = []
    for row in rows:
        key = (row["label"], row["clients"])
        if key not in seen:
            seen.add(key)
            unique.append(row)
    return unique


def _row(label: str, clients, values: dict) -> dict:
    return {
        "label": label.strip(),
        "clients": clients,
        "pairs_per_s": values.get("pairs_per_s"),
        "p50_ms": values.get("p50_ms"),
        "p99_ms": values.get("p99_ms"),
    }


def flat_numbers(result: dict, prefix: str = "", depth: int = 0) -> list[tuple[str, float]]:
    out: list[tuple[str, float]] = []
    for key, value in result.items():
        if key in ("raw", "summary"):
            continue
        label = f"{prefix}{key}"
        if isinstance(value, bool):
            continue
        if isinstance(value, (int, float)):
            out.append((label, value))
        elif isinstance(value, dict) and depth < 3:
            out += flat_numbers(value, f"{label}.", depth + 1)
        elif isinstance(value, list) and depth < 3:
            for i, item in enumerate(value):
                if isinstance(item, dict):
                    out += flat_numbers(item, f"{label}[{i}].", depth + 1)
    return out


def summary_lines(results: dict[str, dict]) -> list[str]:
    lines: list[str] = []

    def section(title: str) -> None:
        lines.append("")
        lines.append(title)
        lines.append("-" * len(title))

    fsync = results.get("fsync", {}).get("result") or {}
    floor = fsync.get("fdatasync_ops_per_s")

    lines += peers_lines(results.get("peers"))
    for name, title in (
        ("configs", "Lock-server configurations (bench.configs; ratios to ZooKeeper per round)"),
        ("scale", "Scale curve (bench.configs; processes, replicas, etcd members)"),
    ):
        chosen = results.get(name, {}).get("result")
        if chosen:
            section(title)
            lines += [f"  {line}" for line in chosen.get("table", [])]

    section("Lock: acquire+release pairs/s (p50 / p99 ms)")
    all_lock: list[dict] = []
    for name in ("lockserver", "redis_lock"):
        result = results.get(name, {}).get("result")
        if result:
            all_lock += lock_rows(name, result)
    if not all_lock:
        lines.append("  (no lock results)")
    for row in sorted(all_lock, key=lambda r: (str(r["label"]), r["clients"])):
        lines.append(
            f"  {row['label']:<42} {row['clients']:>3} clients {row['pairs_per_s'] or 0:>10.1f}"
            f"   {row['p50_ms']} / {row['p99_ms']}"
        )
    # Ratios at equal concurrency: everything against the dlock PostgreSQL backend over HTTP.
    reference = {
        r["clients"]: r
        for r in all_lock
        if "http" in r["label"].lower() and "etcd" not in r["label"].lower()
    }
    if reference:
        section("Ratios against the dlock lock server (PostgreSQL backend, HTTP), same clients")
        for row in sorted(all_lock, key=lambda r: (str(r["label"]), r["clients"])):
            ref = reference.get(row["clients"])
            if ref is None or row is ref or not ref["pairs_per_s"] or not row["pairs_per_s"]:
                continue
            lines.append(
                f"  {row['label']:<42} {row['clients']:>3} clients  "
                f"{row['pairs_per_s'] / ref['pairs_per_s']:>7.2f}×"
            )
    if floor:
        section(f"Durable locks against the disk's fsync floor ({floor:.0f} flushes/s, one writer)")
        for row in all_lock:
            if "redis (no fsync)" in row["label"] or not row["pairs_per_s"]:
                continue
            lines.append(
                f"  {row['label']:<42} {row['clients']:>3} clients  "
                f"{row['pairs_per_s'] / floor:>7.2f}× the flush rate"
            )

    lines += goals_lines(results)

    for name, title in (
        ("e2e", "Payouts end to end (durable PostgreSQL; issue 17 matrix + processes at rail 0)"),
        ("payments", "Payments: claim+post via HTTP vs direct SQL"),
        ("fsync", "Disk"),
    ):
        if name not in results:
            continue
        entry = results[name]
        section(title)
        if entry.get("status") != "ok":
            lines.append(f"  {entry.get('status', 'not run')}: {entry.get('error', '')[:300]}")
            continue
        result = entry["result"]
        summary = result.get("summary")
        if name == "payments" and isinstance(result.get("levels"), list):
            for level in result["levels"]:
                http = (level.get("http") or {}).get("pairs_per_s")
                sql = (level.get("direct") or {}).get("pairs_per_s")
                lines.append(
                    f"  claim+post, {level.get('clients'):>2} clients: HTTP {http}/s,"
                    f" direct SQL {sql}/s, HTTP/SQL {level.get('http_over_direct')}×"
                    f"  (p99 HTTP {(level.get('http') or {}).get('p99_ms')} ms,"
                    f" SQL {(level.get('direct') or {}).get('p99_ms')} ms)"
                )
            continue
        if isinstance(summary, list) and summary:
            for item in summary:
                value = item.get("value")
                shown = f"{value:>10.1f}" if isinstance(value, (int, float)) else f"{value!s:>10}"
                unit, detail = item.get("unit", ""), item.get("detail", "")
                lines.append(f"  {item['label']:<60} {shown} {unit}  {detail}")
        else:
            for label, value in flat_numbers(result)[:24]:
                lines.append(f"  {label:<60} {value}")
        if name == "e2e":
            lines += e2e_scaling_lines(result.get("rows", []))
    lines += settlement_lines(results.get("settlement"))
    lines += compare_lines(results.get("compare"))
    lines += goal_lines(goals(results))
    return lines


def e2e_scaling_lines(rows: list[dict]) -> list[str]:
    """Per rail latency: each point's rate against the first one (one process, lowest N)."""
    lines = []
    for latency in sorted({r.get("rail_latency_ms", 0) for r in rows}):
        same = [r for r in rows if r.get("rail_latency_ms", 0) == latency and r["payouts_per_s"]]
        if len(same) > 1:
            base = same[0]["payouts_per_s"]
            lines.append(
                f"  rail {latency} ms, vs {same[0].get('processes', 1)}×"
                f"{same[0].get('concurrency', 1)}: "
                + ", ".join(
                    f"{r.get('processes', r.get('executors'))}×{r.get('concurrency', 1)}"
                    f" {r['payouts_per_s'] / base:.2f}×"
                    for r in same
                )
            )
    return lines


def issue17_lines(e2e: dict) -> list[str]:
    """Issue 17's goals: one process at rail 200 ms, and one process vs the best at rail 0."""
    verdict = e2e.get("verdict_17")
    if not verdict:
        return ["  (no issue-17 e2e matrix in this result)"]
    goals = e2e.get("goals_17", {})
    lines = []
    one = verdict.get("one_process_200ms")
    if one:
        lines.append(
            f"  one process, rail 200 ms (concurrency {one['concurrency']}):"
            f" {one['payouts_per_s']} payouts/s | >= {goals.get('one_process_200ms')} | 4.1 |"
            f" busiest role {one['busiest_role']}"
        )
    best, mine = verdict.get("any_processes_0ms"), verdict.get("one_process_0ms")
    if best and mine:
        lines.append(
            f"  one process / best of any at rail 0: {verdict['one_over_best_0ms']}×"
            f" ({mine['payouts_per_s']}/s at N={mine['concurrency']} vs {best['payouts_per_s']}/s"
            f" with {best['processes']}×{best['concurrency']})"
            f" | >= {goals.get('one_over_best_0ms')}×"
        )
    return lines


def goals_lines(results: dict[str, dict]) -> list[str]:
    """Payouts end to end beside the like-for-like floor, and the lock server beside its floor
    arm: this run, the numbers before issue 18 (its absolute goals are withdrawn by issue 28:
    the goals are now ratios to arms measured in the same run, `goals`)."""
    from bench.e2e import GOALS, PREVIOUS

    lines = [
        "",
        "dlock against its floors (this run | issue 18's mark | before issue 18)",
        "-" * 60,
    ]
    e2e = (results.get("e2e") or {}).get("result") or {}
    # Issue 18's rows are rail-latency-0 points (results from before the issue-17 matrix lack
    # the field: they were all at 0).
    rows = [
        r
        for r in e2e.get("rows", [])
        if r.get("cpu_ms_per_payout") and not r.get("rail_latency_ms")
    ]
    if rows:
        # The cost at the configuration that pays fastest (what a deployment runs); the other
        # rail-0 points follow, since fixed per-second work weighs more at lower rates.
        best = max(rows, key=lambda r: r.get("payouts_per_s") or 0)
        row = best
        cpu = row["cpu_ms_per_payout"]
        lines.append(
            f"  server CPU per payout ({row['executors']} × {row.get('concurrency', 1)}, the"
            f" fastest rail-0 point): {cpu['total']} ms"
            f" | (withdrawn) | {PREVIOUS['cpu_ms_per_payout']['total']} ms"
            f" | load {row.get('loadavg_1m_at_start')}"
        )
        lines.append(
            "    at every rail-0 point: "
            + ", ".join(
                f"{r['executors']}×{r.get('concurrency', 1)} {r['cpu_ms_per_payout']['total']}"
                for r in rows
            )
        )
        previous = PREVIOUS["cpu_ms_per_payout"]
        lines.append(
            "    by role (now / before): "
            + ", ".join(
                f"{role} {cpu[role]} / {previous.get(role)}" for role in previous if role in cpu
            )
        )
        lines += floor_lines(e2e.get("floor"), cpu)
        lines.append(
            f"  payouts/s end to end, rail 0 (best: {best['executors']} executor process(es)"
            f" × concurrency {best.get('concurrency', 1)}): {best['payouts_per_s']}"
            f" | >= {GOALS['payouts_per_s']} | ~{PREVIOUS['payouts_per_s']} |"
            f" load {best.get('loadavg_1m_at_start')}"
        )
    else:
        lines.append("  (no e2e result: run `python -m bench --only e2e lockserver`)")
    lines += issue17_lines(e2e)
    lock = (results.get("lockserver") or {}).get("result") or {}
    eight = next((lvl for lvl in lock.get("levels", []) if lvl.get("clients") == 8), None)
    if eight and "floor_no_django" not in eight:  # a result from before the floor arm
        lines.append("  (lockserver result without the floor arm: rerun `--only lockserver`)")
    elif eight:
        http, floor = eight["http"], eight["floor_no_django"]
        rounds = eight.get("http_over_floor_rounds")
        how = f"median of {len(rounds)} interleaved rounds" if rounds else "one run each"
        lines.append(
            f"  lock pairs/s at 8 clients, HTTP / floor arm ({how}):"
            f" {eight.get('http_over_floor')}× | >= {GOALS['lock_http_over_floor_8']}× | 0.4× |"
            f" floor {floor['pairs_per_s']}/s vs dlock {http['pairs_per_s']}/s"
        )
        if rounds:
            lines.append(
                "    every round (dlock/floor pairs/s = ratio, load): "
                + ", ".join(
                    f"{r['http']['pairs_per_s']}/{r['floor_no_django']['pairs_per_s']}"
                    f" = {r['http_over_floor']}× ({r.get('loadavg_1m')})"
                    for r in eight.get("rounds", [])
                )
            )
        lines.append(
            f"    server CPU per pair: dlock {http.get('server_cpu_ms_per_pair')} ms,"
            f" floor {floor.get('server_cpu_ms_per_pair')} ms"
        )
    else:
        lines.append("  (no lockserver result with its floor arm at 8 clients)")
    return lines


def floor_lines(floor: dict | None, cpu: dict) -> list[str]:
    """The payout floor beside dlock's CPU per payout, and what each layer costs per payout."""
    if not floor:
        return ["    (no payout floor in this e2e result: BENCH_E2E_FLOOR=1, the default)"]
    base, layers = floor["cpu_ms_per_payout"], floor.get("layers", {})
    mine = (floor.get("dlock") or {}).get("cpu_ms_per_payout") or cpu
    ratio = layers.get("dlock_over_floor")
    trivial = floor.get("trivial_app", {})
    rounds = floor.get("rounds") or []
    how = f"median of {len(rounds)} interleaved rounds" if rounds else "one round"
    lines = [
        f"  server CPU per payout ({how}): dlock {mine['total']} ms | floor {base['total']} ms"
        f" | ratio {floor.get('dlock_over_floor_median', ratio)}× | goal"
        f" <= {GOAL_CPU_OVER_FLOOR}×  (floor: {floor['concurrency']} clients,"
        f" {floor['payouts_per_s']} payouts/s, {floor['completed']}/{floor['payouts']} done,"
        f" load {floor.get('loadavg_1m_at_start')})",
        "    floor by role: "
        + ", ".join(f"{role} {value}" for role, value in base.items() if role != "total"),
        f"    floor by layer: PostgreSQL {layers.get('postgres_ms')} ms,"
        f" gunicorn {layers.get('gunicorn_ms')} ms"
        f" ({trivial.get('cpu_ms_per_request')} ms/request of a trivial app × 6),"
        f" psycopg + SQL functions + JSON {layers.get('psycopg_sql_json_ms')} ms",
    ]
    if rounds:
        lines.append(
            "    every round (dlock / floor ms = ratio, payouts/s dlock / floor, load): "
            + ", ".join(
                f"{r['layers'].get('dlock_total_ms')} / {r['cpu_ms_per_payout']['total']}"
                f" = {r['layers'].get('dlock_over_floor')}× ({r['dlock'].get('payouts_per_s')} /"
                f" {r['payouts_per_s']}, {r.get('loadavg_1m_at_start')})"
                for r in rounds
            )
        )
    above = dict(layers.get("above_floor_by_role_ms") or {})
    if above:
        postgres = above.pop("postgres", None)
        lines.append(
            "    dlock above the floor: Django + DRF + our code (and the executor's P1 listings and"
            f" heartbeats) {layers.get('django_drf_ours_ms')} ms in the four roles ("
            + ", ".join(f"{role} {value}" for role, value in above.items())
            + f"), PostgreSQL {postgres} ms"
        )
    return lines


# ----------------------------------------------------------------------------- issue 28

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


def peers_lines(entry: dict | None) -> list[str]:
    """bench.peers: every arm at every point, medians of the interleaved rounds."""
    if not entry:
        return []
    lines = [
        "",
        "Lock services side by side (bench.peers; medians of interleaved rounds)",
        "-" * 72,
    ]
    if entry.get("status") != "ok":
        return lines + [f"  {entry.get('status', 'not run')}: {entry.get('error', '')[:300]}"]
    peers = entry["result"]
    lines.append(
        f"  {'point':<14} {'arm':<11} {'pairs/s':>9} {'acq p50':>8} {'acq p99':>8}"
        f" {'pair p99':>9} {'CPU ms/pair':>12} {'of it LS':>9} {'writes/pair':>12}"
        f" {'errors':>7}"
    )
    for point in peers.get("points", []):
        name = f"{point['workload']} ×{point['clients']}"
        for arm, row in point["arms"].items():
            ls_cpu = row.get("lockserver_cpu_ms_per_pair")
            writes = row.get("writes_per_pair")
            lines.append(
                f"  {name:<14} {arm:<11} {row['pairs_per_s'] or 0:>9.1f}"
                f" {row['acquire_p50_ms'] or 0:>8.2f} {row['acquire_p99_ms'] or 0:>8.2f}"
                f" {row['p99_ms'] or 0:>9.2f} {row['server_cpu_ms_per_pair'] or 0:>12.3f}"
                f" {'—' if ls_cpu is None else f'{ls_cpu:.3f}':>9}"
                f" {'—' if writes is None else f'{writes:.2f}':>12}"
                f" {row['errors']:>7}"
            )
            name = ""
    lines.append(
        "  CPU ms/pair: the arm's server processes (dlock: lock server + its store); of it LS:"
        " the lock server alone; writes/pair: the store's durable writes (pg transaction ids,"
        " etcd raft proposals, ZooKeeper zxids) over the window, background included"
    )
    tokens = peers.get("tokens") or {}
    if tokens:
        lines.append(
            "  tokens strictly increasing per key: "
            + ", ".join(
                f"{arm} {row['grants']} grants on {row['keys']} keys,"
                f" {len(row['violations'])} violations"
                for arm, row in tokens.items()
            )
        )
    lines.append(f"  load average before → after: {peers.get('loadavg_1m_before_after')}")
    return lines


def settlement_lines(entry: dict | None) -> list[str]:
    if not entry:
        return []
    lines = ["", "Settlement row: posts only (bench.settlement)", "-" * 46]
    if entry.get("status") != "ok":
        return lines + [f"  {entry.get('status', 'not run')}: {entry.get('error', '')[:300]}"]
    result = entry["result"]
    for level in result.get("levels", []):
        lines.append(
            f"  {level['accounts']:>3} accounts,"
            f" PAY_SETTLEMENT_BUCKETS={level.get('buckets', level.get('settlement_rows', 1))}:"
            f" {level['posts_per_s']} posts/s,"
            f" post p50 {level['post_p50_ms']} ms p99 {level['post_p99_ms']} ms;"
            f" row-lock wait {level['lock_wait_share']:.0%} of post time;"
            f" ceiling 1/(statement + commit) = {level['ceiling_posts_per_s']}/s"
        )
    if result.get("verdict"):
        lines.append(f"  {result['verdict']}")
    return lines


def compare_lines(entry: dict | None) -> list[str]:
    if not entry:
        return []
    lines = ["", "Before / after (bench.compare, issue 25 item 8)", "-" * 48]
    if entry.get("status") != "ok":
        return lines + [f"  {entry.get('status', 'not run')}: {entry.get('error', '')[:300]}"]
    result = entry["result"]
    trees, ratios = result["trees"], result["ratios"]
    lines.append(
        f"  before {trees['before']['commit'][:12]}, after {trees['after']['commit'][:12]};"
        f" {result['workload']}"
    )
    for one in result.get("rounds", []):
        b, a = one["before"], one["after"]
        lines.append(
            f"  round {one['round']}: server CPU/payout"
            f" {b['point']['cpu_ms_per_payout'].get('total')}"
            f" → {a['point']['cpu_ms_per_payout'].get('total')} ms, executor"
            f" {b['point'].get('executor_cpu_ms_per_payout')} →"
            f" {a['point'].get('executor_cpu_ms_per_payout')} ms, payouts/s"
            f" {b['point'].get('payouts_per_s')} → {a['point'].get('payouts_per_s')}, floor"
            f" {(b.get('floor') or {}).get('cpu_ms_per_payout', {}).get('total')} →"
            f" {(a.get('floor') or {}).get('cpu_ms_per_payout', {}).get('total')} ms"
            f" (load {one.get('loadavg_1m')})"
        )
    lines.append(
        f"  medians: server CPU after/before {ratios.get('server_cpu_after_over_before')}×,"
        f" executor CPU {ratios.get('executor_cpu_after_over_before')}×, payouts/s"
        f" {ratios.get('payouts_per_s_after_over_before')}×; dlock/floor before"
        f" {ratios.get('before_over_floor')}×, after {ratios.get('after_over_floor')}×"
    )
    ratio = ratios.get("server_cpu_after_over_before")
    verdict = (
        "NOT RUN" if ratio is None else "PASS" if ratio <= GOAL_25_AFTER_OVER_BEFORE else "FAIL"
    )
    lines.append(
        f"  GOAL (issue 25) server CPU per payout after ÷ before: {ratio}×"
        f" | <= {GOAL_25_AFTER_OVER_BEFORE}× | {verdict}"
    )
    return lines


def goals(results: dict[str, dict]) -> list[dict]:
    """Issue 28's goal lines: each with its ratio, its arms, the bound and PASS/FAIL (NOT RUN
    when the part that measures it did not run or gave no number)."""
    peers = _result(results.get("peers"))
    own8 = _peer_point(peers, "own", 8) if peers else None
    out: list[dict] = []

    def goal(name: str, ratio, bound: float, at_most: bool, arms: str, unit: str = "×") -> None:
        if ratio is None:
            verdict = "NOT RUN"
        else:
            verdict = "PASS" if (ratio <= bound if at_most else ratio >= bound) else "FAIL"
        out.append(
            {
                "goal": name,
                "ratio": ratio,
                "unit": unit,
                "bound": f"{'<=' if at_most else '>='} {bound}{unit}",
                "arms": arms,
                "verdict": verdict,
            }
        )

    arms8 = (own8 or {}).get("arms", {})
    ratios8 = (own8 or {}).get("ratios", {})

    def rate(arm: str) -> str:
        row = arms8.get(arm)
        return f"{arm} {row['pairs_per_s']}/s" if row else f"{arm} —"

    def p99(arm: str) -> str:
        row = arms8.get(arm)
        return f"{arm} {row['acquire_p99_ms']} ms" if row else f"{arm} —"

    goal(
        "lock pairs/s at 8 clients (own keys): dlock (pg) ÷ best of ZooKeeper/kazoo, etcd lock API",
        ratios8.get("pg_over_best_peer"),
        GOAL_PG_OVER_BEST_PEER,
        False,
        f"{rate('dlock-pg')}; {rate('zookeeper')}, {rate('etcd-lock')}",
    )
    goal(
        "lock pairs/s at 8 clients (own keys): dlock (etcd) ÷ etcd lock API",
        ratios8.get("etcd_over_etcd_lock"),
        GOAL_ETCD_OVER_ETCD_LOCK,
        False,
        f"{rate('dlock-etcd')}; {rate('etcd-lock')}",
    )
    goal(
        "p99 acquire at 8 clients (own keys): dlock (pg) ÷ best durable peer",
        ratios8.get("pg_p99_over_best_peer"),
        GOAL_P99_OVER_BEST_PEER,
        True,
        f"{p99('dlock-pg')}; {p99('zookeeper')}, {p99('etcd-lock')}",
    )
    e2e = _result(results.get("e2e"))
    floor = e2e.get("floor") or {}
    mine = ((floor.get("dlock") or {}).get("cpu_ms_per_payout") or {}).get("total")
    base = (floor.get("cpu_ms_per_payout") or {}).get("total")
    goal(
        "server CPU per payout: dlock ÷ like-for-like floor (median of interleaved rounds)",
        floor.get("dlock_over_floor_median"),
        GOAL_CPU_OVER_FLOOR,
        True,
        f"dlock {mine} ms; floor {base} ms (every role gunicorn + psycopg + the same SQL)"
        if floor
        else "e2e with its floor not run",
    )
    for workload, clients in (("hot", 8), ("hot", 32), ("own", 8), ("own", 32)):
        point = _peer_point(peers, workload, clients) if peers else None
        arms_p, ratios_p = (point or {}).get("arms", {}), (point or {}).get("ratios", {})
        where = "one hot key" if workload == "hot" else "own keys"

        def arm_text(arm: str, field: str, unit: str, arms_p=arms_p) -> str:
            row = arms_p.get(arm)
            return f"{arm} {row[field]}{unit}" if row else f"{arm} —"

        goal(
            f"issue 39, {where} × {clients}: pairs/s dlock (pg) ÷ ZooKeeper/kazoo",
            ratios_p.get("pg_over_zookeeper"),
            GOAL_39_PG_OVER_ZK,
            False,
            f"{arm_text('dlock-pg', 'pairs_per_s', '/s')};"
            f" {arm_text('zookeeper', 'pairs_per_s', '/s')}",
        )
        if workload == "hot":
            goal(
                f"issue 39, {where} × {clients}: p99 acquire dlock (pg) ÷ ZooKeeper/kazoo",
                ratios_p.get("pg_p99_over_zookeeper"),
                GOAL_39_P99_OVER_ZK,
                True,
                f"{arm_text('dlock-pg', 'acquire_p99_ms', ' ms')};"
                f" {arm_text('zookeeper', 'acquire_p99_ms', ' ms')}",
            )
    goal(
        "issue 39, own keys × 8: pairs/s dlock (etcd) ÷ etcd lock API",
        ratios8.get("etcd_over_etcd_lock"),
        GOAL_39_ETCD_OVER_ETCD_LOCK,
        False,
        f"{rate('dlock-etcd')}; {rate('etcd-lock')}",
    )
    pg8 = arms8.get("dlock-pg") or {}
    store_cpu = (pg8.get("server_cpu_ms_per_pair") or 0) - (
        pg8.get("lockserver_cpu_ms_per_pair") or 0
    )
    goal(
        "issue 39, own keys × 8: lock-server CPU per pair on pg (its nginx + gunicorn)",
        pg8.get("lockserver_cpu_ms_per_pair"),
        GOAL_39_LOCKSERVER_CPU_MS,
        True,
        f"dlock-pg; PostgreSQL's own CPU per pair {store_cpu:.3f} ms" if pg8 else "dlock-pg —",
        unit=" ms",
    )
    # issue 39's lines first: the summary ends with issue 28's four, as it always has
    return [g for g in out if g["goal"].startswith("issue 39")] + [
        g for g in out if not g["goal"].startswith("issue 39")
    ]


def goal_lines(found: list[dict]) -> list[str]:
    lines = ["", "Goals (issues 28 and 39; ratios within this run)", "-" * 48]
    for g in found:
        lines.append(
            f"  GOAL {g['goal']}: {g['ratio']}{g.get('unit', '×')} | {g['bound']}"
            f" | {g['verdict']}  ({g['arms']})"
        )
    return lines


# ----------------------------------------------------------------------------- main


def setup_django() -> None:
    """The harness itself reads payouts through payments' selectors (the e2e part imports the
    experiment's measuring code): Django is set up before any part is imported. The servers a part
    starts get their own environment and databases. The harness makes no Django database
    connection (selectors take the part's own cursor), so an unset URL points nowhere."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "settings.tooling")
    os.environ.setdefault("DJANGO_SECRET_KEY", secrets.token_urlsafe(48))
    for name in ("PAY_DATABASE_URL", "LOCK_DATABASE_URL", "RAIL_DATABASE_URL"):
        os.environ.setdefault(name, "postgres://bench@127.0.0.1:1/unused")
    import django

    django.setup()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench")
    parser.add_argument("--out", type=Path, default=PROJECT / ".run" / "bench")
    parser.add_argument(
        "--only", nargs="*", choices=(*PARTS, *OPTIONAL), help="run only these parts"
    )
    parser.add_argument("--before", help="compare: the git revision measured before (e.g. 55d13fe)")
    parser.add_argument("--after", help="compare: the revision after (default: this tree)")
    args = parser.parse_args(argv)
    names = list(args.only or PARTS)
    if args.before and "compare" not in names:
        names.append("compare")
    if "compare" in names and not args.before:
        parser.error("compare needs --before <git revision>")
    setup_django()
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    results: dict[str, dict] = {}
    info = machine()
    print(
        f"[bench] {info['date']} on {info['cpus']} × {info['cpu']} ({info['mem_gb']} GB),"
        f" load average {info['loadavg_1m_at_start']}"
    )
    for name in names:
        started = time.monotonic()
        print(f"[bench] {name}: running…", flush=True)
        try:
            try:
                module = importlib.import_module(MODULES[name])
            except ModuleNotFoundError as exc:
                if exc.name != MODULES[name]:
                    raise
                results[name] = {"status": "missing", "error": f"{MODULES[name]} is not built yet"}
                print(f"[bench] {name}: missing ({MODULES[name]} not built yet)", flush=True)
                continue
            if name == "compare":
                result = module.run(out, before=args.before, after=args.after)
            else:
                result = module.run(out)
            results[name] = {"status": "ok", "result": result}
        except Exception as exc:
            results[name] = {
                "status": "failed",
                "error": f"{type(exc).__name__}: {exc}",
                "traceback": traceback.format_exc()[-3000:],
            }
            print(f"[bench] {name}: FAILED: {exc}", flush=True)
        results[name]["seconds"] = round(time.monotonic() - started, 1)
        print(f"[bench] {name}: {results[name]['status']} in {results[name]['seconds']} s")
    lines = summary_lines(results)
    text = "\n".join(lines)
    print(f"\n=== dlock bench summary ({info['date']}, {info['cpus']} CPUs, {info['cpu']}) ===")
    print(text)
    summary = {"machine": info, "parts": results, "table": lines, "goals": goals(results)}
    (out / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
    (out / "goals.json").write_text(json.dumps(summary["goals"], indent=2, default=str))
    info["loadavg_1m_at_end"] = round(os.getloadavg()[0], 2)
    print(f"\n[bench] load average {info['loadavg_1m_at_start']} → {info['loadavg_1m_at_end']}")
    print(f"[bench] wrote {out}/*.json")
    failed = [n for n, r in results.items() if r["status"] == "failed"]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
