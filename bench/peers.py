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
- `etcd-lock-grpc`: the same lock API over grpcio (stubs generated from etcd's .proto files,
  `lockserver.etcd_proto`), a channel and a lease per client: etcd's lock on its best client.
- `etcd-recipe-grpc`: the lock recipe at its barest over gRPC (dlock's own etcd client): one
  transaction creating the key on the client's lease if it is absent, one delete; token = the
  create revision. The store work dlock's etcd backend is measured against.

Workloads: `own` (each client loops acquire+release on a key of its own: the path, no queueing)
at 1, 8 and 32 clients, and `hot` (every client on one shared key: the queue) at 8 and 32. A
client is a thread with its own session and connection; dlock's and etcd's HTTP arms use the same
stdlib keep-alive client, ZooKeeper uses kazoo. dlock's hot-key acquire waits server-side
(waitMillis) and honours 429 CONTENTION_EXCEEDED's retryAfterMillis, as a client should.

Per point, BENCH_PEERS_ROUNDS rounds (default 3) of BENCH_PEERS_ROUND_S seconds (default 2) per
arm, arms interleaved and their order rotated each round; each arm's sessions are opened once per
point and kept for every round (BENCH_PEERS_POINTS, e.g. "own:8,hot:32", and BENCH_PEERS_ARMS,
e.g. "dlock-etcd,etcd-lock", run a subset). Per arm and round: pairs/s, p50/p99 of acquire
and of the pair, errors, and the server processes' CPU per pair (utime+stime from
/proc/<pid>/stat, process trees: the lock server role (gunicorn, and its proxy when it has one)
+ PostgreSQL for dlock-pg, + etcd for dlock-etcd; the JVM; etcd). An arm's figure is the median
over its rounds; the goal ratios are medians of per-round ratios.

Durable writes per pair (issue 39 item 2), counted by each store over the arm's window: dlock-pg
the transaction ids PostgreSQL assigned (one per transaction that wrote; read-only ones take
none), dlock-etcd and etcd-lock etcd's committed raft proposals
(`etcd_server_proposals_committed_total`; a lease keepalive is not one), zookeeper the zxids
(`srvr`). Each store's own background writes in the window (the lock servers' housekeeping)
are included, so the figure is an upper bound.

Per etcd arm and round, from etcd's own counters over the window, per pair: the CPU of the etcd
process alone (`etcd_cpu_ms_per_pair`), the key writes it executed (`etcd_put_delete_ops_per_pair`:
`etcd_mvcc_put_total` + `etcd_mvcc_delete_total`, one per put and per delete operation, a delete
that matched no key included; etcd counts no finer) and the watch events it sent
(`etcd_debugging_mvcc_events_total`; the lock servers' watchers and the recipes' waiters). The
compares a dlock-etcd pair sends are fixed by its code and tested
(tests/lockserver/test_etcd_calls_per_pair.py), not counted here. `etcd_ratios` are the issue's
etcd goals: dlock-etcd's etcd CPU per pair ÷ etcd-lock-grpc's, and dlock-etcd's pairs/s ÷
dlock-pg's and ÷ etcd-lock's (gateway), medians of per-round ratios.

Every grant's token is logged per key while it is held; `check_tokens` asserts strictly
increasing per key (a violation fails the run). Writes `<out>/peers.json`.

