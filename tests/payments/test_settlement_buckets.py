"""Bucketed settlement credit (issue 28 item 3): P3 credits one of PAY_SETTLEMENT_BUCKETS rows
of `settlement:<currency>`, chosen from the payout id; every reader sees the account row plus
its buckets, which equals the account's ledger sum; the wire and the ledger are unchanged."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections import defaultdict

import pytest
from django.contrib.admin.utils import quote
from django.urls import reverse

from devstack.common import PROJECT
from payments import services
from payments.fenced_sql import post as post_sql
from payments.models import Account, LedgerEntry, Payout, SettlementBucket
from tests.payments import factories as f

pytestmark = pytest.mark.django_db(databases=["default"])


def _posted(client, acct: Account, amount: int) -> Payout:
    """A payout of `acct` taken through P2, the rail (stand-in) and P3 over the test client."""
    p = f.payout(acct, amount)
    token = f.next_token()
    assert f.claim(client, p, token).status_code == 200
    f.rail_acked(p)
    response = f.post(client, p, token)
    assert response.status_code == 200, response.content
    return p


def _buckets(account_id: str) -> dict[int, int]:
    rows = SettlementBucket.objects.filter(account_id=account_id)
    return {row.bucket: row.balance_minor for row in rows}


def _p5(client, account_id: str) -> dict:
    response = client.get(f"/v1/accounts/{account_id}")
    assert response.status_code == 200, response.content
    return response.json()


def test_posts_of_one_currency_spread_over_the_buckets_and_p5_reads_their_sum(client, settings):
    settings.PAY_SETTLEMENT_BUCKETS = 8
    accounts = [f.account(50_000, currency="SEK") for _ in range(3)]
    posted = [
        _posted(client, acct, 100 + 10 * i) for i in range(8) for acct in accounts
    ]  # 24 payouts

    expected: dict[int, int] = defaultdict(int)
    for p in posted:
        expected[post_sql.settlement_bucket(p.payout_id, buckets=8)] += p.amount_minor
    assert _buckets("settlement:SEK") == dict(expected)
    assert len(expected) > 1  # 24 random ids all in one of 8 buckets: p ≈ 8^-23
    total = sum(p.amount_minor for p in posted)
    # The account row keeps its own balance (0: created by the first credit); the ledger still
    # names the account, one CREDIT leg per payout.
    assert Account.objects.get(account_id="settlement:SEK").balance_minor == 0
    credits = LedgerEntry.objects.filter(account_id="settlement:SEK", direction="CREDIT")
    assert sorted(e.payout_id for e in credits) == sorted(p.payout_id for p in posted)
    settlement = _p5(client, "settlement:SEK")
    assert settlement["balanceMinor"] == settlement["ledgerSumMinor"] == total
    assert set(settlement) == {
        "accountId",
        "currency",
        "balanceMinor",
        "fence",
        "updatedAt",
        "ledgerSumMinor",
    }
    for acct in accounts:
        customer = _p5(client, acct.account_id)
        assert customer["balanceMinor"] == customer["ledgerSumMinor"]
    assert [b for b in f.books() if b[1] != b[2]] == []


def test_with_one_bucket_every_credit_lands_in_one_row(client, settings):
    settings.PAY_SETTLEMENT_BUCKETS = 1
    acct = f.account(10_000, currency="NOK")
    posted = [_posted(client, acct, amount) for amount in (1_250, 750, 500)]

    assert _buckets("settlement:NOK") == {0: 2_500}
    settlement = _p5(client, "settlement:NOK")
    assert settlement["balanceMinor"] == settlement["ledgerSumMinor"] == 2_500
    assert _p5(client, acct.account_id)["balanceMinor"] == 10_000 - 2_500
    assert {p.payout_id for p in posted} == set(
        LedgerEntry.objects.filter(account_id="settlement:NOK").values_list("payout_id", flat=True)
    )


def test_a_replayed_post_credits_its_bucket_once(client, settings):
    settings.PAY_SETTLEMENT_BUCKETS = 8
    acct = f.account(10_000, currency="DKK")
    p = f.payout(acct, 900)
    token = f.next_token()
    assert f.claim(client, p, token).status_code == 200
    f.rail_acked(p)
    body = {"railReference": "rr-bucket-replay", "submissionId": str(uuid.uuid4())}
    assert f.post(client, p, token, body=body).status_code == 200

    replay = f.post(client, p, token, body=body)

    assert replay.status_code == 200 and replay["Idempotent-Replayed"] == "true"
    bucket = post_sql.settlement_bucket(p.payout_id, buckets=8)
    assert _buckets("settlement:DKK") == {bucket: 900}
    assert f.balance("settlement:DKK") == 900


def test_a_settlement_balance_from_before_the_buckets_stays_on_its_row_and_still_counts(
    client, settings
):
    # What migration 0006 finds: settlement credits made on the account row itself.
    old = _posted(client, f.account(10_000, currency="PLN"), 400)
    settlement = Account.objects.get(account_id="settlement:PLN")
    SettlementBucket.objects.filter(account_id="settlement:PLN").delete()
    Account.objects.filter(pk=settlement.pk).update(balance_minor=400)
    settings.PAY_SETTLEMENT_BUCKETS = 8

    new = _posted(client, f.account(10_000, currency="PLN"), 600)

    assert Account.objects.get(pk=settlement.pk).balance_minor == 400
    bucket = post_sql.settlement_bucket(new.payout_id, buckets=8)
    assert _buckets("settlement:PLN") == {bucket: 600}
    books = _p5(client, "settlement:PLN")
    assert books["balanceMinor"] == books["ledgerSumMinor"] == 1_000
    assert old.payout_id != new.payout_id


def test_an_operator_resolution_credits_the_settlement_row_and_the_books_balance(client, settings):
    settings.PAY_SETTLEMENT_BUCKETS = 8
    acct = f.account(10_000, currency="CZK")
    _posted(client, acct, 300)  # a P3 credit in a bucket
    quarantined = f.payout(acct, 700, state="RAIL_AMBIGUOUS")

    services.resolve_quarantined(
        payout_id=quarantined.payout_id,
        resolution="POSTED",
        operator="alice",
        note="statement shows one transfer",
        rail_reference="RR-9",
    )

    assert Account.objects.get(account_id="settlement:CZK").balance_minor == 700
    assert sum(_buckets("settlement:CZK").values()) == 300
    books = _p5(client, "settlement:CZK")
    assert books["balanceMinor"] == books["ledgerSumMinor"] == 1_000


def test_sequential_payout_ids_still_spread_over_every_bucket():
    # Ids whose low bits do not vary (e.g. a time-ordered uuid's node field) must not all land
    # in one bucket: the bucket is a hash of the id, not its low bits.
    ids = [uuid.UUID(int=(n << 64) | 0xABCDEF) for n in range(64)]
    assert {post_sql.settlement_bucket(i, buckets=8) for i in ids} == set(range(8))
    assert {post_sql.settlement_bucket(i, buckets=1) for i in ids} == {0}
    again = [post_sql.settlement_bucket(i, buckets=8) for i in ids]
    assert again == [post_sql.settlement_bucket(i, buckets=8) for i in ids]  # stable


def test_the_admin_shows_a_settlement_accounts_balance_with_its_buckets(client, settings):
    from django.contrib.auth import get_user_model

    settings.PAY_SETTLEMENT_BUCKETS = 8
    for amount in (111, 222, 333):
        _posted(client, f.account(10_000, currency="HUF"), amount)
    staff = get_user_model().objects.create(username="ops-bob", is_staff=True, is_superuser=True)
    client.force_login(staff)

    listing = client.get("/admin/payments/account/?q=settlement:HUF")
    detail = client.get(reverse("admin:payments_account_change", args=[quote("settlement:HUF")]))

    assert listing.status_code == detail.status_code == 200
    assert "666" in listing.content.decode()  # 111 + 222 + 333, not the row's 0
    assert "666" in detail.content.decode()


def _check(buckets: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "ROLE": "payments", "DJANGO_DEBUG": "true"}
    env["PAY_SETTLEMENT_BUCKETS"] = buckets
    return subprocess.run(
        [sys.executable, "manage.py", "check"],
        cwd=PROJECT,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )


@pytest.mark.parametrize("raw", ["0", "-3", "eight", "257"])
def test_a_bad_bucket_count_refuses_to_start(raw):
    done = _check(raw)
    assert done.returncode != 0
    assert "PAY_SETTLEMENT_BUCKETS" in done.stderr


def test_a_good_bucket_count_starts():
    done = _check("16")
    assert done.returncode == 0, done.stderr
