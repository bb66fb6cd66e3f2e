"""bench.peers' lock clients, one per arm: dlock over HTTP (both backends), etcd's v3 lock API
through its JSON gateway and over gRPC (leases kept alive by one thread), etcd's lock recipe over
gRPC (one create-if-absent transaction, one delete), and kazoo's Lock recipe on ZooKeeper. Each
has acquire() -> token, release() and close().
"""

from __future__ import annotations

import base64
import http.client
import json
import threading
import time
import uuid

import grpc

from bench import credentials
from lockserver.etcd_client import EtcdClient
from lockserver.etcd_ops import compare, delete, get, put
from lockserver.etcd_proto import rpc_pb2, rpc_pb2_grpc, v3lock_pb2, v3lock_pb2_grpc

HOT_WAIT_MS = 5_000
LEASE_TTL_S = 60
KEEPALIVE_S = 15.0


class Http:
    """One keep-alive HTTP/1.1 connection (stdlib), JSON in and out. Between rounds a client sits
    idle while the other arms run; a connection idle longer than IDLE_REOPEN_S (below gunicorn's
    5 s keep-alive) is replaced before the next request instead of being written into after the
    server closed it. A failed exchange closes the connection (the next call opens a new one)."""

    IDLE_REOPEN_S = 2.0

    def __init__(self, base_url: str) -> None:
        host, port = base_url.split("//", 1)[1].rsplit(":", 1)
        self.conn = http.client.HTTPConnection(host, int(port), timeout=30)
        self.used = time.monotonic()

    def call(
        self, method: str, path: str, body: dict | None = None, headers: dict | None = None
    ) -> tuple[int, dict]:
        sent = dict(headers or {})
        payload = None
        if body is not None:
            payload = json.dumps(body).encode()
            sent["Content-Type"] = "application/json"
        if time.monotonic() - self.used > self.IDLE_REOPEN_S:
            self.conn.close()
        try:
            self.conn.request(method, path, body=payload, headers=sent)
            response = self.conn.getresponse()
            raw = response.read()
        except (OSError, http.client.HTTPException):
            self.conn.close()
            raise
        finally:
            self.used = time.monotonic()
        try:
            return response.status, (json.loads(raw) if raw else {})
        except ValueError:
            return response.status, {"raw": raw[:200].decode(errors="replace")}

    def close(self) -> None:
        self.conn.close()


class DlockClient:
    def __init__(self, base_url: str, key: str, index: int, hot: bool) -> None:
        self.http = Http(base_url)
        self.key, self.hot = key, hot
        self.owner = f"peer-{index}-{uuid.uuid4().hex[:6]}"
        self.headers = {"X-Owner-Id": self.owner, **credentials.headers()}
        for _ in range(40):  # 32 clients opening at once may be shed: retry as a client would
            status, body = self.http.call(
                "POST", "/v1/sessions", {"ownerId": self.owner, "ttlMillis": 60_000}, self.headers
            )
            if status not in (429, 503):
                break
            time.sleep(0.25)
        if status != 201:
            raise RuntimeError(f"session {status} {body.get('code')}")
        self.session_id = body["sessionId"]
        self.grant: dict | None = None
        self.shed = 0

    def refresh(self) -> None:
        """L2 before each round: the session sits idle while the other arms run (the peers'
        sessions are kept alive by kazoo and by the lease keepalive thread)."""
        status, answer = self._call(
            "POST", f"/v1/sessions/{self.session_id}/heartbeat", {}, self.headers
        )
        if status != 200:
            raise RuntimeError(f"heartbeat {status} {answer.get('code')}")

    def _call(self, method: str, path: str, body: dict | None, headers: dict) -> tuple[int, dict]:
        """A 503 OVERLOADED (shed before any work) is retried after its retryAfterMillis, as
        dlock's own client does; each one is counted in `shed` and stays in the latency."""
        while True:
            status, answer = self.http.call(method, path, body, headers)
            if status == 503 and answer.get("code") == "OVERLOADED":
                self.shed += 1
                time.sleep(min(answer.get("retryAfterMillis") or 50, 1000) / 1000)
                continue
            return status, answer

    def acquire(self) -> int:
        body = {"sessionId": self.session_id, "ttlMillis": 10_000}
        if self.hot:
            body["waitMillis"] = HOT_WAIT_MS
        while True:
            status, answer = self._call("POST", f"/v1/locks/{self.key}/acquire", body, self.headers)
            if status == 200:
                self.grant = answer
                return int(answer["fencingToken"])
            if (
                self.hot
                and status in (409, 429)
                and answer.get("code") in ("LOCK_CONTENDED", "CONTENTION_EXCEEDED")
            ):
                time.sleep(min(answer.get("retryAfterMillis") or 0, 1000) / 1000)
                continue
            raise RuntimeError(f"acquire {status} {answer.get('code')}")

    def release(self) -> None:
        assert self.grant is not None
        status, answer = self._call(
            "DELETE",
            f"/v1/locks/{self.key}?sessionId={self.session_id}",
            None,
            {**self.headers, **credentials.headers(self.grant)},
        )
        self.grant = None
        if status != 204:
            raise RuntimeError(f"release {status} {answer.get('code')}")

    def close(self) -> None:
        self.http.call("DELETE", f"/v1/sessions/{self.session_id}", None, self.headers)
        self.http.close()


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


