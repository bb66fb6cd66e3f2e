"""Show or change the rail stub's fault configuration while it runs (read per request)."""

from __future__ import annotations

import argparse
import json
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from railstub import services


def _rate(raw: str) -> float:
    try:
        value = float(raw)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{raw!r} is not a number") from None
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"{raw} is not a fraction between 0 and 1")
    return value


def _millis(raw: str) -> int:
    try:
        value = int(raw)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{raw!r} is not an integer") from None
    if not 0 <= value <= 60_000:
        raise argparse.ArgumentTypeError(f"{raw} is outside 0…60000 ms")
    return value


def _weight(raw: str) -> int:
    try:
        value = int(raw)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{raw!r} is not an integer") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{raw} is negative")
    return value


def _seed(raw: str) -> int:
    try:
        return int(raw)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{raw!r} is not an integer") from None


OPTIONS = {
    "latency_ms": ("--latency-ms", _millis, "fixed delay before every answer"),
    "failure_rate": ("--failure-rate", _rate, "fraction failing (5xx / drops, see splits)"),
    "duplicate_ack_rate": (
        "--duplicate-ack-rate",
        _rate,
        "fraction of bookings booked twice (second reference, duplicate_of set)",
    ),
    "decline_rate": ("--decline-rate", _rate, "fraction answered 402 declined"),
    "split_5xx": ("--split-5xx", _weight, "weight of failures answered 500 (nothing booked)"),
    "split_drop_before": (
        "--split-drop-before",
        _weight,
        "weight of failures holding the connection --hold-ms, then dropping it (not booked)",
    ),
    "split_drop_after": (
        "--split-drop-after",
        _weight,
        "weight of failures booking the transfer, then dropping the connection",
    ),
    "hold_ms": ("--hold-ms", _millis, "how long a drop-before-booking holds the connection"),
    "seed": ("--seed", _seed, "seed for reproducible faults"),
}


class Command(BaseCommand):
    help = (
        "Show or change the rail stub's faults (ROLE=ops). With no option it prints the config. "
        "--reset makes it a well-behaved rail (all rates 0, no latency)."
    )

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--reset", action="store_true", help="all rates 0, latency 0 first")
        parser.add_argument("--no-seed", action="store_true", help="fresh randomness again")
        for dest, (flag, kind, text) in OPTIONS.items():
            parser.add_argument(flag, dest=dest, type=kind, help=text)

    def handle(self, *args: Any, **options: Any) -> None:
        changes = {dest: options[dest] for dest in OPTIONS if options.get(dest) is not None}
        if options["no_seed"]:
            changes["seed"] = None
        try:
            config = services.reset_config() if options["reset"] else services.load_config()
            if changes:
                config = services.update_config(**changes)
        except Exception as exc:  # a CHECK constraint or an unreachable raildb
            raise CommandError(f"could not update the rail stub config: {exc}") from exc
        self.stdout.write(json.dumps(services.config_dict(config)))
