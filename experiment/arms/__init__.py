"""The experiment's two arms behind one protocol: the runner drives an `Arm` and never asks which.

`fenced` is the real system (executors, lock server, payments, rail proxy); `naive` is the
lease-only control (`experiment.naive`). Each arm knows how to seed its workload, start a
worker, find the lock a stopped worker holds, revoke it, and summarise what it saw; the runner
owns the schedule, the clock and the sampling, identically for both.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from collections.abc import Callable
    from subprocess import Popen

    from experiment.config import ExperimentConfig
    from experiment.fenced_outs import Fault
    from experiment.stack import StackHandle
    from experiment.workers import Worker


@dataclass
class ArmContext:
    """What one arm's run is about: the stack, the config, its run id and where its logs go."""

    stack: StackHandle
    config: ExperimentConfig
    run_id: str
    logdir: Path
    wall0: float = 0.0  # time.time() when the arm's clock started (logs carry wall time)
    payout_ids: list[str] = field(default_factory=list)


class Arm(Protocol):
    name: str
    non_terminal: tuple[str, ...]  # payout states that mean "still in flight"
    needed_commands: dict[str, str]  # manage.py command -> the piece that provides it

    def seed(self, ctx: ArmContext) -> dict[str, list[str]]:
        """Create the workload: {"accounts": [...], "payouts": [...]}."""
        ...

    def spawner(self, ctx: ArmContext) -> Callable[..., Popen]:
        """`spawn(owner_id, metrics_port, extra_env)` → a worker process."""
        ...

    def start_sampling(self, ctx: ArmContext) -> None:
        """Baseline of whatever counters the arm reads from its services."""
        ...

    def sample(self, ctx: ArmContext) -> dict[str, float]:
        """One scrape of the arm's services; returns the fenced-out totals so far (for the
        live progress line)."""
        ...

    def held_lock(self, ctx: ArmContext, worker: Worker) -> tuple[str, int | None] | None:
        """(key, token) of the lock a stopped worker holds, or None."""
        ...

    def revoke(self, ctx: ArmContext, *, key: str, token: int | None, owner: str) -> str:
        """An operator evicts the holder of `key`; returns a note when nothing was revoked."""
        ...

    def summarise(self, ctx: ArmContext, *, truth: dict, faults: list[Fault], kills: int) -> dict:
        """The arm's own rows of the report (reconciler, fenced-outs and their classification)."""
        ...