The arms' clients are `bench.peer_clients`, a round and the token check `bench.peer_rounds`;
this module owns the stack and the run.
"""

from __future__ import annotations

import http.client
import json
import logging
import os
import re
import secrets
import shutil
import tempfile
import threading
import uuid
from collections.abc import Callable
from pathlib import Path

from bench import credentials
from bench.peer_clients import (
    DlockClient,
    EtcdGrpcLockClient,
    EtcdKeepalive,
    EtcdLockClient,
    EtcdRecipeClient,
    Http,
    ZkLockClient,
    etcd_version,
)
from bench.peer_rounds import (
    TokenLog,
    assert_tokens_increase,
    check_tokens,
    drive,
    median_row,
    ratios,
)
from bench.rounds import median, rotated
from bench.zookeeper import ZooKeeperServer
from bench.zookeeper import version as zk_version
from bench.zookeeper import write_count as zk_write_count
from devstack.common import free_port
from devstack.etcd import EtcdServer
from devstack.postgres import PgCluster
from devstack.roles import RoleProcess, manage

__all__ = ["ARMS", "POINTS", "ROUNDS", "ROUND_S", "run"]


ROUNDS = int(os.environ.get("BENCH_PEERS_ROUNDS", "3"))
ROUND_S = float(os.environ.get("BENCH_PEERS_ROUND_S", "2"))
ALL_POINTS = (("own", 1), ("own", 8), ("own", 32), ("hot", 8), ("hot", 32))
ALL_ARMS = (
    "dlock-pg",
    "dlock-etcd",
    "zookeeper",
    "etcd-lock",
    "etcd-lock-grpc",
    "etcd-recipe-grpc",
)
# arms whose store is etcd: etcd's own CPU, keys written and watch events per pair
ETCD_ARMS = ("dlock-etcd", "etcd-lock", "etcd-lock-grpc", "etcd-recipe-grpc")
ETCD_COUNTERS = {
    "put": "etcd_mvcc_put_total",
    "delete": "etcd_mvcc_delete_total",
    "events": "etcd_debugging_mvcc_events_total",
}


def chosen_points(text: str) -> tuple[tuple[str, int], ...]:
    """BENCH_PEERS_POINTS, e.g. "own:8,hot:32" (a subset to re-measure); empty: every point."""
    chosen = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        workload, _, clients = part.partition(":")
        if workload not in ("own", "hot") or not clients.isdigit():
            raise ValueError(f"BENCH_PEERS_POINTS: {part!r} is not own:N or hot:N")
        chosen.append((workload, int(clients)))
    return tuple(chosen) or ALL_POINTS


def chosen_arms(text: str) -> tuple[str, ...]:
    """BENCH_PEERS_ARMS, e.g. "dlock-etcd,etcd-lock"; empty: every arm."""
    chosen = tuple(filter(None, (a.strip() for a in text.split(","))))
    unknown = [arm for arm in chosen if arm not in ALL_ARMS]
    if unknown:
        raise ValueError(f"BENCH_PEERS_ARMS: unknown arm(s) {unknown}, known {ALL_ARMS}")
    return chosen or ALL_ARMS


POINTS = chosen_points(os.environ.get("BENCH_PEERS_POINTS", ""))
ARMS = chosen_arms(os.environ.get("BENCH_PEERS_ARMS", ""))


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
        if arm in ETCD_ARMS and arm not in self.servers:
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

    def _etcd_metrics(self) -> str:
        conn = Http(self.etcd.url)
        try:
            conn.conn.request("GET", "/metrics")
            return conn.conn.getresponse().read().decode()
        except (OSError, http.client.HTTPException):
            return ""
        finally:
            conn.close()

    def _etcd_proposals(self) -> int | None:
        return _counter(self._etcd_metrics(), "etcd_server_proposals_committed_total")

    def etcd_counters(self) -> dict[str, int | None]:
        """etcd's keys-written and watch-event counters now (ETCD_COUNTERS)."""
        text = self._etcd_metrics()
        return {name: _counter(text, metric) for name, metric in ETCD_COUNTERS.items()}

    def client_factory(
        self, arm: str, keepalive: EtcdKeepalive
    ) -> Callable[[int, str, bool], object]:
        if arm == "zookeeper":
            return lambda index, key, hot: ZkLockClient(self.zk.hosts, key)
        if arm == "etcd-lock":
            return lambda index, key, hot: EtcdLockClient(self.etcd.url, key, keepalive)
        if arm == "etcd-lock-grpc":
            return lambda index, key, hot: EtcdGrpcLockClient(self.etcd.url, key, keepalive)
        if arm == "etcd-recipe-grpc":
            return lambda index, key, hot: EtcdRecipeClient(self.etcd.url, key, keepalive)
        url = self.servers[arm].url
        return lambda index, key, hot: DlockClient(url, key, index, hot)

    def stop(self) -> None:
        for server in self.servers.values():
            server.stop()
        self.zk.stop()
        self.etcd.stop()
        self.pg.stop("immediate")


def _counter(text: str, metric: str) -> int | None:
    found = re.search(rf"^{metric} (\S+)$", text, re.M)
    return int(float(found.group(1))) if found else None


def with_etcd_work(row: dict, before: dict, after: dict) -> dict:
    """An etcd arm's round row with etcd's own CPU, keys written and watch events per pair."""
    pairs = row["pairs"]
    delta = {
        name: None if before[name] is None or after[name] is None else after[name] - before[name]
        for name in ETCD_COUNTERS
    }
    written = (
        None if delta["put"] is None or delta["delete"] is None else delta["put"] + delta["delete"]
    )
    etcd_cpu = (row.get("server_cpu_ms_per_pair_by_process") or {}).get("etcd")
    return {
        **row,
        "etcd_cpu_ms_per_pair": etcd_cpu,
        "etcd_put_delete_ops_per_pair": round(written / pairs, 2)
        if pairs and written is not None
        else None,
        "etcd_watch_events_per_pair": round(delta["events"] / pairs, 2)
        if pairs and delta["events"] is not None
        else None,
    }


