"""dlock beside the lock services payment teams already run (issue 28): one workload, every arm,
interleaved rounds in one run.

Arms — all durable (every grant is on disk before it is answered) and all hand out a token a
fenced resource can check:

- `dlock-pg`: the lock server, LOCK_BACKEND=pg, over HTTP (fencingToken: one global sequence).
- `dlock-etcd`: the lock server, LOCK_BACKEND=etcd, over HTTP, on the same etcd as `etcd-lock`.
- `zookeeper`: kazoo's `Lock` recipe (ephemeral sequential znodes under /bench/<key>) on a private
  single-node ZooKeeper with forceSync=yes (bench.zookeeper). The token is the lock znode's
  sequence number, the textbook fencing token: the parent's counter, so strictly increasing per
  key in grant order (a resource would compare it as it compares dlock's).
- `etcd-lock`: etcd's own v3 lock API (`Lock`/`Unlock`, the v3lock service) through etcd's JSON
  gateway (`/v3/lock/lock`, `/v3/lock/unlock`), lease-bound: one lease per client session
  (`/v3/lease/grant`, TTL 60 s, kept alive every 15 s by one thread, revoked at the end). The
  token is the revision in the Lock answer's header: the store's revision once the caller
  holds the lock, above the previous holder's delete, so strictly increasing per key.

Workloads: `own` (each client loops acquire+release on a key of its own: the path, no queueing)
at 1, 8 and 32 clients, and `hot` (every client on one shared key: the queue) at 8 and 32. A
client is a thread with its own session and connection; dlock's and etcd's HTTP arms use the same
stdlib keep-alive client, ZooKeeper uses kazoo. dlock's hot-key acquire waits server-side
(waitMillis) and honours 429 CONTENTION_EXCEEDED's retryAfterMillis, as a client should.

Per point, BENCH_PEERS_ROUNDS rounds (default 3) of BENCH_PEERS_ROUND_S seconds (default 2) per
arm, arms interleaved and their order rotated each round; each arm's sessions are opened once per
point and kept for every round. Per arm and round: pairs/s, p50/p99 of acquire and of the pair,
errors, and the server processes' CPU per pair (utime+stime from /proc/<pid>/stat, process
trees: the lock server role (gunicorn, and its proxy when it has one) + PostgreSQL for
dlock-pg, + etcd for dlock-etcd; the JVM; etcd). An
arm's figure is the median over its rounds; the goal ratios are medians of per-round ratios.

Durable writes per pair (issue 39 item 2), counted by each store over the arm's window: dlock-pg
the transaction ids PostgreSQL assigned (one per transaction that wrote; read-only ones take
none), dlock-etcd and etcd-lock etcd's committed raft proposals
(`etcd_server_proposals_committed_total`; a lease keepalive is not one), zookeeper the zxids
(`srvr`). Each store's own background writes in the window (the lock servers' housekeeping)
are included, so the figure is an upper bound.

Every grant's token is logged per key while it is held; `check_tokens` asserts strictly
increasing per key (a violation fails the run). Writes `<out>/peers.json`.
"""

from __future__ import annotations

import base64
import http.client
import json
import logging
import os
import re
import secrets
import shutil
import statistics
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path

from bench import credentials
from bench.proc import tree_cpu_seconds
from bench.zookeeper import ZooKeeperServer
from bench.zookeeper import version as zk_version
from bench.zookeeper import write_count as zk_write_count
from devstack import EtcdServer, PgCluster, RoleProcess, free_port, manage

ROUNDS = int(os.environ.get("BENCH_PEERS_ROUNDS", "3"))
ROUND_S = float(os.environ.get("BENCH_PEERS_ROUND_S", "2"))
WARMUP_S = 0.3
POINTS = (("own", 1), ("own", 8), ("own", 32), ("hot", 8), ("hot", 32))
ARMS = ("dlock-pg", "dlock-etcd", "zookeeper", "etcd-lock")
PEERS = ("zookeeper", "etcd-lock")  # the durable lock services with a token dlock is held to
HOT_WAIT_MS = 5_000
LEASE_TTL_S = 60
KEEPALIVE_S = 15.0


