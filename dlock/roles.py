"""The ROLE switch: one Django project, one process per role."""

from __future__ import annotations

import os
import sys

ROLES = ("lockserver", "payments", "railproxy", "railstub", "admin", "executor", "ops")

SERVICE_NAMES = {
    "lockserver": "lock-server",
    "payments": "payment-resource",
    "railproxy": "rail-proxy",
    "railstub": "rail-stub",
    "admin": "admin",
    "executor": "executor",
    "ops": "ops",
}


def resolve_role() -> str:
    """Return ROLE from the environment, or stop the process with one clear line."""
    role = os.environ.get("ROLE", "")
    if role not in ROLES:
        shown = repr(role) if role else "missing"
        sys.stderr.write(f"dlock: ROLE is {shown}; set ROLE to one of: {', '.join(ROLES)}\n")
        raise SystemExit(2)
    return role


def configure_settings_module() -> str:
    """Point DJANGO_SETTINGS_MODULE at the role overlay: ROLE is authoritative."""
    role = resolve_role()
    os.environ["DJANGO_SETTINGS_MODULE"] = f"settings.{role}"
    return role