def etcd_ratios(rounds: list[dict]) -> dict:
    """The etcd goals per round and their medians: dlock-etcd's etcd CPU per pair ÷
    etcd-lock-grpc's, dlock-etcd's pairs/s ÷ dlock-pg's and ÷ etcd-lock's (gateway)."""

    def ratio(one: dict, top: str, bottom: str, field: str) -> float | None:
        a, b = one["arms"].get(top), one["arms"].get(bottom)
        if not a or not b or not a.get(field) or not b.get(field):
            return None
        return round(a[field] / b[field], 3)

    per = {
        "etcd_cpu_over_etcd_lock_grpc": [
            ratio(one, "dlock-etcd", "etcd-lock-grpc", "etcd_cpu_ms_per_pair") for one in rounds
        ],
        "etcd_over_pg": [ratio(one, "dlock-etcd", "dlock-pg", "pairs_per_s") for one in rounds],
        "etcd_over_etcd_lock": [
            ratio(one, "dlock-etcd", "etcd-lock", "pairs_per_s") for one in rounds
        ],
        "etcd_over_etcd_lock_grpc": [
            ratio(one, "dlock-etcd", "etcd-lock-grpc", "pairs_per_s") for one in rounds
        ],
    }
    return {**{name: median(values) for name, values in per.items()}, "rounds": per}


def _etcd_medians(rows: list[dict]) -> dict:
    fields = ("etcd_cpu_ms_per_pair", "etcd_put_delete_ops_per_pair", "etcd_watch_events_per_pair")
    return {field: median([r.get(field) for r in rows]) for field in fields}


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
            results.append(
                _run_point(stack, keepalive, tokens, workload, n, arms, rounds, seconds, name)
            )
        versions = {
            "postgres": stack.pg.psql("SHOW server_version").split("'")[1],
            "etcd": etcd_version(stack.etcd.url),
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
        "arms": _arm_notes(stack),
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


def _run_point(
    stack: _Stack,
    keepalive: EtcdKeepalive,
    tokens: TokenLog,
    workload: str,
    n: int,
    arms: tuple[str, ...],
    rounds: int,
    seconds: float,
    name: str,
) -> dict:
    """One point (workload × clients): every arm's sessions opened once, then `rounds`
    interleaved rounds with the arm order rotated each round."""
    hot = workload == "hot"
    run_id = uuid.uuid4().hex[:6]
    keys = {
        arm: [f"bench.{workload}.{run_id}" if hot else f"bench.{run_id}.{i}" for i in range(n)]
        for arm in arms
    }
    opened = {arm: _open(stack.client_factory(arm, keepalive), n, keys[arm], hot) for arm in arms}
    done = []
    try:
        for index in range(rounds):
            order = rotated(arms, index)
            one = {"round": index + 1, "order": list(order), "arms": {}}
            for arm in order:
                etcd_before = stack.etcd_counters() if arm in ETCD_ARMS else None
                row = drive(
                    arm,
                    opened[arm],
                    keys[arm],
                    seconds,
                    stack.server_pids(arm),
                    tokens,
                    stack.write_counter(arm),
                )
                if etcd_before is not None:
                    row = with_etcd_work(row, etcd_before, stack.etcd_counters())
                one["arms"][arm] = row
            one["loadavg_1m"] = round(os.getloadavg()[0], 2)
            done.append(one)
    finally:
        for clients in opened.values():
            for client in clients:
                _close(client)
    point = {
        "workload": workload,
        "clients": n,
        "arms": {
            arm: {
                **median_row([r["arms"][arm] for r in done]),
                **(_etcd_medians([r["arms"][arm] for r in done]) if arm in ETCD_ARMS else {}),
            }
            for arm in arms
        },
        "ratios": ratios(done),
        "etcd_ratios": etcd_ratios(done),
        "rounds": done,
    }
    print(
        f"[bench] {name} {workload} ×{n}: "
        + ", ".join(
            f"{arm} {point['arms'][arm]['pairs_per_s']}/s"
            f" (p99 acq {point['arms'][arm]['acquire_p99_ms']} ms)"
            for arm in arms
        ),
        flush=True,
    )
    return point


def _arm_notes(stack: _Stack) -> dict[str, str]:
    if hasattr(stack, "arm_notes"):
        return stack.arm_notes()
    return {
        "dlock-pg": "dlock lock server, LOCK_BACKEND=pg, HTTP (token: fencingToken)",
        "dlock-etcd": "dlock lock server, LOCK_BACKEND=etcd, HTTP (token: fencingToken)",
        "zookeeper": "kazoo 2.11.0 Lock recipe, ZooKeeper single node forceSync=yes"
        " (token: lock znode sequence)",
        "etcd-lock": "etcd v3lock Lock/Unlock via the JSON gateway, one lease per client"
        " (token: Lock answer's header revision)",
        "etcd-lock-grpc": "etcd v3lock Lock/Unlock over grpcio, a channel and a lease per client"
        " (token: Lock answer's header revision)",
        "etcd-recipe-grpc": "create-if-absent txn on the client's lease + delete, over grpcio"
        " (token: the create revision)",
    }


if __name__ == "__main__":
    import sys

    print(json.dumps(run(sys.argv[1] if len(sys.argv) > 1 else ".run/bench"), indent=2))
