"""`manage.py close_rail_recovery --transfer RAIL_REFERENCE (--recovered --reference REF |
--written-off --reason TEXT) [--operator NAME] [--json]` (ROLE=ops).

Closes an OPEN rail recovery (payments/recovery.py): RECOVERED books the money back (DEBIT
settlement, CREDIT recoverable) with the rail's reference of the return; WRITTEN_OFF moves it to
the loss account (DEBIT loss:rail:<ccy>, CREDIT recoverable) with a reason. Exit 0 closed; 1
refused (no such recovery, closed already, no reference / reason, a --reference with
--written-off: why on stderr, and as JSON with --json); 2 bad arguments or a database could not
be reached.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ops.books import BooksCommand
from payments.recovery import close_recovery

if TYPE_CHECKING:
    import argparse

    from django.contrib.auth.base_user import AbstractBaseUser


class Command(BooksCommand):
    help = "Close an open rail recovery as RECOVERED or WRITTEN_OFF (audited)."

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--transfer", required=True, help="the recovered transfer's reference")
        outcome = parser.add_mutually_exclusive_group(required=True)
        outcome.add_argument("--recovered", action="store_true", help="the money came back")
        outcome.add_argument("--written-off", action="store_true", help="it will not come back")
        parser.add_argument("--reference", default=None, help="RECOVERED: the rail's reference")
        parser.add_argument("--reason", default=None, help="WRITTEN_OFF: why (≥ 8 characters)")
        self.add_operator_arguments(parser)

    def step(self, user: AbstractBaseUser, options: dict[str, Any]) -> tuple[dict[str, Any], str]:
        step = close_recovery(
            rail_reference=options["transfer"],
            outcome="RECOVERED" if options["recovered"] else "WRITTEN_OFF",
            user=user,
            reference=options["reference"],
            reason=options["reason"],
        )
        return step.as_dict(), (
            f"rail recovery of transfer {step.rail_reference} closed {step.status} by "
            f"{step.operator}"
        )
