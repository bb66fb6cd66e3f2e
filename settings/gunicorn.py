"""gunicorn settings for every server role (ROLE picks the app; PORT the listener).

`ROLE=payments gunicorn -c settings/gunicorn.py settings.wsgi`. Every value can be overridden
from the environment (GUNICORN_*); the defaults and why they are what they are:
docs/operations.md, the measurements in docs/CHANGELOG.md.
"""

import gc
import os
import tempfile
from pathlib import Path

_role = os.environ.get("ROLE", "")


def _int(name: str, default: int) -> int:
    raw = os.environ.get(name, "")
    return int(raw) if raw else default


# One process per role by default, threads inside it (docs/CHANGELOG.md):
# the GIL caps a process at about one core of Python, and the psycopg pool (DB_POOL_MAX, per
# process) bounds database work. A pod on a machine with more cores runs GUNICORN_WORKERS > 1: then
# Prometheus metrics live in prometheus_client's multiprocess files, one per worker, summed by
# /metrics (dlock.metrics.scrape_registry). PROMETHEUS_MULTIPROC_DIR names the directory (an
# emptyDir in Kubernetes); unset, a fresh one under $TMPDIR. It must be in the environment before
# anything imports prometheus_client (the workers are forked from this master), so it is set here,
# before the imports below, and emptied: files left by an earlier master would be summed in.
# One directory per pod (per master): never share it between roles or pods.
workers = _int("GUNICORN_WORKERS", 1)
_own_multiproc = workers > 1 and not os.environ.get("PROMETHEUS_MULTIPROC_DIR")
if workers > 1 or os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
    _multiproc = Path(
        os.environ.get("PROMETHEUS_MULTIPROC_DIR") or tempfile.mkdtemp(prefix=f"dlock-{_role}-")
    )
    _multiproc.mkdir(parents=True, exist_ok=True)
    for _stale in _multiproc.glob("*.db"):
        _stale.unlink()
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(_multiproc)


def child_exit(server, worker) -> None:
    """A dead worker's live gauges leave /metrics (its counters stay summed in)."""
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(worker.pid)


def on_exit(server) -> None:
    """Log `service_stopped`; remove the metrics directory this master made for itself (not one
    it was given)."""
    lifecycle.on_exit(server)
    if _own_multiproc:
        import shutil

        shutil.rmtree(os.environ["PROMETHEUS_MULTIPROC_DIR"], ignore_errors=True)


from dlock import edge_listener, lifecycle  # noqa: E402 - after PROMETHEUS_MULTIPROC_DIR is set
from dlock.budgets import LONGEST_REQUEST_S  # noqa: E402

# Behind the role's proxy (nginx: devstack.pod locally, a sidecar in Kubernetes), gunicorn is
# reachable only through it: GUNICORN_BIND is a unix socket in the pod's directory (make up,
# tests) or 127.0.0.1:<port> inside a pod. Without it, BIND_HOST:PORT: a role run bare, e.g. by
# the image smoke test (the monitoring listener, METRICS_PORT, is the proxy's: deploy/nginx/).
if os.environ.get("GUNICORN_BIND"):
    bind = [os.environ["GUNICORN_BIND"]]
else:
    bind = [f"{os.environ.get('BIND_HOST', '127.0.0.1')}:{os.environ.get('PORT', '8080')}"]

# Stock gthread; the subclass only closes the listener at once on SIGTERM and logs the drain
# (dlock/serving.py). GUNICORN_WORKER_CLASS exists for comparisons (bench), not for production.
worker_class = os.environ.get("GUNICORN_WORKER_CLASS", "dlock.serving.DrainingThreadWorker")
# More threads than database slots on purpose: a thread waiting for a slot gives up after
# DB_QUEUE_DEADLINE_MS with 503 OVERLOADED; beyond DB_POOL_MAX_WAITING waiters it is refused at
# once. The lock server also parks threads in bounded acquire waits (waitMillis <= 30 s).
# The rail proxy holds a thread (never a database slot: it hands its connection back first) for
# the whole forward, and the rail stub sleeps its latency in one: at rail latency L, T threads
# cap the pipeline at T / L payouts/s (16 threads at 200 ms is 80/s, at 1 s 16/s), so they get
# 64 (one executor process keeps up to 64 payouts in flight). Those threads come back
# from the rail together and each needs a database slot to record what the rail answered: a
# refusal there ("too many waiting") would leave a submission the rail may have booked
# RAIL_AMBIGUOUS, so in these two roles every thread has a place in the slot queue (the queue
# deadline, DB_QUEUE_DEADLINE_MS, still bounds the wait). gunicorn's raw_env sets it in the
# master (workers inherit it) without touching the environment of whoever reads this file.
# The lock server's 64: LOCK_MAX_WAITS_PER_PROCESS (40) parked waits leave 24 for the fast path,
# and every thread has a place in the slot queue too (at 32 clients the default 16 places shed a
# fifth of the requests with 503 and their retries made the p99 half a second); chosen by
# measurement (docs/performance.md, "Retired studies").
_THREADS = {"lockserver": 64, "railproxy": 64, "railstub": 64}
threads = _int("GUNICORN_THREADS", _THREADS.get(_role, 16))
raw_env = (
    [f"DB_POOL_MAX_WAITING={threads}"]
    if _role in ("lockserver", "railproxy", "railstub")
    and not os.environ.get("DB_POOL_MAX_WAITING")
    else []
)
# Open connections per process (keep-alive included): the proxy's upstream keep-alive pool
# (64) plus the requests it forwards. A request older than SERVER_QUEUE_DEADLINE_MS since the
# proxy took it (X-Request-Start) is shed with 503 OVERLOADED before Django (dlock.admission).
worker_connections = _int("GUNICORN_WORKER_CONNECTIONS", 2048)
backlog = _int("GUNICORN_BACKLOG", 2048)

