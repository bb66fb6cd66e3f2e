"""Probers for the HA experiment's recovery measurement (issue 16, Measure).

A prober repeats one small call every `interval` seconds in its own thread and records every
attempt: start, end (on the arm's clock), ok, and the error code when it failed. Three kinds:

- lock probers: their own session and their own key, acquire + release through `dlock.client`;
  one per lock-server replica (that replica's URL only) and one with every URL, the last
  replica first (the client's failover path, as executors use it, on the replica that dies);
- payments probers: P5 `GET /v1/accounts/<id>` through `dlock.client.transport.Endpoints`;
- rail-proxy probers: its readiness route through the same transport (the proxy's one API call
  is a rail submission, which a probe must never make);
- on etcd, one etcd prober (`etcd/cluster`): a linearizable range read of one key, each member
  in turn (a member that refuses or has no leader is skipped) — etcd's own recovery, to split a
  quorum loss into etcd's time and dlock's (issue 27 item 5).

The lock-server also gets `fwd`, every URL in the order the executors list them (the first
replica first): the client a stall of the first replica hits (issue 27 item 6).

Attempts are never retried inside: what a prober records is what one call saw.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

from dlock.budgets import BUDGETS
from dlock.client import LockClient
from dlock.client.errors import DlockError
from dlock.client.lock import LockSession
from dlock.client.retry import RetryPolicy
from dlock.client.transport import Endpoints, parse_endpoints

PROBE_INTERVAL_S = 0.05
PROBE_SESSION_TTL_MS = 5_000
PROBE_LOCK_TTL_MS = 2_000
BOTH = "both"  # the prober that holds every URL of its role, the last replica first
FORWARD = "fwd"  # every URL of the lock-server in the executors' order
ETCD_PROBE_TIMEOUT = (0.3, 0.5)


@dataclass(frozen=True)
class Attempt:
    start: float
    end: float
    ok: bool
    code: str = ""

    def as_dict(self) -> dict:
        return asdict(self)


def outcome_code(exc: BaseException) -> str:
    if isinstance(exc, DlockError):
        return exc.code or type(exc).__name__
    return type(exc).__name__


class Prober:
    """Calls `attempt()` every `interval` s until stopped; keeps every outcome."""

    def __init__(
        self,
        role: str,
        replica: str,
        attempt: Callable[[], None],
        clock: Callable[[], float],
        *,
        interval: float = PROBE_INTERVAL_S,
        close: Callable[[], None] | None = None,
    ) -> None:
        self.role = role
        self.replica = replica
        self.attempt = attempt
        self.clock = clock
        self.interval = interval
        self.close = close
        self.attempts: list[Attempt] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True, name=self.name)

    @property
    def name(self) -> str:
        return f"{self.role}/{self.replica}"

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        self._thread.join(timeout)
        if self.close is not None:
            with contextlib.suppress(Exception):
                self.close()

    def _loop(self) -> None:
        while not self._stop.is_set():
            start = self.clock()
            try:
                self.attempt()
            except Exception as exc:
                self.attempts.append(Attempt(start, self.clock(), False, outcome_code(exc)))
            else:
                self.attempts.append(Attempt(start, self.clock(), True))
            self._stop.wait(max(0.0, self.interval - (self.clock() - start)))


class ReleaseFailed(RuntimeError):
    """The acquire succeeded but its release did not complete (timed out, refused): the
    attempt did not succeed either (a stalled server can answer the one and not the other)."""


class LockProbe:
    """One session of its own (re-opened when it is lost), acquire + release of its own key."""

    def __init__(self, urls: str, *, owner_id: str, key: str) -> None:
        self.client = LockClient(urls, owner_id, default_ttl_ms=PROBE_LOCK_TTL_MS)
        self.key = key
        self.session: LockSession | None = None
        self.no_retry = RetryPolicy(max_retries=0)

    def __call__(self) -> None:
        if self.session is None or self.session.lost is not None:
            self.close()
            # one attempt, as for the acquire: a retry after retryAfterMillis inside the call
            # would be counted as dlock's recovery time
            self.session = self.client.open_session(PROBE_SESSION_TTL_MS, retry=self.no_retry)
        grant = self.session.acquire(self.key, PROBE_LOCK_TTL_MS, retry=self.no_retry)
        if not grant.release():
            raise ReleaseFailed(f"release of {self.key} did not complete (lock_release_failed)")

    def close(self) -> None:
        session, self.session = self.session, None
        if session is not None:
            with contextlib.suppress(Exception):
                session.close()


def read_probe(urls: str, path: str, *, owner_id: str) -> Callable[[], None]:
    endpoints = Endpoints(urls)
    hop = BUDGETS["advisory.read"]

    def attempt() -> None:
        endpoints.call("GET", path, hop=hop, owner_id=owner_id)

    return attempt


def etcd_probe(urls: str, *, key: str) -> Callable[[], None]:
    """A linearizable read (it needs a leader and a quorum): ok once etcd serves again."""
    import base64

    import requests

    members = [u.strip().rstrip("/") for u in urls.split(",") if u.strip()]
    body = {"key": base64.b64encode(key.encode()).decode()}
    http = requests.Session()

    def attempt() -> None:
        last = "no member"
        for member in members:
            try:
                reply = http.post(f"{member}/v3/kv/range", json=body, timeout=ETCD_PROBE_TIMEOUT)
            except requests.RequestException as exc:
                last = type(exc).__name__
                continue
            if reply.status_code == 200 and "error" not in reply.text[:200]:
                return
            last = f"etcd {reply.status_code}"
        raise RuntimeError(last)

    return attempt


def replica_names(urls: list[str]) -> list[str]:
    """ "r1", "r2", … in the order of the role's URL list (r1 = the role's first replica)."""
    return [f"r{n}" for n in range(1, len(urls) + 1)]


def build_probers(
    env: dict[str, str],
    *,
    run_id: str,
    account_id: str,
    clock: Callable[[], float],
    interval: float = PROBE_INTERVAL_S,
) -> list[Prober]:
    """A prober per replica of each role, plus one per role holding every URL (`both`, the last
    replica first)."""
    probers: list[Prober] = []
    roles = (
        ("lockserver", "LOCK_SERVER_URL"),
        ("payments", "PAYMENTS_URL"),
        ("railproxy", "RAIL_PROXY_URL"),
    )
    for role, var in roles:
        urls = list(parse_endpoints(env[var]))
        targets = list(zip(replica_names(urls), urls, strict=True))
        if len(urls) > 1:
            # the last replica first: the HA faults kill `<role>-2`, so this client is on the
            # replica that dies and must fail over (with r1 first it would never notice)
            targets.append((BOTH, ",".join(reversed(urls))))
            if role == "lockserver":  # as the executors list them: a stall of r1 hits it
                targets.append((FORWARD, ",".join(urls)))
        for replica, target in targets:
            owner = f"probe-{run_id}-{role}-{replica}"
            if role == "lockserver":
                probe = LockProbe(target, owner_id=owner, key=f"probe:{run_id}:{replica}")
                probers.append(
                    Prober(role, replica, probe, clock, interval=interval, close=probe.close)
                )
                continue
            path = f"/v1/accounts/{account_id}" if role == "payments" else "/health/ready"
            probers.append(
                Prober(
                    role,
                    replica,
                    read_probe(target, path, owner_id=owner),
                    clock,
                    interval=interval,
                )
            )
    if env.get("LOCK_BACKEND") == "etcd" and env.get("ETCD_URL"):
        probe = etcd_probe(env["ETCD_URL"], key=f"dlock-probe/{run_id}")
        probers.append(Prober("etcd", "cluster", probe, clock, interval=interval))
    return probers


def wait_all_ok(probers: list[Prober], timeout: float = 30.0) -> bool:
    """Until every prober's latest attempt succeeded (the baseline before any fault)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if all(p.attempts and p.attempts[-1].ok for p in probers):
            return True
        time.sleep(0.1)
    return False
