"""The soak's numbers: growth per minute of every sampled series by a least-squares line over
the second half of the load phase (after warm-up), which logs' events take the bytes, and the
summary as markdown."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

# A series "grows" when its fitted line rises over the fitted window by more than this share
# of its mean and by more than its floor (a few KiB of RSS, one descriptor, ...): noise and
# steps stay below; a leak of ~100 kB/min over six minutes does not.
GROWTH_SHARE = 0.05
FLOORS = {"rss_kib": 1024.0, "fds": 2.0, "threads": 2.0, "processes": 1.0, "connections": 2.0}


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
    return "\n".join(lines) + "\n"
