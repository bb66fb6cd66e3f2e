"""The highest fencing token the lock server has issued, read from its own store.

pg backend: `fencing_token_seq` in lockdb (last_value once called). etcd backend: the token
offset (`{ETCD_PREFIX}meta/token_offset`) plus the store's current revision — every token is
offset-at-grant + create revision, offsets only rise, so no issued token exceeds it and every
later one is greater (lockserver/backends/etcd/tokens.py, `next_token_lower_bound`). The pg
sequence counts under etcd too: a lock server switched from pg keeps the tokens pg issued.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.conf import settings
from django.db import connections

from dlock.dbrouter import alias_for
from lockserver.etcd_client import EtcdClient
from lockserver.etcd_ops import get

SEQUENCE_EXISTS_SQL = "SELECT to_regclass('fencing_token_seq') IS NOT NULL"
SEQUENCE_SQL = "SELECT last_value, is_called FROM fencing_token_seq"


@dataclass(frozen=True)
class IssuedBound:
    """No token above `token` was ever issued; every token issued later is greater."""

    token: int
    backend: str
    sources: dict[str, int]


def pg_sequence_last() -> int:
    """The last value `fencing_token_seq` handed out (0 when none was, or no sequence)."""
    with connections[alias_for("lockserver")].cursor() as cursor:
        cursor.execute(SEQUENCE_EXISTS_SQL)
        if not cursor.fetchone()[0]:
            return 0
        cursor.execute(SEQUENCE_SQL)
        last_value, is_called = cursor.fetchone()
    return int(last_value if is_called else last_value - 1)


def etcd_issued_bound() -> int:
    """Token offset + current revision, read at one revision (EtcdUnavailable if unreachable)."""
    client = EtcdClient(
        settings.ETCD_URL.split(",")[0].strip(),
        connect_timeout=settings.ETCD_CONNECT_TIMEOUT_MS / 1000,
        read_timeout=settings.ETCD_REQUEST_TIMEOUT_MS / 1000,
    )
    try:
        read = client.read(get(settings.ETCD_PREFIX + "meta/token_offset"))
    finally:
        client.close()
    current = read.responses[0].first() if read.responses[0] else None
    offset = int(current.value) if current is not None else 0
    return offset + read.revision


def highest_issued_token() -> IssuedBound:
    """The bound for this deployment's configured lock backend."""
    sources = {"pgSequence": pg_sequence_last()}
    if settings.LOCK_BACKEND == "etcd":
        sources["etcdOffsetPlusRevision"] = etcd_issued_bound()
    return IssuedBound(token=max(sources.values()), backend=settings.LOCK_BACKEND, sources=sources)
