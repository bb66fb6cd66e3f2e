"""C3 §3.8 as one table: per-hop connect/read timeouts and retry counts.

Budgets shrink inward: no hop may wait longer than its caller, or the caller times out first and
manufactures an ambiguity the inner hop was about to resolve. Every HTTP call dlock makes names
one row of `BUDGETS`; nothing else in the code base spells a timeout for these hops.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

# The proxy's read timeout towards the rail (C3 §3.8 "rail-proxy → rail-stub": 1 s / 8 s); the
# same variable the proxy reads (settings.RAIL_READ_TIMEOUT_MS), so the executor always waits
# 2 s longer than the proxy does.
RAIL_READ_TIMEOUT_S = int(os.environ.get("RAIL_READ_TIMEOUT_MS") or 8_000) / 1000.0
# Retry backoff for retry-safe lock-server codes (FR-28): jittered exponential 50 ms → 1 s.
BACKOFF_INITIAL_S = 0.05
BACKOFF_MAX_S = 1.0
# Client-side local deadline: TTL × (1 − safety margin) (ARCHITECTURE §8).
CLIENT_SAFETY_MARGIN = 0.30
# The longest legitimate request per server role, in seconds (gunicorn's graceful timeout and the
# proxy's drain timeout, settings/gunicorn.py and devstack/proxy.py):
#   lockserver: acquire with waitMillis 30 s (+ database deadline)
#   railproxy:  rail connect 1 s + rail read 8 s + two database exchanges (its caller waits 10 s)
#   payments:   database queue deadline + statement deadline (~5 s); its caller waits 3 s
#   railstub:   its configured latency (experiments keep it below the proxy's 8 s read timeout)
LONGEST_REQUEST_S = {"lockserver": 33, "railproxy": 15, "payments": 6, "railstub": 10}


@dataclass(frozen=True)
class Budget:
    """One hop: connect and read timeouts (seconds) and how many retries it may make."""

    connect_s: float
    read_s: float
    retries: int
    why: str

    @property
    def timeout(self) -> tuple[float, float]:
        """The (connect, read) pair `requests` takes."""
        return (self.connect_s, self.read_s)


BUDGETS: dict[str, Budget] = {
    "lock.acquire": Budget(0.5, 2.0, 5, "jittered 50 ms→1 s, retry-safe codes only (FR-28)"),
    "lock.heartbeat": Budget(0.3, 1.0, 2, "2 retries within a third of the session TTL"),
    "lock.renew": Budget(0.5, 2.0, 1, "one retry, retry-safe codes or connect failure only"),
    "lock.release": Budget(0.5, 2.0, 0, "never retried: the lease reaps it"),
    # Not rows of C3 §3.8; they follow the renew/release rows (recorded in CHANGELOG).
    "lock.session": Budget(0.5, 2.0, 1, "open/close a session: like renew / release"),
    "lock.revoke": Budget(0.5, 2.0, 0, "operator action, printed, re-run by a human"),
    "payments.write": Budget(0.5, 3.0, 1, "0 on any 409; 1 retry only on 503 or connect failure"),
    "rail.submit": Budget(1.0, RAIL_READ_TIMEOUT_S + 2.0, 0, "0. Ever."),
    "rail.forward": Budget(1.0, RAIL_READ_TIMEOUT_S, 0, "proxy → rail, never retried (FR-20)"),
    "advisory.read": Budget(0.3, 1.0, 2, "a failed read never blocks a correctness decision"),
    "reconciler.db": Budget(1.0, 30.0, 3, "detective, off the payout path"),
}


def budget(hop: str) -> Budget:
    """The budget of `hop`; an unknown hop is a programming error, not a default."""
    return BUDGETS[hop]


def heartbeat_window_s(session_ttl_ms: int) -> float:
    """All heartbeat attempts (1 + retries) must fit in one third of the session TTL."""
    return session_ttl_ms / 1000.0 / 3.0


def local_deadline_s(ttl_ms: int, margin: float = CLIENT_SAFETY_MARGIN) -> float:
    """How long after the request was sent the client may still believe it holds the lock."""
    return ttl_ms / 1000.0 * (1.0 - margin)


@dataclass(frozen=True)
class Chain:
    """One hop seen from the inside out: (name, milliseconds) stages that must strictly grow."""

    hop: str
    stages: tuple[tuple[str, float], ...]

    def shrinks_inward(self) -> bool:
        values = [ms for _, ms in self.stages]
        return all(inner < outer for inner, outer in zip(values, values[1:], strict=False))


def inward_chains(settings: Any) -> list[Chain]:
    """Every hop's budget chain from the real settings (C3 §3.8).

    The lock server's request deadline on etcd is its admission queue deadline plus one etcd call
    (a call that times out is answered 503 NOT_LEADER at once); the rail proxy's is its queue
    deadline plus the rail connect and read timeouts. Each must fall strictly between the call
    it makes and the read timeout of the client that waits for it, or the client times out first
    and manufactures an ambiguity (a ReadTimeout where NOT_LEADER was coming).
    """
    queue_ms = float(settings.SERVER_QUEUE_DEADLINE_MS)
    etcd_ms = float(settings.ETCD_REQUEST_TIMEOUT_MS)
    lock_deadline = ("lock-server request deadline", queue_ms + etcd_ms)
    chains = [
        Chain(
            hop,
            (
                ("ETCD_REQUEST_TIMEOUT_MS", etcd_ms),
                lock_deadline,
                (f"client read timeout ({hop})", BUDGETS[hop].read_s * 1000),
            ),
        )
        for hop in ("lock.acquire", "lock.heartbeat", "lock.renew", "lock.release", "lock.session")
    ]
    rail_ms = float(settings.RAIL_READ_TIMEOUT_MS)
    rail_connect_ms = float(settings.RAIL_CONNECT_TIMEOUT_MS)
    chains.append(
        Chain(
            "rail.submit",
            (
                ("RAIL_READ_TIMEOUT_MS", rail_ms),
                ("rail-proxy request deadline", queue_ms + rail_connect_ms + rail_ms),
                ("client read timeout (rail.submit)", BUDGETS["rail.submit"].read_s * 1000),
            ),
        )
    )
    chains.append(
        Chain(
            "payments.write",
            (
                ("DB_STATEMENT_TIMEOUT_MS", float(settings.DB_STATEMENT_TIMEOUT_MS)),
                ("client read timeout (payments.write)", BUDGETS["payments.write"].read_s * 1000),
            ),
        )
    )
    return chains
