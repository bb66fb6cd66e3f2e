"""`manage.py reverse_payout PAYOUT_ID --reason TEXT [--operator NAME] [--json]` (ROLE=ops).

Reverses a POSTED payout the rail's statement contradicts (payments/reversal.py): DEBIT
settlement, CREDIT the payout's account (new ledger rows owned by a `payout_reversal` row; the
posting's rows stay), and the payout moves POSTED → FAILED. Guarded by the reconciler's latest
finding (taken after the payout was POSTED, without its reference) and by the statement read
now. Exit 0 reversed; 1 refused (why on stderr, and as JSON with --json; only the refusal's
audit is written); 2 bad arguments (a reason under 8 characters, a payout id that is no uuid or
exists nowhere: nothing recorded) or a database could not be reached: nothing changed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ops.books import PayoutCommand, fresh_statement
from payments.reversal import check_reason, reverse_payout

if TYPE_CHECKING:
    import argparse

    from django.contrib.auth.base_user import AbstractBaseUser


class Command(PayoutCommand):
    help = "Reverse a POSTED payout whose reference the rail's statement lacks (audited)."

    def add_payout_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--reason", required=True, help="why (at least 8 characters)")

    def check_input(self, options: dict[str, Any]) -> None:
        check_reason(options["reason"].strip())

    def step(self, user: AbstractBaseUser, options: dict[str, Any]) -> tuple[dict[str, Any], str]:
        done = reverse_payout(
            payout_id=options["payout_uuid"],
            reason=options["reason"],
            user=user,
            read_statement=fresh_statement,
        )
        return done.as_dict(), (
            f"payout {done['payoutId']} reversed POSTED → FAILED: {done['amountMinor']} "
            f"{done['currency']} back to {done['accountId']} (reversal {done['reversalId']}) "
            f"by {done['operator']}; next: ROLE=ops manage.py reconcile"
        )
