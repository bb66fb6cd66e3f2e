"""gunicorn settings for every server role (ROLE picks the app; PORT the listener).

`ROLE=payments gunicorn -c settings/gunicorn.py settings.wsgi`. Every value can be overridden
from the environment (GUNICORN_*); the defaults and why they are what they are:
docs/operations.md, numbers in docs/benchmarks.md.
"""

import os
import tempfile
from pathlib import Path

_role = os.environ.get("ROLE", "")


def _int(name: str, default: int) -> int:
    raw = os.environ.get(name, "")
    return int(raw) if raw else default


# One process per role by default, threads inside it (measured in docs/benchmarks.md): the GIL
# caps a process at about one core of Python, and the psycopg pool (DB_POOL_MAX, per process)
# bounds database work. A pod on a machine with more cores runs GUNICORN_WORKERS > 1: then
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
    """Remove the metrics directory this master made for itself (not one it was given)."""
    if _own_multiproc:
        import shutil

        shutil.rmtree(os.environ["PROMETHEUS_MULTIPROC_DIR"], ignore_errors=True)


from dlock.serving import drain_on_sigint  # noqa: E402 - after PROMETHEUS_MULTIPROC_DIR is set

_host = os.environ.get("BIND_HOST", "127.0.0.1")
bind = [f"{_host}:{os.environ.get('PORT', '8080')}"]
# Kubernetes scrapes a separate port (`http-metrics`) that answers /metrics and /health/* only
# (dlock.middleware.refusal), so NetworkPolicy can open it to monitoring alone.
if os.environ.get("METRICS_PORT"):
    bind.append(f"{_host}:{os.environ['METRICS_PORT']}")

# GUNICORN_WORKER_CLASS exists for the comparison in bench/loadtest.py, not for production.
worker_class = os.environ.get("GUNICORN_WORKER_CLASS", "dlock.serving.DrainingThreadWorker")
# More threads than database slots on purpose: a thread waiting for a slot gives up after
# DB_QUEUE_DEADLINE_MS with 503 OVERLOADED; beyond DB_POOL_MAX_WAITING waiters it is refused at
# once. The lock server also parks threads in bounded acquire waits (waitMillis <= 30 s).
# The rail proxy holds a thread (never a database slot: it hands its connection back first) for
# the whole forward, and the rail stub sleeps its latency in one: at rail latency L, T threads
# cap the pipeline at T / L payouts/s (16 threads at 200 ms is 80/s, at 1 s 16/s), so they get
# 64 (issue 17: one executor process keeps up to 64 payouts in flight). Those threads come back
# from the rail together and each needs a database slot to record what the rail answered: a
# refusal there ("too many waiting") would leave a submission the rail may have booked
# RAIL_AMBIGUOUS, so in these two roles every thread has a place in the slot queue (the queue
# deadline, DB_QUEUE_DEADLINE_MS, still bounds the wait). gunicorn's raw_env sets it in the
# master (workers inherit it) without touching the environment of whoever reads this file.
_THREADS = {"lockserver": 32, "railproxy": 64, "railstub": 64}
threads = _int("GUNICORN_THREADS", _THREADS.get(_role, 16))
raw_env = (
    [f"DB_POOL_MAX_WAITING={threads}"]
    if _role in ("railproxy", "railstub") and not os.environ.get("DB_POOL_MAX_WAITING")
    else []
)
# Open connections per process (keep-alive included); above it the worker stops accepting and
# new clients wait in the kernel backlog, where no deadline sees them (a 2x load test hung
# there). Accepted requests cost little when the box is full: one older than
# SERVER_QUEUE_DEADLINE_MS (from its arrival) is shed with 503 OVERLOADED before Django
# (dlock.admission).
worker_connections = _int("GUNICORN_WORKER_CONNECTIONS", 2048)
backlog = _int("GUNICORN_BACKLOG", 2048)

# C3 §3.8 budgets shrink inward; the server must outlive every request its callers may still be
# waiting for. The longest legitimate request per role:
#   lockserver: acquire with waitMillis 30 s (+ database deadline)
#   railproxy:  rail connect 1 s + rail read 8 s + two database exchanges (its caller waits 10 s)
#   payments:   database queue deadline + statement deadline (~5 s); its caller waits 3 s
#   railstub:   its configured latency (experiments keep it below the proxy's 8 s read timeout)
_longest_request_s = {"lockserver": 33, "railproxy": 15, "payments": 6, "railstub": 10}.get(
    _role, 15
)
# gthread workers heartbeat from the event loop, not per request: `timeout` only kills a worker
# whose loop is stuck, never a slow request. Keep it above any request anyway.
timeout = _int("GUNICORN_TIMEOUT", 60)
# SIGTERM/SIGINT: listener closed at once, in-flight requests get this long, then exit.
# Kubernetes terminationGracePeriodSeconds must exceed it (k8s/ sets it per role).
graceful_timeout = _int("GUNICORN_GRACEFUL_TIMEOUT", _longest_request_s)
# Executors reuse connections; the keep-alive must be shorter than any idle timeout in front
# of us (kube-proxy/conntrack is minutes) so the server, not a middlebox, closes first.
keepalive = _int("GUNICORN_KEEPALIVE", 5)

# Request limits (the body limit is DLOCK_MAX_BODY_BYTES, enforced by dlock.middleware).
limit_request_line = 4094  # the longest path is /v1/locks/<128-char key>/acquire + query
limit_request_fields = 50
limit_request_field_size = 4096  # header values are also validated by dlock.headers

# The worker's heartbeat touches a file in worker_tmp_dir from the event loop (dlock's worker: at
# most every 0.5 s, dlock.serving.HEARTBEAT_INTERVAL_S; stock gthread: every turn); on a disk or
# overlay filesystem that is a metadata write each time, in memory it is not (gunicorn's own
# advice for containers).
# gunicorn makes its file there with mkstemp and unlinks it at once.
_shm = "/dev/shm"  # noqa: S108 - see above
worker_tmp_dir = os.environ.get("GUNICORN_WORKER_TMP_DIR") or (
    _shm if os.path.isdir(_shm) and os.access(_shm, os.W_OK) else None
)

accesslog = None  # request logs come from the app (JSON, without bodies)
errorlog = "-"
loglevel = os.environ.get("GUNICORN_LOGLEVEL", "warning")
proc_name = f"dlock-{_role}"
# Behind a Kubernetes Service there is no proxy whose headers we trust.
forwarded_allow_ips = ""
when_ready = drain_on_sigint
# gunicorn's control socket (gunicornc) is off: nothing uses it, and its default path under
# $HOME is read-only in the image (it logged "Control server error: [Errno 30]" on every start).
control_socket_disable = True
