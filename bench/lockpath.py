"""The lock path's CPU by layer (issue 39 item 3): the lock server's WSGI application (Django,
dlock, django-prometheus, psycopg — no gunicorn, no nginx) called in this process for acquire +
release pairs on one key against a private durable PostgreSQL, timed by CPU (`process_time`),
then profiled by CPU time (cProfile on `process_time`, not wall clock or GIL samples) and each
function's own time summed by the package it lives in.

`python -m bench --only lockpath` (BENCH_LOCKPATH_PAIRS, default 2 000; BENCH_LOCKPATH_ROUNDS,
default 8; BENCH_LOCKPATH_BACKEND=etcd runs the etcd backend on a private etcd, into
`lockpath-etcd.json`). Writes `<out>/lockpath.json`: CPU per pair without the profiler; arms
in blocks of pairs/8 alternated in one process (order rotated per round) — the role at the
bench's WARNING and at the default INFO, and with each per-request cut undone (django-prometheus'
stock request metrics; log records that collect caller and thread; the pair's two event lines
written, as at DEBUG; the request parsed by gunicorn's Python parser rather than gunicorn_h1c,
the C parser gunicorn's default `http_parser` picks up) — with what each cut saves (the median
per-round difference); and the share of each layer. The parser arms parse each request's bytes
with gunicorn's own RequestParser before the application is called (gunicorn's only part here).
"""

from __future__ import annotations

import cProfile
import io
import json
import logging
import os
import pstats
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from django_prometheus.middleware import (
    Metrics,
    PrometheusAfterMiddleware,
    PrometheusBeforeMiddleware,
)
from gunicorn.config import Config as GunicornConfig
from gunicorn.http.parser import RequestParser
from prometheus_client import CollectorRegistry

from bench import credentials
from bench.rounds import rotated
from devstack.common import free_port
from devstack.etcd import EtcdServer
from devstack.postgres import PgCluster
from devstack.roles import manage

PAIRS = int(os.environ.get("BENCH_LOCKPATH_PAIRS", "2000"))
ARM_ROUNDS = int(os.environ.get("BENCH_LOCKPATH_ROUNDS", "8"))
BACKEND = os.environ.get("BENCH_LOCKPATH_BACKEND", "pg")
NAME = "lockpath" if BACKEND == "pg" else f"lockpath-{BACKEND}"
PROJECT = Path(__file__).resolve().parent.parent


def _layer(filename: str) -> str:
    if "/site-packages/" in filename:
        return filename.split("/site-packages/")[1].split("/")[0]
    if filename.startswith(str(PROJECT)):
        top = filename[len(str(PROJECT)) + 1 :].split("/")[0]
        return "harness" if top == "bench" else f"dlock ({top}/)"
    if filename == "~":
        return "builtins (C functions called from Python)"
    return "standard library"


class _App:
    """The role's WSGI application with a session of its own; `pair()` is one L4 + L6."""

    def __init__(self) -> None:
        from settings.wsgi import application

        self.application = application
        self.parser: GunicornConfig | None = None  # parse each request with gunicorn's parser
        self.headers = {**credentials.headers(), "X-Owner-Id": "lockpath"}
        status, body = self.call(
            "POST", "/v1/sessions", {"ownerId": "lockpath", "ttlMillis": 60_000}
        )
        assert status == 201, (status, body)
        self.session = body["sessionId"]
        self.count = 0

    def parse(self, method: str, path: str, raw: bytes, headers: dict) -> None:
        """What gunicorn does with the request's bytes before the application is called."""
        assert self.parser is not None
        head = [f"{method} {path} HTTP/1.1", "Host: 127.0.0.1", f"Content-Length: {len(raw)}"]
        head += [f"{name}: {value}" for name, value in headers.items()]
        if raw:
            head.append("Content-Type: application/json")
        data = ("\r\n".join(head) + "\r\n\r\n").encode() + raw
        request = next(RequestParser(self.parser, iter([data]), ("127.0.0.1", 40000)))
        assert request.path == path.partition("?")[0] and request.body.read() == raw

    def call(self, method: str, path: str, body: dict | None = None, extra: dict | None = None):
        raw = json.dumps(body).encode() if body is not None else b""
        if self.parser is not None:
            self.parse(method, path, raw, {**self.headers, **(extra or {})})
        path, _, query = path.partition("?")
        environ = {
            "REQUEST_METHOD": method,
            "PATH_INFO": path,
            "QUERY_STRING": query,
            "SERVER_NAME": "127.0.0.1",
            "SERVER_PORT": "80",
            "HTTP_HOST": "127.0.0.1",
            "SERVER_PROTOCOL": "HTTP/1.1",
            "REMOTE_ADDR": "127.0.0.1",
            "CONTENT_LENGTH": str(len(raw)),
            "wsgi.input": io.BytesIO(raw),
            "wsgi.errors": sys.stderr,
            "wsgi.url_scheme": "http",
            "wsgi.multithread": True,
            "wsgi.multiprocess": False,
            "wsgi.run_once": False,
        }
        if raw:
            environ["CONTENT_TYPE"] = "application/json"
        for name, value in {**self.headers, **(extra or {})}.items():
            environ["HTTP_" + name.upper().replace("-", "_")] = value
        answer: dict = {}

        def start(status: str, headers: list, exc_info=None) -> None:
            answer["status"] = int(status[:3])

        content = b"".join(self.application(environ, start))
        return answer["status"], (json.loads(content) if content else {})

    def pair(self) -> None:
        self.count += 1
        if self.count % 300 == 0:  # the session outlives a slow, profiled run
            self.call("POST", f"/v1/sessions/{self.session}/heartbeat", {})
        status, grant = self.call(
            "POST", "/v1/locks/lockpath/acquire", {"sessionId": self.session, "ttlMillis": 10_000}
        )
        assert status == 200, (status, grant)
        proof = {"X-Fencing-Token": str(grant["fencingToken"])}
        proof[credentials.PROOF_HEADER] = grant["fencingProof"]
        status, _ = self.call("DELETE", f"/v1/locks/lockpath?sessionId={self.session}", None, proof)
        assert status == 204, status


