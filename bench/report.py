"""The summary table of `python -m bench`: every part's numbers side by side with ratios, read
from the parts' result dicts (printed, and written to `.run/bench/summary.json`).
"""

from __future__ import annotations

from bench.goals import GOAL_25_AFTER_OVER_BEFORE, GOAL_CPU_OVER_FLOOR, goal_lines, goals

# bench.peers' etcd ratios (medians of per-round ratios) as the summary names them
ETCD_RATIOS = {
    "etcd_over_pg": "pairs/s ÷ dlock-pg's",
    "etcd_over_etcd_lock": "÷ etcd-lock's",
    "etcd_over_etcd_lock_grpc": "÷ etcd-lock-grpc's",
    "etcd_cpu_over_etcd_lock_grpc": "etcd CPU per pair ÷ etcd-lock-grpc's",
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
    lines = peers_lines(results.get("peers"))
    lines += goals_lines(results)
    lines += part_lines(results)
    lines += compare_lines(results.get("compare"))
    lines += transport_lines(results.get("transport"))
    lines += lockpath_lines(results.get("lockpath"))
    lines += goal_lines(goals(results))
    return lines


def _section(title: str) -> list[str]:
    return ["", title, "-" * len(title)]


def part_lines(results: dict[str, dict]) -> list[str]:
    """The e2e and fsync parts: their own summary rows, else their numbers; etcd_paced's rows."""
    lines = etcd_paced_lines(results.get("etcd_paced"))
    for name, title in (
        ("e2e", "Payouts end to end (durable PostgreSQL)"),
        ("fsync", "Disk"),
    ):
        if name not in results:
            continue
        entry = results[name]
        lines += _section(title)
        if entry.get("status") != "ok":
            lines.append(f"  {entry.get('status', 'not run')}: {entry.get('error', '')[:300]}")
            continue
        result = entry["result"]
        summary = result.get("summary")
        if isinstance(summary, list) and summary:
            for item in summary:
                value = item.get("value")
                shown = f"{value:>10.1f}" if isinstance(value, (int, float)) else f"{value!s:>10}"
                unit, detail = item.get("unit", ""), item.get("detail", "")
                lines.append(f"  {item['label']:<60} {shown} {unit}  {detail}")
        else:
            for label, value in flat_numbers(result)[:24]:
                lines.append(f"  {label:<60} {value}")
    return lines


def etcd_paced_lines(entry: dict | None) -> list[str]:
    """bench.etcd_paced: per arm and pace every round's figures, then the medians of per-round
    ratios of etcd's CPU per pair, dlock's backend ÷ the recipe."""
    if not entry:
        return []
    lines = _section("etcd's CPU per pair at one rate (bench.etcd_paced, in process, no HTTP)")
    if entry.get("status") != "ok":
        return lines + [f"  {entry.get('status', 'not run')}: {entry.get('error', '')[:300]}"]
    result = entry["result"]
    lines.append(f"  {result['clients']} threads per arm; paced: {result['rate']} pairs/s")
    lines.append(
        "  arm, pace: every round's pairs/s | etcd CPU ms per pair | put+delete ops per pair"
    )
    for name, rows in result["rows"].items():
        lines.append(
            f"  {name:<16} "
            + " | ".join(
                "/".join(str(row[field]) for row in rows)
                for field in (
                    "pairs_per_s",
                    "etcd_cpu_ms_per_pair",
                    "etcd_put_delete_ops_per_pair",
                )
            )
        )
    ratios = result["etcd_cpu_dlock_over_recipe"]
    lines.append(
        "  etcd CPU per pair, dlock ÷ recipe (median of per-round ratios): "
        + ", ".join(f"{pace} {value}×" for pace, value in ratios.items())
    )
    return lines


def goals_lines(results: dict[str, dict]) -> list[str]:
    """Payouts end to end beside the like-for-like floor: this run, the numbers before issue 18
    (its absolute goals are withdrawn by issue 28: the goals are now ratios to arms measured in
    the same run, `goals`)."""
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
        lines.append("  (no e2e result: run `python -m bench --only e2e`)")
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
        f"  {'point':<14} {'arm':<16} {'pairs/s':>9} {'acq p50':>8} {'acq p99':>8}"
        f" {'pair p99':>9} {'CPU ms/pair':>12} {'of it LS':>9} {'writes/pair':>12}"
        f" {'errors':>7}"
    )
    for point in peers.get("points", []):
        name = f"{point['workload']} ×{point['clients']}"
        for arm, row in point["arms"].items():
            ls_cpu = row.get("lockserver_cpu_ms_per_pair")
            writes = row.get("writes_per_pair")
            lines.append(
                f"  {name:<14} {arm:<16} {row['pairs_per_s'] or 0:>9.1f}"
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
    lines += _etcd_lines(peers.get("points", []))
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


def _etcd_lines(points: list[dict]) -> list[str]:
    """bench.peers' etcd columns (etcd's own counters per pair, medians over rounds) and its etcd
    ratios (medians of per-round ratios), per point where an etcd arm ran."""
    lines: list[str] = []
    for point in points:
        where = f"{point['workload']} ×{point['clients']}"
        etcd = {arm: row for arm, row in point["arms"].items() if "etcd_cpu_ms_per_pair" in row}
        if etcd:
            lines.append(
                f"  etcd per pair, {where} (etcd CPU ms / put+delete ops / watch events): "
                + ", ".join(
                    f"{arm} {row['etcd_cpu_ms_per_pair']}"
                    f" / {row.get('etcd_put_delete_ops_per_pair')}"
                    f" / {row.get('etcd_watch_events_per_pair')}"
                    for arm, row in etcd.items()
                )
            )
        ratios = point.get("etcd_ratios") or {}
        if any(ratios.get(name) is not None for name in ETCD_RATIOS):
            lines.append(
                f"  dlock-etcd, {where}: "
                + ", ".join(
                    f"{text} {'—' if ratios.get(name) is None else f'{ratios[name]}×'}"
                    for name, text in ETCD_RATIOS.items()
                )
            )
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


def transport_lines(entry: dict | None) -> list[str]:
    """bench.transport: the client's CPU per call in each tree, and the median of per-round
    ratios after ÷ before."""
    if not entry:
        return []
    lines = _section("The HTTP client transport, CPU per call (bench.transport)")
    if entry.get("status") != "ok":
        return lines + [f"  {entry.get('status', 'not run')}: {entry.get('error', '')[:300]}"]
    result = entry["result"]
    trees = result["trees"]
    lines.append(
        f"  before {trees['before']['commit'][:12]}, after {trees['after']['commit'][:12]};"
        f" {result['workload']}; load {result.get('loadavg_1m')}"
    )
    for arm, row in result["arms"].items():
        lines.append(
            f"  {arm:<10} {row['before_us']} → {row['after_us']} µs per call,"
            f" after ÷ before {row['after_over_before']}× (median of per-round ratios)"
        )
    return lines


def lockpath_lines(entry: dict | None) -> list[str]:
    """bench.lockpath: the lock path's CPU per pair in process, by layer, and each cut's arm."""
    if not entry:
        return []
    lines = _section("The lock path's CPU per pair in process (bench.lockpath)")
    if entry.get("status") != "ok":
        return lines + [f"  {entry.get('status', 'not run')}: {entry.get('error', '')[:300]}"]
    data = entry["result"]
    lines.append(
        f"  {data['backend']}: {data['cpu_ms_per_pair']} ms of CPU per pair (no gunicorn, no"
        f" nginx; by log level {data['cpu_ms_per_pair_by_log_level']})"
    )
    lines.append(
        "  by layer: " + ", ".join(f"{k} {v} %" for k, v in data["layers_percent"].items())
    )
    top = list(data.get("dlock_functions_percent", {}).items())[:3]
    lines.append("  dlock's busiest functions: " + ", ".join(f"{k} {v} %" for k, v in top))
    for cut, saved in data["cuts_us_per_pair"].items():
        lines.append(f"  cut: {cut}: {saved} µs of CPU per pair (median per-round difference)")
    return lines
