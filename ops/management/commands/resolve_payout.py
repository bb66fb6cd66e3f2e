"""`manage.py resolve_payout PAYOUT_ID --to POSTED|FAILED [--reference REF] --note TEXT
[--override] [--operator NAME] [--json]` (ROLE=ops).

The admin's quarantine resolve as a command, with the same guard and audit
(payments/resolve.py): POSTED needs its reference on the rail's statement, read now, booked for
this payout with its amount (no override lifts that), and the reconciler's BOOKED_ONCE
(duplicates recorded as rail recoveries); FAILED needs NOT_BOOKED (or every booked transfer a
recovery). Exit 0 resolved; 1 refused (the payout is not RAIL_AMBIGUOUS, a guard refuses, an
unknown operator; the reason on stderr, and as JSON with --json): nothing changed but the
refusal's audit (`payout_resolution_refused` event, LogEntry, `operator_refusal` row); 2 bad
arguments (an override's note under 20 characters, a `--reference` with FAILED, a payout id
that is no uuid or exists nowhere: nothing recorded) or a database could not be reached.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.core.management.base import CommandError

from ops.books import PayoutCommand, fresh_statement
from payments.resolve import check_request, resolve_payout

if TYPE_CHECKING:
    import argparse

    from django.contrib.auth.base_user import AbstractBaseUser


class Command(PayoutCommand):
    help = "Resolve a RAIL_AMBIGUOUS payout as POSTED or FAILED, only the safe way (audited)."

    def add_payout_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--to", required=True, choices=["POSTED", "FAILED"], dest="to")
        parser.add_argument("--reference", default=None, help="POSTED: the statement's reference")
        parser.add_argument("--note", required=True, help="what you checked and why")
        parser.add_argument(
            "--override", action="store_true", help="resolve against the reconciler (reasoned)"
        )

    def check_input(self, options: dict[str, Any]) -> None:
        if options["to"] == "FAILED" and options["reference"] is not None:
            raise CommandError(
                "--reference is the statement's reference of a POSTED resolution; a FAILED one "
                "has none",
                returncode=2,
            )
        check_request(
            resolution=options["to"], note=options["note"].strip(), override=options["override"]
        )

    def step(self, user: AbstractBaseUser, options: dict[str, Any]) -> tuple[dict[str, Any], str]:
        done = resolve_payout(
            payout_id=options["payout_uuid"],
            resolution=options["to"],
            user=user,
            note=options["note"],
            rail_reference=options["reference"],
            override=options["override"],
            read_statement=fresh_statement,
        )
        suffix = " (override)" if done["override"] else ""
        ref = f" with reference {done['reference']}" if done["reference"] else ""
        return done.as_dict(), (
            f"payout {done['payoutId']} resolved as {done['toState']}{ref}{suffix} by "
            f"{done['operator']}"
        )
