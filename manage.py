#!/usr/bin/env python
"""Django's command-line utility; ROLE selects the settings overlay.

Anything that is not the command's own answer ends in one line on stderr and exit 2, never a
traceback: a command this ROLE does not install (an ops command is named before any setting is
read), settings the role cannot load (a database URL that is not one, a missing one), a
database that one of dlock's commands cannot reach (Django's own, `migrate` among them, keep
their traceback).

An operator's command -- under ROLE=ops one of dlock's own, under a server role one of
ROLE_OPERATOR_COMMANDS (the retention purge, django-axes' unlocks) -- prints only its human lines
(or its --json answer) on the terminal; its JSON events go to the events log,
settings.DLOCK_EVENTS_LOG, unless `--log-json` (taken out of the arguments here, any command)
asks for them on stderr.
"""

import sys
from pathlib import Path

from dlock.roles import configure_settings_module


def _fail(line: str) -> None:
    sys.stderr.write(f"dlock: {line}\n")
    raise SystemExit(2)


# settings/ops.py installs every role's app: a command of any of them runs under ROLE=ops.
OPS_APPS = ("lockserver", "payments", "railproxy", "railstub", "executor", "ops")


def _ours(name: str) -> bool:
    """A command of dlock's own apps (not Django's: `migrate` keeps its traceback)."""
    from pathlib import Path

    from django.conf import settings
    from django.core.management import find_commands

    base = Path(settings.BASE_DIR)
    return any(name in find_commands(str(base / app / "management")) for app in OPS_APPS)


def _check_ops_command(role: str, argv: list[str]) -> None:
    """An ops command under another role: name ROLE=ops before any setting is read (only
    settings/ops.py installs the ops app)."""
    from django.core.management import find_commands

    name = argv[1] if len(argv) > 1 else ""
    if role == "ops" or not name or name.startswith("-"):
        return
    if name in find_commands(str(Path(__file__).resolve().parent / "ops" / "management")):
        _fail(f"{name} is not a command of ROLE={role}; run it with ROLE=ops")


# Operator commands documented under a server role (docs/operations.md): the retention purge
# (also ROLE=payments) and django-axes' unlocks (ROLE=admin).
ROLE_OPERATOR_COMMANDS = ("purge_idempotency", "axes_reset", "axes_reset_ip", "axes_reset_username")


def _route_events(role: str, argv: list[str], log_json: bool) -> None:
    """An operator's command (ROLE=ops and one of dlock's, or one of ROLE_OPERATOR_COMMANDS):
    its events to the events log, not the terminal (the role's LOGGING with a standard-library
    FileHandler at the root, which Django's own set-up in execute_from_command_line then
    applies)."""
    name = argv[1] if len(argv) > 1 else ""
    operator = (role == "ops" and _ours(name)) or name in ROLE_OPERATOR_COMMANDS
    if log_json or not operator:
        return
    from django.conf import settings

    target = settings.DLOCK_EVENTS_LOG
    if target == "-":
        return
    try:
        Path(target).parent.mkdir(parents=True, exist_ok=True)
        Path(target).open("a").close()
    except OSError as exc:
        _fail(
            f"cannot write the events log {target} ({exc.strerror}); set DLOCK_EVENTS_LOG to "
            "a writable file or - (stderr), or pass --log-json"
        )
    settings.LOGGING["handlers"]["events_log"] = {
        "class": "logging.FileHandler",
        "filename": target,
        "formatter": "json",
        "encoding": "utf-8",
    }
    settings.LOGGING["root"]["handlers"] = ["events_log"]


def _check_command(role: str, argv: list[str]) -> None:
    """Stop a command this role does not install, naming the role that has it."""
    from django.core.management import get_commands

    name = argv[1] if len(argv) > 1 else ""
    if role == "ops" or not name or name.startswith("-") or name in get_commands():
        return
    if _ours(name):
        _fail(f"{name} is not a command of ROLE={role}; run it with ROLE=ops")


def main() -> None:
    role = configure_settings_module()
    _check_ops_command(role, sys.argv)
    log_json = "--log-json" in sys.argv
    if log_json:
        sys.argv.remove("--log-json")
    from django.core.exceptions import ImproperlyConfigured
    from django.db import DatabaseError

    try:
        import django

        django.setup()
    except ImproperlyConfigured as exc:
        _fail(f"ROLE={role} cannot start: {exc}")
    _check_command(role, sys.argv)
    _route_events(role, sys.argv, log_json)
    from django.core.management import execute_from_command_line

    try:
        execute_from_command_line(sys.argv)
    except DatabaseError as exc:
        if not _ours(sys.argv[1] if len(sys.argv) > 1 else ""):
            raise
        cause = exc.__cause__ or exc
        first = (str(cause).strip().splitlines() or [""])[0]
        _fail(
            f"{sys.argv[1] if len(sys.argv) > 1 else 'manage.py'} could not use a database "
            f"({type(cause).__name__}: {first}); nothing was decided"
        )


if __name__ == "__main__":
    main()
