"""`manage.py revoke_lock KEY --operator NAME --reason TEXT [--expected-token N] [--no-push]`.

Calls L8 and prints the outcome. For `payout:{accountId}` keys, with paydb reachable, pushes the
new token floor to the account fence and the rail high-water mark (ops.revoke) so the
evicted holder is fenced out immediately. Exit 0 revoked, 1 refused by the lock server (a
verdict), 2 the tool could not finish (the ops commands' convention for anything that is not a
verdict): revoked but the push failed, or no answer from the lock server (not reached: nothing
revoked; or the request was sent and the answer lost: outcome unknown, check L7).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError
from django.db import DatabaseError

from dlock.client import DlockError, LockClient, ServiceUnreachable
from dlock.errors import ApiError
from ops.revoke import PushResult, protected_account, push_floor

if TYPE_CHECKING:
    import argparse


class Command(BaseCommand):
    help = "Revoke a lock (L8) and fence its evicted holder out at the resources it protects."

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("key")
        parser.add_argument("--operator", required=True)
        parser.add_argument("--reason", required=True, help="at least 8 characters")
        parser.add_argument("--expected-token", type=int, default=None)
        parser.add_argument("--no-push", action="store_true", help="only call L8")
        parser.add_argument("--json", action="store_true")

    def handle(self, *args: Any, **options: Any) -> None:
        key = options["key"]
        client = LockClient(
            settings.LOCK_SERVER_URL, owner_id=f"operator:{options['operator']}"[:64]
        )
        try:
            outcome = client.revoke(
                key,
                operator=options["operator"],
                reason=options["reason"],
                expected_token=options["expected_token"],
            )
        except ServiceUnreachable as exc:
            outcome_known = not exc.sent
            self._emit(
                options,
                {
                    "revoked": False if outcome_known else None,
                    "key": key,
                    "code": None,
                    "message": exc.message,
                    "outcomeKnown": outcome_known,
                },
            )
            what = (
                "lock server not reached; nothing was revoked"
                if outcome_known
                else "request sent but no answer: the revoke may have happened; check "
                f"GET /v1/locks/{key} before retrying"
            )
            raise CommandError(f"{what} ({exc.message})", returncode=2) from exc
        except DlockError as exc:
            self._emit(
                options,
                {
                    "revoked": False,
                    "key": key,
                    "code": exc.code,
                    "message": exc.message,
                    "details": exc.details,
                },
            )
            raise CommandError(f"revoke refused: {exc}", returncode=1) from exc
        result: dict = {"revoked": True, "key": key, **outcome}
        account_id = protected_account(key)
        push = PushResult(account_id)
        code = 0
        if account_id is None:
            push.skipped = "key protects no known resource"
        elif options["no_push"]:
            push.skipped = "--no-push"
        else:
            try:
                push = push_floor(account_id=account_id, floor=int(outcome["newTokenFloor"]))
            except ApiError as exc:
                push.skipped = f"{exc.code}: {exc.message}"
            except DatabaseError as exc:
                push.skipped = f"paydb unreachable: {exc.__class__.__name__}"
                code = 2
        result["push"] = push.as_dict()
        self._emit(options, result)
        if code:
            raise CommandError(
                "revoked at the lock server, but the fence push failed", returncode=code
            )

    def _emit(self, options: dict[str, Any], result: dict) -> None:
        if options["json"]:
            self.stdout.write(json.dumps(result, sort_keys=True))
            return
        if result.get("revoked") is None:
            self.stdout.write(f"outcome UNKNOWN for {result['key']}: {result['message']}")
            return
        if not result.get("revoked"):
            self.stdout.write(f"NOT revoked {result['key']}: {result['code']} {result['message']}")
            return
        self.stdout.write(
            f"revoked {result['key']}: token {result.get('revokedToken')} "
            f"→ floor {result.get('newTokenFloor')} (revocation {result.get('revocationId')})"
        )
        push = result["push"]
        if push["skipped"]:
            self.stdout.write(f"  push skipped: {push['skipped']}")
        else:
            self.stdout.write(
                f"  pushed: account {push['accountId']} fence={push['accountFence']} "
                f"rail high-water={push['railHighWater']}"
            )
