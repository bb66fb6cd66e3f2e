"""Fence repair: lower a fence no legitimate token can pass to the highest token issued.

A fence (the account's, or the rail proxy's high-water mark) above every token the lock server
has issued — e.g. raised by a forged token before tokens carried proofs (#12), or by a bug —
blocks the account forever: revoke can only raise fences. Repair sets each such fence to
the issued bound B, so every future grant (token > B) passes and no past token (≤ B) can claim
or reach the rail again. It never touches a fence at or below B.

Steps, one paydb transaction:
  1. row-lock the account fence and the high-water mark (no claim, post or admission can move
     them until commit);
  2. read B from the lock server's store, *after* the locks: a token issued before step 2 is
     ≤ B; one issued after is > B and passes — and none of them wrote here in between;
  3. refuse (RepairRefused, nothing changed) unless a fence is above B;
  4. lower what is above B (conditional on the value read in step 1), append the audit row;
then, after commit, the WARNING `fence_repaired` event.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from django.db import connections, transaction

from dlock.dbrouter import alias_for
from dlock.logs import log_event
from dlock.timefmt import rfc3339_ms
from ops.tokens import IssuedBound, highest_issued_token
from payments.operator import lock_account_fence, lower_account_fence, record_fence_repair
from railproxy.operator import lock_high_water, lower_high_water

MIN_REASON_CHARS = 8


class RepairRefused(Exception):
    """The repair was refused and nothing was changed; the message says why."""


@dataclass(frozen=True)
class Repair:
    repair_id: int
    account_id: str
    operator: str
    reason: str
    issued: IssuedBound
    old_fence: int
    new_fence: int
    old_rail_high_water: int | None
    new_rail_high_water: int | None
    at: Any

    def as_dict(self) -> dict[str, Any]:
        return {
            "repairId": self.repair_id,
            "accountId": self.account_id,
            "operator": self.operator,
            "reason": self.reason,
            "lockBackend": self.issued.backend,
            "issuedBound": self.issued.token,
            "issuedSources": self.issued.sources,
            "oldFence": self.old_fence,
            "newFence": self.new_fence,
            "oldRailHighWater": self.old_rail_high_water,
            "newRailHighWater": self.new_rail_high_water,
            "at": rfc3339_ms(self.at),
        }


def repair_fence(
    *,
    account_id: str,
    operator: str,
    reason: str,
    issued_bound: Any = highest_issued_token,
) -> Repair:
    """Lower the account's fence and rail high-water mark to the issued bound, audited.

    RepairRefused when the reason or operator is missing, the account is unknown, or neither
    fence is above the bound (a healthy account). `issued_bound` reads B (injectable).
    """
    reason, operator = reason.strip(), operator.strip()
    if len(reason) < MIN_REASON_CHARS:
        raise RepairRefused(f"--reason must say why, in at least {MIN_REASON_CHARS} characters")
    if not operator:
        raise RepairRefused("no operator identity: pass --operator")
    alias = alias_for("payments")
    with transaction.atomic(using=alias), connections[alias].cursor() as cursor:
        old_fence = lock_account_fence(cursor, account_id=account_id)
        if old_fence is None:
            raise RepairRefused(f"account {account_id!r} not found; nothing changed")
        old_high = lock_high_water(cursor, account_id=account_id)
        issued: IssuedBound = issued_bound()
        bound = issued.token
        fence_high = old_fence > bound
        rail_high = old_high is not None and old_high > bound
        if not (fence_high or rail_high):
            raise RepairRefused(
                f"account {account_id} is healthy: fence {old_fence} and rail high-water "
                f"{old_high if old_high is not None else '-'} are not above the highest token "
                f"the lock server issued ({bound}, {issued.backend}); nothing changed"
            )
        new_fence = old_fence
        if fence_high:
            lowered = lower_account_fence(
                cursor, account_id=account_id, expected=old_fence, bound=bound
            )
            if lowered != bound:  # cannot happen under the row lock; never write half
                raise RepairRefused("the account fence moved under its row lock; nothing changed")
            new_fence = bound
        new_high = old_high
        if old_high is not None and rail_high:
            new_high = lower_high_water(
                cursor, account_id=account_id, expected=old_high, bound=bound
            )
            if new_high != bound:
                raise RepairRefused("the rail high-water moved under its row lock; nothing changed")
        repair_id, at = record_fence_repair(
            cursor,
            account_id=account_id,
            operator=operator,
            reason=reason,
            lock_backend=issued.backend,
            issued_bound=bound,
            old_fence=old_fence,
            new_fence=new_fence,
            old_rail_high_water=old_high,
            new_rail_high_water=new_high,
        )
    repair = Repair(
        repair_id,
        account_id,
        operator,
        reason,
        issued,
        old_fence,
        new_fence,
        old_high,
        new_high,
        at,
    )
    log_event("fence_repaired", level=logging.WARNING, **repair.as_dict())
    return repair
