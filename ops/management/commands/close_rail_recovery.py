"""`manage.py close_rail_recovery --transfer RAIL_REFERENCE (--recovered --reference REF |
--written-off --reason TEXT) [--operator NAME] [--json]` (ROLE=ops).

Closes an OPEN rail recovery (payments/recovery.py): RECOVERED books the money back (DEBIT
settlement, CREDIT recoverable) with the rail's reference of the return; WRITTEN_OFF moves it to
the loss account (DEBIT loss:rail:<ccy>, CREDIT recoverable) with a reason. Exit 0 closed; 1
refused (no such recovery, closed already, no reference / reason: why on stderr, and as JSON
with --json); 2 a database could not be reached.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.core.management.base import BaseCommand, CommandError
from django.db import DatabaseError

from dlock.errors import ApiError
from ops.books import answer, operator_user, refuse
from payments.recovery import close_recovery

if TYPE_CHECKING:
    import argparse


class Command(BaseCommand):
    help = "Close an open rail recovery as RECOVERED or WRITTEN_OFF (audited)."

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--transfer", required=True, help="the recovered transfer's reference")
        outcome = parser.add_mutually_exclusive_group(required=True)
        outcome.add_argument("--recovered", action="store_true", help="the money came back")
        outcome.add_argument("--written-off", action="store_true", help="it will not come back")
        parser.add_argument("--reference", default=None, help="RECOVERED: the rail's reference")
        parser.add_argument("--reason", default=None, help="WRITTEN_OFF: why (≥ 8 characters)")
        parser.add_argument("--operator", default=None, help="admin user name (default: OS user)")
        parser.add_argument("--json", action="store_true", help="print the outcome as JSON")

    def handle(self, *args: Any, **options: Any) -> None:
        as_json = options["json"]
        outcome = "RECOVERED" if options["recovered"] else "WRITTEN_OFF"
        try:
            user = operator_user(options["operator"])
            step = close_recovery(
                rail_reference=options["transfer"],
                outcome=outcome,
                user=user,
                reference=options["reference"],
                reason=options["reason"],
            )
        except ApiError as exc:
            raise refuse(self, exc, as_json=as_json) from exc
        except DatabaseError as exc:
            raise CommandError(
                f"close_rail_recovery could not reach paydb ({type(exc).__name__}); "
                "nothing changed",
                returncode=2,
            ) from exc
        answer(
            self,
            step.as_dict(),
            f"rail recovery of transfer {step.rail_reference} closed {step.status} by "
            f"{step.operator}",
            as_json=as_json,
        )
