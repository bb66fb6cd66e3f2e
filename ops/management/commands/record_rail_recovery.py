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
arguments or a database could not be reached.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.core.management.base import CommandError

from dlock.errors import ApiError
from ops.books import BooksCommand, answer, fresh_statement
from ops.reconciler import reconcile
from payments.recovery import REASON_MIN, record_recovery

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

    def handle(self, *args: Any, **options: Any) -> None:
        if options["dry_run"] and not options["all_from_reconcile"]:
            raise CommandError("--dry-run goes with --all-from-reconcile", returncode=2)
        if not options["dry_run"] and not options["reason"]:
            raise CommandError("--reason is required (at least 8 characters)", returncode=2)
        super().handle(*args, **options)

    def step(self, user: AbstractBaseUser, options: dict[str, Any]) -> tuple[dict[str, Any], str]:
        if options["all_from_reconcile"]:
            return self._all(user, options)
        step = record_recovery(
            rail_reference=options["transfer"],
            reason=options["reason"],
            user=user,
            statement_read=True,
            statement=fresh_statement(options["transfer"].strip()),
        )
        return step.as_dict(), (
            f"rail recovery recorded for transfer {step.rail_reference} (payout "
            f"{step.payout_id}, {step.amount_minor} {step.currency}) by {step.operator}: OPEN"
        )

    def _all(self, user: AbstractBaseUser, options: dict[str, Any]) -> tuple[dict, str]:
        rows = plan()
        lines = [
            f"{n}. {r['railReference']}  payout {r['payoutId']} ({r['state']}, own "
            f"{r['ownReference'] or '-'})  {r['amountMinor']} {r['currency']}"
            for n, r in enumerate(rows, 1)
        ]
        if options["dry_run"]:
            text = "\n".join(
                [
                    f"plan: {len(rows)} transfer(s) need a rail recovery (nothing recorded)",
                    *lines,
                    "apply: ROLE=ops manage.py record_rail_recovery --all-from-reconcile "
                    '--reason "…" --operator YOUR_ADMIN_USER',
                ]
            )
            return {"ok": True, "dryRun": True, "plan": rows}, text
        reason = (options["reason"] or "").strip()
        if len(reason) < REASON_MIN:
            raise CommandError(f"--reason needs at least {REASON_MIN} characters", returncode=2)
        results, refused = [], 0
        for row in rows:
            ref = row["railReference"]
            try:
                step = record_recovery(
                    rail_reference=ref,
                    reason=reason,
                    user=user,
                    statement_read=True,
                    statement=fresh_statement(ref),
                )
                results.append({**row, "recorded": True, "recoveryId": step.recovery_id})
            except ApiError as exc:
                refused += 1
                why = str((exc.details or {}).get("reason") or exc.message)
                results.append({**row, "recorded": False, "reason": why})
        body = {"ok": not refused, "dryRun": False, "results": results}
        text = "\n".join(
            [
                f"recorded {len(rows) - refused} of {len(rows)} rail recoveries by "
                f"{user.get_username()}",
                *(
                    f"  {r['railReference']}: "
                    + ("OPEN" if r["recorded"] else f"refused: {r['reason']}")
                    for r in results
                ),
                "next: ROLE=ops manage.py reconcile",
            ]
        )
        if refused:
            answer(self, body, text, as_json=options["json"])
            raise _Partial(refused, len(rows))
        return body, text


class _Partial(CommandError):
    def __init__(self, refused: int, total: int) -> None:
        super().__init__(f"refused: {refused} of {total} transfers (see above)", returncode=1)
