"""manage.py purge_idempotency: idempotency records past the retention window, of payouts that
have ended, deleted (payments.retention). ROLE=ops or ROLE=payments; the k8s CronJob
`idempotency-purge` (k8s/idempotency-purge.yaml) runs it daily.

Steps: check the window (at least 1 day) → delete in batches → one human line, one
`idempotency_purged` event.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from dlock.logs import log_event
from payments.retention import purge_idempotency_records

if TYPE_CHECKING:
    import argparse

MIN_DAYS = 1
MAX_DAYS = 36_500  # a century: any longer keeps everything anyway (and overflows make_interval)


class Command(BaseCommand):
    help = (
        "Delete idempotency records older than the retention window whose payout has ended "
        "(POSTED, FAILED, ABANDONED); a quarantined or live payout keeps its records."
    )

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "--older-than-days",
            type=int,
            default=None,
            help=f"the window (default IDEMPOTENCY_RETENTION_DAYS; {MIN_DAYS} to {MAX_DAYS})",
        )
        parser.add_argument("--dry-run", action="store_true", help="count, delete nothing")

    def handle(self, *args: Any, **options: Any) -> None:
        if settings.ROLE not in ("ops", "payments"):
            raise CommandError(
                f"purge_idempotency runs under ROLE=ops or ROLE=payments, not ROLE={settings.ROLE}",
                returncode=2,
            )
        days = options["older_than_days"]
        if days is None:
            days = settings.IDEMPOTENCY_RETENTION_DAYS
        if not MIN_DAYS <= days <= MAX_DAYS:
            raise CommandError(
                f"--older-than-days must be {MIN_DAYS} to {MAX_DAYS}, got {days}", returncode=2
            )
        count = purge_idempotency_records(older_than_days=days, dry_run=options["dry_run"])
        verb = "would delete" if options["dry_run"] else "deleted"
        log_event("idempotency_purged", count=count, olderThanDays=days, dryRun=options["dry_run"])
        self.stdout.write(f"purge_idempotency: {verb} {count} record(s) older than {days} day(s)")
