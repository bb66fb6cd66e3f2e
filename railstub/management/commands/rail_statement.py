"""Export the rail's statement (rail_transfer): what the rail actually paid, the ground truth."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from django.core.management.base import BaseCommand

from dlock.timefmt import rfc3339_ms
from railstub import services

if TYPE_CHECKING:
    import argparse


class Command(BaseCommand):
    help = "Print the rail stub's statement: every booked transfer (ROLE=ops)."

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--json", action="store_true", help="one JSON document on stdout")
        parser.add_argument("--client-ref", help="only transfers for this clientRef")

    def handle(self, *args: Any, **options: Any) -> None:
        rows = services.statement(client_ref=options.get("client_ref"))
        transfers = [
            {
                "railReference": row.rail_reference,
                "clientRef": row.client_ref,
                "amountMinor": row.amount_minor,
                "currency": row.currency,
                "acceptedAt": rfc3339_ms(row.accepted_at),
                "duplicateOf": row.duplicate_of,
            }
            for row in rows
        ]
        per_ref: dict[str, int] = {}
        for row in rows:
            per_ref[row.client_ref] = per_ref.get(row.client_ref, 0) + 1
        totals: dict[str, int] = {}
        for row in rows:
            totals[row.currency] = totals.get(row.currency, 0) + row.amount_minor
        summary = {
            "transferCount": len(rows),
            "clientRefCount": len(per_ref),
            "clientRefsPaidMoreThanOnce": sorted(ref for ref, n in per_ref.items() if n > 1),
            "totalMinorByCurrency": totals,
        }
        if options["json"]:
            self.stdout.write(json.dumps({"transfers": transfers, "summary": summary}, indent=2))
            return
        header = f"{'railReference':<26} {'clientRef':<40} {'amount':>12} cur acceptedAt"
        self.stdout.write(header)
        for t in transfers:
            dup = f"  duplicate of {t['duplicateOf']}" if t["duplicateOf"] else ""
            self.stdout.write(
                f"{t['railReference']:<26} {t['clientRef']:<40} {t['amountMinor']:>12} "
                f"{t['currency']} {t['acceptedAt']}{dup}"
            )
        self.stdout.write(
            f"{summary['transferCount']} transfers for {summary['clientRefCount']} clientRefs; "
            f"{len(summary['clientRefsPaidMoreThanOnce'])} clientRefs paid more than once; "
            f"totals {totals}"
        )
