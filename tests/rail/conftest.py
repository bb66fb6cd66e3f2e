"""A private stack for the rail tests (short rail timeouts) and small factories over SQL/HTTP."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass

import psycopg
import pytest
import requests

from dlock import proof
from tests.conftest import LiveStack, start_stack, stop_stack

# The rail stub's config row with every fault off: tests start from it and set what they need.
STUB_CLEAN = {
    "latency_ms": 0,
    "failure_rate": 0.0,
    "duplicate_ack_rate": 0.0,
    "decline_rate": 0.0,
    "split_5xx": 1,
    "split_drop_before": 1,
    "split_drop_after": 1,
    "hold_ms": 0,
    "seed": None,
}


def stub_config_statement(**values) -> tuple[str, dict]:
    """The UPDATE that sets the stub's config row to STUB_CLEAN overlaid with `values`."""
    config = {**STUB_CLEAN, **values}
    assignments = ", ".join(f"{name} = %({name})s" for name in config)
    return (
        f"UPDATE railstub_config SET {assignments}, updated_at = clock_timestamp() WHERE id = 1",
        config,
    )


# Short timeouts keep ambiguous outcomes fast: connect 0.5 s, read 1.5 s, the recording's retry
# 1 s, sweep after 3.5 s (connect + read + retry + margin).
RAIL_ENV = {
    "RAIL_CONNECT_TIMEOUT_MS": "500",
    "RAIL_READ_TIMEOUT_MS": "1500",
    "RAIL_RECORD_RETRY_MS": "1000",
    "RAIL_SWEEP_MARGIN_MS": "500",
    "RAIL_SWEEP_INTERVAL_MS": "300",
}


@pytest.fixture(scope="session")
def rail_stack():
    stack = start_stack("rail", extra_env=RAIL_ENV)
    yield stack
    stop_stack(stack)


@dataclass
class Payout:
    payout_id: str
    account_id: str
    amount_minor: int
    currency: str
    beneficiary_ref: str
    token: int

    @property
    def key(self) -> str:
        return f"payout-{self.payout_id}"

    def body(self, **override) -> dict:
        body = {
            "payoutId": self.payout_id,
            "accountId": self.account_id,
            "amountMinor": self.amount_minor,
            "currency": self.currency,
            "beneficiaryRef": self.beneficiary_ref,
        }
        body.update(override)
        return body


