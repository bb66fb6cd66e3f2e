"""A test/experiment hook: pause the executor at a named phase, deterministically.

`DLOCK_EXECUTOR_PAUSE_AT=<phase>:<seconds|stop>[,<phase>:<seconds|stop>...]`

Phases sit AFTER `grant.ensure_valid()` and immediately BEFORE the protected write, which is
exactly where a GC pause or a descheduled pod hurts: the local check passed, the write has not
been sent. Each entry fires once per process, on the first payout that reaches it.

    before_claim   (alias after_acquire)  lock held, claim not yet sent
    before_submit  (alias after_claim)    payout CLAIMED under our token, rail not yet called
    before_post    (alias after_submit)   rail ACKED, ledger not yet posted

`<seconds>` sleeps (interrupted by SIGTERM, which abandons the section); `stop` sends the process
SIGSTOP to itself, so a test can wait for state `T`, act, and SIGCONT it (or kill -9 it).
Every pause logs `executor_paused` first, with the phase, payout and token.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable

from dlock.logs import log_event

PHASES = ("before_claim", "before_submit", "before_post")
ALIASES = {
    "after_acquire": "before_claim",
    "after_claim": "before_submit",
    "after_submit": "before_post",
}
ENV = "DLOCK_EXECUTOR_PAUSE_AT"


class PausePlan:
    """Parsed DLOCK_EXECUTOR_PAUSE_AT: phase → seconds (float) or "stop"."""

    def __init__(self, spec: str | None) -> None:
        self.pending: dict[str, float | str] = {}
        for raw in (spec or "").split(","):
            raw = raw.strip()
            if not raw:
                continue
            phase, _, value = raw.partition(":")
            phase = ALIASES.get(phase, phase)
            if phase not in PHASES:
                raise ValueError(f"{ENV}: unknown phase {phase!r} (one of {', '.join(PHASES)})")
            if value == "stop":
                self.pending[phase] = "stop"
            else:
                try:
                    self.pending[phase] = float(value)
                except ValueError:
                    raise ValueError(f"{ENV}: {raw!r} needs <seconds> or 'stop'") from None

    @classmethod
    def from_env(cls) -> PausePlan:
        return cls(os.environ.get(ENV))

    def __bool__(self) -> bool:
        return bool(self.pending)

    def at(self, phase: str, *, wait: Callable[[float], bool], **fields: object) -> None:
        """Pause here if planned. `wait(seconds)` returns True when a stop was requested."""
        action = self.pending.pop(phase, None)
        if action is None:
            return
        log_event("executor_paused", phase=phase, action=str(action), pid=os.getpid(), **fields)
        if action == "stop":
            # Directed at this thread: the stop is taken on this very syscall's return. A
            # process-directed kill() may be taken by another thread first, letting this one
            # (a section thread of a concurrent executor) run on into its protected write.
            signal.pthread_kill(threading.get_ident(), signal.SIGSTOP)
            log_event("executor_resumed", phase=phase, pid=os.getpid(), **fields)
            return
        wait(float(action))
        log_event("executor_resumed", phase=phase, pid=os.getpid(), **fields)
