"""What the books commands (`resolve_payout`, `record_rail_recovery`, `close_rail_recovery`)
share: who the operator is, a fresh read of the rail's statement, and how an answer is printed.

The operator is a Django staff user of paydb (the admin's user table), so every command step
leaves the same LogEntry an admin action does. `--operator` names an existing staff user (an
unknown name is refused). Without it, the OS user's own staff account if there is one, else the
command-line account `cli:<OS user>` (created on first use, staff, with no usable password: it
can never log in to the admin), so a script run as the issue spells it is attributed to the OS
user who ran it.
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


CLI_PREFIX = "cli:"


def operator_user(name: str | None) -> AbstractBaseUser:
    """The active staff user called `name`, or CommandError (exit 1); without a name, the OS
    user's staff account or its command-line account (see the module's docstring)."""
    users = get_user_model()._default_manager.db_manager(alias_for("payments"))
    wanted = (name or "").strip()
    if not wanted:
        who = os_user() or "unknown"
        own = users.filter(username=who, is_active=True, is_staff=True).first()
        if own is not None:
            return own
        user, created = users.get_or_create(
            username=f"{CLI_PREFIX}{who}"[:150], defaults={"is_staff": True, "is_active": True}
        )
        if created:
            user.set_unusable_password()
            user.save(update_fields=["password"])
        if user.is_active and user.is_staff:
            return user
        wanted = user.get_username()  # deactivated by an administrator: refused below
    user = users.filter(username=wanted, is_active=True, is_staff=True).first()
    if user is None:
        raise CommandError(
            f"refused: no active staff user {wanted!r} (pass --operator with your admin user "
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
