"""The shapes of etcd v3 calls: the ops a transaction is built from (`compare`, `put`, `delete`,
`get`, as etcd's own protobuf messages from `lockserver.etcd_proto`) and the answers read back
(`KeyValue`, `RangeResult`, `TxnResult`). The client that sends them is
`lockserver.etcd_client`.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from typing import Any

from lockserver.etcd_proto import kv_pb2, rpc_pb2

Compare = rpc_pb2.Compare
RequestOp = rpc_pb2.RequestOp


# Keys repeat (a session's, a lock's, the offset's: every call of a pair names the same few), so
# their encodings are kept.
@functools.lru_cache(maxsize=16384)
def key_bytes(key: str) -> bytes:
    return key.encode()


@functools.lru_cache(maxsize=16384)
def key_text(raw: bytes) -> str:
    return raw.decode()


@functools.lru_cache(maxsize=16384)
def range_end(prefix: str) -> bytes:
    """The range_end that selects every key starting with `prefix` (last byte + 1)."""
    raw = bytearray(prefix.encode())
    raw[-1] += 1
    return bytes(raw)


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


def key_value(raw: kv_pb2.KeyValue) -> KeyValue:
    return KeyValue(
        key=key_text(raw.key),
        value=raw.value,
        create_revision=raw.create_revision,
        mod_revision=raw.mod_revision,
        version=raw.version,
        lease=raw.lease,
    )


@dataclass(frozen=True)
class RangeResult:
    kvs: list[KeyValue]
    count: int

    def first(self) -> KeyValue | None:
        return self.kvs[0] if self.kvs else None


def range_result(raw: rpc_pb2.RangeResponse) -> RangeResult:
    return RangeResult(kvs=[key_value(item) for item in raw.kvs], count=raw.count)


@dataclass(frozen=True)
class TxnResult:
    succeeded: bool
    revision: int  # the store's revision after the txn (the txn's own revision if it wrote)
    # one per op: a RangeResult for ranges (and for deletes: the deleted kvs), None for puts
    responses: list[RangeResult | None]


def txn_result(raw: rpc_pb2.TxnResponse) -> TxnResult:
    responses: list[RangeResult | None] = []
    for item in raw.responses:
        kind = item.WhichOneof("response")
        if kind == "response_range":
            responses.append(range_result(item.response_range))
        elif kind == "response_delete_range":
            deleted = item.response_delete_range
            responses.append(
                RangeResult(kvs=[key_value(kv) for kv in deleted.prev_kvs], count=deleted.deleted)
            )
        else:
            responses.append(None)
    return TxnResult(succeeded=raw.succeeded, revision=raw.header.revision, responses=responses)


def writes(ops: list[RequestOp]) -> bool:
    """Whether any of `ops` changes the store (a txn of ranges alone may go to any member)."""
    return any(op.WhichOneof("request") != "request_range" for op in ops)


# --------------------------------------------------------------------------- txn builders


_TARGETS = {
    "CREATE": (Compare.CREATE, "create_revision"),
    "MOD": (Compare.MOD, "mod_revision"),
    "VERSION": (Compare.VERSION, "version"),
    "LEASE": (Compare.LEASE, "lease"),
    "VALUE": (Compare.VALUE, "value"),
}
_RESULTS = {
    "EQUAL": Compare.EQUAL,
    "GREATER": Compare.GREATER,
    "LESS": Compare.LESS,
    "NOT_EQUAL": Compare.NOT_EQUAL,
}


def compare(
    key: str, target: str, op: str, value: int | str | bytes, *, prefix: bool = False
) -> Compare:
    """target: CREATE | MOD | VERSION | LEASE | VALUE; op: EQUAL | GREATER | LESS | NOT_EQUAL.

    With `prefix` every key under `key` must satisfy it; with none there, etcd compares an
    empty key (revisions 0), so CREATE EQUAL 0 over a prefix means "no key under it"."""
    kind, field = _TARGETS[target]
    if target == "VALUE":
        operand: int | bytes = value.encode() if isinstance(value, str) else bytes(value)  # type: ignore[arg-type]
    else:
        operand = int(value)
    message = Compare(result=_RESULTS[op], target=kind, key=key_bytes(key), **{field: operand})
    if prefix:
        message.range_end = range_end(key)
    return message


def put(key: str, value: str | bytes, lease: int = 0) -> RequestOp:
    data = value.encode() if isinstance(value, str) else value
    return RequestOp(request_put=rpc_pb2.PutRequest(key=key_bytes(key), value=data, lease=lease))


def delete(key: str, *, prev_kv: bool = False, prefix: bool = False) -> RequestOp:
    return RequestOp(
        request_delete_range=rpc_pb2.DeleteRangeRequest(
            key=key_bytes(key), range_end=range_end(key) if prefix else b"", prev_kv=prev_kv
        )
    )


def nested_txn(
    compares: list[Compare], success: list[RequestOp], failure: list[RequestOp] | None = None
) -> RequestOp:
    """A transaction inside a transaction's branch (etcd 3.3+): its writes happen only when its
    own compares hold, at the outer transaction's revision."""
    return RequestOp(
        request_txn=rpc_pb2.TxnRequest(compare=compares, success=success, failure=failure or [])
    )


def range_request(
    key: str, *, prefix: bool = False, count_only: bool = False, revision: int = 0
) -> rpc_pb2.RangeRequest:
    return rpc_pb2.RangeRequest(
        key=key_bytes(key),
        range_end=range_end(key) if prefix else b"",
        count_only=count_only,
        revision=revision,
    )


def get(
    key: str, *, prefix: bool = False, count_only: bool = False, revision: int = 0
) -> RequestOp:
    """A range op; `revision` > 0 reads the key as it was at that revision (until compacted)."""
    return RequestOp(
        request_range=range_request(key, prefix=prefix, count_only=count_only, revision=revision)
    )
