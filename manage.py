#!/usr/bin/env python
"""Django's command-line utility; ROLE selects the settings overlay.

Anything that is not the command's own answer ends in one line on stderr and exit 2, never a
traceback: settings the role cannot load (a database URL that is not one, a missing one), a
command this ROLE does not install, a database that one of dlock's commands cannot reach
(Django's own, `migrate` among them, keep their traceback).
"""

import sys

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
    from django.core.exceptions import ImproperlyConfigured
    from django.db import DatabaseError

    try:
        import django

        django.setup()
    except ImproperlyConfigured as exc:
        _fail(f"ROLE={role} cannot start: {exc}")
    _check_command(role, sys.argv)
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
