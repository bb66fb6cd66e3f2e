"""The etcd lock backend (lock.backend=etcd): see `backend.EtcdLockBackend` and `keys`."""

from __future__ import annotations

from lockserver.backends.etcd.backend import EtcdLockBackend
from lockserver.backends.etcd.common import ttl_seconds
from lockserver.backends.etcd.tokens import TokenFloorError

__all__ = ["EtcdLockBackend", "TokenFloorError", "ttl_seconds"]