class TokenOrderError(AssertionError):
    """A key's tokens did not strictly increase in grant order."""


class TokenLog:
    """Every grant's token, per (arm, key), appended by the holder while it holds the lock — so
    the order of a key's list is its grant order."""

    def __init__(self) -> None:
        self.by_key: dict[tuple[str, str], list[int]] = {}
        self._guard = threading.Lock()

    def record(self, arm: str, key: str, token: int) -> None:
        tokens = self.by_key.get((arm, key))
        if tokens is None:
            with self._guard:
                tokens = self.by_key.setdefault((arm, key), [])
        tokens.append(token)


def check_tokens(by_key: dict[tuple[str, str], list[int]]) -> dict[str, dict]:
    """Per arm: keys, grants, and every place a key's token failed to exceed the one before."""
    report: dict[str, dict] = {}
    for (arm, key), tokens in sorted(by_key.items()):
        row = report.setdefault(arm, {"keys": 0, "grants": 0, "violations": []})
        row["keys"] += 1
        row["grants"] += len(tokens)
        for index in range(1, len(tokens)):
            if tokens[index] <= tokens[index - 1]:
                row["violations"].append(
                    {
                        "key": key,
                        "grant": index,
                        "previous": tokens[index - 1],
                        "token": tokens[index],
                    }
                )
    return report


def assert_tokens_increase(by_key: dict[tuple[str, str], list[int]]) -> dict[str, dict]:
    report = check_tokens(by_key)
    bad = {arm: row["violations"][:3] for arm, row in report.items() if row["violations"]}
    if bad:
        raise TokenOrderError(f"tokens not strictly increasing per key: {bad}")
    return report


# ----------------------------------------------------------------------------- clients


class _Http:
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
        self.http = _Http(base_url)
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
        self.http = _Http(etcd_url)
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
        conn = _Http(self.url)
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
                    conn = _Http(self.url)
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


# ----------------------------------------------------------------------------- driving


