"""Client CPU per call and executor CPU per payout: urllib3 (dlock.http now), requests, and the
hand-written client dlock.http replaced (issue 25.4, CHANGELOG "clients on urllib3").

Not a test: `pytest tests/hotpath/measure_client_cpu.py -s` (CLIENT_CPU_ROUNDS, default 3). A fresh
live stack; the old client is read from git (commit BASELINE) into a throwaway module, never
kept in the tree. CPU is this process's `time.process_time()` (the client side only: the servers
are other processes), per call in interleaved blocks, so a shared box shifts every arm alike.

Rows: P4 read (GET, the executor's advisory read), L4 acquire + L6 release (two POST/DELETE to
the lock server), and a whole payout through an in-process Executor (lock, claim, submit,
post, release, plus its share of listing and heartbeats).
"""

from __future__ import annotations

import importlib.util
import json
import os
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from typing import Any

import requests

from devstack.common import PROJECT
from dlock.auth import authorization_header
from dlock.budgets import BUDGETS
from tests.conftest import start_stack, stop_stack

BASELINE = "55d13fe"  # the tree before the clients moved to urllib3
BLOCK = 200
PAYOUTS = 40


def _old_http() -> Any:
    source = subprocess.run(
        ["git", "show", f"{BASELINE}:dlock/http.py"],
        cwd=PROJECT,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    spec = importlib.util.spec_from_loader("dlock_http_baseline", loader=None)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    exec(compile(source, "dlock_http_baseline.py", "exec"), module.__dict__)  # noqa: S102
    return module


def _cpu_per(fn: Callable[[], None], n: int) -> float:
    start = time.process_time()
    for _ in range(n):
        fn()
    return (time.process_time() - start) / n * 1000.0  # ms


def main(rounds: int = 3) -> dict[str, Any]:
    stack = start_stack("clcpu")
    os.environ.update({k: v for k, v in stack.env.items() if k.startswith("DLOCK_")})
    try:
        return _measure(stack, rounds)
    finally:
        stop_stack(stack)


def _measure(stack: Any, rounds: int) -> dict[str, Any]:
    import dlock.client.transport as transport
    import dlock.http as new
    from executor.worker import Executor

    old = _old_http()
    seeded = json.loads(
        stack.manage(
            "seed_payouts",
            "--accounts=8",
            f"--payouts-per-account={PAYOUTS * 2 * (rounds + 1) // 8 + 2}",
            "--balance-minor=1000000000",
            "--amount-minor=100",
            "--json",
        )
        .stdout.strip()
        .splitlines()[-1]
    )
    some_payout = seeded["payouts"][0]
    some_payout = some_payout if isinstance(some_payout, str) else some_payout["payoutId"]
    payments, locks = stack.url("payments"), stack.url("lockserver")
    auth = authorization_header("executor")
    read_hop = BUDGETS["advisory.read"]
    session = requests.Session()

    def new_session() -> str:  # one per block: no heartbeat runs here
        return session.post(
            f"{locks}/v1/sessions", json={"ownerId": "w-cpu", "ttlMillis": 60_000}, headers=auth
        ).json()["sessionId"]

    def p4(module: Any) -> Callable[[], None]:
        def one() -> None:
            reply = module.exchange(
                "GET", f"{payments}/v1/payouts/{some_payout}", hop=read_hop, headers=auth
            )
            assert reply.status == 200

        return one

    def p4_requests() -> None:
        answer = session.get(
            f"{payments}/v1/payouts/{some_payout}", headers=auth, timeout=read_hop.timeout
        )
        assert answer.status_code == 200

    def pair(module: Any) -> Callable[[], None]:
        key = f"cpu.{uuid.uuid4().hex[:8]}"
        sid = new_session()
        hop = BUDGETS["lock.acquire"]

        def one() -> None:
            grant = module.exchange(
                "POST",
                f"{locks}/v1/locks/{key}/acquire",
                hop=hop,
                owner_id="w-cpu",
                json_body={"sessionId": sid},
                headers=auth,
            ).body
            gone = module.exchange(
                "DELETE",
                f"{locks}/v1/locks/{key}",
                hop=hop,
                owner_id="w-cpu",
                params={"sessionId": sid},
                headers={
                    **auth,
                    "X-Fencing-Token": str(grant["fencingToken"]),
                    "X-Fencing-Proof": grant["fencingProof"],
                },
            )
            assert gone.status == 204

        return one

    def pair_requests() -> Callable[[], None]:
        key = f"cpu.{uuid.uuid4().hex[:8]}"
        sid = new_session()
        hop = BUDGETS["lock.acquire"]

        def one() -> None:
            grant = session.post(
                f"{locks}/v1/locks/{key}/acquire",
                json={"sessionId": sid},
                headers={**auth, "X-Owner-Id": "w-cpu"},
                timeout=hop.timeout,
            ).json()
            gone = session.delete(
                f"{locks}/v1/locks/{key}",
                params={"sessionId": sid},
                headers={
                    **auth,
                    "X-Owner-Id": "w-cpu",
                    "X-Fencing-Token": str(grant["fencingToken"]),
                    "X-Fencing-Proof": grant["fencingProof"],
                },
                timeout=hop.timeout,
            )
            assert gone.status_code == 204, gone.text

        return one

    def payouts(module: Any) -> float:
        """Executor CPU per payout with `module` as the transport under dlock.client."""
        saved = transport.exchange, transport.pool_for
        transport.exchange, transport.pool_for = module.exchange, module.pool_for
        try:
            executor = Executor(
                owner_id=f"cpu-{uuid.uuid4().hex[:6]}",
                lock_url=locks,
                payments_url=payments,
                rail_proxy_url=stack.url("railproxy"),
            )
            start = time.process_time()
            executor.run(max_payouts=PAYOUTS)
            spent = time.process_time() - start
            posted = executor.outcomes.get("posted", 0)
            assert posted >= PAYOUTS // 2, executor.outcomes
        finally:
            transport.exchange, transport.pool_for = saved
        return spent / posted * 1000.0

    arms: dict[str, dict[str, Callable[[], float]]] = {
        "P4 read": {
            "handwritten": lambda: _cpu_per(p4(old), BLOCK),
            "urllib3": lambda: _cpu_per(p4(new), BLOCK),
            "requests": lambda: _cpu_per(p4_requests, BLOCK),
        },
        "L4+L6 pair": {
            "handwritten": lambda: _cpu_per(pair(old), BLOCK // 2),
            "urllib3": lambda: _cpu_per(pair(new), BLOCK // 2),
            "requests": lambda: _cpu_per(pair_requests(), BLOCK // 2),
        },
        "executor per payout": {
            "handwritten": lambda: payouts(old),
            "urllib3": lambda: payouts(new),
        },
    }
    for row in arms.values():  # warm every path (imports, pools, server caches) once
        for measure in row.values():
            measure()
    results: dict[str, dict[str, list[float]]] = {row: {} for row in arms}
    for index in range(rounds):
        for row, by_arm in arms.items():
            order = list(by_arm) if index % 2 == 0 else list(reversed(by_arm))
            for arm in order:
                results[row].setdefault(arm, []).append(round(by_arm[arm](), 4))
    summary = {
        row: {
            **{f"{arm}_ms": values for arm, values in by_arm.items()},
            **{f"median_{arm}_ms": statistics.median(v) for arm, v in by_arm.items()},
        }
        for row, by_arm in results.items()
    }
    print(json.dumps(summary, indent=2))
    return summary


def test_measure_clients() -> None:
    summary = main(int(os.environ.get("CLIENT_CPU_ROUNDS", "3")))
    assert set(summary) == {"P4 read", "L4+L6 pair", "executor per payout"}
