"""Framework CPU per request, per role, without a database (issue 18: the per-request overhead).

`python -m bench.overhead [ROLE ...] [--requests N]`: each role in a fresh process (its own
settings overlay, DEBUG off), Django's WSGI handler called in-process exactly as gunicorn calls
it, CPU time of the calling thread per request for three paths that touch no database —
`GET /health/live`, a `/v1` write without a credential (401 envelope) and an unknown `/v1` route
(404 envelope) — so what is measured is the handler, the middleware, URL resolution, the
credential check and the envelope. For payment-resource also P4 and P1 refused in the view
(a non-UUID id, `limit=0`: the executor's reads up to the SQL), for rail-stub `POST /submit`
with an empty object (400). For rail-proxy also one rail forward (`rail_call.forward`)
against a loopback socket that answers a valid ack. Thread CPU, not wall time: the number moves
less with other load on the box; compare trees interleaved all the same.
"""

from __future__ import annotations

import io
import json
import os
import secrets
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

from devstack import bound_listener

ROLES = ("lockserver", "payments", "railproxy", "railstub")
WRITE_PATH = {"lockserver": "/v1/locks/k/acquire", "railproxy": "/v1/rail/submissions"}
NOWHERE = "postgres://bench@127.0.0.1:1/unused"
ACK = json.dumps({"railReference": "RR-1", "acceptedAt": "2026-12-01T00:00:00.000Z"}).encode()


# A credential the child's DLOCK_CREDENTIALS accepts (the refused reads below reach the view);
# the parent makes it, each child reads it from its environment.
CREDENTIAL_ENV = "BENCH_OVERHEAD_CREDENTIAL"


def _environ(
    method: str, path: str, query: str = "", body: bytes = b"", auth: bool = False
) -> dict:
    extra = {"HTTP_AUTHORIZATION": f"Bearer {os.environ[CREDENTIAL_ENV]}"} if auth else {}
    if body:
        extra["CONTENT_TYPE"] = "application/json"
    return {
        **extra,
        "REQUEST_METHOD": method,
        "PATH_INFO": path,
        "QUERY_STRING": query,
        "SERVER_NAME": "127.0.0.1",
        "SERVER_PORT": "8080",
        "SERVER_PROTOCOL": "HTTP/1.1",
        "HTTP_HOST": "127.0.0.1",
        "HTTP_ACCEPT": "application/json",
        "HTTP_TRACEPARENT": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
        "CONTENT_LENGTH": str(len(body)),
        "wsgi.input": io.BytesIO(body),
        "wsgi.url_scheme": "http",
        "wsgi.errors": sys.stderr,
    }


def _per_call_us(call, n: int) -> float:
    for _ in range(min(200, n)):
        call()
    started = time.thread_time()
    for _ in range(n):
        call()
    return round((time.thread_time() - started) / n * 1e6, 1)


def _ack_server() -> int:
    listener = bound_listener(backlog=512)

    def serve() -> None:
        while True:
            conn, _ = listener.accept()
            with conn:
                data = b""
                while b"\r\n\r\n" not in data:
                    data += conn.recv(4096)
                head, _, rest = data.partition(b"\r\n\r\n")
                length = next(
                    int(line.split(b":", 1)[1])
                    for line in head.split(b"\r\n")
                    if line.lower().startswith(b"content-length:")
                )
                while len(rest) < length:
                    rest += conn.recv(4096)
                conn.sendall(
                    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n"
                    b"Content-Length: %d\r\n\r\n%s" % (len(ACK), ACK)
                )

    threading.Thread(target=serve, daemon=True).start()
    return listener.getsockname()[1]


def measure(role: str, n: int) -> dict:
    """In this process: configure Django for `role` and time the paths."""
    import django
    from django.core.wsgi import get_wsgi_application

    django.setup()
    app = get_wsgi_application()

    def start_response(status, headers, exc_info=None):
        return None

    def call(method: str, path: str, **kw):
        return lambda: b"".join(app(_environ(method, path, **kw), start_response))

    result: dict = {"role": role}
    result["health_live_us"] = _per_call_us(call("GET", "/health/live"), n)
    result["v1_401_us"] = _per_call_us(call("POST", WRITE_PATH.get(role, "/v1/payouts/x/claim")), n)
    result["v1_404_us"] = _per_call_us(call("GET", "/v1/no-such-route"), n)
    # The view layer on the executor's reads and the stub's endpoint, refused before any SQL:
    # P4 with a non-UUID id, P1 with limit=0 (400s), POST /submit with an empty object (400).
    if role == "payments":
        result["p4_bad_id_us"] = _per_call_us(call("GET", "/v1/payouts/x", auth=True), n)
        result["p1_bad_limit_us"] = _per_call_us(
            call("GET", "/v1/payouts", query="state=PENDING&limit=0", auth=True), n
        )
    if role == "railstub":
        result["submit_400_us"] = _per_call_us(call("POST", "/submit", body=b"{}"), n)
    if role == "railproxy":
        from django.conf import settings

        from railproxy.rail_call import forward
        from railproxy.submission import SubmissionRequest

        settings.RAIL_STUB_URL = f"http://127.0.0.1:{_ack_server()}"
        request = SubmissionRequest(uuid.uuid4(), "acct", 1, "EUR", "ben", 1, "owner", "key")
        result["rail_forward_us"] = _per_call_us(
            lambda: forward(request=request, submission_id=uuid.uuid4()), max(n // 5, 100)
        )
    return result


def _role_env(role: str, credential: str) -> dict:
    from dlock.auth import credentials_entry

    return {
        **os.environ,
        "ROLE": role,
        "DJANGO_SETTINGS_MODULE": f"settings.{role}",
        "DJANGO_DEBUG": "false",
        "DJANGO_SECRET_KEY": secrets.token_urlsafe(48),
        "DLOCK_PROOF_KEYS": "bench:" + secrets.token_urlsafe(32),
        "DLOCK_CREDENTIALS": credentials_entry(credential, "executor"),
        CREDENTIAL_ENV: credential,
        "DLOCK_LOG_LEVEL": "WARNING",
        "PAY_DATABASE_URL": NOWHERE,
        "LOCK_DATABASE_URL": NOWHERE,
        "RAIL_DATABASE_URL": NOWHERE,
    }


def main(argv: list[str]) -> int:
    if argv[:1] == ["--child"]:
        print(json.dumps(measure(argv[1], int(argv[2]))))
        return 0
    n = 1500
    if "--requests" in argv:
        at = argv.index("--requests")
        n = int(argv[at + 1])
        argv = argv[:at] + argv[at + 2 :]
    project = Path(__file__).resolve().parent.parent
    from dlock.auth import new_credential

    credential = new_credential()
    for role in argv or ROLES:
        child = subprocess.run(
            [sys.executable, "-m", "bench.overhead", "--child", role, str(n)],
            env=_role_env(role, credential),
            cwd=project,
            capture_output=True,
            text=True,
            check=True,
        )
        print(child.stdout.strip().splitlines()[-1])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
