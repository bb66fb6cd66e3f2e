"""The shapes of etcd v3 calls through its JSON gateway: the ops a transaction is built from
(`compare`, `put`, `delete`, `get`) and the answers read back (`KeyValue`, `RangeResult`,
`TxnResult`). Keys and values travel base64-encoded; int64 fields arrive as JSON strings. The
client that sends them is `lockserver.etcd_client`.
"""

from __future__ import annotations

import base64
import functools
import json
from dataclasses import dataclass
from typing import Any


def _b64(raw: str | bytes) -> str:
    data = raw.encode() if isinstance(raw, str) else raw
    return base64.b64encode(data).decode("ascii")


def _unb64(text: str | None) -> bytes:
    return base64.b64decode(text) if text else b""


# Keys repeat (a session's, a lock's, the offset's: every call of a pair names the same few), so
# their encodings are kept; values are encoded each time.
@functools.lru_cache(maxsize=16384)
def _key64(key: str) -> str:
    return _b64(key)


@functools.lru_cache(maxsize=16384)
def _key_from64(text: str) -> str:
    return _unb64(text).decode()


@functools.lru_cache(maxsize=16384)
def _range_end64(prefix: str) -> str:
    return _b64(prefix_end(prefix))


def prefix_end(prefix: str) -> str:
    """The range_end that selects every key starting with `prefix` (last byte + 1)."""
    raw = bytearray(prefix.encode())
    raw[-1] += 1
    return raw.decode()


@dataclass(frozen=True)
class KeyValue:
    key: str
    value: bytes
    create_revision: int
    mod_revision: int
    version: int
    lease: int

    def json(self) -> dict[str, Any]:
        return json.loads(self.value)


def _kv(raw: dict[str, Any]) -> KeyValue:
    return KeyValue(
        key=_key_from64(raw["key"]) if raw.get("key") else "",
        value=_unb64(raw.get("value")),
        create_revision=int(raw.get("create_revision", 0)),
        mod_revision=int(raw.get("mod_revision", 0)),
        version=int(raw.get("version", 0)),
        lease=int(raw.get("lease", 0)),
    )


@dataclass(frozen=True)
class RangeResult:
    kvs: list[KeyValue]
    count: int

    def first(self) -> KeyValue | None:
        return self.kvs[0] if self.kvs else None


def _range_result(raw: dict[str, Any]) -> RangeResult:
    return RangeResult(
        kvs=[_kv(item) for item in raw.get("kvs", [])], count=int(raw.get("count", 0))
    )


@dataclass(frozen=True)
class TxnResult:
    succeeded: bool
    revision: int  # the store's revision after the txn (the txn's own revision if it wrote)
    # one per op: a RangeResult for ranges (and for deletes: the deleted kvs), None for puts
    responses: list[RangeResult | None]


# --------------------------------------------------------------------------- txn builders


_COMPARED = {
    "CREATE": "create_revision",
    "MOD": "mod_revision",
    "VERSION": "version",
    "LEASE": "lease",
    "VALUE": "value",
}


def compare(
    key: str, target: str, op: str, value: int | str | bytes, *, prefix: bool = False
) -> dict[str, Any]:
    """target: CREATE | MOD | VERSION | LEASE | VALUE; op: EQUAL | GREATER | LESS | NOT_EQUAL.

    With `prefix` every key under `key` must satisfy it; with none there, etcd compares an
    empty key (revisions 0), so CREATE EQUAL 0 over a prefix means "no key under it"."""
    field = _COMPARED[target]
    encoded = _b64(value) if target == "VALUE" else str(value)
    body = {"target": target, "key": _key64(key), "result": op, field: encoded}
    if prefix:
        body["range_end"] = _range_end64(key)
    return body


def put(key: str, value: str | bytes, lease: int = 0) -> dict[str, Any]:
    body: dict[str, Any] = {"key": _key64(key), "value": _b64(value)}
    if lease:
        body["lease"] = str(lease)
    return {"request_put": body}


def delete(key: str, *, prev_kv: bool = False, prefix: bool = False) -> dict[str, Any]:
    body: dict[str, Any] = {"key": _key64(key)}
    if prev_kv:
        body["prev_kv"] = True
    if prefix:
        body["range_end"] = _range_end64(key)
    return {"request_delete_range": body}


def get(
    key: str, *, prefix: bool = False, count_only: bool = False, revision: int = 0
) -> dict[str, Any]:
    """A range op; `revision` > 0 reads the key as it was at that revision (until compacted)."""
    body: dict[str, Any] = {"key": _key64(key)}
    if revision:
        body["revision"] = str(revision)
    if prefix:
        body["range_end"] = _range_end64(key)
    if count_only:
        body["count_only"] = True
    return {"request_range": body}


# --------------------------------------------------------------------------- client
