"""Live counts on stdout while an arm runs (one rewritten line on a terminal, else every 2 s)."""

from __future__ import annotations

import sys
import time

SHOWN = ("PENDING", "CLAIMED", "SUBMITTING", "RAIL_ACKED", "POSTED", "FAILED", "RAIL_AMBIGUOUS")
SHORT = {"RAIL_AMBIGUOUS": "AMBIG", "RAIL_ACKED": "ACKED", "SUBMITTING": "SUBMIT"}


class LivePrinter:
    def __init__(self, stream=None, total: int = 0) -> None:
        self.stream = stream or sys.stdout
        self.tty = hasattr(self.stream, "isatty") and self.stream.isatty()
        self.last = 0.0
        self.arm = ""
        self.total = total

    def __call__(self, arm: str, t: float, counts: dict, fenced_out: dict, label: str) -> None:
        if arm != self.arm:
            self.finish()
            self.arm = arm
        if not self.tty and time.monotonic() - self.last < 2.0:
            return
        self.last = time.monotonic()
        done = sum(counts.get(s, 0) for s in ("POSTED", "FAILED", "RAIL_AMBIGUOUS", "ABANDONED"))
        total = sum(counts.values()) or 1
        bar = "#" * int(20 * done / total)
        parts = " ".join(f"{SHORT.get(s, s)}={counts.get(s, 0)}" for s in SHOWN)
        fenced = f" fenced_out={int(sum(fenced_out.values()))}" if arm == "fenced" else ""
        line = f"[{arm:<6}] {t:5.1f}s [{bar:<20}] {parts}{fenced} | {label[:28]}"
        if self.tty:
            self.stream.write("\r" + line[:160].ljust(160))
        else:
            self.stream.write(line + "\n")
        self.stream.flush()

    def finish(self) -> None:
        if self.tty and self.arm:
            self.stream.write("\n")
            self.stream.flush()
