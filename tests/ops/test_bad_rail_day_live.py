"""Issue 40, done when: after a run where the rail duplicate-acks and drops answers, an on-call
closes the books with the commands the tools print — the reviewed plan for the duplicates, each
finding's own `nextSteps`, the recoveries listed and closed — without writing a loop, and
`reconcile` exits 0 with balances summing to 0 and settlement credits equal to the statement.

A private stack (its own databases); real executors drive real payouts through the rail stub."""

from __future__ import annotations

import json
import shlex
import textwrap

import pytest

from tests.browser.test_books_browser import bad_rail_day, paydb, raildb, states
from tests.conftest import start_stack, stop_stack
from tests.executor.conftest import STACK_ENV

pytestmark = [pytest.mark.live, pytest.mark.slow]

ONCALL = "oncall-40"


@pytest.fixture(scope="module")
def stack():
    stack = start_stack("day40", STACK_ENV)
    stack.manage(
        "shell",
        "-c",
        textwrap.dedent(
            f"""
            from django.contrib.auth.models import User
            User.objects.create_user({ONCALL!r}, is_staff=True)
            """
        ),
    )
    yield stack
    stop_stack(stack)


def printed(stack, command: str):
    """Run a command exactly as a hint prints it (ROLE=ops manage.py …), as the on-call."""
    words = shlex.split(command.replace("YOUR_ADMIN_USER", ONCALL))
    assert words[:2] == ["ROLE=ops", "manage.py"], command
    return stack.manage(*words[2:], check=False)


def reconcile(stack) -> tuple[int, dict]:
    result = stack.manage("reconcile", "--json", "--metrics-file", "/dev/null", check=False)
    assert "Traceback" not in result.stderr
    return result.returncode, json.loads(result.stdout)


def test_an_oncall_closes_a_bad_rail_day_from_the_printed_hints_alone(stack, tmp_path):
    duplicated, booked_once, not_booked = bad_rail_day(stack, tmp_path, duplicate_acked=3)

    code, report = reconcile(stack)
    assert code == 1
    # The run-level hint: many duplicates go as one reviewed plan.
    (hint,) = report["nextSteps"]
    assert "--all-from-reconcile --dry-run" in hint
    for pid in duplicated:
        found = report["payouts"][pid]
        assert found["ownReference"] and len(found["needsRecovery"]) == 1
        assert found["ownReference"] not in found["needsRecovery"]

    plan = printed(
        stack,
        "ROLE=ops manage.py record_rail_recovery --all-from-reconcile --dry-run --json "
        "--operator YOUR_ADMIN_USER",
    )
    assert plan.returncode == 0, plan.stderr
    planned = {r["railReference"] for r in json.loads(plan.stdout)["plan"]}
    assert planned == {ref for pid in duplicated for ref in report["payouts"][pid]["needsRecovery"]}
    applied = printed(
        stack,
        'ROLE=ops manage.py record_rail_recovery --all-from-reconcile --reason "rail duplicate '
        'acks, ticket 40" --operator YOUR_ADMIN_USER',
    )
    assert applied.returncode == 0, applied.stderr

    # The quarantine: each finding's own next steps, as printed.
    code, report = reconcile(stack)
    for pid in booked_once + not_booked:
        for step in report["payouts"][pid]["nextSteps"]:
            done = printed(stack, step)
            assert done.returncode == 0, (step, done.stderr)
    assert states(stack, booked_once) == dict.fromkeys(booked_once, "POSTED")
    assert states(stack, not_booked) == dict.fromkeys(not_booked, "FAILED")

    # The recoveries: listed open first, then closed (one back, the rest written off).
    listed = json.loads(stack.manage("list_rail_recoveries", "--json").stdout)["recoveries"]
    assert [r["status"] for r in listed] == ["OPEN"] * len(duplicated)
    first, *rest = (r["railReference"] for r in listed)
    closes = [
        f"ROLE=ops manage.py close_rail_recovery --transfer {first} --recovered --reference "
        "RET-40 --operator YOUR_ADMIN_USER",
        *(
            f"ROLE=ops manage.py close_rail_recovery --transfer {ref} --written-off --reason "
            '"claim refused, ticket 40" --operator YOUR_ADMIN_USER'
            for ref in rest
        ),
    ]
    for close in closes:
        done = printed(stack, close)
        assert done.returncode == 0, (close, done.stderr)

    code, report = reconcile(stack)
    assert code == 0, report["violations"]
    ((total,),) = paydb(
        stack,
        "SELECT COALESCE(SUM(balance_minor), 0) + (SELECT COALESCE(SUM(balance_minor), 0)"
        " FROM settlement_bucket) FROM account",
    )
    assert total == 0
    ((statement,),) = raildb(stack, "SELECT COALESCE(SUM(amount_minor), 0) FROM rail_transfer")
    ((credits,),) = paydb(
        stack,
        "SELECT COALESCE(SUM(amount_minor), 0) FROM ledger_entry"
        " WHERE account_id = 'settlement:EUR' AND direction = 'CREDIT'",
    )
    assert credits == statement == (2 * len(duplicated) + 1) * 700
