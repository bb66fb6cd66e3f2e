"""One sweep by hand: quarantine every rail intent left unresolved (ROLE=ops)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.core.management.base import BaseCommand

from railproxy.sweep import sweep_unresolved_intents

if TYPE_CHECKING:
    import argparse


class Command(BaseCommand):
    help = (
        "Turn every PENDING rail intent older than the rail timeouts (+ margin) into TIMEOUT and "
        "its payout into RAIL_AMBIGUOUS. Never re-forwards anything."
    )

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "--older-than-ms", type=int, default=None, help="override the age threshold"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        age = options["older_than_ms"]
        swept = sweep_unresolved_intents(older_than_s=None if age is None else age / 1000)
        self.stdout.write(f"swept {swept} unresolved intent(s) to RAIL_AMBIGUOUS")
