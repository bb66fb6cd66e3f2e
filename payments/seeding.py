"""Seeding: accounts with opening balances and PENDING payouts (manage.py seed_payouts, tests,
benchmarks). Each is its own transaction on paydb; opening balances are ledger pairs from
`funding:<currency>`, so balance == ledger sum from the first row on.
"""

from __future__ import annotations

import uuid

from django.db import connections, transaction

from dlock.dbrouter import alias_for
from dlock.errors import validation_error
from payments.fenced_sql import account as account_sql
from payments.fenced_sql import ledger as ledger_sql
from payments.models import Account, AccountKind, Payout, PayoutEvent


def _alias() -> str:
    return alias_for("payments")


def funding_account_id(currency: str) -> str:
    return f"funding:{currency}"


def create_account(
    *, account_id: str, currency: str = "EUR", opening_balance_minor: int = 0
) -> Account:
    """A CUSTOMER account; a positive opening balance is a ledger pair from `funding:<cur>`."""
    if opening_balance_minor < 0:
        raise validation_error(
            "opening balance must be >= 0",
            [{"field": "openingBalanceMinor", "message": ">= 0"}],
        )
    with transaction.atomic(using=_alias()), connections[_alias()].cursor() as cur:
        account = Account.objects.using(_alias()).create(
            account_id=account_id, currency=currency, kind=AccountKind.CUSTOMER
        )
        if opening_balance_minor > 0:
            funding = funding_account_id(currency)
            account_sql.ensure_account(
                cur, account_id=funding, currency=currency, kind=AccountKind.FUNDING
            )
            ledger_sql.post_ledger(
                cur,
                payout_id=None,
                debit_account=funding,
                credit_account=account_id,
                amount=opening_balance_minor,
                fence=0,
            )
    account.refresh_from_db(using=_alias())
    return account


def _pending_payout(
    *,
    payout_id: uuid.UUID,
    account: Account,
    amount_minor: int,
    beneficiary_ref: str | None = None,
) -> Payout:
    """A new (unsaved) PENDING payout in the account's currency, with its stable idempotency key."""
    return Payout(
        payout_id=payout_id,
        account=account,
        amount_minor=amount_minor,
        currency=account.currency,
        beneficiary_ref=beneficiary_ref or f"ben-{payout_id.hex[:12]}",
        state="PENDING",
        idempotency_key=f"payout-{payout_id}",
    )


def create_payout(
    *,
    account_id: str,
    amount_minor: int,
    beneficiary_ref: str | None = None,
    payout_id: uuid.UUID | None = None,
    owner_id: str = "seed",
) -> Payout:
    """A PENDING payout with its stable idempotency key and its first payout_event row."""
    payout_id = payout_id or uuid.uuid4()
    with transaction.atomic(using=_alias()):
        account = Account.objects.using(_alias()).get(account_id=account_id)
        payout = _pending_payout(
            payout_id=payout_id,
            account=account,
            amount_minor=amount_minor,
            beneficiary_ref=beneficiary_ref,
        )
        payout.save(using=_alias(), force_insert=True)
        PayoutEvent.objects.using(_alias()).create(
            payout=payout, from_state=None, to_state="PENDING", token=None, owner_id=owner_id
        )
    return payout


def seed(
    *,
    accounts: int,
    payouts_per_account: int,
    balance_minor: int,
    amount_minor: int,
    currency: str = "EUR",
) -> dict[str, list[str]]:
    """Accounts with opening balances and PENDING payouts (one transaction per account)."""
    account_ids: list[str] = []
    payout_ids: list[str] = []
    for _ in range(accounts):
        with transaction.atomic(using=_alias()):
            account = create_account(
                account_id=f"acct-{uuid.uuid4().hex[:16]}",
                currency=currency,
                opening_balance_minor=balance_minor,
            )
            ids = [uuid.uuid4() for _ in range(payouts_per_account)]
            Payout.objects.using(_alias()).bulk_create(
                _pending_payout(payout_id=pid, account=account, amount_minor=amount_minor)
                for pid in ids
            )
            PayoutEvent.objects.using(_alias()).bulk_create(
                PayoutEvent(payout_id=pid, from_state=None, to_state="PENDING", owner_id="seed")
                for pid in ids
            )
        account_ids.append(account.account_id)
        payout_ids.extend(str(pid) for pid in ids)
    return {"accounts": account_ids, "payouts": payout_ids}
