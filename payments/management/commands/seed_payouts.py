"""manage.py seed_payouts: CUSTOMER accounts with opening balances and PENDING payouts.

Steps: for each account, one transaction creating the account and its opening ledger pair
(CREDIT the account B, DEBIT `funding:<cur>` B, so balance == ledger sum); then M PENDING
payouts of amount A with their first payout_event row. `--json` prints the ids on stdout.
"""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING, Any

from django.core.management.base import BaseCommand, CommandError

from payments import seeding

if TYPE_CHECKING:
    import argparse


INT64_MAX = 2**63 - 1  # ledger amounts and balances are bigint


def _positive(name: str, value: int, *, allow_zero: bool = False) -> int:
    """Bad arguments are not an answer: exit 2, one line, before any row is written."""
    if value < 0 or (value == 0 and not allow_zero):
        raise CommandError(
            f"--{name} must be {'>= 0' if allow_zero else '> 0'}, got {value}", returncode=2
        )
    if value > INT64_MAX:
        raise CommandError(f"--{name} must be <= {INT64_MAX} (bigint), got {value}", returncode=2)
    return value


class Command(BaseCommand):
    help = "Create accounts with opening balances and PENDING payouts (paydb)."

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--accounts", type=int, required=True)
        parser.add_argument("--payouts-per-account", type=int, required=True)
        parser.add_argument("--balance-minor", type=int, required=True)
        parser.add_argument("--amount-minor", type=int, required=True)
        parser.add_argument("--currency", default="EUR")
        parser.add_argument("--json", action="store_true", help="print the ids as JSON")

    def handle(self, *args: Any, **options: Any) -> None:
        currency = options["currency"]
        if not re.fullmatch(r"[A-Z]{3}", currency):
            raise CommandError(
                f"--currency must be an ISO-4217 code like EUR, got {currency!r}", returncode=2
            )
        result = seeding.seed(
            accounts=_positive("accounts", options["accounts"]),
            payouts_per_account=_positive(
                "payouts-per-account", options["payouts_per_account"], allow_zero=True
            ),
            balance_minor=_positive("balance-minor", options["balance_minor"], allow_zero=True),
            amount_minor=_positive("amount-minor", options["amount_minor"]),
            currency=currency,
        )
        if options["json"]:
            self.stdout.write(json.dumps(result))
        else:
            self.stdout.write(
                f"seeded {len(result['accounts'])} account(s) and "
                f"{len(result['payouts'])} PENDING payout(s) in {currency}"
            )
