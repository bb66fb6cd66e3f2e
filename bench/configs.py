"""Lock-server configurations side by side (issue 39): the peers' workload, with several dlock
lock servers as arms, each its own configuration, interleaved with ZooKeeper/kazoo in one run.

Two sets, each an optional part of `python -m bench`:

- `configs` — the defaults chosen by measurement (ARCHITECTURE decisions 23 and 24): the per-key
  waiter cap (`LOCK_MAX_WAITERS_PER_KEY`), the per-process wait cap (`LOCK_MAX_WAITS_PER_PROCESS`)
  and gunicorn's threads and processes, at hot key × 32 and own keys × 8 and × 32.
- `scale` — the scale curve: pg lock-server processes 1, 2, 4 (`GUNICORN_WORKERS`) and replicas
  1, 2 (separate lock servers on one database, clients spread over them round-robin), and the
  etcd backend on 1 and on 3 members, at own keys × 8 and × 32 and hot key × 8.

Each arm's figures are medians over the rounds (bench.peers); the ratios here are medians of the
per-round ratio to ZooKeeper's pairs/s (and p99 acquire). A replica's and a member's CPU is summed
into the arm's lock-server and store CPU. Writes `<out>/configs.json` or `<out>/scale.json`.
"""

from __future__ import annotations

import os
import secrets
import statistics
from pathlib import Path

from bench import credentials, peers
from bench.peers import EtcdKeepalive, _Http, _Stack
from devstack import RoleProcess, free_port, manage
from devstack.etcd import etcd_cluster

# label: (backend, environment over the lock server's, replicas, etcd members)
Variant = tuple[str, dict[str, str], int, int]

CONFIGS: dict[str, Variant] = {
    # the defaults before issue 39's choice: cap 8, 16 waits, 32 threads, 16 pool places
    "pg-cap8-t32": (
        "pg",
        {
            "LOCK_MAX_WAITERS_PER_KEY": "8",
            "LOCK_MAX_WAITS_PER_PROCESS": "16",
            "GUNICORN_THREADS": "32",
            "DB_POOL_MAX_WAITING": "16",
        },
        1,
        1,
    ),
    "pg-cap32-t64-q16": ("pg", {"DB_POOL_MAX_WAITING": "16"}, 1, 1),
    # the defaults chosen (settings/base.py, settings/gunicorn.py): cap 32, 40 waits, 64 threads,
    # every thread a place in the database slot queue, one process
    "pg-cap32-t64-q64": ("pg", {}, 1, 1),
    "pg-cap32-t64-q64-w2": ("pg", {"GUNICORN_WORKERS": "2"}, 1, 1),
}
CONFIG_POINTS = (("hot", 32), ("own", 8), ("own", 32))

SCALE: dict[str, Variant] = {
    "pg-w1": ("pg", {}, 1, 1),
    "pg-w2": ("pg", {"GUNICORN_WORKERS": "2"}, 1, 1),
    "pg-w4": ("pg", {"GUNICORN_WORKERS": "4"}, 1, 1),
    "pg-w1-r2": ("pg", {}, 2, 1),
    "etcd-m1": ("etcd", {}, 1, 1),
    "etcd-m3": ("etcd", {}, 1, 3),
}
SCALE_POINTS = (("own", 8), ("own", 32), ("hot", 8))


class VariantStack(_Stack):
    """PostgreSQL, etcd (one member, and three when an arm asks) and ZooKeeper; a lock server (or
    several replicas) per variant, each on its own database or etcd prefix."""

    def __init__(self, work: Path, variants: dict[str, Variant]) -> None:
        super().__init__(work)
        self.variants = variants
        self.etcd3: list = []
        self.replicas: dict[str, list[RoleProcess]] = {}

    def start(self) -> None:
        self.pg.start()
        self.etcd.start()
        self.zk.start()
        if any(members == 3 for _, _, _, members in self.variants.values()):
            ports = [(free_port(), free_port()) for _ in range(3)]
            self.etcd3 = etcd_cluster(self.work / "etcd3", ports)
            for member in self.etcd3:
                member.start(wait=False)
            for member in self.etcd3:
                member.wait_healthy()
        base = {
            "DJANGO_SECRET_KEY": os.environ.get("DJANGO_SECRET_KEY") or secrets.token_urlsafe(48),
            "DJANGO_DEBUG": "false",
            "DLOCK_LOG_LEVEL": "WARNING",
            "LOCK_RETRY_BUDGET": "1000000",
            **credentials.server_env(),
        }
        for index, (label, (backend, extra, replicas, members)) in enumerate(self.variants.items()):
            env = {
                **base,
                "LOCK_BACKEND": backend,
                "LOCK_DATABASE_URL": self.pg.create_database(f"bench_cfg_{index}"),
                **extra,
            }
            if backend == "etcd":
                cluster = self.etcd3 if members == 3 else [self.etcd]
                env["ETCD_URL"] = ",".join(m.url for m in cluster)
                env["ETCD_PREFIX"] = f"dlock{index}/"
            manage(["migrate", "--no-input", "-v", "0"], env, role="lockserver")
            self.replicas[label] = [
                RoleProcess(
                    "lockserver", free_port(), env, self.work / f"{label}-{n}.log", name=label
                ).start()
                for n in range(replicas)
            ]

    def _etcd_of(self, arm: str) -> list:
        return self.etcd3 if self.variants[arm][3] == 3 else [self.etcd]

    def server_pids(self, arm: str) -> dict[str, int]:
        if arm not in self.variants:
            return super().server_pids(arm)
        pids = {}
        for n, server in enumerate(self.replicas[arm]):
            assert server.process is not None
            pids["lockserver" if n == 0 else f"lockserver-{n + 1}"] = server.process.pid
        if self.variants[arm][0] == "pg":
            pids["postgres"] = self.postmaster_pid()
        else:
            for n, member in enumerate(self._etcd_of(arm)):
                assert member.process is not None
                pids[f"etcd-{n + 1}"] = member.process.pid
        return pids

    def write_counter(self, arm: str):
        if arm not in self.variants:
            return super().write_counter(arm)
        if self.variants[arm][0] == "pg":
            return self._pg_xids
        url = self._etcd_of(arm)[0].url
        return lambda: _proposals(url)

    def client_factory(self, arm: str, keepalive: EtcdKeepalive):
        if arm not in self.variants:
            return super().client_factory(arm, keepalive)
        urls = [server.url for server in self.replicas[arm]]
        return lambda index, key, hot: peers.DlockClient(urls[index % len(urls)], key, index, hot)

    def arm_notes(self) -> dict[str, str]:
        notes = {
            label: f"dlock lock server, LOCK_BACKEND={backend}, {replicas} replica(s),"
            f" {members} etcd member(s) if etcd; {extra or 'the defaults'}"
            for label, (backend, extra, replicas, members) in self.variants.items()
        }
        notes["zookeeper"] = "kazoo Lock recipe, ZooKeeper single node forceSync=yes"
        return notes

    def stop(self) -> None:
        for servers in self.replicas.values():
            for server in servers:
                server.stop()
        for member in self.etcd3:
            member.stop()
        super().stop()


