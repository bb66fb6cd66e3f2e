"""One account's client for the settlement bench: keep-alive connections to the lock server,
payments and the rail proxy, a session, and the calls that take a payout to RAIL_ACKED and post
it (bench/settlement.py)."""

from __future__ import annotations

import http.client
import json
import time
from urllib.parse import urlsplit

from bench import credentials, payout_path


class AccountClient:
    """One account's client: keep-alive connections to the lock server, payments, rail proxy."""

    def __init__(self, stack, owner: str) -> None:
        self.owner = owner
        self.used: dict[str, float] = {}
        self.conns = {}
        for role in ("lockserver", "payments", "railproxy"):
            url = urlsplit(stack.url(role))
            self.conns[role] = http.client.HTTPConnection(url.hostname, url.port, timeout=30)
        status, body = self.call(
            "lockserver", "POST", "/v1/sessions", {"ownerId": owner, "ttlMillis": 60_000}
        )
        if status != 201:
            raise RuntimeError(f"session {status} {body}")
        self.session_id = body["sessionId"]
        self.beat = time.monotonic()

    def heartbeat(self) -> None:
        """L2 every 10 s: preparing hundreds of payouts on one session outlasts its TTL."""
        if time.monotonic() - self.beat < 10:
            return
        status, body = self.call(
            "lockserver", "POST", f"/v1/sessions/{self.session_id}/heartbeat", {}
        )
        if status != 200:
            raise RuntimeError(f"heartbeat {status} {body}")
        self.beat = time.monotonic()

    def call(self, role: str, method: str, path: str, body, headers=None) -> tuple[int, dict]:
        sent = {"X-Owner-Id": self.owner, **credentials.headers(), **(headers or {})}
        payload = None
        if body is not None:
            payload = json.dumps(body).encode()
            sent["Content-Type"] = "application/json"
        conn = self.conns[role]
        if time.monotonic() - self.used.get(role, 0.0) > 2.0:  # below gunicorn's keep-alive
            conn.close()  # reopened by the next request, not written into after a server close
        try:
            conn.request(method, path, body=payload, headers=sent)
            response = conn.getresponse()
            raw = response.read()
        except (OSError, http.client.HTTPException):
            conn.close()
            raise
        finally:
            self.used[role] = time.monotonic()
        return response.status, (json.loads(raw) if raw else {})

    def prepare(self, payout_id: str, account_id: str, key: str, amount: int, currency: str):
        """L4 → P2 → rail submission → L6: the payout is RAIL_ACKED; what P3 needs is kept."""
        self.heartbeat()
        lock = f"payout:{account_id}"
        status, grant = self.call(*payout_path.acquire(lock, self.session_id))
        if status != 200:
            raise RuntimeError(f"acquire {status} {grant}")
        fenced = {**credentials.headers(grant), "X-Idempotency-Key": key}
        status, claimed = self.call(*payout_path.claim(payout_id), fenced)
        if status != 200:
            raise RuntimeError(f"claim {status} {claimed}")
        status, submitted = self.call(
            *payout_path.submission(payout_id, account_id, amount, currency, claimed), fenced
        )
        if status != 200:
            raise RuntimeError(f"submission {status} {submitted}")
        status, _ = self.call(
            *payout_path.release(lock, self.session_id), credentials.headers(grant)
        )
        if status != 204:
            raise RuntimeError(f"release {status}")
        return payout_id, fenced, submitted

    def post(self, payout_id: str, fenced: dict, submitted: dict) -> None:
        """P3 under `fenced`: the account's latest grant (the account's fence is the last
        claim's token, and P3 accepts a token >= the fence) with this payout's own key."""
        status, posted = self.call(*payout_path.post(payout_id, submitted), fenced)
        if status != 200:
            raise RuntimeError(f"post {status} {posted}")