class _StockMetrics(Metrics):
    """django-prometheus' stock request metrics in a registry of their own (the role's own
    registry already holds the names dlock.prometheus exports): the same updates per request."""

    _instance = None

    def register_metric(self, metric_cls, name, documentation, labelnames=(), **kwargs):
        kwargs["registry"] = CollectorRegistry()
        return super().register_metric(metric_cls, name, documentation, labelnames, **kwargs)


class _StockBefore(PrometheusBeforeMiddleware):
    metrics_cls = _StockMetrics


class _StockAfter(PrometheusAfterMiddleware):
    metrics_cls = _StockMetrics


_STOCK_METRICS = {
    "dlock.prometheus.BeforeMiddleware": f"{__name__}._StockBefore",
    "dlock.prometheus.AfterMiddleware": f"{__name__}._StockAfter",
}


def _parser(mode: str) -> GunicornConfig:
    config = GunicornConfig()
    config.set("http_parser", mode)  # "python", or "fast": gunicorn_h1c (an error without it)
    return config


def _arms(app: _App) -> dict[str, tuple]:
    """Each arm: (WSGI application, log level, collect caller and thread info in records, the
    level of dlock's events, gunicorn's request parser or None). The shipped role at the bench's
    WARNING and at the default INFO, and each cut undone: django-prometheus' stock request
    metrics (dlock.prometheus), log records that collect the caller and thread (dlock.logs),
    the pair's two event lines (lockserver.services, DEBUG), gunicorn_h1c (gunicorn's Python
    parser instead)."""
    from django.conf import settings
    from django.core.handlers.wsgi import WSGIHandler
    from django.test import override_settings

    stock = [_STOCK_METRICS.get(name, name) for name in settings.MIDDLEWARE]
    with override_settings(MIDDLEWARE=stock):
        stock_metrics = WSGIHandler()
    python, fast = _parser("python"), _parser("fast")
    return {
        "WARNING": (app.application, logging.WARNING, False, logging.NOTSET, None),
        "INFO": (app.application, logging.INFO, False, logging.NOTSET, None),
        "WARNING, stock request metrics": (
            stock_metrics,
            logging.WARNING,
            False,
            logging.NOTSET,
            None,
        ),
        "INFO, records with caller and thread": (
            app.application,
            logging.INFO,
            True,
            logging.NOTSET,
            None,
        ),
        "INFO, the pair's event lines written (DEBUG)": (
            app.application,
            logging.INFO,
            False,
            logging.DEBUG,
            None,
        ),
        "INFO, gunicorn's Python request parser": (
            app.application,
            logging.INFO,
            False,
            logging.NOTSET,
            python,
        ),
        "INFO, gunicorn_h1c request parser": (
            app.application,
            logging.INFO,
            False,
            logging.NOTSET,
            fast,
        ),
    }


# What each cut saves (µs per pair): the median per-round difference of two arms.
_CUTS = {
    "request metrics: 4 updates per request, not 12 (dlock.prometheus)": (
        "WARNING, stock request metrics",
        "WARNING",
    ),
    "log records without caller and thread (dlock.logs)": (
        "INFO, records with caller and thread",
        "INFO",
    ),
    "the pair's two event lines at DEBUG, not written at INFO (lockserver.services)": (
        "INFO, the pair's event lines written (DEBUG)",
        "INFO",
    ),
    "gunicorn_h1c: gunicorn's C request parser, not its Python one (2 requests)": (
        "INFO, gunicorn's Python request parser",
        "INFO, gunicorn_h1c request parser",
    ),
}


