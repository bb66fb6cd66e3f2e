"""Server CPU per hot request, plain view against its DRF class, in one run (issue 18).

Not a test: `pytest tests/hotpath/measure_cpu.py -s` (HOTPATH_ROUNDS, default 3): a fresh live
stack plus, for each hot role, a process on tests.hotpath.reference_urls (the DRF classes),
same databases. One client sends
blocks of well-formed requests to one arm, then the other, interleaved; each block reads the
serving process tree's utime+stime from /proc (bench.proc.cpu_seconds) before and after. CPU
time per request, not wall time: the box is shared, and a sequential client keeps each process
to the request it is serving. Rows: L4+L6 pair (lock-server), P2 claim (payment-resource), rail
submission (rail-proxy, including its call to the stub, which is a separate process), P1 list
of 100 PENDING payouts and P4 read (payment-resource, the executor's JSON GETs), POST /submit
(rail-stub, called directly).
"""

from __future__ import annotations

import json
import os
import statistics
import uuid

import psycopg
import requests

from bench.proc import cpu_seconds
from devstack.common import free_port
from devstack.roles import RoleProcess
from dlock import proof
from tests.conftest import start_stack, stop_stack

OWNER = "w-cpu"
BLOCK = 60


def main(rounds: int = 3) -> dict:
    stack = start_stack("hvcpu")
    refs: dict[str, RoleProcess] = {}
    try:
        for role in ("lockserver", "payments", "railproxy", "railstub"):
            refs[role] = RoleProcess(
                role,
                free_port(),
                stack.env,
                stack.logdir / f"{role}-reference.log",
                app="tests.hotpath.reference_wsgi",
            ).start()
        arms = {
            "plain": {r: (stack.url(r), stack.procs[r].process.pid) for r in refs},
            "drf": {r: (p.url, p.process.pid) for r, p in refs.items()},
        }
        done = stack.manage(
            "seed_payouts",
            "--accounts=2",
            f"--payouts-per-account={BLOCK * (rounds + 1) + 5}",
            "--balance-minor=1000000000",
            "--amount-minor=100",
            "--json",
        )
        seeded = json.loads(done.stdout.strip().splitlines()[-1])
        with psycopg.connect(stack.env["PAY_DATABASE_URL"], autocommit=True) as conn:
            pool = {
                account: [
                    row[0]
                    for row in conn.execute(
                        "SELECT payout_id::text FROM payout WHERE account_id = %s", [account]
                    )
                ]
                for account in seeded["accounts"]
            }
        accounts = dict(zip(arms, seeded["accounts"], strict=True))
        tokens = {arm: 10 for arm in arms}
        http = requests.Session()
        results: dict[str, dict[str, list[float]]] = {}

        def lock_pair(arm: str) -> None:
            url = arms[arm]["lockserver"][0]
            sid = http.post(f"{url}/v1/sessions", json={"ownerId": OWNER}).json()["sessionId"]
            key = f"cpu.{uuid.uuid4().hex[:10]}"
            pid = arms[arm]["lockserver"][1]
            before = cpu_seconds(pid)
            for _ in range(BLOCK):
                grant = http.post(
                    f"{url}/v1/locks/{key}/acquire",
                    json={"sessionId": sid},
                    headers={"X-Owner-Id": OWNER},
                ).json()
                gone = http.delete(
                    f"{url}/v1/locks/{key}",
                    params={"sessionId": sid},
                    headers={
                        "X-Fencing-Token": str(grant["fencingToken"]),
                        "X-Fencing-Proof": grant["fencingProof"],
                        "X-Owner-Id": OWNER,
                    },
                )
                assert gone.status_code == 204, gone.text
            record(arm, "lockserver L4+L6 pair", (cpu_seconds(pid) - before) / BLOCK)

        issued: dict[str, int] = {}

        def claim_headers(arm: str, payout_id: str) -> dict[str, str]:
            # A fresh token per payout: the rail proxy fences an account's submissions by token.
            if payout_id not in issued:
                tokens[arm] += 1
                issued[payout_id] = tokens[arm]
            token = issued[payout_id]
            return {
                "X-Fencing-Token": str(token),
                "X-Fencing-Proof": proof.sign(key=proof.payout_key(accounts[arm]), token=token),
                "X-Owner-Id": OWNER,
                "X-Idempotency-Key": f"payout-{payout_id}",
            }

        def claims(arm: str) -> list[str]:
            url, pid = arms[arm]["payments"]
            ids = [pool[accounts[arm]].pop() for _ in range(BLOCK)]
            before = cpu_seconds(pid)
            for payout_id in ids:
                answer = http.post(
                    f"{url}/v1/payouts/{payout_id}/claim",
                    json={"expectedState": "PENDING"},
                    headers=claim_headers(arm, payout_id),
                )
                assert answer.status_code == 200, answer.text
            record(arm, "payments P2 claim", (cpu_seconds(pid) - before) / BLOCK)
            return ids

        def submissions(arm: str, ids: list[str]) -> None:
            url, pid = arms[arm]["railproxy"]
            refs_by_id = {payout_id: beneficiary(payout_id) for payout_id in ids}
            before = cpu_seconds(pid)
            for payout_id in ids:
                answer = http.post(
                    f"{url}/v1/rail/submissions",
                    json={
                        "payoutId": payout_id,
                        "accountId": accounts[arm],
                        "amountMinor": 100,
                        "currency": "EUR",
                        "beneficiaryRef": refs_by_id[payout_id],
                    },
                    headers=claim_headers(arm, payout_id),
                )
                assert answer.status_code == 200, answer.text
            record(arm, "railproxy submission", (cpu_seconds(pid) - before) / BLOCK)

        def beneficiary(payout_id: str) -> str:
            with psycopg.connect(stack.env["PAY_DATABASE_URL"], autocommit=True) as conn:
                return conn.execute(
                    "SELECT beneficiary_ref FROM payout WHERE payout_id = %s", [payout_id]
                ).fetchone()[0]

        def reads(arm: str, ids: list[str]) -> None:
            url, pid = arms[arm]["payments"]
            json_only = {"Accept": "application/json"}
            before = cpu_seconds(pid)
            for _ in range(BLOCK):
                page = http.get(
                    f"{url}/v1/payouts",
                    params={"state": "PENDING", "limit": 100},
                    headers=json_only,
                )
                assert page.status_code == 200, page.text
            record(arm, "payments P1 list (100 items)", (cpu_seconds(pid) - before) / BLOCK)
            before = cpu_seconds(pid)
            for payout_id in ids:
                answer = http.get(f"{url}/v1/payouts/{payout_id}", headers=json_only)
                assert answer.status_code == 200, answer.text
            record(arm, "payments P4 read", (cpu_seconds(pid) - before) / BLOCK)

        def stub_calls(arm: str) -> None:
            url, pid = arms[arm]["railstub"]
            before = cpu_seconds(pid)
            for _ in range(BLOCK):
                answer = http.post(
                    f"{url}/submit",
                    json={
                        "clientRef": f"cpu-{uuid.uuid4()}",
                        "amountMinor": 100,
                        "currency": "EUR",
                    },
                )
                assert answer.status_code == 200, answer.text
            record(arm, "railstub submit", (cpu_seconds(pid) - before) / BLOCK)

        def one_round(arm: str) -> None:
            lock_pair(arm)
            ids = claims(arm)
            submissions(arm, ids)
            reads(arm, ids)
            stub_calls(arm)

        def record(arm: str, row: str, seconds: float) -> None:
            results.setdefault(row, {}).setdefault(arm, []).append(round(seconds * 1000, 3))

        for arm in arms:  # warm-up: imports, pools, first connections
            one_round(arm)
        results.clear()
        for index in range(rounds):
            order = list(arms) if index % 2 == 0 else list(reversed(arms))
            for arm in order:
                one_round(arm)
        summary = {
            row: {
                **{f"{arm}_ms": values for arm, values in by_arm.items()},
                "median_plain_ms": statistics.median(by_arm["plain"]),
                "median_drf_ms": statistics.median(by_arm["drf"]),
            }
            for row, by_arm in results.items()
        }
        print(json.dumps(summary, indent=2))
        return summary
    finally:
        for process in refs.values():
            process.stop()
        stop_stack(stack)


def test_measure() -> None:
    summary = main(int(os.environ.get("HOTPATH_ROUNDS", "3")))
    assert set(summary) == {
        "lockserver L4+L6 pair",
        "payments P2 claim",
        "railproxy submission",
        "payments P1 list (100 items)",
        "payments P4 read",
        "railstub submit",
    }