class EtcdLockClient:
    """etcd's lock API through the JSON gateway, bound to this client's own lease."""

    def __init__(self, etcd_url: str, key: str, keepalive: EtcdKeepalive) -> None:
        self.http = Http(etcd_url)
        status, body = self.http.call("POST", "/v3/lease/grant", {"TTL": LEASE_TTL_S})
        if status != 200 or "ID" not in body:
            raise RuntimeError(f"lease grant {status} {body}")
        self.lease = body["ID"]
        self.name = _b64(f"peers/{key}")
        self.owned: str | None = None
        self.keepalive = keepalive
        keepalive.add(self.lease)

    def acquire(self) -> int:
        status, body = self.http.call(
            "POST", "/v3/lock/lock", {"name": self.name, "lease": self.lease}
        )
        if status != 200 or "key" not in body:
            raise RuntimeError(f"lock {status} {str(body)[:120]}")
        self.owned = body["key"]
        return int(body["header"]["revision"])

    def release(self) -> None:
        status, body = self.http.call("POST", "/v3/lock/unlock", {"key": self.owned})
        self.owned = None
        if status != 200:
            raise RuntimeError(f"unlock {status} {str(body)[:120]}")

    def close(self) -> None:
        self.keepalive.remove(self.lease)
        self.http.call("POST", "/v3/lease/revoke", {"ID": self.lease})
        self.http.close()


def _grpc_target(etcd_url: str) -> str:
    return etcd_url.split("://", 1)[-1].rstrip("/")


class EtcdGrpcLockClient:
    """etcd's lock API (the v3lock service's Lock/Unlock) over grpcio with the stubs generated
    from etcd's .proto files, on a channel of its own, bound to this client's own lease (kept
    alive by the same thread as the gateway arm's)."""

    def __init__(self, etcd_url: str, key: str, keepalive: EtcdKeepalive) -> None:
        self.channel = grpc.insecure_channel(
            _grpc_target(etcd_url), (("grpc.use_local_subchannel_pool", 1),)
        )
        self.lock = v3lock_pb2_grpc.LockStub(self.channel)
        self.leases = rpc_pb2_grpc.LeaseStub(self.channel)
        self.lease = self.leases.LeaseGrant(rpc_pb2.LeaseGrantRequest(TTL=LEASE_TTL_S)).ID
        self.name = f"peers/{key}".encode()
        self.owned: bytes | None = None
        self.keepalive = keepalive
        keepalive.add(str(self.lease))

    def acquire(self) -> int:
        answer = self.lock.Lock(
            v3lock_pb2.LockRequest(name=self.name, lease=self.lease), timeout=30
        )
        self.owned = answer.key
        return int(answer.header.revision)

    def release(self) -> None:
        self.lock.Unlock(v3lock_pb2.UnlockRequest(key=self.owned), timeout=30)
        self.owned = None

    def close(self) -> None:
        self.keepalive.remove(str(self.lease))
        self.leases.LeaseRevoke(rpc_pb2.LeaseRevokeRequest(ID=self.lease), timeout=10)
        self.channel.close()