class Rail:
    """Helpers bound to one stack: paydb/raildb reads, stub config, payout factory, submit."""

    def __init__(self, stack: LiveStack) -> None:
        self.stack = stack
        self.proxy_url = stack.url("railproxy")

    # -- databases
    def pay(self, sql: str, params=None):
        with psycopg.connect(self.stack.env["PAY_DATABASE_URL"], autocommit=True) as conn:
            cur = conn.execute(sql, params)
            return cur.fetchall() if cur.description else None

    def raildb(self, sql: str, params=None):
        with psycopg.connect(self.stack.env["RAIL_DATABASE_URL"], autocommit=True) as conn:
            cur = conn.execute(sql, params)
            return cur.fetchall() if cur.description else None

    def stub_config(self, **values) -> None:
        """Set the stub's config row (all rates 0, holds 10 s, unless given): read by the stub per
        request."""
        self.raildb(*stub_config_statement(**{"hold_ms": 10_000, **values}))

    def transfers(self, client_ref: str) -> list[tuple]:
        return self.raildb(
            "SELECT rail_reference, duplicate_of FROM rail_transfer WHERE client_ref = %s"
            " ORDER BY accepted_at",
            [client_ref],
        )

    def stub_requests(self, client_ref: str) -> list[str]:
        rows = self.raildb(
            "SELECT fault FROM rail_request WHERE client_ref = %s ORDER BY id", [client_ref]
        )
        return [r[0] for r in rows]

    def submissions(self, payout_id: str) -> list[tuple]:
        """(outcome, presented_token, detail, rail_reference) in submission order."""
        return self.pay(
            "SELECT outcome, presented_token, detail, rail_reference FROM rail_submission"
            " WHERE payout_id = %s ORDER BY submitted_at",
            [payout_id],
        )

    def payout_state(self, payout_id: str) -> str:
        return self.pay("SELECT state FROM payout WHERE payout_id = %s", [payout_id])[0][0]

    def payout_events(self, payout_id: str) -> list[tuple]:
        return self.pay(
            "SELECT from_state, to_state, token FROM payout_event WHERE payout_id = %s"
            " ORDER BY at, id",
            [payout_id],
        )

    def high_water(self, account_id: str) -> tuple | None:
        rows = self.pay(
            "SELECT highest_token, retry_payout_id FROM rail_high_water WHERE account_id = %s",
            [account_id],
        )
        return rows[0] if rows else None

    @staticmethod
    def wait_for(predicate, timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        while not predicate():
            if time.monotonic() > deadline:
                raise AssertionError(f"condition not met within {timeout} s")
            time.sleep(0.05)

    # -- factories
    def claimed_payout(
        self, token: int, *, account_id: str | None = None, amount_minor: int = 1_250
    ) -> Payout:
        """A payout already CLAIMED under `token` (rows written directly in paydb)."""
        account_id = account_id or f"acct-{uuid.uuid4().hex[:12]}"
        payout = Payout(
            str(uuid.uuid4()),
            account_id,
            amount_minor,
            "EUR",
            f"benef-{uuid.uuid4().hex[:8]}",
            token,
        )
        self.pay(
            "INSERT INTO account (account_id, currency, kind, balance_minor, fence)"
            " VALUES (%s, 'EUR', 'CUSTOMER', 1000000, %s) ON CONFLICT (account_id) DO NOTHING",
            [account_id, token],
        )
        self.pay(
            "INSERT INTO payout (payout_id, account_id, amount_minor, currency, beneficiary_ref,"
            " state, attempt_count, claim_token, claim_owner_id, idempotency_key)"
            " VALUES (%s, %s, %s, 'EUR', %s, 'CLAIMED', 1, %s, 'worker-a', %s)",
            [payout.payout_id, account_id, amount_minor, payout.beneficiary_ref, token, payout.key],
        )
        return payout

    def orphan_intent(self, payout: Payout, *, age: str = "1 hour") -> None:
        """What a proxy killed `age` ago left behind: payout SUBMITTING, its intent PENDING."""
        self.pay("UPDATE payout SET state = 'SUBMITTING' WHERE payout_id = %s", [payout.payout_id])
        self.pay(
            "INSERT INTO rail_submission (submission_id, payout_id, account_id, amount_minor,"
            " currency, presented_token, owner_id, idempotency_key, request_hash, client_ref,"
            " outcome, submitted_at)"
            " VALUES (gen_random_uuid(), %s, %s, %s, 'EUR', %s, 'worker-a', %s, 'h', %s,"
            " 'PENDING', clock_timestamp() - %s::interval)",
            [
                payout.payout_id,
                payout.account_id,
                payout.amount_minor,
                payout.token,
                payout.key,
                payout.payout_id,
                age,
            ],
        )

    def reclaim(self, payout: Payout, token: int) -> None:
        """What a recovery claim does to the payout row: CLAIMED under a newer token."""
        self.pay(
            "UPDATE payout SET state = 'CLAIMED', claim_token = %s WHERE payout_id = %s",
            [token, payout.payout_id],
        )

    # -- HTTP
    def submit(
        self,
        payout: Payout,
        *,
        token: int | None = None,
        owner: str = "worker-a",
        key: str | None = None,
        body: dict | None = None,
        url: str | None = None,
        headers: dict | None = None,
    ) -> requests.Response:
        token = token if token is not None else payout.token
        sent = {
            "X-Fencing-Token": str(token),
            # What L4 answered for `payout:{accountId}` with this token (the suite shares the
            # roles' DLOCK_PROOF_KEYS); a test overrides or removes it through `headers`.
            "X-Fencing-Proof": proof.sign(key=proof.payout_key(payout.account_id), token=token),
            "X-Owner-Id": owner,
            "X-Idempotency-Key": key or payout.key,
        }
        sent.update(headers or {})
        sent = {k: v for k, v in sent.items() if v is not None}
        return requests.post(
            f"{url or self.proxy_url}/v1/rail/submissions",
            json=body if body is not None else payout.body(),
            headers=sent,
            timeout=15,
        )


@pytest.fixture
def rail(rail_stack) -> Rail:
    helper = Rail(rail_stack)
    helper.stub_config()  # a well-behaved rail unless the test says otherwise
    yield helper
    helper.stub_config()
