"""`manage.py record_rail_recovery --transfer RAIL_REFERENCE --reason TEXT [--operator NAME]
[--json]` (ROLE=ops).

Records a rail transfer no POSTED payout accounts for (a duplicate ack; the booked transfer of a
payout resolved FAILED) as a rail recovery and books it: DEBIT recoverable:rail:<ccy>, CREDIT
settlement:<ccy> (payments/recovery.py). Guarded by the reconciler's evidence and by the rail's
statement read now. Exit 0 recorded; 1 refused (why on stderr, and as JSON with --json; only the
refusal's audit is written); 2 a database could not be reached.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ops.books import BooksCommand, fresh_statement
from payments.recovery import record_recovery

if TYPE_CHECKING:
    import argparse

    from django.contrib.auth.base_user import AbstractBaseUser


class Command(BooksCommand):
    help = "Record a rail transfer no POSTED payout accounts for as a rail recovery (audited)."

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--transfer", required=True, help="the rail's reference (statement)")
        parser.add_argument("--reason", required=True, help="why (at least 8 characters)")
        self.add_operator_arguments(parser)

    def step(self, user: AbstractBaseUser, options: dict[str, Any]) -> tuple[dict[str, Any], str]:
        step = record_recovery(
            rail_reference=options["transfer"],
            reason=options["reason"],
            user=user,
            statement_read=True,
            statement=fresh_statement(options["transfer"].strip()),
        )
        return step.as_dict(), (
            f"rail recovery recorded for transfer {step.rail_reference} (payout "
            f"{step.payout_id}, {step.amount_minor} {step.currency}) by {step.operator}: OPEN"
        )