def _set_arm(app: _App, arm: tuple) -> None:
    app.application, level, caller, events, app.parser = arm
    logging.getLogger().setLevel(level)
    logging.getLogger("dlock.events").setLevel(events)
    logging._srcfile = _SRCFILE if caller else None  # type: ignore[attr-defined]
    logging.logThreads = logging.logMultiprocessing = caller


# What the standard library sets `logging._srcfile` to (dlock.logs turns it off).
_SRCFILE = os.path.normcase(logging.addLevelName.__code__.co_filename)


def _measure(out: Path, pairs: int) -> dict:
    """In a process of its own (Django configured for the lock-server role)."""
    app = _App()
    arms = _arms(app)
    for arm in arms.values():  # warm: prepared statements, pool, caches
        _set_arm(app, arm)
        for _ in range(200):
            app.pair()
    _set_arm(app, arms["WARNING"])
    cpu, wall = time.process_time(), time.perf_counter()
    for _ in range(pairs):
        app.pair()
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    # Arms in alternated blocks (order rotated per round), CPU per pair of each block.
    blocks: dict[str, list[float]] = {name: [] for name in arms}
    names = list(arms)
    for index in range(ARM_ROUNDS):
        for name in rotated(names, index):
            _set_arm(app, arms[name])
            began = time.process_time()
            for _ in range(pairs // 8):
                app.pair()
            blocks[name].append((time.process_time() - began) * 1000 / (pairs // 8))
    cuts = {
        cut: round(
            1000
            * statistics.median(
                a - b for a, b in zip(blocks[undone], blocks[shipped], strict=True)
            ),
            1,
        )
        for cut, (undone, shipped) in _CUTS.items()
    }
    logs = {level: round(statistics.median(blocks[level]), 3) for level in ("INFO", "WARNING")}
    _set_arm(app, arms["WARNING"])
    profile = cProfile.Profile(time.process_time)
    profile.enable()
    for _ in range(pairs):
        app.pair()
    profile.disable()
    stats = pstats.Stats(profile)
    by_layer: Counter[str] = Counter()
    by_function: Counter[str] = Counter()
    for (filename, line, function), row in stats.stats.items():  # type: ignore[attr-defined]
        own = row[2]
        by_layer[_layer(filename)] += own
        if _layer(filename).startswith("dlock"):
            by_function[f"{filename[len(str(PROJECT)) + 1 :]}:{line} {function}"] += own
    total = sum(by_layer.values()) or 1.0
    data = {
        "name": NAME,
        "backend": BACKEND,
        "pairs": pairs,
        "cpu_ms_per_pair": round(cpu * 1000 / pairs, 3),
        "wall_ms_per_pair": round(wall * 1000 / pairs, 3),
        "cpu_ms_per_pair_by_log_level": logs,
        "cpu_ms_per_pair_by_arm": {
            name: round(statistics.median(values), 3) for name, values in blocks.items()
        },
        "cuts_us_per_pair": cuts,
        "layers_percent": {k: round(100 * v / total, 1) for k, v in by_layer.most_common()},
        "dlock_functions_percent": {
            k: round(100 * v / total, 2) for k, v in by_function.most_common(15)
        },
    }
    (out / f"{NAME}.json").write_text(json.dumps(data, indent=2) + "\n")
    return data


def run(out_dir: str | Path = ".run/bench", pairs: int = PAIRS) -> dict:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="dlock-bench-lockpath-"))
    work.chmod(0o755)
    pg = PgCluster(work / "pg", free_port())
    pg.start()
    etcd = EtcdServer(work / "etcd", free_port(), free_port()) if BACKEND == "etcd" else None
    if etcd is not None:
        etcd.start()
    try:
        env = {
            "DJANGO_SECRET_KEY": os.environ.get("DJANGO_SECRET_KEY") or secrets.token_urlsafe(48),
            "DJANGO_DEBUG": "false",
            "DLOCK_LOG_LEVEL": "WARNING",
            "LOCK_RETRY_BUDGET": "1000000",
            **credentials.server_env(),
            "LOCK_BACKEND": BACKEND,
            "LOCK_DATABASE_URL": pg.create_database("bench_lockpath"),
            "ROLE": "lockserver",
            **({"ETCD_URL": etcd.url} if etcd is not None else {}),
        }
        manage(["migrate", "--no-input", "-v", "0"], env, role="lockserver")
        child = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
        # The event lines of the INFO blocks (the role logs to stderr) go to a file, not a pipe
        # someone must drain: lockpath.log, with anything else the run had to say.
        with (out / "lockpath.log").open("w") as log:
            subprocess.run(
                [sys.executable, "-m", "bench.lockpath", str(out), str(pairs)],
                env={**child, **env},
                cwd=PROJECT,
                check=True,
                stdout=subprocess.DEVNULL,
                stderr=log,
            )
    finally:
        if etcd is not None:
            etcd.stop()
        pg.stop("immediate")
    return json.loads((out / f"{NAME}.json").read_text())  # bench.report prints it


if __name__ == "__main__":
    _measure(Path(sys.argv[1]), int(sys.argv[2]))
