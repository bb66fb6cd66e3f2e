"""bench.peers' rounds: every grant's token logged per key and checked strictly increasing, one
arm driven for a round (pairs/s, latencies, CPU and durable writes per pair), and the medians and
goal ratios over the interleaved rounds.
"""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Callable

from bench.proc import tree_cpu_seconds
from bench.rounds import median

WARMUP_S = 0.3
PEERS = ("zookeeper", "etcd-lock")  # the durable lock services with a token dlock is held to


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
    shed = sum(getattr(c, "shed", 0) for c in clients) - shed_before
    written = (
        None if writes_before is None or writes_after is None else writes_after - writes_before
    )
    return _round_row(pairs, acquires, seconds, cpu, written, client_cpu, shed, errors)


def _round_row(
    pairs: list[list[float]],
    acquires: list[list[float]],
    seconds: float,
    cpu: dict[str, float],
    written: int | None,
    client_cpu: float,
    shed: int,
    errors: dict[str, int],
) -> dict:
    """One arm's round from its samples: rates, percentiles, CPU and durable writes per pair."""
    flat_pairs = [s for per in pairs for s in per]
    flat_acq = [s for per in acquires for s in per]
    count = len(flat_pairs)
    per_pair = None if written is None or not count else round(written / count, 2)
    return {
        "pairs": count,
        "writes_per_pair": per_pair,
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
        "shed_retried": shed,
        "errors": sum(errors.values()),
        "errors_by_kind": errors,
    }


def median_row(rows: list[dict]) -> dict:
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
        **{name: median(values) for name, values in per.items()},
        "rounds": per,
    }
