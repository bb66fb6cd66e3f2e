"""What the books commands (`resolve_payout`, `record_rail_recovery`, `close_rail_recovery`)
share: who the operator is, a fresh read of the rail's statement, and how an answer is printed.

The operator is a Django staff user of paydb (the admin's user table), so every command step
leaves the same LogEntry an admin action does; `--operator` names it (default: the OS user).
"""

from __future__ import annotations

import getpass
import json
from typing import TYPE_CHECKING, Any

from django.contrib.auth import get_user_model
from django.core.management.base import CommandError

from dlock.dbrouter import alias_for
from dlock.errors import ApiError
from payments.recovery import StatementTransfer
from railstub.selectors import statement_transfer

if TYPE_CHECKING:
    from django.contrib.auth.base_user import AbstractBaseUser
    from django.core.management.base import BaseCommand


def os_user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # no passwd entry (an arbitrary container uid)
        return ""


def operator_user(name: str | None) -> AbstractBaseUser:
    """The active staff user called `name` (default: the OS user), or CommandError (exit 1)."""
    name = (name or os_user()).strip()
    user = (
        get_user_model()
        ._default_manager.db_manager(alias_for("payments"))
        .filter(username=name, is_active=True, is_staff=True)
        .first()
    )
    if user is None:
        raise CommandError(
            f"refused: no active staff user {name!r} (pass --operator with your admin user "
            "name; the audit records it)",
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


def refuse(command: BaseCommand, exc: ApiError, *, as_json: bool) -> CommandError:
    """Exit 1 with the reason: printed as JSON on stdout with --json, always on stderr."""
    reason = str((exc.details or {}).get("reason") or exc.message)
    if as_json:
        command.stdout.write(
            json.dumps({"ok": False, "code": exc.code.value, "reason": reason}, sort_keys=True)
        )
    return CommandError(f"refused: {reason}", returncode=1)


def answer(command: BaseCommand, body: dict[str, Any], text: str, *, as_json: bool) -> None:
    command.stdout.write(json.dumps(body, sort_keys=True) if as_json else text)
