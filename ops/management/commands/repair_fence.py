"""`manage.py repair_fence --account ID --reason TEXT [--operator NAME] [--json]` (ROLE=ops).

Lowers the account's fence and the rail proxy's high-water mark for `payout:{ID}` to the highest
token the lock server has issued (ops.repair), so every future grant passes and no past token
can. Exit 0 repaired (audit row in `fence_repair`, WARNING `fence_repaired` event); 1 refused
(healthy account, unknown account, no reason): nothing changed; 2 a database or the lock
server's store could not be read: nothing changed.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from django.core.management.base import BaseCommand, CommandError
from django.db import DatabaseError
from django.utils.connection import ConnectionDoesNotExist

from lockserver.etcd_client import EtcdError
from ops.books import os_user
from ops.repair import RepairRefused, repair_fence

if TYPE_CHECKING:
    import argparse


class Command(BaseCommand):
    help = "Lower a fence no legitimate token can pass to the highest token issued (audited)."

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--account", required=True, help="the account id")
        parser.add_argument("--reason", required=True, help="why (at least 8 characters)")
        parser.add_argument("--operator", default=None, help="who (default: the OS user)")
        parser.add_argument("--json", action="store_true", help="print the repair as JSON")

    def handle(self, *args: Any, **options: Any) -> None:
        operator = options["operator"] or os_user()
        try:
            repair = repair_fence(
                account_id=options["account"], operator=operator, reason=options["reason"]
            )
        except ConnectionDoesNotExist:
            raise CommandError(
                "repair_fence needs the lock server's store: set LOCK_DATABASE_URL "
                "(LOCK_BACKEND=pg) or the etcd endpoints (LOCK_BACKEND=etcd); nothing changed",
                returncode=2,
            ) from None
        except RepairRefused as exc:
            raise CommandError(f"repair_fence refused: {exc}", returncode=1) from exc
        except (DatabaseError, EtcdError) as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            raise CommandError(
                f"repair_fence could not read the stores ({type(exc).__name__}: {first}); "
                "nothing changed",
                returncode=2,
            ) from exc
        if options["json"]:
            self.stdout.write(json.dumps(repair.as_dict(), sort_keys=True))
            return
        self.stdout.write(
            f"repaired {repair.account_id}: fence {repair.old_fence} → {repair.new_fence}, "
            f"rail high-water {repair.old_rail_high_water} → {repair.new_rail_high_water} "
            f"(highest issued token {repair.issued.token}, {repair.issued.backend}; "
            f"audit #{repair.repair_id} by {repair.operator})"
        )
