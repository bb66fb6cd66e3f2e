"""The etcd backend's token source: token = offset + create_revision, the offset persisted under
`meta/token_offset` and raised so that every next token exceeds the deployment's floor."""

from __future__ import annotations

import logging
import threading

from dlock.logs import log_event
from lockserver.backends.etcd.keys import INT64_MAX, KeySpace
from lockserver.etcd_client import EtcdClient, KeyValue, compare, get, put

logger = logging.getLogger("dlock.lockserver.etcd")


class TokenFloorError(RuntimeError):
    """The backend cannot guarantee that its next token exceeds LOCK_TOKEN_FLOOR."""


class TokensMixin(KeySpace):
    client: EtcdClient
    token_floor: int
    adopt_pg_sequence: bool
    _offset: int | None
    _offset_guard: threading.Lock

    def ensure_token_floor(self) -> int:
        """Persist (or raise) the token offset so that every next token exceeds the floor.

        token = offset + create_revision and every later create_revision exceeds the current
        store revision R, so offset + R >= floor suffices. Raising the offset is always safe
        (grants keep the offset they were issued with); the only unsafe case is an int64
        overflow, which raises TokenFloorError. Returns the offset in force.
        """
        floor = max(int(self.token_floor or 0), self._pg_sequence_floor())
        if floor < 0 or floor >= INT64_MAX // 2:
            raise TokenFloorError(f"LOCK_TOKEN_FLOOR={floor} is outside 0..{INT64_MAX // 2}")
        while True:
            read = self.client.read(get(self._offset_key))
            revision = read.revision
            current = read.responses[0].first() if read.responses[0] else None
            if current is None:
                offset = max(0, floor - revision)
                guard = compare(self._offset_key, "CREATE", "EQUAL", 0)
            else:
                try:
                    stored = int(current.value)
                except ValueError:
                    raise TokenFloorError(
                        f"{self._offset_key} holds {current.value!r}, not an integer"
                    ) from None
                if stored + revision >= floor:
                    self._offset = stored
                    return stored
                offset = floor - revision
                guard = compare(self._offset_key, "MOD", "EQUAL", current.mod_revision)
            result = self.client.txn([guard], [put(self._offset_key, str(offset))])
            if result.succeeded:
                log_event(
                    "token_offset_set",
                    backend="etcd",
                    offset=offset,
                    floor=floor,
                    revision=revision,
                    previous=None if current is None else int(current.value),
                )
                self._offset = offset
                return offset
            # another lock-server replica wrote it first: read again

    def _pg_sequence_floor(self) -> int:
        """The PostgreSQL backend's last token, when lockdb is configured and reachable.

        A lock-server switched from pg to etcd keeps its LOCK_DATABASE_URL, so the highest token
        pg ever issued is an automatic floor (read-only; 0 when there is no such sequence).
        """
        if not self.adopt_pg_sequence:
            return 0
        try:
            import psycopg
            from django.db import connections

            from dlock.dbrouter import alias_for

            # a connection of its own: this runs at start-up, before Django's pool is in use
            params = dict(connections[alias_for("lockserver")].get_connection_params())
            for name in ("cursor_factory", "context", "prepare_threshold", "pool"):
                params.pop(name, None)
            params["connect_timeout"] = 2
            params["autocommit"] = True
            with psycopg.connect(**params) as conn:
                if not conn.execute(
                    "SELECT to_regclass('fencing_token_seq') IS NOT NULL"
                ).fetchone()[0]:
                    return 0
                last_value, is_called = conn.execute(
                    "SELECT last_value, is_called FROM fencing_token_seq"
                ).fetchone()
                return int(last_value if is_called else last_value - 1)
        except Exception as exc:  # unreachable lockdb: the configured floor still applies
            logger.warning("could not read fencing_token_seq from lockdb: %s", exc)
            return 0

    def _current_offset(self) -> int:
        if self._offset is None:
            with self._offset_guard:
                if self._offset is None:
                    self.ensure_token_floor()
        assert self._offset is not None
        return self._offset

    def next_token_lower_bound(self) -> int:
        """Every token issued from now on is greater than this (operators: the switch floor)."""
        revision = self.client.read(get(self._offset_key)).revision
        return self._current_offset() + revision

    def _token(self, kv: KeyValue) -> int:
        return kv.json()["offset"] + kv.create_revision
