"""Operator revoke (L8) plus the push that makes it bite at once.

L8 advances the token floor at the lock server, but the resources only learn of it when the next
holder writes. For `payout:{accountId}` we push the new floor into the account fence and the rail
high-water mark ourselves, so the evicted holder's in-flight claim, post or submission is fenced
out now rather than later.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from django.db import connections, transaction

from dlock.dbrouter import alias_for
from payments.operator import push_fence_floor
from railproxy.operator import push_high_water_floor

PAYOUT_KEY = re.compile(r"payout:(?P<account>.+)")


@dataclass
class PushResult:
    """Where the floor was pushed, or why it was not."""

    account_id: str | None
    account_fence: int | None = None
    rail_high_water: int | None = None
    skipped: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "accountId": self.account_id,
            "accountFence": self.account_fence,
            "railHighWater": self.rail_high_water,
            "skipped": self.skipped,
        }


def protected_account(key: str) -> str | None:
    """The account a lock key protects, for the keys whose resources we know."""
    match = PAYOUT_KEY.fullmatch(key)
    return match.group("account") if match else None


def push_floor(*, account_id: str, floor: int, pay_database_url: str | None = None) -> PushResult:
    """Raise the account fence and the rail high-water mark to `floor`, in one transaction.

    Both are GREATEST(…, floor): a push never lowers a fence, and repeating it is harmless.
    Through Django's paydb alias, or straight to `pay_database_url` (the experiment harness
    pushes to a stack whose paydb is not this process's).
    """
    if pay_database_url is None:
        alias = alias_for("payments")
        with transaction.atomic(using=alias), connections[alias].cursor() as cursor:
            return _push(cursor, account_id=account_id, floor=floor)
    import psycopg

    with psycopg.connect(pay_database_url) as conn, conn.transaction(), conn.cursor() as cursor:
        return _push(cursor, account_id=account_id, floor=floor)


def _push(cursor: Any, *, account_id: str, floor: int) -> PushResult:
    fence = push_fence_floor(cursor, account_id=account_id, floor=floor)
    high_water = push_high_water_floor(cursor, account_id=account_id, floor=floor)
    return PushResult(account_id, account_fence=fence, rail_high_water=high_water)
