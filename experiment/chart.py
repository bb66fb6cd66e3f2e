"""PNG chart: payouts over time per outcome, one panel per arm, fault windows shaded."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

STATE_COLOURS = {
    "PENDING": "#9e9e9e",
    "CLAIMED": "#90caf9",
    "SUBMITTING": "#42a5f5",
    "RAIL_ACKED": "#1e88e5",
    "POSTED": "#2e7d32",
    "FAILED": "#ef6c00",
    "ABANDONED": "#795548",
    "RAIL_AMBIGUOUS": "#c62828",
}
FAULT_COLOURS = {
    "pause": "#7e57c2",
    "kill": "#000000",
    "restart": "#ff9800",
    "pg_restart": "#d81b60",
    "rail_latency": "#ffeb3b",
    "rail_failures": "#f44336",
    "duplicate_ack": "#00bcd4",
    "revoke": "#3949ab",
}


def draw(report: dict, path: Path) -> Path:
    arms = report["arms"]
    fig, axes = plt.subplots(
        len(arms), 1, figsize=(11, 4.2 * len(arms)), sharex=True, squeeze=False
    )
    for ax, (name, arm) in zip(axes[:, 0], arms.items(), strict=True):
        series = arm["series"]
        times = [point["t"] for point in series]
        for state, colour in STATE_COLOURS.items():
            values = [point.get(state, 0) for point in series]
            if any(values):
                ax.plot(times, values, label=state, color=colour, linewidth=1.8)
        seen: set[str] = set()
        for window in arm["windows"]:
            kind = window["kind"]
            colour = FAULT_COLOURS.get(kind, "#bdbdbd")
            label = f"fault: {kind}" if kind not in seen else None
            seen.add(kind)
            if kind == "kill" or window["end"] - window["start"] < 0.05:
                ax.axvline(window["start"], color=colour, linestyle="--", linewidth=1, label=label)
            else:
                alpha = 0.10 if kind == "pause" else 0.18
                ax.axvspan(window["start"], window["end"], color=colour, alpha=alpha, label=label)
        fenced = arm["fenced_out_sum"]
        title = (
            f"{name}: {arm['by_state'].get('POSTED', 0)} posted, "
            f"{arm['duplicates_caused']} duplicates caused, "
            f"fenced out {'n/a' if fenced is None else int(fenced)}"
        )
        ax.set_title(title)
        ax.set_ylabel("payouts")
        ax.grid(alpha=0.3)
        ax.legend(loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize=8)
    axes[-1, 0].set_xlabel("seconds since the arm started")
    fig.suptitle(f"dlock fencing experiment, seed {report['config']['seed']}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
