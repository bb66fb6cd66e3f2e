"""`make example`'s story (examples/stock) on a live stack: the stale worker is refused with
409 FENCED_OUT, a forged token with 400 INVALID_TOKEN, and the stock changes once. It fails if
the kit's proof check or its fenced write stops refusing (the story then exits 1)."""

from __future__ import annotations

import subprocess
import sys
import uuid

import pytest

from devstack.common import PROJECT, free_port

pytestmark = [pytest.mark.live]


def test_the_story_fences_out_the_stale_worker_and_the_stock_changes_once(live_stack):
    env = {
        **live_stack.env,
        "EXAMPLE_PORT": str(free_port()),
        "EXAMPLE_DATABASE_NAME": f"dlock_example_{uuid.uuid4().hex[:8]}",
    }
    env.pop("DLOCK_FENCING_PUBLIC_KEYS", None)  # read from the lock server, as an adopter may

    story = subprocess.run(
        [sys.executable, "-m", "examples.stock.story"],
        cwd=PROJECT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )

    assert story.returncode == 0, story.stdout + story.stderr
    out = story.stdout
    assert "GET /v1/fencing-keys" in out
    assert "a forged token takes one: 400 INVALID_TOKEN" in out
    assert "409 FENCED_OUT" in out
    assert "the resource changed once: quantity 10 -> 9, written by worker-b" in out
