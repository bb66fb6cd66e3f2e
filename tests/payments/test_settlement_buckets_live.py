"""Concurrent P3 posts of one currency over real HTTP (gunicorn, the default 8 settlement
buckets): every post lands once, each bucket holds exactly its payouts' credits, and every
balance — the settlement account's row plus its buckets — equals its ledger sum."""

from __future__ import annotations

import json
import threading
import uuid
from collections import defaultdict

import psycopg
import pytest
import requests

from payments.fenced_sql import post as post_sql
from tests.payments.factories import fence_proof

pytestmark = pytest.mark.live

TIMEOUT = 10
CURRENCY = "CHF"  # no other test on the shared stack posts in it
ACCOUNTS, PER_ACCOUNT, AMOUNT = 8, 6, 1_000
THREADS_PER_ACCOUNT = 2  # two posters on one account also race on its fence row


def _seed(live_stack) -> dict:
    done = live_stack.manage(
        "seed_payouts",
        f"--accounts={ACCOUNTS}",
        f"--payouts-per-account={PER_ACCOUNT}",
        f"--balance-minor={PER_ACCOUNT * AMOUNT * 2}",
        f"--amount-minor={AMOUNT}",
        f"--currency={CURRENCY}",
        "--json",
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def _headers(account: str, token: int, payout_id: str) -> dict[str, str]:
    return {
        "X-Fencing-Token": str(token),
        "X-Fencing-Proof": fence_proof(account, token),
        "X-Owner-Id": f"poster-{account[-6:]}",
        "X-Idempotency-Key": f"payout-{payout_id}",
    }


def _paydb(live_stack, sql: str, params: tuple) -> list[tuple]:
    with psycopg.connect(live_stack.env["PAY_DATABASE_URL"], autocommit=True) as conn:
        return conn.execute(sql, params).fetchall()


def test_concurrent_posts_of_one_currency_leave_every_balance_equal_to_its_ledger(live_stack):
    base = live_stack.url("payments")
    seeded = _seed(live_stack)
    payouts: dict[str, list[str]] = defaultdict(list)
    for payout_id, account in _paydb(
        live_stack,
        "SELECT payout_id::text, account_id FROM payout WHERE payout_id = ANY(%s::uuid[])",
        (seeded["payouts"],),
    ):
        payouts[account].append(payout_id)
    # Claims one by one (each a newer token on its account), then the rail stand-in; the posts
    # present the account's last grant (P3 accepts token >= fence).
    token = 7_000_000_000 + uuid.uuid4().int % 1_000_000_000
    last: dict[str, int] = {}
    for account, ids in payouts.items():
        for payout_id in ids:
            token += 1
            claimed = requests.post(
                f"{base}/v1/payouts/{payout_id}/claim",
                json={"expectedState": "PENDING"},
                headers=_headers(account, token, payout_id),
                timeout=TIMEOUT,
            )
            assert claimed.status_code == 200, claimed.text
        last[account] = token
    _paydb(
        live_stack,
        "UPDATE payout SET state = 'RAIL_ACKED' WHERE payout_id = ANY(%s::uuid[])"
        " RETURNING payout_id",
        (seeded["payouts"],),
    )

    answers: list[int] = []
    barrier = threading.Barrier(ACCOUNTS * THREADS_PER_ACCOUNT)

    def poster(account: str, ids: list[str]) -> None:
        with requests.Session() as session:
            barrier.wait(timeout=60)
            for payout_id in ids:
                response = session.post(
                    f"{base}/v1/payouts/{payout_id}/post",
                    json={
                        "railReference": f"rr-{payout_id[:8]}",
                        "submissionId": str(uuid.uuid4()),
                    },
                    headers=_headers(account, last[account], payout_id),
                    timeout=TIMEOUT,
                )
                answers.append(response.status_code)

    threads = [
        threading.Thread(target=poster, args=(account, ids[n::THREADS_PER_ACCOUNT]))
        for account, ids in payouts.items()
        for n in range(THREADS_PER_ACCOUNT)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)

    assert sorted(answers) == [200] * ACCOUNTS * PER_ACCOUNT
    states = _paydb(
        live_stack,
        "SELECT state, count(*) FROM payout WHERE payout_id = ANY(%s::uuid[]) GROUP BY state",
        (seeded["payouts"],),
    )
    assert states == [("POSTED", ACCOUNTS * PER_ACCOUNT)]
    settlement = f"settlement:{CURRENCY}"
    expected: dict[int, int] = defaultdict(int)
    for payout_id in seeded["payouts"]:
        expected[post_sql.settlement_bucket(uuid.UUID(payout_id), buckets=8)] += AMOUNT
    buckets = _paydb(
        live_stack,
        "SELECT bucket, balance_minor FROM settlement_bucket WHERE account_id = %s",
        (settlement,),
    )
    assert dict(buckets) == dict(expected)
    assert _paydb(
        live_stack, "SELECT balance_minor FROM account WHERE account_id = %s", (settlement,)
    ) == [(0,)]
    legs = _paydb(
        live_stack,
        "SELECT direction, count(*) FROM ledger_entry WHERE account_id = %s GROUP BY direction",
        (settlement,),
    )
    assert legs == [("CREDIT", ACCOUNTS * PER_ACCOUNT)]
    for account in [settlement, *payouts]:
        books = requests.get(f"{base}/v1/accounts/{account}", timeout=TIMEOUT).json()
        assert books["balanceMinor"] == books["ledgerSumMinor"], books
    books = requests.get(f"{base}/v1/accounts/{settlement}", timeout=TIMEOUT).json()
    assert books["balanceMinor"] == ACCOUNTS * PER_ACCOUNT * AMOUNT
