"""The soak's numbers: growth per minute of every sampled series by a least-squares line over
the second half of the load phase (after warm-up), which logs' events take the bytes, and the
summary as markdown."""

from __future__ import annotations

import json
import os
import platform
from collections import Counter
from dataclasses import asdict
from pathlib import Path

NON_TERMINAL = ("PENDING", "CLAIMED", "SUBMITTING", "RAIL_ACKED")

# A series "grows" when its fitted line rises over the fitted window by more than its floor
# (512 KiB of RSS, two descriptors, threads or connections) and by more than this share of its
# mean: a warm-up step before the window stays below; a leak of ~100 kB/min over six minutes of
# window does not. A flag is a prompt to look (the samples are in the JSON), not a verdict.
GROWTH_SHARE = 0.005
FLOORS = {"rss_kib": 512.0, "fds": 2.0, "threads": 2.0, "processes": 1.0, "connections": 2.0}


def slope_per_minute(times: list[float], values: list[float]) -> float:
    """Least-squares slope of values over times (seconds), per minute; 0 with < 3 points."""
    n = len(times)
    if n < 3:
        return 0.0
    mean_t = sum(times) / n
    mean_v = sum(values) / n
    var = sum((t - mean_t) ** 2 for t in times)
    if var == 0:
        return 0.0
    cov = sum((t - mean_t) * (v - mean_v) for t, v in zip(times, values, strict=True))
    return cov / var * 60.0


def _floor(name: str) -> float:
    for suffix, floor in FLOORS.items():
        if name.endswith(suffix) or f"/{suffix}/" in name:
            return floor
    return 1.0


def growth(samples: list[dict], *, warmup_until: float, load_end: float) -> dict[str, dict]:
    """Per series: first and last value of the load phase, slope per minute over the window
    [warmup_until, load_end], and whether that is growth (see GROWTH_SHARE). Tables and logs
    grow with the work by design; their slope per payout is in the summary instead."""
    window = [s for s in samples if warmup_until <= s["t"] <= load_end]
    loaded = [s for s in samples if s["t"] <= load_end]
    names = sorted({k for s in samples for k in s if k != "t"})
    out: dict[str, dict] = {}
    for name in names:
        pts = [(s["t"], float(s[name])) for s in window if name in s]
        every = [float(s[name]) for s in loaded if name in s]
        if not pts or not every:
            continue
        slope = slope_per_minute([t for t, _ in pts], [v for _, v in pts])
        span_min = (pts[-1][0] - pts[0][0]) / 60.0
        mean = sum(v for _, v in pts) / len(pts)
        rise = slope * span_min
        out[name] = {
            "first": every[0],
            "last": every[-1],
            "window_mean": round(mean, 1),
            "per_minute": round(slope, 3),
            "window_rise": round(rise, 1),
            "grows": rise > max(GROWTH_SHARE * abs(mean), _floor(name)),
        }
    return out


def log_events(path: Path, *, limit: int = 8) -> list[dict]:
    """The events a JSON-lines log's bytes go to (its rotated files too), largest first."""
    sizes: Counter[str] = Counter()
    counts: Counter[str] = Counter()
    files = [path, *(path.with_name(f"{path.name}.{i}") for i in range(1, 10))]
    for candidate in files:
        if not candidate.exists():
            continue
        with candidate.open("rb") as handle:
            for raw in handle:
                try:
                    entry = json.loads(raw)
                    event = str(entry.get("event") or "(no event)")
                except (ValueError, AttributeError):
                    entry, event = {}, "(not JSON)"
                if event == "log":  # a library's record: its logger says whose
                    event = f"log:{entry.get('logger', '?')}"
                sizes[event] += len(raw)
                counts[event] += 1
    return [
        {"event": event, "lines": counts[event], "bytes": size}
        for event, size in sizes.most_common(limit)
    ]


