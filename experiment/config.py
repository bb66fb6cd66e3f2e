"""What one experiment run is: sizes, lease, seed, which arms, where the report goes."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from pathlib import Path

# The experiment's arms (`experiment.arms`): the real system and the lease-only control.
ARMS = ("fenced", "naive")

# A CI-sized run: both arms in well under two minutes on two cores (seed 7 shows both effects).
# Its verdict never depends on luck (issue 27 item 4): exactly three pauses (claimed, submitted,
# locked), and the fault phase goes on (up to `land_timeout` more seconds) until every one has
# landed — its worker stopped in its phase and resumed; the payouts are paced so work is left
# for the last one. Fewer than two landed pauses, or pauses in fewer than two phases, is
# INCONCLUSIVE with that reason, never a silent pass.
CI_PRESET = {
    "executors": 3,
    "executor_concurrency": 2,  # issue 17: every executor keeps up to 2 payouts in flight
    "accounts": 4,  # with fewer, a freshly armed executor can starve on contention for seconds
    "payouts": 72,
    "duration": 20.0,
    "lease_ms": 1500,
    "drain_timeout": 30.0,
    "pauses": 3,
    "pauses_must_land": True,
}
LANDED_PAUSES_MIN = 2  # a run that must land its pauses needs this many, in as many phases


# The HA recovery run (`--ha-recovery`): the fenced arm only, enough work to keep payouts flowing
# through five faults one at a time (the duration is the recovery schedule's).
RECOVERY_PRESET = {
    "arm": "fenced",
    "executors": 4,
    "executor_concurrency": 2,
    "accounts": 8,
    "payouts": 320,
    "lease_ms": 2000,
    "drain_timeout": 60.0,
    "pauses": None,  # the recovery schedule has no pauses (even with --ci)
    "pauses_must_land": False,
}


@dataclass
class ExperimentConfig:
    seed: int = 7
    executors: int = 4
    # issue 17: payouts in flight per executor process (`run_executor --concurrency`); the
    # naive arm's workers stay one payout at a time (their point is what a lease alone allows).
    executor_concurrency: int = 4
    payouts: int = 240
    accounts: int = 0  # 0 = derived from the sections in flight (n_accounts)
    duration: float = 40.0
    lease_ms: int = 2000
    base_latency_ms: int | None = None  # None = paced so the work spans the fault phase
    amount_minor: int = 1_000
    drain_timeout: float = 60.0
    arm: str = "both"
    out: Path = Path(".run/experiment")
    pg_restart: bool = True
    ha: bool = False  # add the HA faults (needs 3 etcd members and 2 replicas per role)
    # The recovery run: the HA faults alone, one at a time, `settle_s` apart (issue 16, Measure).
    ha_recovery: bool = False
    settle_s: float = 8.0
    # Exactly this many pauses (None: as many as fit the fault phase) and, when they must land,
    # a fault phase that goes on until each has (at most `land_timeout` seconds longer).
    pauses: int | None = None
    pauses_must_land: bool = False
    land_timeout: float = 40.0
    run_id: str = field(default_factory=lambda: uuid.uuid4().hex[:8])

    @property
    def base_latency(self) -> int:
        """The rail's latency outside fault windows. Paced so K workers need ~85 % of the fault
        phase for the workload (faults must hit work in flight), capped at 40 % of the lease."""
        if self.base_latency_ms is not None:
            return self.base_latency_ms
        per_payout = self.parallel * 0.85 * self.duration / max(1, self.payouts)
        return int(max(0.0, min(per_payout - 0.1, 0.4 * self.lease_ms / 1000)) * 1000)

    @property
    def n_accounts(self) -> int:
        # Half as many accounts as sections in flight: a lease that lapses is taken over at once.
        return self.accounts or max(2, self.executors * self.executor_concurrency // 2)

    @property
    def parallel(self) -> int:
        """Sections that can be in flight at once: one per account at most (the account lock)."""
        return max(1, min(self.executors * self.executor_concurrency, self.n_accounts))

    @property
    def per_account(self) -> int:
        return max(1, self.payouts // self.n_accounts)

    def arms(self) -> list[str]:
        return list(ARMS) if self.arm == "both" else [self.arm]