def _proposals(url: str) -> int | None:
    import re

    conn = _Http(url)
    try:
        conn.conn.request("GET", "/metrics")
        text = conn.conn.getresponse().read().decode()
    except OSError:
        return None
    finally:
        conn.close()
    found = re.search(r"^etcd_server_proposals_committed_total (\S+)$", text, re.M)
    return int(float(found.group(1))) if found else None


def _over_zookeeper(data: dict) -> None:
    """Per point and arm: the medians of the per-round ratios to ZooKeeper (pairs/s, p99
    acquire), and the lock server's CPU per pair summed over its replicas."""
    for point in data["points"]:
        point["over_zookeeper"] = {}
        for arm in point["arms"]:
            if arm == "zookeeper":
                continue
            rate, p99, cpu = [], [], []
            for one in point["rounds"]:
                row, zk = one["arms"][arm], one["arms"].get("zookeeper")
                if zk and zk["pairs_per_s"]:
                    rate.append(row["pairs_per_s"] / zk["pairs_per_s"])
                if zk and zk["pairs"] and row["pairs"] and zk["acquire_p99_ms"]:
                    p99.append(row["acquire_p99_ms"] / zk["acquire_p99_ms"])
                by = row.get("server_cpu_ms_per_pair_by_process") or {}
                own = [v for k, v in by.items() if k.startswith("lockserver") and v is not None]
                if own:
                    cpu.append(sum(own))
            point["over_zookeeper"][arm] = {
                "pairs_per_s": round(statistics.median(rate), 3) if rate else None,
                "acquire_p99": round(statistics.median(p99), 3) if p99 else None,
            }
            point["arms"][arm]["lockserver_cpu_ms_per_pair_all"] = (
                round(statistics.median(cpu), 3) if cpu else None
            )


def table(data: dict) -> list[str]:
    lines = [
        f"{'arm':<18} {'point':<8} {'pairs/s':>8} {'÷ZK':>6} {'p99 acq ms':>11} {'÷ZK':>6}"
        f" {'ls CPU ms/pair':>15} {'errors':>6}"
    ]
    for point in data["points"]:
        where = f"{point['workload']}×{point['clients']}"
        for arm, row in point["arms"].items():
            ratio = point["over_zookeeper"].get(arm, {})
            lines.append(
                f"{arm:<18} {where:<8} {row['pairs_per_s']:>8} {ratio.get('pairs_per_s') or '':>6}"
                f" {row['acquire_p99_ms']:>11} {ratio.get('acquire_p99') or '':>6}"
                f" {row.get('lockserver_cpu_ms_per_pair_all') or '':>15} {row['errors']:>6}"
            )
    return lines


def _run(name: str, variants: dict[str, Variant], points, out_dir) -> dict:
    only = os.environ.get("BENCH_CONFIGS_ARMS")
    if only:
        variants = {k: v for k, v in variants.items() if k in only.split(",")}
    data = peers.run(
        out_dir,
        points=points,
        arms=(*variants, "zookeeper"),
        stack_factory=lambda work: VariantStack(work, variants),
        name=name,
    )
    _over_zookeeper(data)
    data["table"] = table(data)
    (Path(out_dir) / f"{name}.json").write_text(peers.json.dumps(data, indent=2) + "\n")
    print("\n".join(data["table"]), flush=True)
    return data


def run(out_dir: str | Path = ".run/bench") -> dict:
    return _run("configs", CONFIGS, CONFIG_POINTS, out_dir)


def run_scale(out_dir: str | Path = ".run/bench") -> dict:
    return _run("scale", SCALE, SCALE_POINTS, out_dir)
