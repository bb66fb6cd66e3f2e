"""The rail stub's behaviour during an arm: reset once, then live changes as fault windows open."""

from __future__ import annotations

import threading
import time

import psycopg

from experiment.stack import MissingPiece, StackHandle

HOLD_MS = 3_000  # a drop-before-booking holds the connection this long (below the read timeouts)

RAIL_CONFIG_UPDATE = """
UPDATE railstub_config
   SET latency_ms = %(latency)s, failure_rate = %(failure)s, duplicate_ack_rate = %(duplicate)s,
       decline_rate = 0, updated_at = clock_timestamp()
 WHERE id = 1
"""


class RailConfigurator:
    """Applies the wanted rail config in the background (a manage.py call takes ~1 s); the last
    wanted config always wins."""

    def __init__(self, stack: StackHandle) -> None:
        self.stack = stack
        self.wanted: dict | None = None
        self.applied: dict | None = None
        self.errors: list[str] = []
        self.cond = threading.Condition()
        self.closed = False
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def want(self, config: dict) -> None:
        with self.cond:
            if config != self.wanted:
                self.wanted = dict(config)
                self.cond.notify()

    def _run(self) -> None:
        while True:
            with self.cond:
                while not self.closed and self.wanted == self.applied:
                    self.cond.wait()
                if self.closed and self.wanted == self.applied:
                    return
                config = dict(self.wanted or {})
            self.apply_now(config)
            with self.cond:
                self.applied = config
                self.cond.notify_all()

    def reset(self, *, seed: int, hold_ms: int) -> None:
        """Once per arm, through the stub's own command: a well-behaved, seeded rail."""
        result = self.stack.manage(
            "railstub_config", "--reset", "--seed", str(seed), "--hold-ms", str(hold_ms)
        )
        if result.returncode != 0:
            raise MissingPiece(
                "manage.py railstub_config failed (issue 6):\n" + (result.stderr or "")[-1500:]
            )
        self.applied = None

    def apply_now(self, config: dict) -> None:
        """Live changes write the stub's config row directly (read per request by the stub):
        a manage.py process per change would cost a core-second on a two-core box."""
        params = {
            "latency": int(config["latency_ms"]),
            "failure": float(config["failure_rate"]),
            "duplicate": float(config["duplicate_ack_rate"]),
        }
        for attempt in range(5):  # PostgreSQL may be restarting right now
            try:
                with psycopg.connect(self.stack.env["RAIL_DATABASE_URL"], connect_timeout=2) as c:
                    c.execute(RAIL_CONFIG_UPDATE, params)
                return
            except psycopg.Error as exc:
                error = str(exc)
                time.sleep(0.5 + attempt)
        self.errors.append(f"rail config {params}: {error[:300]}")

    def settle(self, timeout: float = 30) -> None:
        with self.cond:
            self.cond.wait_for(lambda: self.wanted == self.applied, timeout)

    def close(self) -> None:
        with self.cond:
            self.closed = True
            self.cond.notify_all()
        self.thread.join(30)
