"""Run one arm (or both) of the fencing experiment against a stack and report.

`run()` builds the seeded fault schedule (or the recovery schedule), checks the commands each arm
needs, runs each arm (`experiment.armrun.ArmRun`) under the same schedule, decides the verdict
and writes `<out>/report.json` and `<out>/report.png`.
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict
from pathlib import Path

from experiment import ha
from experiment.armrun import ArmRun, Progress, lock_backend, quiet
from experiment.arms import Arm
from experiment.arms.fenced import FencedArm
from experiment.arms.naive import NaiveArm
from experiment.config import ExperimentConfig
from experiment.schedule import FaultEvent, build_schedule, recovery_schedule
from experiment.stack import MissingPiece, StackHandle
from experiment.verdict import verdict

__all__ = ["run", "run_arm"]


def arm_named(name: str) -> Arm:
    """The arm called `name` (one of `experiment.config.ARMS`)."""
    arms: dict[str, Arm] = {"fenced": FencedArm(), "naive": NaiveArm()}
    return arms[name]


def check_commands(stack: StackHandle, arm: Arm) -> None:
    """Fail loudly, naming the missing piece, before any fault is injected."""
    from django.conf import settings

    if settings.configured and "executor" in settings.INSTALLED_APPS:
        from django.core.management import get_commands

        commands = get_commands()
    else:  # outside Django (make demo): ask manage.py itself, as the ops role
        result = stack.manage("help", "--commands")
        commands = dict.fromkeys(result.stdout.split())
    missing = [
        f"manage.py {name} — {who}"
        for name, who in arm.needed_commands.items()
        if name not in commands
    ]
    if missing:
        raise MissingPiece(
            "the experiment needs pieces that are not built yet:\n  " + "\n  ".join(missing)
        )


def run_arm(
    arm: str,
    stack: StackHandle,
    config: ExperimentConfig,
    schedule: list[FaultEvent],
    *,
    progress: Progress = quiet,
) -> dict:
    return ArmRun(arm_named(arm), stack, config, schedule, progress=progress).run()


def run(
    stack: StackHandle,
    config: ExperimentConfig,
    *,
    progress: Progress = quiet,
    check: bool = True,
    schedule: list[FaultEvent] | None = None,
) -> tuple[int, dict]:
    """Both arms (or one) under one schedule (`schedule`, else built from the seed)."""
    out = Path(config.out)
    out.mkdir(parents=True, exist_ok=True)
    stack.check_ready()
    if schedule is None and config.ha_recovery:
        schedule = recovery_schedule(settle_s=config.settle_s)
    if schedule is None:
        schedule = build_schedule(
            seed=config.seed,
            duration=config.duration,
            workers=config.executors,
            lease_ms=config.lease_ms,
            pg_restart=config.pg_restart and stack.pg_cluster is not None,
            ha=config.ha,
            pauses=config.pauses,
        )
    if config.ha and not ha.is_ha(stack.env):
        raise MissingPiece(
            "the HA experiment needs `make up LOCK_BACKEND=etcd ETCD_MEMBERS=3 REPLICAS=2`"
        )
    if check:
        for name in config.arms():
            check_commands(stack, arm_named(name))
    results: dict[str, dict] = {}
    for name in config.arms():
        results[name] = run_arm(name, stack, config, schedule, progress=progress)
    code, lines = verdict(
        results,
        expect_fenced_outs=not config.ha_recovery,
        pauses_must_land=config.pauses_must_land,
    )
    settings = {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(config).items()}
    report = {
        "config": settings,
        "lock_backend": lock_backend(stack),
        "schedule": [e.as_dict() for e in schedule],
        "arms": results,
        "verdict": {"exit_code": code, "lines": lines},
    }
    (out / "report.json").write_text(json.dumps(report, indent=2, default=str))
    try:
        from experiment.chart import draw

        draw(report, out / "report.png")
    except Exception as exc:
        print(f"[experiment] chart not drawn: {exc}", file=sys.stderr)
    return code, report
