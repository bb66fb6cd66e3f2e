"""What one experiment run is: sizes, lease, seed, which arms, where the report goes."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from pathlib import Path

from experiment.arms import ARMS

# A CI-sized run: both arms in well under two minutes on two cores (seed 7 shows both effects).
CI_PRESET = {
    "executors": 3,
    "accounts": 3,  # with 2, a freshly armed executor can starve on contention for seconds
    "payouts": 54,
    "duration": 20.0,
    "lease_ms": 1500,
    "drain_timeout": 30.0,
}


@dataclass
class ExperimentConfig:
    seed: int = 7
    executors: int = 4
    payouts: int = 240
    accounts: int = 0  # 0 = as many as executors (contention: workers share accounts)
    duration: float = 40.0
    lease_ms: int = 2000
    base_latency_ms: int | None = None  # None = paced so the work spans the fault phase
    amount_minor: int = 1_000
    drain_timeout: float = 60.0
    arm: str = "both"
    out: Path = Path(".run/experiment")
    pg_restart: bool = True
    ha: bool = False  # add the HA faults (needs 3 etcd members and 2 replicas per role)
    run_id: str = field(default_factory=lambda: uuid.uuid4().hex[:8])

    @property
    def base_latency(self) -> int:
        """The rail's latency outside fault windows. Paced so K workers need ~85 % of the fault
        phase for the workload (faults must hit work in flight), capped at 40 % of the lease."""
        if self.base_latency_ms is not None:
            return self.base_latency_ms
        per_payout = self.executors * 0.85 * self.duration / max(1, self.payouts)
        return int(max(0.0, min(per_payout - 0.1, 0.4 * self.lease_ms / 1000)) * 1000)

    @property
    def n_accounts(self) -> int:
        # Half as many accounts as workers: a lease that lapses is taken over at once.
        return self.accounts or max(2, self.executors // 2)

    @property
    def per_account(self) -> int:
        return max(1, self.payouts // self.n_accounts)

    def arms(self) -> list[str]:
        return list(ARMS) if self.arm == "both" else [self.arm]
