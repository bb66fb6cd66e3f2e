"""The executor's hops to the payment resource (P1–P4) and the rail proxy, each within its budget.

Retry rules (C3 §3.8): claim/post retry once, and only on a 503 or a connect failure (nothing
reached the server); any 409 is final. Rail submit is never retried. Reads are advisory.

Each service URL may be a comma-separated list of replicas (decision 16). A call moves to the
next replica only on an outcome that proves nothing changed (`dlock.client.changed_nothing`):
for the rail submission that is "nothing was sent" alone — once its bytes left, it is never
presented again, to any replica. Waits honour the server's retryAfterMillis. A replica that
timed out, refused or answered 503/504 is demoted for the next calls (decision 21,
`dlock.client.Endpoints`); the rail proxy's is probed back by a health GET, not a payout.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from dlock.budgets import BACKOFF_INITIAL_S, BUDGETS
from dlock.client import DlockError, Endpoints, Grant, ServiceUnreachable, retry_delay_s

PAYOUT_STATES = (
    "PENDING",
    "CLAIMED",
    "SUBMITTING",
    "RAIL_ACKED",
    "POSTED",
    "FAILED",
    "ABANDONED",
    "RAIL_AMBIGUOUS",
)


@dataclass(frozen=True)
class Candidate:
    """One P1 row: enough to pick a lock key and a first step; never proof of state."""

    payout_id: str
    account_id: str
    amount_minor: int
    currency: str
    state: str
    created_at: datetime | None

    @classmethod
    def from_item(cls, item: dict[str, Any]) -> Candidate:
        created = item.get("createdAt")
        return cls(
            payout_id=str(item["payoutId"]),
            account_id=str(item["accountId"]),
            amount_minor=int(item["amountMinor"]),
            currency=str(item["currency"]),
            state=str(item["state"]),
            created_at=datetime.fromisoformat(created.replace("Z", "+00:00")) if created else None,
        )


def idempotency_key(payout_id: str) -> str:
    """The payout's stable key (INTERFACES: `payout-<payout_id>`), never regenerated."""
    return f"payout-{payout_id}"


def _retriable_write_failure(exc: DlockError) -> bool:
    if isinstance(exc, ServiceUnreachable):
        return not exc.sent
    return exc.status == 503


class Api:
    """HTTP client for the payment resource and the rail proxy, as one owner."""

    def __init__(
        self,
        *,
        payments_url: str,
        rail_proxy_url: str,
        owner_id: str,
        sleep: Callable[[float], None] = time.sleep,
        pool_size: int | None = None,
    ) -> None:
        self.payments = Endpoints(payments_url, pool_size=pool_size, name="payments")
        # A demoted rail-proxy replica is probed back with a health GET, never with a payout
        # (a trial submission to a still-stalled replica would end RAIL_AMBIGUOUS).
        self.rail_proxy = Endpoints(
            rail_proxy_url, pool_size=pool_size, name="railproxy", probe_path="/health/live"
        )
        self.owner_id = owner_id
        self.sleep = sleep

    # -- advisory reads ------------------------------------------------------------------

    def _read(self, path: str, params: dict[str, Any] | None = None) -> Any:
        hop = BUDGETS["advisory.read"]
        attempt = 0
        while True:
            try:
                return self.payments.call(
                    "GET", path, hop=hop, owner_id=self.owner_id, params=params
                ).body
            except DlockError as exc:
                if attempt >= hop.retries or not (
                    isinstance(exc, ServiceUnreachable) or exc.retry_safe
                ):
                    raise
                attempt += 1
                self.sleep(retry_delay_s(exc, BACKOFF_INITIAL_S * 2**attempt, cap_s=1.0))

    def list_payouts(
        self, state: str, *, limit: int = 100, max_items: int = 500
    ) -> list[Candidate]:
        """P1, following nextCursor up to `max_items` rows."""
        items: list[Candidate] = []
        cursor: str | None = None
        while len(items) < max_items:
            params: dict[str, Any] = {"state": state, "limit": limit}
            if cursor:
                params["cursor"] = cursor
            page = self._read("/v1/payouts", params)
            items.extend(Candidate.from_item(item) for item in page.get("items", []))
            cursor = page.get("nextCursor")
            if not cursor:
                break
        return items

    def get_payout(self, payout_id: str) -> dict[str, Any]:
        """P4: the payout and its submissions summary. Advisory."""
        return self._read(f"/v1/payouts/{payout_id}")

    def get_account(self, account_id: str) -> dict[str, Any]:
        """P5. Advisory."""
        return self._read(f"/v1/accounts/{account_id}")

    # -- protected writes ----------------------------------------------------------------

    def _write(self, path: str, body: dict[str, Any], *, grant: Grant, payout_id: str) -> Any:
        budget = BUDGETS["payments.write"]
        headers = {**grant.fence_headers(), "X-Idempotency-Key": idempotency_key(payout_id)}
        attempt = 0
        while True:
            try:
                return self.payments.call(
                    "POST",
                    path,
                    hop=budget,
                    owner_id=self.owner_id,
                    json_body=body,
                    headers=headers,
                ).body
            except DlockError as exc:
                if attempt >= budget.retries or not _retriable_write_failure(exc):
                    raise
                attempt += 1
                self.sleep(retry_delay_s(exc, BACKOFF_INITIAL_S, cap_s=1.0))

    def claim(self, payout_id: str, *, grant: Grant, expected_state: str) -> dict[str, Any]:
        """P2: PENDING/CLAIMED → CLAIMED under the grant (account fence strictly below it)."""
        return self._write(
            f"/v1/payouts/{payout_id}/claim",
            {"expectedState": expected_state},
            grant=grant,
            payout_id=payout_id,
        )

    def post(
        self, payout_id: str, *, grant: Grant, rail_reference: str, submission_id: str
    ) -> dict[str, Any]:
        """P3: RAIL_ACKED → POSTED with the two ledger legs (account fence ≤ token)."""
        return self._write(
            f"/v1/payouts/{payout_id}/post",
            {
                "railReference": rail_reference,
                "submissionId": submission_id,
                "railOutcome": "ACKED",
            },
            grant=grant,
            payout_id=payout_id,
        )

    def submit(self, payout: dict[str, Any], *, grant: Grant) -> dict[str, Any]:
        """Rail proxy submission: presented once, never retried, whatever happens."""
        payout_id = str(payout["payoutId"])
        body = {
            "payoutId": payout_id,
            "accountId": payout["accountId"],
            "amountMinor": int(payout["amountMinor"]),
            "currency": payout["currency"],
            "beneficiaryRef": payout.get("beneficiaryRef") or "",
        }
        return self.rail_proxy.call(
            "POST",
            "/v1/rail/submissions",
            failover_after_send=False,
            hop=BUDGETS["rail.submit"],
            owner_id=self.owner_id,
            json_body=body,
            headers={
                **grant.fence_headers(),
                "X-Idempotency-Key": payout.get("idempotencyKey") or idempotency_key(payout_id),
            },
        ).body