def _percentile(samples: list[float], q: float) -> float:
    if not samples:
        return 0.0
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def drive(
    arm: str,
    clients: list,
    keys: list[str],
    seconds: float,
    server_pids: dict[str, int],
    tokens: TokenLog,
    writes: Callable[[], int | None] | None = None,
) -> dict:
    """Every client loops acquire → (log token) → release for `seconds` after a warm-up;
    `writes` reads the store's count of durable writes (before and after the window)."""
    n = len(clients)
    acquires: list[list[float]] = [[] for _ in range(n)]
    pairs: list[list[float]] = [[] for _ in range(n)]
    errors: dict[str, int] = {}
    window = {"start": time.monotonic() + WARMUP_S, "stop": 0.0}
    window["stop"] = window["start"] + seconds
    ready = threading.Barrier(n + 1)

    def worker(index: int) -> None:
        client, key = clients[index], keys[index]
        refresh = getattr(client, "refresh", None)
        if refresh is not None:
            try:
                refresh()
            except Exception as exc:  # counted; the round's acquires will say the rest
                kind = f"{type(exc).__name__}: {str(exc)[:60]}"
                errors[kind] = errors.get(kind, 0) + 1
        ready.wait()
        while True:
            began = time.monotonic()
            if began >= window["stop"]:
                return
            try:
                token = client.acquire()
                held = time.monotonic()
                tokens.record(arm, key, token)
                client.release()
            except Exception as exc:  # counted, never hidden
                kind = f"{type(exc).__name__}: {str(exc)[:60]}"
                errors[kind] = errors.get(kind, 0) + 1
                time.sleep(0.01)  # a persistent failure must not spin a core the arms share
                continue
            if began >= window["start"]:
                acquires[index].append(held - began)
                pairs[index].append(time.monotonic() - began)

    threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(n)]
    for thread in threads:
        thread.start()
    ready.wait()
    time.sleep(max(0.0, window["start"] - time.monotonic()))
    cpu_before = {name: tree_cpu_seconds(pid) for name, pid in server_pids.items()}
    writes_before = writes() if writes is not None else None
    client_before = time.process_time()
    shed_before = sum(getattr(c, "shed", 0) for c in clients)
    for thread in threads:
        thread.join(seconds + 90)
    cpu = {name: tree_cpu_seconds(pid) - cpu_before[name] for name, pid in server_pids.items()}
    writes_after = writes() if writes is not None else None
    client_cpu = time.process_time() - client_before
    flat_pairs = [s for per in pairs for s in per]
    flat_acq = [s for per in acquires for s in per]
    count = len(flat_pairs)
    written = (
        None
        if writes_before is None or writes_after is None or not count
        else round((writes_after - writes_before) / count, 2)
    )
    return {
        "pairs": count,
        "writes_per_pair": written,
        "pairs_per_s": round(count / seconds, 1),
        "acquire_p50_ms": round(_percentile(flat_acq, 0.50) * 1000, 2),
        "acquire_p99_ms": round(_percentile(flat_acq, 0.99) * 1000, 2),
        "p50_ms": round(_percentile(flat_pairs, 0.50) * 1000, 2),
        "p99_ms": round(_percentile(flat_pairs, 0.99) * 1000, 2),
        "server_cpu_ms_per_pair": round(sum(cpu.values()) * 1000 / count, 3) if count else None,
        "server_cpu_ms_per_pair_by_process": {
            name: round(value * 1000 / count, 3) if count else None for name, value in cpu.items()
        },
        # the lock server alone: its gunicorn (and its nginx when run as a pod), not the store
        "lockserver_cpu_ms_per_pair": round(cpu["lockserver"] * 1000 / count, 3)
        if count and "lockserver" in cpu
        else None,
        "server_cores_busy": round(sum(cpu.values()) / seconds, 2),
        "client_cores_busy": round(client_cpu / seconds, 2),
        "shed_retried": sum(getattr(c, "shed", 0) for c in clients) - shed_before,
        "errors": sum(errors.values()),
        "errors_by_kind": errors,
    }


def _median_row(rows: list[dict]) -> dict:
    """Each number is the median over the rounds (pairs/s, latencies, CPU)."""
    out: dict = {"rounds": len(rows)}
    for field in (
        "pairs_per_s",
        "acquire_p50_ms",
        "acquire_p99_ms",
        "p50_ms",
        "p99_ms",
        "server_cpu_ms_per_pair",
        "lockserver_cpu_ms_per_pair",
        "writes_per_pair",
        "server_cores_busy",
        "client_cores_busy",
    ):
        values = [r[field] for r in rows if r.get(field) is not None]
        out[field] = round(statistics.median(values), 3) if values else None
    out["errors"] = sum(r["errors"] for r in rows)
    out["shed_retried"] = sum(r.get("shed_retried", 0) for r in rows)
    return out


