"""Not a test: `pytest tests/executor/measure_walk.py -s` prints the walk of one payout — every
call into the `executor` package, in order, on the section thread of one PENDING → POSTED
payout (a profile hook on a real in-process Executor against the private stack)."""

from __future__ import annotations

import threading
from pathlib import Path

from executor.worker import Executor
from tests.executor.conftest import owner_id, payout_ids, seed, states

EXECUTOR_PACKAGE = str(Path(__file__).resolve().parents[2] / "executor")


def test_measure(exec_stack):
    (payout,) = payout_ids(seed(exec_stack, accounts=1, per_account=1, balance=10_000, amount=1))
    executor = Executor(
        owner_id=owner_id("walk"),
        lock_url=exec_stack.env["LOCK_SERVER_URL"],
        payments_url=exec_stack.env["PAYMENTS_URL"],
        rail_proxy_url=exec_stack.env["RAIL_PROXY_URL"],
    )
    walk: list[str] = []

    def profile(frame, event, _arg):
        code = frame.f_code
        on_section = threading.current_thread().name.startswith("payout")
        if event == "call" and on_section and code.co_filename.startswith(EXECUTOR_PACKAGE):
            walk.append(f"{Path(code.co_filename).name}:{code.co_qualname}")

    threading.setprofile(profile)
    try:
        assert executor.run(max_payouts=1) == 0
    finally:
        threading.setprofile(None)
    assert states(exec_stack, [payout]) == {payout: "POSTED"}
    print(f"\nthe walk of one payout: {len(walk)} stops, {len(set(walk))} functions")
    for stop in walk:
        print(f"  {stop}")
