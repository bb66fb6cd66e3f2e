"""`manage.py fencing_experiment`: try hard to make dlock pay twice; show the naive design does.

Steps: read the stack (`.run/stack.env`, started by `make up`) → build the seeded fault schedule →
run each arm (fenced = the real executors; naive = lease-only workers calling the rail stub) →
print the table, write `<out>/report.json` and `<out>/report.png` → exit 1 if the fenced arm
caused any duplicate or broke an invariant, 3 if the faults were too weak to prove anything.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from experiment import demo
from experiment.config import CI_PRESET, RECOVERY_PRESET, ExperimentConfig
from experiment.progress import LivePrinter
from experiment.report import table
from experiment.runner import run
from experiment.schedule import RECOVERY_SETTLE_S, recovery_duration
from experiment.stack import MissingPiece, from_stack_env, private_stack

if TYPE_CHECKING:
    import argparse


class Command(BaseCommand):
    help = "Run the fencing experiment (fenced vs naive) under a seeded fault schedule."

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--seed", type=int, default=7)
        parser.add_argument("--executors", type=int, default=None)
        parser.add_argument(
            "--executor-concurrency",
            type=int,
            default=None,
            help="payouts in flight per executor process (run_executor --concurrency; default 4,"
            " --ci 2)",
        )
        parser.add_argument("--payouts", type=int, default=None)
        parser.add_argument("--duration", type=float, default=None, help="fault phase, seconds")
        parser.add_argument("--lease-ms", type=int, default=None)
        parser.add_argument(
            "--base-latency-ms", type=int, default=None, help="rail latency outside faults"
        )
        parser.add_argument("--arm", choices=["fenced", "naive", "both"], default="both")
        parser.add_argument("--out", type=Path, default=None)
        parser.add_argument("--ci", action="store_true", help="small and fast (CI-sized)")
        parser.add_argument("--no-pg-restart", action="store_true")
        parser.add_argument(
            "--ha",
            action="store_true",
            help="add etcd leader kill, quorum loss and replica kills (3 etcd members, 2 replicas)",
        )
        parser.add_argument(
            "--ha-recovery",
            action="store_true",
            help="implies --ha: the HA faults alone, one at a time with a settle period, probers"
            " on every replica; prints the per-fault, per-replica recovery table",
        )
        parser.add_argument(
            "--settle", type=float, default=None, help="--ha-recovery: seconds between faults"
        )
        parser.add_argument(
            "--demo",
            action="store_true",
            help="`make demo`'s run: the fenced arm, demo-sized, then where to look next",
        )
        parser.add_argument(
            "--private-stack",
            action="store_true",
            help="start a throwaway stack (own PostgreSQL, four roles, free ports) under --out",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        preset: dict[str, Any] = dict(CI_PRESET) if options["ci"] else {}
        recovery = options["ha_recovery"]
        if options["demo"]:
            preset = dict(demo.DEMO_PRESET)
        elif recovery:
            settle = options["settle"] or RECOVERY_SETTLE_S
            preset = {**preset, **RECOVERY_PRESET, "settle_s": settle}
            preset["duration"] = recovery_duration(settle)
            if options["arm"] != "both":
                preset["arm"] = options["arm"]
        else:
            preset["arm"] = options["arm"]
        config = ExperimentConfig(
            seed=options["seed"],
            base_latency_ms=options["base_latency_ms"],
            pg_restart=not options["no_pg_restart"],
            ha=options["ha"] or recovery,
            ha_recovery=recovery,
            out=options["out"] or Path(settings.BASE_DIR) / ".run" / "experiment",
            **preset,
        )
        for name in ("executors", "executor_concurrency", "payouts", "duration", "lease_ms"):
            if options[name] is not None:
                setattr(config, name, options[name])
        if config.executors < 2:
            raise CommandError("--executors must be at least 2 (stale writers need a rival)")
        if config.executor_concurrency < 1:
            raise CommandError("--executor-concurrency must be at least 1")
        if options["demo"]:
            self.stdout.write(
                demo.introduction(
                    config.executors,
                    config.executor_concurrency,
                    config.payouts,
                    config.lease_ms,
                    config.duration,
                )
            )
        stop = None
        try:
            if options["private_stack"]:
                self.stdout.write(f"starting a private stack under {config.out / 'stack'} …")
                stack, stop = private_stack(Path(config.out) / "stack")
            else:
                stack = from_stack_env()
            code, report = run(stack, config, progress=LivePrinter())
        except MissingPiece as exc:
            raise CommandError(str(exc)) from exc
        finally:
            if stop is not None:
                stop()
        self.stdout.write(demo.banner("report") if options["demo"] else "")
        self.stdout.write(table(report))
        if not options["demo"]:
            self.stdout.write(
                f"\nreport: {config.out / 'report.json'}  chart: {config.out / 'report.png'}"
            )
            sys.exit(code)
        self.stdout.write(demo.where(stack.env, Path(config.out)))
        line = demo.verdict_line(code)
        if line:
            self.stdout.write(line)
        sys.exit(1 if code == 1 else 0)