def _median(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return round(statistics.median(known), 3) if known else None


def ratios(rounds: list[dict]) -> dict:
    """Per-round goal ratios (issue 28) and their medians: pairs/s dlock-pg ÷ the best peer,
    dlock-etcd ÷ etcd-lock, and p99 acquire dlock ÷ the best (lowest) peer's."""
    per: dict[str, list[float | None]] = {
        "pg_over_best_peer": [],
        "etcd_over_etcd_lock": [],
        "pg_p99_over_best_peer": [],
        "etcd_p99_over_best_peer": [],
        "pg_over_zookeeper": [],  # issue 39's goals are against ZooKeeper/kazoo
        "pg_p99_over_zookeeper": [],
    }
    for one in rounds:
        arms = one["arms"]
        zk = arms.get("zookeeper")
        pg_row = arms.get("dlock-pg")
        per["pg_over_zookeeper"].append(
            round(pg_row["pairs_per_s"] / zk["pairs_per_s"], 3)
            if pg_row and zk and zk["pairs_per_s"]
            else None
        )
        per["pg_p99_over_zookeeper"].append(
            round(pg_row["acquire_p99_ms"] / zk["acquire_p99_ms"], 3)
            if pg_row and pg_row["pairs"] and zk and zk["pairs"] and zk["acquire_p99_ms"]
            else None
        )
        peers = [arms[p] for p in PEERS if p in arms and arms[p]["pairs"]]
        best_rate = max((p["pairs_per_s"] for p in peers), default=0)
        best_p99 = min((p["acquire_p99_ms"] for p in peers), default=0)
        pg, etcd, etcd_lock = arms.get("dlock-pg"), arms.get("dlock-etcd"), arms.get("etcd-lock")
        per["pg_over_best_peer"].append(
            round(pg["pairs_per_s"] / best_rate, 3) if pg and best_rate else None
        )
        per["etcd_over_etcd_lock"].append(
            round(etcd["pairs_per_s"] / etcd_lock["pairs_per_s"], 3)
            if etcd and etcd_lock and etcd_lock["pairs_per_s"]
            else None
        )
        per["pg_p99_over_best_peer"].append(
            round(pg["acquire_p99_ms"] / best_p99, 3) if pg and pg["pairs"] and best_p99 else None
        )
        per["etcd_p99_over_best_peer"].append(
            round(etcd["acquire_p99_ms"] / best_p99, 3)
            if etcd and etcd["pairs"] and best_p99
            else None
        )
    return {
        **{name: _median(values) for name, values in per.items()},
        "rounds": per,
    }


# ----------------------------------------------------------------------------- the run


class _Stack:
    """PostgreSQL, etcd and ZooKeeper side by side in one directory (one disk), and a lock server
    per dlock backend."""

    def __init__(self, work: Path) -> None:
        self.work = work
        self.pg = PgCluster(work / "pg", free_port())  # durable: fsync on, synchronous_commit on
        self.etcd = EtcdServer(work / "etcd", free_port(), free_port())  # WAL fsync, as always
        self.zk = ZooKeeperServer(work / "zk", free_port())  # forceSync=yes
        self.servers: dict[str, RoleProcess] = {}

    def start(self) -> None:
        self.pg.start()
        self.etcd.start()
        self.zk.start()
        base = {
            "DJANGO_SECRET_KEY": os.environ.get("DJANGO_SECRET_KEY") or secrets.token_urlsafe(48),
            "DJANGO_DEBUG": "false",
            "DLOCK_LOG_LEVEL": "WARNING",
            "LOCK_RETRY_BUDGET": "1000000",
            **credentials.server_env(),
        }
        for name, backend in (("dlock-pg", "pg"), ("dlock-etcd", "etcd")):
            env = {
                **base,
                "LOCK_BACKEND": backend,
                "LOCK_DATABASE_URL": self.pg.create_database(f"bench_peers_{backend}"),
            }
            if backend == "etcd":
                env["ETCD_URL"] = self.etcd.url
            manage(["migrate", "--no-input", "-v", "0"], env, role="lockserver")
            self.servers[name] = RoleProcess(
                "lockserver", free_port(), env, self.work / f"{name}.log", name=name
            ).start()

    def postmaster_pid(self) -> int:
        return int((self.pg.datadir / "postmaster.pid").read_text().split()[0])

    def server_pids(self, arm: str) -> dict[str, int]:
        """The processes whose CPU is the arm's server CPU (the proxy in front, if any, too)."""
        assert self.etcd.process is not None and self.zk.process is not None
        if arm == "zookeeper":
            return {"zookeeper": self.zk.process.pid}
        if arm == "etcd-lock":
            return {"etcd": self.etcd.process.pid}
        server = self.servers[arm]
        assert server.process is not None
        # the role's process tree: gunicorn, and its nginx when the stack runs the role as a
        # pod (gunicorn behind its own proxy: RoleProcess.process is then the pod)
        pids = {"lockserver": server.process.pid}
        if arm == "dlock-pg":
            pids["postgres"] = self.postmaster_pid()
        else:
            pids["etcd"] = self.etcd.process.pid
        return pids

    def write_counter(self, arm: str) -> Callable[[], int | None]:
        """The arm's store's count of durable writes so far (see the module docstring)."""
        if arm == "zookeeper":
            return lambda: zk_write_count(self.zk.port)
        if arm == "dlock-pg":
            return self._pg_xids
        return self._etcd_proposals

    def _pg_xids(self) -> int | None:
        found = re.search(r"\d+", self.pg.psql("SELECT pg_snapshot_xmax(pg_current_snapshot())"))
        return int(found.group()) if found else None

    def _etcd_proposals(self) -> int | None:
        conn = _Http(self.etcd.url)
        try:
            conn.conn.request("GET", "/metrics")
            text = conn.conn.getresponse().read().decode()
        except (OSError, http.client.HTTPException):
            return None
        finally:
            conn.close()
        found = re.search(r"^etcd_server_proposals_committed_total (\S+)$", text, re.M)
        return int(float(found.group(1))) if found else None

    def client_factory(
        self, arm: str, keepalive: EtcdKeepalive
    ) -> Callable[[int, str, bool], object]:
        if arm == "zookeeper":
            return lambda index, key, hot: ZkLockClient(self.zk.hosts, key)
        if arm == "etcd-lock":
            return lambda index, key, hot: EtcdLockClient(self.etcd.url, key, keepalive)
        url = self.servers[arm].url
        return lambda index, key, hot: DlockClient(url, key, index, hot)

    def stop(self) -> None:
        for server in self.servers.values():
            server.stop()
        self.zk.stop()
        self.etcd.stop()
        self.pg.stop("immediate")


def _open(factory, n: int, keys: list[str], hot: bool) -> list:
    """n clients opened in parallel (32 sessions one after another would take a while)."""
    made: list = [None] * n
    failures: list[str] = []

    def one(index: int) -> None:
        try:
            made[index] = factory(index, keys[index], hot)
        except Exception as exc:
            failures.append(f"{type(exc).__name__}: {exc}")

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    if failures or any(c is None for c in made):
        for client in made:
            if client is not None:
                _close(client)
        raise RuntimeError(f"clients did not open: {failures[:3]}")
    return made


def _close(client) -> None:
    try:
        client.close()
    except Exception:  # the point's numbers are taken; a close failure is not one of them
        logging.getLogger(__name__).debug("close failed", exc_info=True)


def run(
    out_dir: str | Path = ".run/bench",
    *,
    points: tuple[tuple[str, int], ...] = POINTS,
    arms: tuple[str, ...] = ARMS,
    rounds: int = ROUNDS,
    seconds: float = ROUND_S,
    stack_factory: Callable[[Path], _Stack] | None = None,
    name: str = "peers",
) -> dict:
    """`stack_factory` (bench.configs) builds a stack with other lock-server arms; `name` names
    the part's JSON file and its lines."""
    logging.getLogger("kazoo").setLevel(logging.ERROR)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f"dlock-bench-{name}-"))
    work.chmod(0o755)
    stack = (stack_factory or _Stack)(work)
    tokens = TokenLog()
    keepalive: EtcdKeepalive | None = None
    results: list[dict] = []
    load_before = os.getloadavg()[0]
    try:
        stack.start()
        keepalive = EtcdKeepalive(stack.etcd.url)
        for workload, n in points:
            hot = workload == "hot"
            run_id = uuid.uuid4().hex[:6]
            keys = {
                arm: [
                    f"bench.{workload}.{run_id}" if hot else f"bench.{run_id}.{i}" for i in range(n)
                ]
                for arm in arms
            }
            opened = {
                arm: _open(stack.client_factory(arm, keepalive), n, keys[arm], hot) for arm in arms
            }
            done = []
            try:
                for index in range(rounds):
                    order = arms[index % len(arms) :] + arms[: index % len(arms)]
                    one = {"round": index + 1, "order": list(order), "arms": {}}
                    for arm in order:
                        one["arms"][arm] = drive(
                            arm,
                            opened[arm],
                            keys[arm],
                            seconds,
                            stack.server_pids(arm),
                            tokens,
                            stack.write_counter(arm),
                        )
                    one["loadavg_1m"] = round(os.getloadavg()[0], 2)
                    done.append(one)
            finally:
                for clients in opened.values():
                    for client in clients:
                        _close(client)
            point = {
                "workload": workload,
                "clients": n,
                "arms": {arm: _median_row([r["arms"][arm] for r in done]) for arm in arms},
                "ratios": ratios(done),
                "rounds": done,
            }
            results.append(point)
            print(
                f"[bench] {name} {workload} ×{n}: "
                + ", ".join(
                    f"{arm} {point['arms'][arm]['pairs_per_s']}/s"
                    f" (p99 acq {point['arms'][arm]['acquire_p99_ms']} ms)"
                    for arm in arms
                ),
                flush=True,
            )
        versions = {
            "postgres": stack.pg.psql("SHOW server_version").split("'")[1],
            "etcd": _etcd_version(stack.etcd.url),
            "zookeeper": zk_version(stack.zk.port),
        }
    finally:
        if keepalive is not None:
            keepalive.stop()
        stack.stop()
        shutil.rmtree(work, ignore_errors=True)
    token_report = check_tokens(tokens.by_key)
    data = {
        "name": name,
        "arms": stack.arm_notes()
        if hasattr(stack, "arm_notes")
        else {
            "dlock-pg": "dlock lock server, LOCK_BACKEND=pg, HTTP (token: fencingToken)",
            "dlock-etcd": "dlock lock server, LOCK_BACKEND=etcd, HTTP (token: fencingToken)",
            "zookeeper": "kazoo 2.11.0 Lock recipe, ZooKeeper single node forceSync=yes"
            " (token: lock znode sequence)",
            "etcd-lock": "etcd v3lock Lock/Unlock via the JSON gateway, one lease per client"
            " (token: Lock answer's header revision)",
        },
        "versions": versions,
        "durability": "PostgreSQL fsync=on synchronous_commit=on; etcd WAL fsync; ZooKeeper"
        " forceSync=yes; all three data directories in one directory on one disk",
        "interleaved": f"{rounds} rounds × {seconds} s per arm and point, arm order rotated each"
        " round; an arm's figures are medians over rounds, the ratios medians of per-round ratios",
        "loadavg_1m_before_after": [round(load_before, 2), round(os.getloadavg()[0], 2)],
        "cpus": os.cpu_count(),
        "etcd_keepalives": {"sent": keepalive.sent, "failed": keepalive.failed}
        if keepalive
        else None,
        "tokens": token_report,
        "points": results,
    }
    (out / f"{name}.json").write_text(json.dumps(data, indent=2) + "\n")
    assert_tokens_increase(tokens.by_key)  # a violation fails the part, its numbers written
    return data


def _etcd_version(url: str) -> str:
    conn = _Http(url)
    try:
        status, body = conn.call("GET", "/version")
        return str(body.get("etcdserver", "?")) if status == 200 else "?"
    except (OSError, http.client.HTTPException):
        return "?"
    finally:
        conn.close()


if __name__ == "__main__":
    import sys

    print(json.dumps(run(sys.argv[1] if len(sys.argv) > 1 else ".run/bench"), indent=2))
