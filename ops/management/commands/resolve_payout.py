"""`manage.py resolve_payout PAYOUT_ID --to POSTED|FAILED [--reference REF] --note TEXT
[--override] [--operator NAME] [--json]` (ROLE=ops).

The admin's quarantine resolve as a command, with the same guard and audit
(payments/resolve.py): POSTED needs the reconciler's BOOKED_ONCE (duplicates recorded as rail
recoveries) and the statement's reference; FAILED needs NOT_BOOKED (or every booked transfer a
recovery). Exit 0 resolved; 1 refused (the reason on stderr, and as JSON with --json): nothing
changed but the refusal's audit (`payout_resolution_refused` event, LogEntry); 2 a database
could not be reached.
"""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Any

from django.core.management.base import BaseCommand, CommandError
from django.db import DatabaseError

from dlock.errors import ApiError
from ops.books import answer, operator_user, refuse
from payments.resolve import resolve_payout

if TYPE_CHECKING:
    import argparse


class Command(BaseCommand):
    help = "Resolve a RAIL_AMBIGUOUS payout as POSTED or FAILED, only the safe way (audited)."

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("payout_id", help="the payout id (uuid)")
        parser.add_argument("--to", required=True, choices=["POSTED", "FAILED"], dest="to")
        parser.add_argument("--reference", default=None, help="POSTED: the statement's reference")
        parser.add_argument("--note", required=True, help="what you checked and why")
        parser.add_argument(
            "--override", action="store_true", help="resolve against the reconciler (reasoned)"
        )
        parser.add_argument("--operator", default=None, help="admin user name (default: OS user)")
        parser.add_argument("--json", action="store_true", help="print the outcome as JSON")

    def handle(self, *args: Any, **options: Any) -> None:
        as_json = options["json"]
        try:
            payout_id = uuid.UUID(options["payout_id"])
        except ValueError:
            raise CommandError(
                f"refused: {options['payout_id']!r} is not a payout id (uuid)", returncode=1
            ) from None
        try:
            user = operator_user(options["operator"])
            done = resolve_payout(
                payout_id=payout_id,
                resolution=options["to"],
                user=user,
                note=options["note"],
                rail_reference=options["reference"],
                override=options["override"],
            )
        except ApiError as exc:
            raise refuse(self, exc, as_json=as_json) from exc
        except DatabaseError as exc:
            raise CommandError(
                f"resolve_payout could not reach paydb ({type(exc).__name__}); nothing changed",
                returncode=2,
            ) from exc
        suffix = " (override)" if done.override else ""
        ref = f" with reference {done.reference}" if done.reference else ""
        answer(
            self,
            done.as_dict(),
            f"payout {done.payout_id} resolved as {done.to_state}{ref}{suffix} by {done.operator}",
            as_json=as_json,
        )
