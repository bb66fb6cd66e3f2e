"""The naive arm: lease-only workers (`experiment.naive`) calling the rail stub directly."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import psycopg

from experiment import naive
from experiment.measure import NAIVE_NON_TERMINAL
from experiment.workers import spawn_naive

if TYPE_CHECKING:
    from collections.abc import Callable
    from subprocess import Popen

    from experiment.arms import ArmContext
    from experiment.fenced_outs import Fault
    from experiment.workers import Worker

# Only the victim's own lease: by the time the operator acts a rival may hold the key.
NAIVE_REVOKE = "DELETE FROM experiment_naive_lease WHERE lease_key = %s AND owner_id = %s"


class NaiveArm:
    name = "naive"
    non_terminal = NAIVE_NON_TERMINAL
    needed_commands = {"railstub_config": "issue 6 (rail stub)"}

    def seed(self, ctx: ArmContext) -> dict[str, list[str]]:
        config = ctx.config
        return naive.seed(
            ctx.stack.env["PAY_DATABASE_URL"],
            run_id=ctx.run_id,
            accounts=config.n_accounts,
            payouts_per_account=config.per_account,
            balance_minor=config.per_account * config.amount_minor * 2,
            amount_minor=config.amount_minor,
        )

    def spawner(self, ctx: ArmContext) -> Callable[..., Popen]:
        return spawn_naive(
            pay_url=ctx.stack.env["PAY_DATABASE_URL"],
            rail_url=ctx.stack.url("railstub"),
            run_id=ctx.run_id,
            lease_ms=ctx.config.lease_ms,
            logdir=ctx.logdir,
        )

    def start_sampling(self, ctx: ArmContext) -> None:
        return None  # no services of its own: nothing fences it out

    def sample(self, ctx: ArmContext) -> dict[str, float]:
        return {}

    def held_lock(self, ctx: ArmContext, worker: Worker) -> tuple[str, int | None] | None:
        """The lease of the worker's last section (its log's last `naive_section_started`)."""
        key = None
        path = ctx.logdir / f"{worker.owner_id}.log"
        for line in path.read_text(errors="replace").splitlines() if path.exists() else []:
            if '"naive_section_started"' in line:
                try:
                    key = json.loads(line).get("key")
                except ValueError:
                    continue
        return (key, None) if key else None

    def revoke(self, ctx: ArmContext, *, key: str, token: int | None, owner: str) -> str:
        """The operator deletes the stuck holder's lease row."""
        with psycopg.connect(ctx.stack.env["PAY_DATABASE_URL"], autocommit=True) as conn:
            deleted = conn.execute(NAIVE_REVOKE, (key, owner)).rowcount
        return "" if deleted else f"revoke skipped: {owner} no longer held {key}"

    def summarise(self, ctx: ArmContext, *, truth: dict, faults: list[Fault], kills: int) -> dict:
        return {
            "reconciler": None,
            "fenced_out_total": None,
            "fenced_out_sum": None,
            "fenced_out_scraped": None,
            "fenced_out_executor_logs": None,
            "fenced_out_classification": None,
            "lock_backend_observed": None,
        }
