"""A real lock-server process per backend (gunicorn on a free port, its own fresh lockdb).

`lock_server` is parametrized over ("pg", "etcd"); tests written against it (HTTP only) run
unchanged on both backends. Expiry tests use 1–2 s TTLs.
"""

from __future__ import annotations

import os
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import requests

from devstack.common import free_port
from devstack.roles import RoleProcess
from dlock import proof
from tests.conftest import fresh_etcd, migrated_db

PROJECT = Path(__file__).resolve().parents[2]

# Small limits so 429 paths are reachable quickly; every test uses fresh sessions and keys.
TEST_LIMITS = {
    "LOCK_MAX_WAITERS_PER_KEY": "3",
    "LOCK_RETRY_BUDGET": "5",
    "LOCK_RETRY_WINDOW_MS": "3000",
    "LOCK_HOUSEKEEPING_MS": "200",
    "LOCK_MAX_TTL_MS": "30000",  # so clamping is observable
}


def fence_headers(key: str, token: int, owner: str, fproof: str | None = None) -> dict[str, str]:
    """Token, owner and the proof the server issued for (key, token), unless `fproof` is given
    (the suite shares the servers' DLOCK_PROOF_KEYS, so it can compute what L4 answered)."""
    return {
        "X-Fencing-Token": str(token),
        "X-Fencing-Proof": fproof if fproof is not None else proof.sign(key=key, token=token),
        "X-Owner-Id": owner,
    }


@dataclass
class LockServer:
    backend: str
    env: dict[str, str]
    proc: RoleProcess
    http: requests.Session = field(default_factory=requests.Session)

    @property
    def url(self) -> str:
        return self.proc.url

    @property
    def db_url(self) -> str:
        return self.env["LOCK_DATABASE_URL"]

    def stop(self) -> None:
        self.http.close()  # no idle keep-alive connection for the worker to drain
        self.proc.stop()

    def restart(self, **extra_env: str) -> None:
        self.stop()
        self.proc.env = {**self.env, **extra_env}
        self.proc.start()

    def log_text(self) -> str:
        return self.proc.logfile.read_text(errors="replace")

    # -- HTTP helpers (timeouts well above any waitMillis a test uses) -----------------------

    def post(self, path: str, body=None, headers=None, timeout: float = 40):
        return self.http.post(self.url + path, json=body, headers=headers or {}, timeout=timeout)

    def get(self, path: str, headers=None, timeout: float = 10):
        return self.http.get(self.url + path, headers=headers or {}, timeout=timeout)

    def delete(self, path: str, headers=None, params=None, body=None, timeout: float = 10):
        return self.http.delete(
            self.url + path, headers=headers or {}, params=params, json=body, timeout=timeout
        )

    def session(self, owner: str | None = None, ttl_ms: int = 10_000) -> dict:
        owner = owner or f"worker-{uuid.uuid4().hex[:8]}"
        response = self.post("/v1/sessions", {"ownerId": owner, "ttlMillis": ttl_ms})
        assert response.status_code == 201, response.text
        return response.json()

    def acquire(self, key: str, session: dict, *, ttl_ms: int | None = None, wait_ms=None):
        body: dict = {"sessionId": session["sessionId"]}
        if ttl_ms is not None:
            body["ttlMillis"] = ttl_ms
        if wait_ms is not None:
            body["waitMillis"] = wait_ms
        return self.post(
            f"/v1/locks/{key}/acquire", body, headers={"X-Owner-Id": session["ownerId"]}
        )

    def release(self, key: str, session: dict, token: int, *, fproof: str | None = None):
        return self.delete(
            f"/v1/locks/{key}",
            headers=fence_headers(key, token, session["ownerId"], fproof),
            params={"sessionId": session["sessionId"]},
        )

    def renew(
        self,
        key: str,
        session: dict,
        token: int,
        ttl_ms: int | None = None,
        *,
        fproof: str | None = None,
    ):
        body: dict = {"sessionId": session["sessionId"]}
        if ttl_ms is not None:
            body["ttlMillis"] = ttl_ms
        return self.post(
            f"/v1/locks/{key}/renew",
            body,
            headers=fence_headers(key, token, session["ownerId"], fproof),
        )

    def revoke(self, key: str, **body):
        body.setdefault("operator", "oncall-alice")
        body.setdefault("reason", "stuck worker holding the account")
        return self.post(f"/v1/locks/{key}/revoke", body)


def start_lock_server(backend: str, extra_env: dict[str, str] | None = None) -> LockServer:
    db_name = f"ls_{backend}_{uuid.uuid4().hex[:6]}_lockdb"
    env = {
        "DJANGO_SECRET_KEY": os.environ["DJANGO_SECRET_KEY"],
        "DLOCK_PROOF_KEYS": os.environ["DLOCK_PROOF_KEYS"],
        "DJANGO_DEBUG": "false",
        "LOCK_BACKEND": backend,
        "LOCK_DATABASE_URL": migrated_db(db_name, "lockserver", "LOCK_DATABASE_URL"),
        **TEST_LIMITS,
        **(extra_env or {}),
    }
    logdir = Path(tempfile.mkdtemp(prefix=f"dlock-lockserver-{backend}-"))
    proc = RoleProcess("lockserver", free_port(), env, logdir / "lockserver.log").start()
    return LockServer(backend=backend, env=env, proc=proc)


@pytest.fixture
def own_etcd():
    """A private etcd server, for tests that stop it or need a store with no history."""
    server = fresh_etcd()
    yield server
    server.stop()


@pytest.fixture(scope="session", params=["pg", "etcd"])
def lock_server(request):
    backend = request.param
    extra: dict[str, str] = {}
    if backend == "etcd":
        extra["ETCD_URL"] = request.getfixturevalue("etcd_server").url
    server = start_lock_server(backend, extra)
    yield server
    server.stop()


def assert_error(response, status: int, code: str) -> dict:
    """The C3 envelope with this status and code; returns the body."""
    assert response.status_code == status, response.text
    assert response.headers["Content-Type"] == "application/json; charset=utf-8"
    body = response.json()
    assert body["code"] == code, body
    assert set(body) <= {"code", "message", "retrySafe", "retryAfterMillis", "details", "traceId"}
    return body


def revoke_until_answered(server: LockServer, key: str, results: list, count: int) -> None:
    """Revoke each grant of `key` as it is made until `count` waiters have answers (≤ 20 s)."""
    deadline = time.monotonic() + 20
    while len(results) < count and time.monotonic() < deadline:
        if server.get(f"/v1/locks/{key}").json()["held"]:
            server.revoke(key)
        time.sleep(0.05)


def new_key() -> str:
    return f"payout:acct-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def key() -> str:
    """A fresh lock key per test."""
    return new_key()
