"""A private four-service stack for the executor tests (its rail-stub faults are ours to turn)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest
import requests
from psycopg import sql

from devstack.common import PROJECT, PYTHON, free_port, wait_until
from devstack.roles import RoleProcess
from tests.conftest import LiveStack, start_stack, stop_stack

# Short leases so takeovers happen within a test; the proxy's rail read timeout short so an
# injected drop becomes RAIL_AMBIGUOUS in ~1.5 s rather than 8 s.
STACK_ENV = {
    "RAIL_READ_TIMEOUT_MS": "1500",
    "RAIL_SWEEP_INTERVAL_MS": "500",
    "RAIL_SWEEP_MARGIN_MS": "500",
    "LOCK_HOUSEKEEPING_MS": "200",
}
LOCK_TTL_MS = 2_000


@pytest.fixture(scope="session")
def exec_stack():
    stack = start_stack("exec", STACK_ENV)
    yield stack
    stop_stack(stack)


@pytest.fixture
def rail(exec_stack):
    """Turn the rail stub's faults for one test; a well-behaved rail again afterwards."""
    yield lambda *args: exec_stack.manage("railstub_config", *args)
    exec_stack.manage("railstub_config", "--reset")


def seed(stack: LiveStack, *, accounts: int, per_account: int, balance: int, amount: int) -> dict:
    out = stack.manage(
        "seed_payouts",
        "--accounts",
        str(accounts),
        "--payouts-per-account",
        str(per_account),
        "--balance-minor",
        str(balance),
        "--amount-minor",
        str(amount),
        "--json",
    ).stdout
    return json.loads(out.strip().splitlines()[-1])


def owner_id(name: str) -> str:
    """A fresh executor owner id: `name` plus a random suffix, so reruns never collide."""
    return f"{name}-{uuid.uuid4().hex[:6]}"


def payout_ids(seeded: dict) -> list[str]:
    return [p if isinstance(p, str) else p["payoutId"] for p in seeded["payouts"]]


def account_ids(seeded: dict) -> list[str]:
    return [a if isinstance(a, str) else a["accountId"] for a in seeded["accounts"]]


@dataclass
class ExecutorProcess:
    owner_id: str
    process: subprocess.Popen
    log: Path

    @property
    def pid(self) -> int:
        return self.process.pid

    def events(self, name: str | None = None) -> list[dict]:
        found = []
        for line in self.log.read_text(errors="replace").splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if name is None or record.get("event") == name:
                found.append(record)
        return found

    def wait(self, timeout: float = 60) -> int:
        return self.process.wait(timeout)

    def wait_stopped(self, timeout: float = 30) -> None:
        """Until the process SIGSTOPped itself at its pause phase."""
        wait_until(
            lambda: _proc_state(self.pid) == "T" or self.process.poll() is not None,
            timeout=timeout,
            what=f"{self.owner_id} to stop at its pause phase",
        )
        assert self.process.poll() is None, self.log.read_text()[-3000:]


def _proc_state(pid: int) -> str | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return None
    return re.search(r"\) (\S)", stat).group(1)


def start_executor(
    stack: LiveStack,
    owner_id: str,
    *args: str,
    pause: str | None = None,
    lock_ttl_ms: int = LOCK_TTL_MS,
    session_ttl_ms: int = LOCK_TTL_MS,
    log_dir: Path,
    env_overrides: dict[str, str] | None = None,
) -> ExecutorProcess:
    env = {**os.environ, **stack.env, "ROLE": "executor", **(env_overrides or {})}
    env.pop("DLOCK_EXECUTOR_PAUSE_AT", None)
    if pause:
        env["DLOCK_EXECUTOR_PAUSE_AT"] = pause
    log = log_dir / f"{owner_id}.log"
    handle = open(log, "ab")
    process = subprocess.Popen(
        [
            PYTHON,
            str(PROJECT / "manage.py"),
            "run_executor",
            "--owner-id",
            owner_id,
            "--lock-ttl-ms",
            str(lock_ttl_ms),
            "--session-ttl-ms",
            str(session_ttl_ms),
            *args,
        ],
        cwd=PROJECT,
        env=env,
        stdout=handle,
        stderr=subprocess.STDOUT,
    )
    return ExecutorProcess(owner_id, process, log)


def account_state(stack: LiveStack, account_id: str) -> dict:
    """P5: the account as the payment resource answers it (balance, ledger sum, fence)."""
    return requests.get(f"{stack.url('payments')}/v1/accounts/{account_id}", timeout=5).json()


def drain(stack: LiveStack, tmp_path: Path, *owners: str) -> None:
    """`run_executor --until-idle` as one real process per owner; each must exit 0."""
    procs = [start_executor(stack, owner, "--until-idle", log_dir=tmp_path) for owner in owners]
    for proc in procs:
        assert proc.wait(120) == 0, proc.log.read_text()[-3000:]


def second_replica(stack: LiveStack, role: str, log_dir: Path) -> RoleProcess:
    """Another replica of `role` on the stack's databases, on a port of its own (started)."""
    return RoleProcess(role, free_port(), stack.env, log_dir / f"{role}-2.log").start()


def closed_port_url() -> str:
    """A loopback URL nothing listens on: every connect is refused (nothing sent)."""
    return f"http://127.0.0.1:{free_port()}"


def paydb(stack: LiveStack):
    return psycopg.connect(stack.env["PAY_DATABASE_URL"], autocommit=True)


def raildb(stack: LiveStack):
    return psycopg.connect(stack.env["RAIL_DATABASE_URL"], autocommit=True)


def states(stack: LiveStack, ids: list[str]) -> dict[str, str]:
    with paydb(stack) as conn:
        rows = conn.execute(
            "SELECT payout_id::text, state FROM payout WHERE payout_id::text = ANY(%s)", (ids,)
        ).fetchall()
    return dict(rows)


def rail_requests(stack: LiveStack, ids: list[str]) -> dict[str, int]:
    """How many times the rail was asked to pay each payout (clientRef = payout id)."""
    return _rows_per_client_ref(stack, "rail_request", ids)


def rail_transfers(stack: LiveStack, ids: list[str]) -> dict[str, int]:
    return _rows_per_client_ref(stack, "rail_transfer", ids)


def _rows_per_client_ref(stack: LiveStack, table: str, ids: list[str]) -> dict[str, int]:
    query = sql.SQL(
        "SELECT client_ref, count(*) FROM {} WHERE client_ref = ANY(%s) GROUP BY client_ref"
    ).format(sql.Identifier(table))
    with raildb(stack) as conn:
        rows = conn.execute(query, (ids,)).fetchall()
    return dict(rows)


def fenced_out_count(stack: LiveStack, role: str, resource: str) -> float:
    text = requests.get(f"{stack.url(role)}/metrics", timeout=5).text
    match = re.search(rf'^lock_fenced_out_total{{resource="{resource}"}} (\S+)$', text, re.M)
    return float(match.group(1)) if match else 0.0


def wait_for_state(stack: LiveStack, payout_id: str, wanted: set[str], timeout: float = 30):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        state = states(stack, [payout_id]).get(payout_id)
        if state in wanted:
            return state
        time.sleep(0.1)
    raise AssertionError(f"{payout_id} never reached {wanted}: {states(stack, [payout_id])}")
