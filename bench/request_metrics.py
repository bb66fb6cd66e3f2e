"""CPU per request of django-prometheus' request metrics, in process, per role.

`python -m bench.request_metrics [ROLE ...] [--requests N] [--rounds R]`: each role in a fresh
process (bench.overhead's environment: its settings overlay, DEBUG off, no database), two
Django WSGI handlers side by side — settings.MIDDLEWARE as shipped, and the same without
django-prometheus' two middlewares — called alternately in blocks of N requests, R rounds,
for three paths that touch no database (`GET /health/live`, a `/v1` write refused 401, an
unknown `/v1` route, 404). Thread CPU per request; the medians and the median per-round
difference (what the metrics cost) are printed as one JSON line per role.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from bench.overhead import ROLES, WRITE_PATH, _environ, _role_env

PROMETHEUS = ("dlock.prometheus.BeforeMiddleware", "dlock.prometheus.AfterMiddleware")


def measure(role: str, n: int, rounds: int) -> dict:
    import django
    from django.conf import settings
    from django.core.handlers.wsgi import WSGIHandler
    from django.test import override_settings

    django.setup()
    shipped = WSGIHandler()
    with override_settings(MIDDLEWARE=[m for m in settings.MIDDLEWARE if m not in PROMETHEUS]):
        bare = WSGIHandler()

    def start_response(status, headers, exc_info=None):
        return None

    def block(app, method: str, path: str) -> float:
        started = time.thread_time()
        for _ in range(n):
            b"".join(app(_environ(method, path), start_response))
        return (time.thread_time() - started) / n * 1e6

    paths = {
        "health_live": ("GET", "/health/live"),
        "v1_401": ("POST", WRITE_PATH.get(role, "/v1/payouts/x/claim")),
        "v1_404": ("GET", "/v1/no-such-route"),
    }
    result: dict = {"role": role}
    for name, (method, path) in paths.items():
        block(shipped, method, path), block(bare, method, path)  # warm both
        with_metrics, without = [], []
        for index in range(rounds):
            arms = [(shipped, with_metrics), (bare, without)]
            for app, into in arms if index % 2 == 0 else arms[::-1]:
                into.append(block(app, method, path))
        result[name] = {
            "with_us": round(statistics.median(with_metrics), 1),
            "without_us": round(statistics.median(without), 1),
            "metrics_us": round(
                statistics.median(a - b for a, b in zip(with_metrics, without, strict=True)), 1
            ),
        }
    return result


def main(argv: list[str]) -> int:
    if argv[:1] == ["--child"]:
        print(json.dumps(measure(argv[1], int(argv[2]), int(argv[3]))))
        return 0
    options = {"--requests": 1000, "--rounds": 5}
    for flag in options:
        if flag in argv:
            at = argv.index(flag)
            options[flag] = int(argv[at + 1])
            argv = argv[:at] + argv[at + 2 :]
    from dlock.auth import new_credential

    credential = new_credential()
    project = Path(__file__).resolve().parent.parent
    print(f"load average {os.getloadavg()[0]:.2f}")
    for role in argv or ROLES:
        child = subprocess.run(
            [sys.executable, "-m", "bench.request_metrics", "--child", role]
            + [str(options["--requests"]), str(options["--rounds"])],
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