def summarise(config, started, samples, load_end, states, books, cpu, logs, events, ids) -> dict:
    truth = books["truth"]
    done = int(states.get("POSTED", 0))
    by_state = truth["by_state"]
    stuck = sum(by_state.get(s, 0) for s in NON_TERMINAL)
    grown = growth(samples, warmup_until=load_end / 2, load_end=load_end)
    tables = {
        name.removeprefix("table/"): {
            "rows": int(g["last"]),
            "per_1000_payouts": round((g["last"] - g["first"]) * 1000 / max(done, 1), 1),
        }
        for name, g in grown.items()
        if name.startswith("table/") and g["last"]
    }
    last = samples[-1] if samples else {}
    log_summary = {
        name: {
            "bytes": int(last.get(f"log/{name}", 0)),
            "per_payout": round(last.get(f"log/{name}", 0) / max(done, 1), 1),
            "top_events": log_events(path),
        }
        for name, path in logs.items()
    }
    quarantined = by_state.get("RAIL_AMBIGUOUS", 0)
    growing = sorted(
        n for n, g in grown.items() if g["grows"] and not n.startswith(("table/", "log/"))
    )
    balanced = truth["invariant_violation_count"] == 0 and not books["unexplained"]
    cpu_total = sum(cpu.values())
    verdict = [
        f"payouts seeded {len(ids)}, done (POSTED) {done} in {config.minutes} min of load"
        f" + drain; {round(done / max(cpu_total, 1e-9), 2)} payouts per CPU-second (all roles,"
        f" executors; PostgreSQL not counted)",
        f"presented to the rail more than once: {truth['duplicates_caused']}",
        f"stuck (non-terminal after the drain): {stuck}",
        f"quarantined (RAIL_AMBIGUOUS): {quarantined}; why: {books['quarantine_notes'] or '-'};"
        f" reconciler: {books['quarantine_classes'] or '-'}",
        f"books balance: {'yes' if balanced else 'NO'} (invariant violations"
        f" {truth['invariant_violation_count']}, unexplained reconciler findings"
        f" {len(books['unexplained'])}, rail duplicate acks {truth['rail_duplicate_acks']})",
        "still growing after warm-up: " + (", ".join(growing) or "nothing"),
    ]
    return {
        "started": started,
        "machine": f"{os.cpu_count()} CPUs, {platform.node()}, load {os.getloadavg()[0]:.2f}",
        "config": {**asdict(config), "out": str(config.out)},
        "events": events,
        "payouts_seeded": len(ids),
        "payouts_done": done,
        "by_state": by_state,
        "presented_twice": truth["duplicates_caused"],
        "stuck": stuck,
        "quarantined": quarantined,
        "quarantine_reasons": {
            "notes": books["quarantine_notes"],
            "reconciler": books["quarantine_classes"],
        },
        "books_balance": balanced,
        "reconcile_exit_code": books["reconcile_exit_code"],
        "unexplained_findings": books["unexplained"][:20],
        "invariant_violations": truth["invariant_violations"][:20],
        "rail_duplicate_acks": truth["rail_duplicate_acks"],
        "cpu_seconds": {k: round(v, 1) for k, v in cpu.items()},
        "cpu_ms_per_payout": {k: round(v * 1000 / max(done, 1), 2) for k, v in cpu.items()},
        "growth": grown,
        "growing": growing,
        "tables": tables,
        "logs": log_summary,
        "verdict": verdict,
        "samples": samples,
    }


def _growth_rows(summary: dict) -> list[str]:
    rows = []
    for name, g in summary["growth"].items():
        if name.startswith(("table/", "log/")) or (g["first"] == g["last"] and not g["grows"]):
            continue
        mark = " **grows**" if g["grows"] else ""
        rows.append(f"| `{name}` | {g['first']:g} | {g['last']:g} | {g['per_minute']:+g}{mark} |")
    return rows


def markdown(summary: dict) -> str:
    """The summary for a human: the verdict lines, then the tables."""
    c = summary["config"]
    lines = [
        f"# Soak {summary['started']} ({c['minutes']} min, {c['executors']} executors ×"
        f" {c['concurrency']}, {summary['machine']})",
        "",
        *[f"- {line}" for line in summary["verdict"]],
        "",
        "## Growth per minute (least squares over the second half of the load phase)",
        "",
        "| series | first | last | per minute |",
        "|---|---|---|---|",
        *_growth_rows(summary),
        "",
        "## Tables (rows per 1 000 payouts done)",
        "",
        "| table | rows at end | per 1 000 payouts |",
        "|---|---|---|",
        *[
            f"| `{name}` | {t['rows']} | {t['per_1000_payouts']} |"
            for name, t in summary["tables"].items()
        ],
        "",
        "## Log bytes per payout done",
        "",
        "| log | bytes | per payout | top events (bytes) |",
        "|---|---|---|---|",
        *[
            f"| {name} | {entry['bytes']} | {entry['per_payout']} | "
            + ", ".join(f"{e['event']} {e['bytes']}" for e in entry["top_events"][:4])
            + " |"
            for name, entry in summary["logs"].items()
        ],
    ]
    heap = summary["events"].get("heap_grown") or {}
    if heap:
        lines += ["", "## Allocations grown after warm-up (tracemalloc, by traceback)", ""]
        for name, stats in heap.items():
            lines.append(f"- {name}: " + "; ".join(
                f"{s['size_diff_kib']:+g} KiB / {s['count_diff']:+d} blocks at"
                f" {' <- '.join(reversed(s['traceback'][-3:]))}" if "traceback" in s else str(s)
                for s in stats[:3]
            ))  # fmt: skip
    return "\n".join(lines) + "\n"
