"""Lock storage backends behind one interface (`base.LockBackend`); `get_backend()` picks one."""

from __future__ import annotations

import threading

from django.conf import settings

from lockserver.backends.base import LockBackend

_backend: LockBackend | None = None
_guard = threading.Lock()


def get_backend() -> LockBackend:
    """The process-wide backend chosen by settings.LOCK_BACKEND (pg | etcd)."""
    global _backend
    with _guard:
        if _backend is None:
            if settings.LOCK_BACKEND == "etcd":
                from lockserver.backends.etcd import EtcdLockBackend

                _backend = EtcdLockBackend()
            else:
                from lockserver.backends.pg import PgLockBackend

                _backend = PgLockBackend()
        return _backend


def reset_backend() -> None:
    """Tests only: forget the cached backend (e.g. after switching settings.LOCK_BACKEND)."""
    global _backend
    with _guard:
        if _backend is not None:
            _backend.close()
        _backend = None
