"""`manage.py list_rail_recoveries [--status OPEN|RECOVERED|WRITTEN_OFF] [--json]` (ROLE=ops).

Every rail recovery (payments/recovery.py), OPEN first and oldest first within a status, with its
age (now − recorded for an open one; recorded → closed for a closed one), payout, amount and who
recorded / closed it; then the next command for each open one. Read-only. Exit 0; 2 bad
arguments or paydb could not be reached.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from django.core.management.base import BaseCommand
from django.utils import timezone

from dlock.dbrouter import alias_for
from dlock.timefmt import rfc3339_ms
from payments.models import RailRecovery

if TYPE_CHECKING:
    import argparse
    import datetime as dt

ORDER = {"OPEN": 0, "RECOVERED": 1, "WRITTEN_OFF": 2}


def age(seconds: float) -> str:
    seconds = int(seconds)
    days, rest = divmod(seconds, 86_400)
    hours, rest = divmod(rest, 3_600)
    return f"{days}d{hours:02d}h" if days else f"{hours}h{rest // 60:02d}m"


def _seconds(start: dt.datetime, end: dt.datetime) -> float:
    return max(0.0, (end - start).total_seconds())


class Command(BaseCommand):
    help = "List rail recoveries: open first, oldest first, with their age."

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--status", choices=list(ORDER), default=None)
        parser.add_argument("--json", action="store_true", help="one JSON document on stdout")

    def handle(self, *args: Any, **options: Any) -> None:
        rows = RailRecovery.objects.using(alias_for("payments")).all()
        if options["status"]:
            rows = rows.filter(status=options["status"])
        now = timezone.now()
        found = sorted(rows, key=lambda r: (ORDER[r.status], r.recorded_at, r.rail_reference))
        items = [
            {
                "railReference": r.rail_reference,
                "status": r.status,
                "payoutId": str(r.payout_id) if r.payout_id else None,
                "amountMinor": int(r.amount_minor),
                "currency": r.currency,
                "recordedAt": rfc3339_ms(r.recorded_at),
                "recordedBy": r.recorded_by,
                "closedAt": rfc3339_ms(r.closed_at),
                "closedBy": r.closed_by,
                "ageSeconds": int(_seconds(r.recorded_at, r.closed_at or now)),
            }
            for r in found
        ]
        if options["json"]:
            self.stdout.write(json.dumps({"recoveries": items}, indent=2, sort_keys=True))
            return
        opened = sum(1 for i in items if i["status"] == "OPEN")
        lines = [f"{len(items)} rail recoveries, {opened} OPEN"]
        lines.extend(
            f"  {i['status']:<11} {age(i['ageSeconds']):>7}  {i['railReference']:<26} "
            f"payout {i['payoutId'] or '-'}  {i['amountMinor']} {i['currency']}  "
            f"recorded by {i['recordedBy']}"
            + (f", closed by {i['closedBy']}" if i["closedBy"] else "")
            for i in items
        )
        if opened:
            lines.append(
                "next, per OPEN one: ROLE=ops manage.py close_rail_recovery --transfer REF "
                "(--recovered --reference RETURN_REF | --written-off --reason TEXT) "
                "--operator YOUR_ADMIN_USER"
            )
        self.stdout.write("\n".join(lines))
