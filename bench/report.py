"""The summary table of `python -m bench`: every part's numbers side by side with ratios, read
from the parts' result dicts (printed, and written to `.run/bench/summary.json`).
"""

from __future__ import annotations

from bench.goals import GOAL_25_AFTER_OVER_BEFORE, GOAL_CPU_OVER_FLOOR, goal_lines, goals


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
    lines = peers_lines(results.get("peers"))
    lines += lock_lines(results)
    lines += goals_lines(results)
    lines += part_lines(results)
    lines += compare_lines(results.get("compare"))
    lines += goal_lines(goals(results))
    return lines


def _section(title: str) -> list[str]:
    return ["", title, "-" * len(title)]


def lock_lines(results: dict[str, dict]) -> list[str]:
    """Every lock-shaped row of bench.lockserver, its ratio to dlock's PostgreSQL backend over
    HTTP at the same clients, and to the disk's fsync floor."""
    fsync = results.get("fsync", {}).get("result") or {}
    floor = fsync.get("fdatasync_ops_per_s")
    lines = _section("Lock: acquire+release pairs/s (p50 / p99 ms)")
    all_lock: list[dict] = []
    result = results.get("lockserver", {}).get("result")
    if result:
        all_lock += lock_rows("lockserver", result)
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
        lines += _section(
            "Ratios against the dlock lock server (PostgreSQL backend, HTTP), same clients"
        )
        for row in sorted(all_lock, key=lambda r: (str(r["label"]), r["clients"])):
            ref = reference.get(row["clients"])
            if ref is None or row is ref or not ref["pairs_per_s"] or not row["pairs_per_s"]:
                continue
            lines.append(
                f"  {row['label']:<42} {row['clients']:>3} clients  "
                f"{row['pairs_per_s'] / ref['pairs_per_s']:>7.2f}×"
            )
    if floor:
        lines += _section(
            f"Durable locks against the disk's fsync floor ({floor:.0f} flushes/s, one writer)"
        )
        for row in all_lock:
            if not row["pairs_per_s"]:
                continue
            lines.append(
                f"  {row['label']:<42} {row['clients']:>3} clients  "
                f"{row['pairs_per_s'] / floor:>7.2f}× the flush rate"
            )
    return lines


def part_lines(results: dict[str, dict]) -> list[str]:
    """The e2e and fsync parts: their own summary rows, else their numbers."""
    lines: list[str] = []
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
    lines += _lockserver_floor_lines((results.get("lockserver") or {}).get("result") or {})
    return lines


def _lockserver_floor_lines(lock: dict) -> list[str]:
    """The lock server beside its floor arm at 8 clients (bench.lockserver)."""
    from bench.e2e import GOALS

    eight = next((lvl for lvl in lock.get("levels", []) if lvl.get("clients") == 8), None)
    if eight and "floor_no_django" not in eight:  # a result from before the floor arm
        return ["  (lockserver result without the floor arm: rerun `--only lockserver`)"]
    if not eight:
        return ["  (no lockserver result with its floor arm at 8 clients)"]
    http, floor = eight["http"], eight["floor_no_django"]
    rounds = eight.get("http_over_floor_rounds")
    how = f"median of {len(rounds)} interleaved rounds" if rounds else "one run each"
    lines: list[str] = []
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
