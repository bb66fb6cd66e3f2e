"""`manage.py close_rail_recovery (--transfer RAIL_REFERENCE (--recovered --reference REF |
--written-off --reason TEXT) | --all-from-file PLAN [--dry-run]) [--operator NAME] [--json]`
(ROLE=ops).

Closes an OPEN rail recovery (payments/recovery.py): RECOVERED books the money back (DEBIT
settlement, CREDIT recoverable) with the rail's reference of the return; WRITTEN_OFF moves it to
the loss account (DEBIT loss:rail:<ccy>, CREDIT recoverable) with a reason.

`--all-from-file PLAN` closes a bad rail day's recoveries without a loop. PLAN is a text file,
one recovery a line, blank lines and `#` comments ignored:

    TRANSFER  RECOVERED    RETURN_REFERENCE  [note …]
    TRANSFER  WRITTEN_OFF  reason …

(the transfer's rail reference, the outcome, then the rail's reference of the money that came
back, or the write-off's reason: the rest of the line). The whole file is checked before any
recovery is read: a malformed line, a transfer named twice, or a line that breaks a flag's
rules (no return reference, a reason under 8 characters) is exit 2 naming its line, and so is a
transfer with no recovery; nothing is closed then. `--dry-run` prints the plan (one line per
recovery: payout, amount, its status now) and changes nothing; without it each line is closed
as if by `--transfer` (guarded and audited one by one; a refused one, say closed already, is
reported and the rest go on). `list_rail_recoveries` prints the OPEN ones to start a PLAN from.

Exit 0 closed (or planned); 1 refused (a recovery closed already, an unknown operator: why on
stderr, and as JSON with --json; the refusal is recorded; with --all-from-file: at least one was
refused); 2 bad arguments (a --recovered without --reference, a --reference with --written-off,
a short reason, a transfer with no recovery, a bad PLAN: nothing recorded) or a database could
not be reached.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from django.core.management.base import CommandError

from dlock.dbrouter import alias_for
from dlock.errors import ApiError
from ops.books import BooksCommand, plan_text, run_plan
from payments.models import RailRecovery
from payments.recovery import CLOSE_OUTCOMES, check_close, close_recovery

if TYPE_CHECKING:
    import argparse

    from django.contrib.auth.base_user import AbstractBaseUser


def read_plan(path: str) -> list[dict[str, Any]]:
    """The PLAN file's steps, each checked by the close's own rules (module docstring);
    CommandError (exit 2) naming the first bad line."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise CommandError(f"--all-from-file {path}: cannot read it ({exc})", returncode=2) from exc
    rows: list[dict[str, Any]] = []
    seen: dict[str, int] = {}
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        parts = line.split(maxsplit=2)
        where = f"{path}:{number}"
        if len(parts) < 3 or parts[1] not in CLOSE_OUTCOMES:
            raise CommandError(
                f"{where}: expected `TRANSFER RECOVERED RETURN_REFERENCE [note]` or "
                f"`TRANSFER WRITTEN_OFF reason`, got {line[:80]!r}",
                returncode=2,
            )
        transfer, outcome, rest = parts
        if transfer in seen:
            raise CommandError(
                f"{where}: transfer {transfer} is already planned on line {seen[transfer]}",
                returncode=2,
            )
        seen[transfer] = number
        if outcome == "RECOVERED":
            reference, _, note = rest.partition(" ")
            row = {"railReference": transfer, "outcome": outcome, "reference": reference}
            row["reason"] = note.strip() or None
        else:
            row = {"railReference": transfer, "outcome": outcome, "reference": None}
            row["reason"] = rest.strip()
        try:
            check_close(outcome=outcome, reference=row["reference"], reason=row["reason"] or "")
        except ApiError as exc:
            raise CommandError(f"{where}: {exc.message}", returncode=2) from None
        rows.append({**row, "line": number})
    if not rows:
        raise CommandError(f"--all-from-file {path}: no recovery to close", returncode=2)
    return rows


