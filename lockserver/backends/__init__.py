"""Lock storage backends behind one interface (`base.LockBackend`); `get_backend()` picks one."""

from __future__ import annotations

import sys
import threading
from pathlib import Path

from django.conf import settings

from lockserver.backends.base import LockBackend
from lockserver.backends.etcd.backend import EtcdLockBackend
from lockserver.backends.etcd.tokens import TokenFloorError
from lockserver.backends.pg import PgLockBackend

_backend: LockBackend | None = None
_guard = threading.Lock()


def get_backend() -> LockBackend:
    """The process-wide backend chosen by settings.LOCK_BACKEND (pg | etcd)."""
    global _backend
    with _guard:
        if _backend is None:
            _backend = EtcdLockBackend() if settings.LOCK_BACKEND == "etcd" else PgLockBackend()
        return _backend


def reset_backend() -> None:
    """Tests only: forget the cached backend (e.g. after switching settings.LOCK_BACKEND)."""
    global _backend
    with _guard:
        if _backend is not None:
            _backend.close()
        _backend = None


def start_up() -> None:
    """Once per lock-server process (called from lockserver/apps.py).

    With LOCK_BACKEND=etcd, builds the backend, which persists or raises the token offset so
    every next token exceeds the deployment's floor. A floor that cannot be made safe stops the
    process with one line; an unreachable store does not (the floor is then ensured before the
    first grant, and readiness stays DOWN until it is). Management commands (migrate and
    friends) skip this: the serving process checks the floor, not the tools.
    """
    if Path(sys.argv[0]).name in ("manage.py", "django-admin"):
        return
    if settings.LOCK_BACKEND != "etcd":
        return
    try:
        get_backend()
    except TokenFloorError as exc:
        sys.stderr.write(f"dlock lock-server: refusing to start: {exc}\n")
        sys.stderr.flush()
        raise SystemExit(3) from None
