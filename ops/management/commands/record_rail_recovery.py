"""`manage.py record_rail_recovery (--transfer RAIL_REFERENCE | --all-from-reconcile [--dry-run])
--reason TEXT [--operator NAME] [--json]` (ROLE=ops).

Records a rail transfer no POSTED payout accounts for (a duplicate ack; the booked transfer of a
payout resolved FAILED) as a rail recovery and books it: DEBIT recoverable:rail:<ccy>, CREDIT
settlement:<ccy> (payments/recovery.py). Guarded by the reconciler's evidence and by the rail's
statement read now.

`--all-from-reconcile` is a bad rail day's N duplicates without a loop: it runs the reconciler
now and takes every transfer its findings list under `needsRecovery` (never a payout's own
transfer), oldest first; `--dry-run` prints that plan (one line per transfer: payout, amount,
reference) and changes nothing but the reconciler's findings; without it each transfer is
recorded as if by `--transfer` (guarded and audited one by one; a refused one is reported and
the rest go on).

Exit 0 recorded (or planned); 1 refused (why on stderr, and as JSON with --json; only the
refusal's audit is written; with --all-from-reconcile: at least one was refused); 2 bad
arguments (a reason under 8 characters, --dry-run without --all-from-reconcile: nothing
recorded) or a database could not be reached.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.core.management.base import CommandError

from ops.books import BooksCommand, fresh_statement, plan_text, run_plan
from ops.reconciler import reconcile
from payments.recovery import check_reason, check_record, record_recovery

if TYPE_CHECKING:
    import argparse

    from django.contrib.auth.base_user import AbstractBaseUser


def plan() -> list[dict[str, Any]]:
    """Every transfer the reconciler (run now) says needs a recovery, oldest first."""
    report = reconcile()
    rows = []
    for payout_id, found in report.classifications.items():
        by_ref = {t["railReference"]: t for t in found["transfers"]}
        rows.extend(
            {
                "railReference": ref,
                "payoutId": payout_id,
                "state": found["state"],
                "ownReference": found["ownReference"],
                "amountMinor": by_ref[ref]["amountMinor"],
                "currency": by_ref[ref]["currency"],
                "acceptedAt": by_ref[ref]["acceptedAt"],
            }
            for ref in found["needsRecovery"]
        )
    return sorted(rows, key=lambda r: (r["acceptedAt"], r["railReference"]))


class Command(BooksCommand):
    help = "Record a rail transfer no POSTED payout accounts for as a rail recovery (audited)."

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        which = parser.add_mutually_exclusive_group(required=True)
        which.add_argument("--transfer", help="the rail's reference (statement)")
        which.add_argument(
            "--all-from-reconcile",
            action="store_true",
            help="every transfer the reconciler says needs a recovery",
        )
        parser.add_argument(
            "--dry-run", action="store_true", help="with --all-from-reconcile: print the plan"
        )
        parser.add_argument("--reason", default=None, help="why (at least 8 characters)")
        self.add_operator_arguments(parser)

    def check_input(self, options: dict[str, Any]) -> None:
        if options["dry_run"] and not options["all_from_reconcile"]:
            raise CommandError("--dry-run goes with --all-from-reconcile", returncode=2)
        if not options["dry_run"]:
            if not options["reason"]:
                raise CommandError("--reason is required (at least 8 characters)", returncode=2)
            reason = options["reason"].strip()
            if options["all_from_reconcile"]:
                check_reason(reason)
            else:
                check_record(rail_reference=options["transfer"].strip(), reason=reason)

    def step(self, user: AbstractBaseUser, options: dict[str, Any]) -> tuple[dict[str, Any], str]:
        if options["all_from_reconcile"]:
            return self._all(user, options)
        done = self._record(options["transfer"].strip(), options["reason"], user)
        return done.as_dict(), (
            f"rail recovery recorded for transfer {done['railReference']} (payout "
            f"{done['payoutId']}, {done['amountMinor']} {done['currency']}) by "
            f"{done['operator']}: OPEN"
        )

    def _record(self, ref: str, reason: str, user: AbstractBaseUser) -> Any:
        return record_recovery(
            rail_reference=ref,
            reason=reason,
            user=user,
            statement_read=True,
            statement=fresh_statement(ref),
        )

    def _all(self, user: AbstractBaseUser, options: dict[str, Any]) -> tuple[dict, str]:
        rows = plan()
        if options["dry_run"]:
            return {"ok": True, "dryRun": True, "plan": rows}, plan_text(
                f"plan: {len(rows)} transfer(s) need a rail recovery (nothing recorded)",
                [
                    f"{r['railReference']}  payout {r['payoutId']} ({r['state']}, own "
                    f"{r['ownReference'] or '-'})  {r['amountMinor']} {r['currency']}"
                    for r in rows
                ],
                "apply: ROLE=ops manage.py record_rail_recovery --all-from-reconcile "
                '--reason "…" --operator YOUR_ADMIN_USER',
            )
        return run_plan(
            self,
            rows,
            lambda row: {
                "recoveryId": self._record(row["railReference"], options["reason"], user)[
                    "recoveryId"
                ]
            },
            done_key="recorded",
            done_text=lambda _: "OPEN",
            summary=f"recorded {{done}} of {{total}} rail recoveries by {user.get_username()}",
            next_step="next: ROLE=ops manage.py reconcile",
            as_json=options["json"],
        )