class Command(BooksCommand):
    help = "Close open rail recoveries as RECOVERED or WRITTEN_OFF (audited), one or a PLAN."

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        which = parser.add_mutually_exclusive_group(required=True)
        which.add_argument("--transfer", help="the recovered transfer's reference")
        which.add_argument(
            "--all-from-file",
            metavar="PLAN",
            help="close every recovery a PLAN file lists (format: the command's help)",
        )
        outcome = parser.add_mutually_exclusive_group()
        outcome.add_argument("--recovered", action="store_true", help="the money came back")
        outcome.add_argument("--written-off", action="store_true", help="it will not come back")
        parser.add_argument("--reference", default=None, help="RECOVERED: the rail's reference")
        parser.add_argument("--reason", default=None, help="WRITTEN_OFF: why (≥ 8 characters)")
        parser.add_argument(
            "--dry-run", action="store_true", help="with --all-from-file: print the plan"
        )
        self.add_operator_arguments(parser)

    def check_input(self, options: dict[str, Any]) -> None:
        one = (options["recovered"], options["written_off"], options["reference"])
        if options["all_from_file"]:
            if any(one) or options["reason"]:
                raise CommandError(
                    "--all-from-file takes each outcome from its PLAN: no --recovered, "
                    "--written-off, --reference or --reason",
                    returncode=2,
                )
            path = options["all_from_file"]
            options["plan"] = _existing(read_plan(path), path)
            return
        if options["dry_run"]:
            raise CommandError("--dry-run goes with --all-from-file", returncode=2)
        if not (options["recovered"] or options["written_off"]):
            raise CommandError("one of --recovered or --written-off is required", returncode=2)
        check_close(
            outcome=_outcome(options),
            reference=(options["reference"] or "").strip() or None,
            reason=(options["reason"] or "").strip(),
        )

    def step(self, user: AbstractBaseUser, options: dict[str, Any]) -> tuple[dict[str, Any], str]:
        if options["all_from_file"]:
            return self._all(user, options)
        done = close_recovery(
            user=user,
            rail_reference=options["transfer"],
            outcome=_outcome(options),
            reference=options["reference"],
            reason=options["reason"],
        )
        return done.as_dict(), (
            f"rail recovery of transfer {done['railReference']} closed {done['status']} by "
            f"{done['operator']}"
        )

    def _all(self, user: AbstractBaseUser, options: dict[str, Any]) -> tuple[dict, str]:
        rows = options["plan"]
        if options["dry_run"]:
            return {"ok": True, "dryRun": True, "plan": rows}, plan_text(
                f"plan: close {len(rows)} rail recovery(ies) (nothing closed)",
                [
                    f"{r['railReference']}  {r['outcome']}"
                    + (f" {r['reference']}" if r["reference"] else "")
                    + f"  payout {r['payoutId'] or '-'}  {r['amountMinor']} {r['currency']}"
                    + ("" if r["status"] == "OPEN" else f"  (already {r['status']}: refused)")
                    for r in rows
                ],
                f"apply: ROLE=ops manage.py close_rail_recovery --all-from-file "
                f"{options['all_from_file']} --operator YOUR_ADMIN_USER",
            )
        return run_plan(
            self,
            rows,
            lambda row: {
                "status": close_recovery(
                    user=user,
                    rail_reference=row["railReference"],
                    outcome=row["outcome"],
                    reference=row["reference"],
                    reason=row["reason"],
                )["status"]
            },
            done_key="closed",
            done_text=lambda r: r["status"],
            summary=f"closed {{done}} of {{total}} rail recoveries by {user.get_username()}",
            next_step="next: ROLE=ops manage.py reconcile",
            as_json=options["json"],
        )


def _outcome(options: dict[str, Any]) -> str:
    return "RECOVERED" if options["recovered"] else "WRITTEN_OFF"


def _existing(rows: list[dict[str, Any]], path: str) -> list[dict[str, Any]]:
    """Each planned step with its recovery as it is now; exit 2 when a line of the PLAN at
    `path` names a transfer with no recovery (the plan names nothing there: nothing is closed)."""
    found = {
        r.rail_reference: r
        for r in RailRecovery.objects.using(alias_for("payments")).filter(
            rail_reference__in=[row["railReference"] for row in rows]
        )
    }
    for row in rows:
        recovery = found.get(row["railReference"])
        if recovery is None:
            raise CommandError(
                f"{path}:{row['line']}: no rail recovery for transfer {row['railReference']!r} "
                "(list_rail_recoveries shows them); nothing closed",
                returncode=2,
            )
        row.update(
            payoutId=str(recovery.payout_id) if recovery.payout_id else None,
            amountMinor=int(recovery.amount_minor),
            currency=recovery.currency,
            status=recovery.status,
        )
    return rows
