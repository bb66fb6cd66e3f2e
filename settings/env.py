"""Small helpers that read the environment and fail loudly on a bad value."""

from __future__ import annotations

import os
import re

import dj_database_url
from django.core.exceptions import ImproperlyConfigured


def env_str(name: str, default: str | None = None) -> str:
    value = os.environ.get(name, default)
    if value is None:
        raise ImproperlyConfigured(f"{name} must be set")
    return value


def env_bool(name: str, default: bool = False) -> bool:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    lowered = raw.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise ImproperlyConfigured(f"{name} must be a boolean (true/false), got {raw!r}")


def env_int(
    name: str, default: int, *, minimum: int | None = None, maximum: int | None = None
) -> int:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ImproperlyConfigured(f"{name} must be an integer, got {raw!r}") from None
    if minimum is not None and value < minimum:
        raise ImproperlyConfigured(f"{name} must be >= {minimum}, got {value}")
    if maximum is not None and value > maximum:
        raise ImproperlyConfigured(f"{name} must be <= {maximum}, got {value}")
    return value


def env_database(name: str) -> dict:
    """A Django DATABASES entry from a postgres:// URL in the environment variable `name`."""
    url = os.environ.get(name)
    if not url:
        raise ImproperlyConfigured(f"{name} must be set to a postgres:// URL")
    try:
        config = dj_database_url.parse(url, conn_max_age=0, conn_health_checks=True)
    except ValueError:  # no scheme, an unknown one: dj-database-url lists every scheme it knows
        raise ImproperlyConfigured(f"{name} must be a postgres:// URL") from None
    if config["ENGINE"] != "django.db.backends.postgresql":
        raise ImproperlyConfigured(
            f"{name} must be a PostgreSQL URL, got engine {config['ENGINE']}"
        )
    options = config.setdefault("OPTIONS", {})
    options.setdefault("connect_timeout", env_int("DB_CONNECT_TIMEOUT_S", 2, minimum=1))
    options.setdefault("application_name", os.environ.get("ROLE", "dlock"))
    config["TEST"] = {"NAME": f"test_{config['NAME']}"}
    return config


CREDENTIAL_SCOPES = frozenset({"executor", "operator"})
_CREDENTIAL_ENTRY = re.compile(r"(?P<scopes>[a-z]+(?:\+[a-z]+)*):(?P<digest>[0-9a-f]{64})")


def env_credentials(name: str) -> dict[str, frozenset[str]]:
    """`scope[+scope]:sha256hex` entries, comma-separated → {sha256hex: scopes} (dlock.auth)."""
    table: dict[str, set[str]] = {}
    for entry in (part.strip() for part in os.environ.get(name, "").split(",")):
        if not entry:
            continue
        match = _CREDENTIAL_ENTRY.fullmatch(entry)
        if not match:
            raise ImproperlyConfigured(
                f"{name} entries must be scope[+scope]:sha256hex (64 lowercase hex digits)"
            )
        scopes = set(match.group("scopes").split("+"))
        if not scopes <= CREDENTIAL_SCOPES:
            raise ImproperlyConfigured(
                f"{name}: unknown scope(s) {sorted(scopes - CREDENTIAL_SCOPES)}"
            )
        table.setdefault(match.group("digest"), set()).update(scopes)
    return {digest: frozenset(scopes) for digest, scopes in table.items()}
