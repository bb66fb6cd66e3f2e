"""`make up` and a role that is alive but not ready: wait for it, never replace it."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from devstack.common import StackError, live, readiness_checks, ready, say

# How long `up` waits for a role that is alive (answers /health/live) but not ready.
ALIVE_WAIT_S = 60.0


def plan(
    name: str,
    port: int,
    running: dict[str, dict[str, Any]],
    *,
    scheme: str = "http",
    ca: str | None = None,
) -> str:
    """What `up` does with one instance: "ready" (leave it), "alive" (its process answers
    /health/live but is not ready: wait for it, never replace it — a new process would wait for
    the same dependency, and replacing it refuses connections meanwhile), "replace" (its process
    exists but does not answer at all) or "start" (nothing runs)."""
    if name not in running:
        return "start"
    url = f"{scheme}://127.0.0.1:{port}"
    if ready(url, ca):
        return "ready"
    return "alive" if live(url, ca) else "replace"


def wait_alive(
    alive: list[tuple[str, int]],
    run: Path,
    *,
    timeout: float = ALIVE_WAIT_S,
    scheme: str = "http",
    ca: str | None = None,
) -> None:
    """Wait until every alive-but-not-ready instance is ready; say what it waits for. After
    `timeout` it is left running and `up` fails, naming it and its readiness checks."""
    for name, port in alive:
        url = f"{scheme}://127.0.0.1:{port}"
        checks = readiness_checks(url, ca)
        say(f"{name} is alive but not ready ({checks}): waiting, not replacing it")
        deadline = time.monotonic() + timeout
        while not ready(url, ca):
            if time.monotonic() >= deadline:
                raise StackError(
                    f"{name} on {url} is alive (answers /health/live) but not ready after "
                    f"{timeout:.0f}s ({readiness_checks(url, ca)}); it is left running — fix what "
                    f"it waits for (log: {run / 'logs' / f'{name}.log'}) or `make down`"
                )
            time.sleep(0.2)
