"""What the books commands (`resolve_payout`, `reverse_payout`, `record_rail_recovery`,
`close_rail_recovery`) share: who the operator is, a fresh read of the rail's statement, and
how an answer and each exit code are printed.

The operator is a Django staff user of paydb (the admin's user table), so every command step
leaves the same LogEntry an admin action does. `--operator` names an active staff user; left
out, the OS user's name is used. A name paydb does not know as an active staff user is refused
(exit 1), and the refusal is recorded (`operator_refusal` row, `operator_refused` event): no
account is ever created on the fly.
"""

from __future__ import annotations

import getpass
import json
import uuid
from typing import TYPE_CHECKING, Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError
from django.db import DatabaseError

from dlock.dbrouter import alias_for
from dlock.errors import ApiError
from payments import audit
from payments.operator_action import Refused
from payments.recovery import StatementTransfer
from railstub.selectors import statement_transfer

if TYPE_CHECKING:
    from collections.abc import Callable

    from django.contrib.auth.base_user import AbstractBaseUser


def os_user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # no passwd entry (an arbitrary container uid)
        return ""


def operator_user(name: str | None, *, action: str) -> AbstractBaseUser:
    """The active staff user called `name` (default: the OS user's name), or CommandError
    (exit 1) after recording the refusal (payments.audit: an `operator_refusal` row)."""
    users = get_user_model()._default_manager.db_manager(alias_for("payments"))
    wanted = (name or "").strip() or os_user()
    user = users.filter(username=wanted, is_active=True, is_staff=True).first() if wanted else None
    if user is None:
        reason = (
            f"no active staff user {wanted!r} in paydb"
            if wanted
            else "no operator: pass --operator with your admin user name"
        )
        audit.refused(
            "operator_refused",
            operator=wanted or "-",
            user=None,
            action=action,
            reason=reason,
            object_type="operator",
            object_id=wanted or "-",
        )
        raise CommandError(
            f"refused: {reason} (pass --operator with your admin user name; "
            "ROLE=admin manage.py createsuperuser makes one)",
            returncode=1,
        )
    return user


def fresh_statement(rail_reference: str) -> StatementTransfer | None:
    """The rail's statement row for this reference, read now (raildb, ops role)."""
    row = statement_transfer(rail_reference=rail_reference)
    if row is None:
        return None
    return StatementTransfer(
        rail_reference=row["railReference"],
        client_ref=row["clientRef"],
        amount_minor=row["amountMinor"],
        currency=row["currency"],
    )


def refuse(command: BaseCommand, exc: Refused, *, as_json: bool) -> CommandError:
    """Exit 1 with the reason: printed as JSON on stdout with --json, always on stderr."""
    if as_json:
        command.stdout.write(
            json.dumps({"ok": False, "code": exc.code.value, "reason": exc.reason}, sort_keys=True)
        )
    return CommandError(exc.message, returncode=1)


def bad_input(exc: ApiError) -> CommandError:
    """Exit 2, one line: the input broke a flag's rules or named nothing; nothing recorded."""
    return CommandError(exc.message, returncode=2)


def answer(command: BaseCommand, body: dict[str, Any], text: str, *, as_json: bool) -> None:
    command.stdout.write(json.dumps(body, sort_keys=True) if as_json else text)


class BooksCommand(BaseCommand):
    """An ops books command: `check_input(options)` applies the input's own rules, `step(user,
    options)` does the work; this maps the outcomes to exit codes, one line each:

      0 done;
      1 refused on a real object (the operator, the payout, the transfer): recorded;
      2 the input broke a flag's rules or named nothing (nothing recorded), or the tool could
        not run (a database could not be reached).

    The input's rules come before the operator is looked up, so a mistyped flag leaves no
    record even for an unknown operator."""

    def add_operator_arguments(self, parser: Any) -> None:
        parser.add_argument("--operator", default=None, help="admin user name (default: OS user)")
        parser.add_argument("--json", action="store_true", help="print the outcome as JSON")

    def check_input(self, options: dict[str, Any]) -> None:
        """The input's own rules, before any row is read: raise ApiError (exit 2)."""

    def step(self, user: AbstractBaseUser, options: dict[str, Any]) -> tuple[dict[str, Any], str]:
        raise NotImplementedError

    def handle(self, *args: Any, **options: Any) -> None:
        as_json = options["json"]
        name = self.__class__.__module__.rsplit(".", 1)[-1]
        try:
            self.check_input(options)
            user = operator_user(options["operator"], action=name)
            body, text = self.step(user, options)
        except Refused as exc:
            raise refuse(self, exc, as_json=as_json) from exc
        except ApiError as exc:
            raise bad_input(exc) from exc
        except DatabaseError as exc:
            raise CommandError(
                f"{name} could not reach a database ({type(exc).__name__}); nothing changed",
                returncode=2,
            ) from exc
        answer(self, body, text, as_json=as_json)


class PayoutCommand(BooksCommand):
    """A books command on one payout: its first argument is the payout id (a uuid, else exit 2
    before anything is read), given to `step` as options["payout_uuid"]; the command's own
    arguments come from `add_payout_arguments`, then --operator and --json."""

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("payout_id", help="the payout id (uuid)")
        self.add_payout_arguments(parser)
        self.add_operator_arguments(parser)

    def add_payout_arguments(self, parser: Any) -> None:
        raise NotImplementedError

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            options["payout_uuid"] = uuid.UUID(options["payout_id"])
        except ValueError:
            raise CommandError(
                f"{options['payout_id']!r} is not a payout id (uuid)", returncode=2
            ) from None
        super().handle(*args, **options)


class PartlyRefused(CommandError):
    """A reviewed plan ran with some steps refused (each reported and recorded): exit 1."""

    def __init__(self, refused: int, total: int) -> None:
        super().__init__(f"refused: {refused} of {total} steps (see above)", returncode=1)


def run_plan(
    command: BaseCommand,
    rows: list[dict[str, Any]],
    apply_one: Callable[[dict[str, Any]], dict[str, Any]],
    *,
    done_key: str,
    done_text: Callable[[dict[str, Any]], str],
    summary: str,
    next_step: str,
    as_json: bool,
) -> tuple[dict[str, Any], str]:
    """Apply a reviewed plan, each row one guarded, audited step (`apply_one(row)` → the fields
    it adds, or Refused): a refused row is reported and the rest go on, and the command then
    exits 1 (PartlyRefused) after printing what happened. `record_rail_recovery
    --all-from-reconcile` and `close_rail_recovery --all-from-file` both run through here."""
    results, refused = [], 0
    for row in rows:
        try:
            results.append({**row, done_key: True, **apply_one(row)})
        except Refused as exc:
            refused += 1
            results.append({**row, done_key: False, "reason": exc.reason})
    body = {"ok": not refused, "dryRun": False, "results": results}
    text = "\n".join(
        [
            summary.format(done=len(rows) - refused, total=len(rows)),
            *(
                f"  {r['railReference']}: "
                + (done_text(r) if r[done_key] else f"refused: {r['reason']}")
                for r in results
            ),
            next_step,
        ]
    )
    if refused:
        answer(command, body, text, as_json=as_json)
        raise PartlyRefused(refused, len(rows))
    return body, text


def plan_text(header: str, lines: list[str], apply_line: str) -> str:
    """A dry run's printed plan: what would be done, one numbered line per step, and the
    command that applies it."""
    return "\n".join([header, *(f"{n}. {line}" for n, line in enumerate(lines, 1)), apply_line])
