"""`make example`: the stale-holder story against the running stack, told by the stock service.

1. worker A acquires `stock:{sku}` (a 1 s lease) and pauses — a GC pause, a stalled VM — past it;
2. worker B acquires the lock once A's lease has lapsed; a forged token is refused (400
   INVALID_TOKEN); B takes one item (200);
3. A wakes and takes one item with its old token: 409 FENCED_OUT, nothing written;
4. the row changed once (quantity 10 → 9, written by worker-b).

Environment: LOCK_SERVER_URL and DLOCK_EXECUTOR_CREDENTIAL (.run/stack.env), PAY_DATABASE_URL
(the stack's PostgreSQL, where the service gets a database of its own: EXAMPLE_DATABASE_NAME,
default dlock_example), EXAMPLE_PORT (the service's port). DLOCK_FENCING_PUBLIC_KEYS is read from
the lock server's GET /v1/fencing-keys when unset. Exit 0 when the story ends as above.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import psycopg
import requests
from psycopg import sql
from pythonjsonlogger.json import JsonFormatter

from dlock.client import DlockError, LockClient
from dlock.fence import fetch_public_keys
from examples.stock.service import SCHEMA_SQL

START_QUANTITY = 10


def say(line: str) -> None:
    print(f"[example] {line}", flush=True)


def own_database(stack_database_url: str, name: str) -> str:
    """The service's own database on the stack's PostgreSQL (created once), as a URL."""
    stack = urlsplit(stack_database_url)
    admin = urlunsplit(stack._replace(path="/postgres"))
    with psycopg.connect(admin, autocommit=True) as conn:
        if conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone() is None:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    url = urlunsplit(stack._replace(path=f"/{name}"))
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(SCHEMA_SQL)
    return url


def start_service(env: dict[str, str], port: int) -> subprocess.Popen:
    service = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gunicorn",
            "--bind",
            f"127.0.0.1:{port}",
            "--workers",
            "1",
            "--threads",
            "4",
            "--log-level",
            "warning",
            "examples.stock.wsgi:application",
        ],
        cwd=Path(__file__).resolve().parents[2],
        env=env,
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if requests.get(f"http://127.0.0.1:{port}/health/ready", timeout=5).ok:
                return service
        except requests.RequestException:  # not listening yet, or still loading Django
            pass
        if service.poll() is not None:
            break
        time.sleep(0.1)
    service.terminate()
    service.wait(timeout=30)
    raise SystemExit("[example] the stock service did not start")


def take(base: str, sku: str, worker: str, headers: dict[str, str]) -> requests.Response:
    return requests.post(
        f"{base}/stock/{sku}", headers={**headers, "X-Owner-Id": worker}, timeout=10
    )


def play(lock_url: str, base: str, database_url: str) -> bool:
    sku = f"sku-{uuid.uuid4().hex[:8]}"
    key = f"stock:{sku}"
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute("INSERT INTO stock (sku, quantity) VALUES (%s, %s)", [sku, START_QUANTITY])
    say(f"{sku}: quantity {START_QUANTITY}")
    worker_a = LockClient(lock_url, "worker-a")
    worker_b = LockClient(lock_url, "worker-b")
    with worker_a.session(10_000) as session_a, worker_b.session(10_000) as session_b:
        grant_a = session_a.acquire(key, ttl_ms=1_000)
        say(f"worker A acquired {key} with token {grant_a.token}, then pauses past its 1 s lease")
        # B waits in the lock server's queue; it is granted only once A's lease has lapsed.
        grant_b = session_b.acquire(key, ttl_ms=10_000, wait_ms=10_000)
        say(f"worker B acquired {key} with token {grant_b.token}")
        # A token nobody was granted, with a made-up proof, opens nothing.
        forged = {"X-Fencing-Token": str(2**63 - 1), "X-Fencing-Proof": "v2.x." + "A" * 86}
        answer_forged = take(base, sku, "mallory", forged)
        say(
            f"a forged token takes one: {answer_forged.status_code} "
            f"{answer_forged.json().get('code')}"
        )
        answer_b = take(base, sku, "worker-b", grant_b.fence_headers())
        say(f"worker B takes one: {answer_b.status_code} {answer_b.json()}")
        answer_a = take(base, sku, "worker-a", grant_a.fence_headers())
        refusal = answer_a.json()
        say(
            f"worker A wakes and takes one with token {grant_a.token}: {answer_a.status_code} "
            f"{refusal.get('code')} {refusal.get('details')}"
        )
        try:
            grant_b.release()
        except DlockError:
            pass
    final = requests.get(f"{base}/stock/{sku}", timeout=10).json()
    changed_once = (
        answer_forged.status_code == 400
        and answer_forged.json().get("code") == "INVALID_TOKEN"
        and answer_b.status_code == 200
        and answer_a.status_code == 409
        and refusal.get("code") == "FENCED_OUT"
        and final["quantity"] == START_QUANTITY - 1
        and final["lastWriter"] == "worker-b"
    )
    if changed_once:
        say(
            f"A was fenced out (409 FENCED_OUT); the resource changed once: quantity "
            f"{START_QUANTITY} -> {final['quantity']}, written by {final['lastWriter']}"
        )
    else:
        say(
            f"UNEXPECTED: the resource is {final} (forged {answer_forged.status_code}, "
            f"B {answer_b.status_code}, A {answer_a.status_code}): a write was not refused"
        )
    return changed_once


def main() -> int:
    # The lock client's events (`lock_lost` when A's lease runs out) as JSON lines, as the
    # service's settings log the kit's.
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter())
    logging.getLogger("dlock").addHandler(handler)
    lock_url = os.environ["LOCK_SERVER_URL"]
    env = dict(os.environ)
    if not env.get("DLOCK_FENCING_PUBLIC_KEYS"):
        env["DLOCK_FENCING_PUBLIC_KEYS"] = fetch_public_keys(lock_url).setting_value()
        say("read the lock server's public keys from GET /v1/fencing-keys")
    database_url = own_database(
        os.environ["PAY_DATABASE_URL"], os.environ.get("EXAMPLE_DATABASE_NAME", "dlock_example")
    )
    port = int(os.environ["EXAMPLE_PORT"])
    env.update(EXAMPLE_DATABASE_URL=database_url, DJANGO_SETTINGS_MODULE="examples.stock.settings")
    service = start_service(env, port)
    say(f"the stock service is up on 127.0.0.1:{port} (examples/stock/service.py)")
    try:
        return 0 if play(lock_url, f"http://127.0.0.1:{port}", database_url) else 1
    finally:
        service.terminate()
        service.wait(timeout=30)


if __name__ == "__main__":
    raise SystemExit(main())