# C3 §3.8 budgets shrink inward; the server must outlive every request its callers may still be
# waiting for: the longest legitimate request per role is dlock.budgets.LONGEST_REQUEST_S.
_longest_request_s = LONGEST_REQUEST_S.get(_role, 15)
# gthread workers heartbeat from the event loop, not per request: `timeout` only kills a worker
# whose loop is stuck, never a slow request. Keep it above any request anyway.
timeout = _int("GUNICORN_TIMEOUT", 60)
# SIGTERM/SIGINT: listener closed at once, in-flight requests get this long, then exit.
# Kubernetes terminationGracePeriodSeconds must exceed it (k8s/ sets it per role).
graceful_timeout = _int("GUNICORN_GRACEFUL_TIMEOUT", _longest_request_s)
# The proxy reuses its upstream connections for at most 4 s idle (deploy/nginx/): longer
# here, so gunicorn never closes one nginx is about to reuse.
keepalive = _int("GUNICORN_KEEPALIVE", 5)

# Request limits: the proxy refuses bigger heads first (4 KiB lines, 413 over
# DLOCK_MAX_BODY_BYTES); these stay as a second fence for a role run bare.
# (above anything the proxy passes on: its 16 KiB head holds fewer than 4096 fields).
limit_request_line = 8190
limit_request_fields = 4096
limit_request_field_size = 8190

# The worker's heartbeat touches a file in worker_tmp_dir from the event loop; on a disk or
# overlay filesystem that is a metadata write each time, in memory it is not (gunicorn's own
# advice for containers); gunicorn makes its file there with mkstemp and unlinks it at once.
_shm = "/dev/shm"  # noqa: S108 - see above
worker_tmp_dir = os.environ.get("GUNICORN_WORKER_TMP_DIR") or (
    _shm if os.path.isdir(_shm) and os.access(_shm, os.W_OK) else None
)

accesslog = None  # request logs come from the app (JSON, without bodies)
errorlog = "-"
loglevel = os.environ.get("GUNICORN_LOGLEVEL", "warning")
proc_name = f"dlock-{_role}"
# Only the role's own proxy reaches gunicorn, and it overwrites X-Forwarded-For/-Proto.
forwarded_allow_ips = "127.0.0.1,::1"
# The scheme is the proxy's X-Forwarded-Proto alone: gunicorn's default also reads
# X-Forwarded-Ssl and X-Forwarded-Protocol and answers a contradiction between them with its own
# HTML 400 (the proxy drops a client's copies of those two as well).
secure_scheme_headers = {"X-FORWARDED-PROTO": "https"}
# One JSON line when the role is ready and one when it has stopped (dlock.lifecycle; the drain
# line comes from the worker, dlock.serving).
when_ready = lifecycle.when_ready
# Its proxy's datagrams: bound by the master, read in every worker (from post_worker_init).
on_starting = edge_listener.listen
# gunicorn's control socket (gunicornc) is off: nothing uses it, and its default path under
# $HOME is read-only in the image (it logged "Control server error: [Errno 30]" on every start).
control_socket_disable = True


def post_worker_init(worker) -> None:
    """The objects the worker made loading the app (modules, settings, URLconf: most of the
    heap) go to the collector's permanent generation, so its full collections never walk them
    again. Measured at 1 x 32, rail 0 (bench e2e, 2 048 payouts): full collections took
    0.27 s of the four roles' CPU before, 0.08 s after (0.09 ms per payout, 0.6 %). First, the
    worker starts reading its proxy's datagrams (dlock.edge_listener)."""
    edge_listener.read_in_child(worker)
    gc.freeze()