class EtcdRecipeClient:
    """etcd's lock recipe at its barest, over gRPC (dlock's own etcd client, one channel per
    client): acquire is one transaction creating `recipe/{key}` on the client's lease only if
    it does not exist (else the holder is watched until it is deleted, then again), release
    deletes it. The token is the create revision. The floor dlock's etcd backend is held to:
    one key put, one delete per pair."""

    def __init__(self, etcd_url: str, key: str, keepalive: EtcdKeepalive) -> None:
        self.client = EtcdClient(etcd_url, read_timeout=30.0)
        self.lease, _ = self.client.lease_grant(LEASE_TTL_S)
        self.key = f"recipe/{key}"
        self.keepalive = keepalive
        keepalive.add(str(self.lease))

    def acquire(self) -> int:
        while True:
            result = self.client.txn(
                [compare(self.key, "CREATE", "EQUAL", 0)],
                [put(self.key, "", self.lease)],
                [get(self.key)],
            )
            if result.succeeded:
                return result.revision
            self.client.wait_for_change(
                [self.key], after_revision=result.revision, timeout_s=30, deletions_only=True
            )

    def release(self) -> None:
        self.client.txn([], [delete(self.key)])

    def close(self) -> None:
        self.keepalive.remove(str(self.lease))
        self.client.lease_revoke(self.lease)
        self.client.close()


class EtcdKeepalive:
    """One thread keeps every etcd-lock client's lease alive (every KEEPALIVE_S)."""

    def __init__(self, etcd_url: str) -> None:
        self.url = etcd_url
        self.leases: set[str] = set()
        self.sent = 0
        self.failed = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True, name="etcd-keepalive")
        self._thread.start()

    def add(self, lease: str) -> None:
        self.leases.add(lease)

    def remove(self, lease: str) -> None:
        self.leases.discard(lease)

    def _loop(self) -> None:
        conn = Http(self.url)
        while not self._stop.wait(KEEPALIVE_S):
            for lease in list(self.leases):
                try:
                    status, body = conn.call("POST", "/v3/lease/keepalive", {"ID": lease})
                    ttl = int(((body.get("result") or {}).get("TTL")) or 0)
                    self.sent += 1
                    if status != 200 or ttl <= 0:
                        self.failed += 1
                except (OSError, http.client.HTTPException):
                    self.failed += 1
                    conn.close()
                    conn = Http(self.url)
        conn.close()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)


class ZkLockClient:
    """kazoo's Lock recipe; one ZooKeeper session (KazooClient) per client."""

    def __init__(self, hosts: str, key: str) -> None:
        from kazoo.client import KazooClient

        self.zk = KazooClient(hosts=hosts, timeout=30)
        self.zk.start(timeout=30)
        self.lock = self.zk.Lock(f"/bench/{key}")

    def acquire(self) -> int:
        if not self.lock.acquire(timeout=30):
            raise RuntimeError("zookeeper lock not acquired in 30 s")
        return int(self.lock.node[-10:])  # the sequential znode's counter: the fencing token

    def release(self) -> None:
        self.lock.release()

    def close(self) -> None:
        self.zk.stop()
        self.zk.close()


def etcd_version(url: str) -> str:
    conn = Http(url)
    try:
        status, body = conn.call("GET", "/version")
        return str(body.get("etcdserver", "?")) if status == 200 else "?"
    except (OSError, http.client.HTTPException):
        return "?"
    finally:
        conn.close()
