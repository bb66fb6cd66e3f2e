"""What every part of the dev stack shares: where the project is, names, ports, waiting."""

from __future__ import annotations

import contextlib
import os
import random
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import requests

PROJECT = Path(__file__).resolve().parent.parent
PYTHON = sys.executable
ROLES = ("lockserver", "payments", "railproxy", "railstub", "admin")
DEFAULT_PORTS = {
    "lockserver": 8081,
    "payments": 8082,
    "railproxy": 8083,
    "railstub": 8084,
    "admin": 8085,
}
REPLICA_PORT_STEP = 100  # replica n of a role listens on its port + (n - 1) * 100
REPLICATED_ROLES = ("lockserver", "payments", "railproxy")  # the rail stub is the outside world
URL_ENV = {
    "lockserver": "LOCK_SERVER_URL",
    "payments": "PAYMENTS_URL",
    "railproxy": "RAIL_PROXY_URL",
    "railstub": "RAIL_STUB_URL",
    "admin": "ADMIN_URL",
}
DATABASES = ("lockdb", "paydb", "raildb")
DB_URL_ENV = {
    "lockdb": "LOCK_DATABASE_URL",
    "paydb": "PAY_DATABASE_URL",
    "raildb": "RAIL_DATABASE_URL",
}
ROLE_DATABASES = {
    "lockserver": ("lockdb",),
    "payments": ("paydb",),
    "railstub": ("raildb",),
    "admin": ("paydb",),
}


class StackError(RuntimeError):
    pass


def say(message: str) -> None:
    print(f"[dlock] {message}", flush=True)


# Ports the stack and the tests listen on come from here: below the kernel's ephemeral range
# (/proc/sys/net/ipv4/ip_local_port_range, 32768-60999 on Linux by default), which outgoing
# connections draw their source ports from, so no client connection can take a port between
# free_port() choosing it and a server binding it ("Address already in use").
# DLOCK_PORT_SLICE="i/n" narrows it to its i-th of n equal slices (0-based) for one process and
# its children: each parallel test worker draws from a slice of its own (tests/pgplugin.py), so
# two processes can never choose the same port between one's probe and its bind.
FULL_RESERVED_PORTS = range(20000, 30000)


def _reserved_ports() -> range:
    given = os.environ.get("DLOCK_PORT_SLICE", "")
    if not given:
        return FULL_RESERVED_PORTS
    index, _, count = given.partition("/")
    i, n = int(index), int(count)
    if not 0 <= i < n:
        raise StackError(f"DLOCK_PORT_SLICE={given}: want i/n with 0 <= i < n")
    width = len(FULL_RESERVED_PORTS) // n
    low = FULL_RESERVED_PORTS.start + i * width
    return range(low, low + width)


RESERVED_PORTS = _reserved_ports()
_random = random.SystemRandom()


def ephemeral_range() -> range:
    """The kernel's ephemeral (outgoing source) port range, inclusive."""
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return range(int(low), int(high) + 1)
    except (OSError, ValueError):
        return range(32768, 61000)


# Ports this process handed out: the probe cannot see a port that was chosen but is not bound
# yet, so two calls before anything binds could return the same one (8 ports for one stack
# collide about once in 360 runs). Never the same port twice per process, until all are used.
_handed_out: set[int] = set()
_handed_lock = threading.Lock()
# Ports of blocks given to a stack (free_port_block): never handed out again by this process.
_blocks_held: set[int] = set()


def free_port(attempts: int = 200) -> int:
    """A random port of RESERVED_PORTS that nothing listens on or is bound to right now (a
    probe bind on 127.0.0.1 and on all addresses), never one of the ephemeral range, and never
    one this process was given before."""
    ephemeral = ephemeral_range()
    usable = [p for p in RESERVED_PORTS if p not in ephemeral]
    with _handed_lock:
        candidates = [p for p in usable if p not in _handed_out and p not in _blocks_held]
        if len(candidates) < attempts:
            _handed_out.clear()
            candidates = [p for p in usable if p not in _blocks_held]
        for _ in range(attempts):
            port = _random.choice(candidates)
            if _bindable(port):
                _handed_out.add(port)
                return port
    raise StackError(f"no free port in {RESERVED_PORTS} after {attempts} tries")


def free_port_block(size: int, *, replicas: int = 1, attempts: int = 200) -> int:
    """A base port of RESERVED_PORTS whose base+1..base+size (and the same +100 per further
    replica) are all free, for a stack given its role ports (`up(ports=...)`). The block is held
    for the life of the process: no later free_port() of it (the stack's own PostgreSQL or
    etcd, chosen after the block and before the roles bind) can return one of its ports."""
    ephemeral = ephemeral_range()
    top = RESERVED_PORTS.stop - size - 100 * (replicas - 1)
    bases = [b for b in range(RESERVED_PORTS.start, top, 10) if b not in ephemeral]
    with _handed_lock:
        for _ in range(attempts):
            base = _random.choice(bases)
            wanted = [base + n + 100 * r for n in range(1, size + 1) for r in range(replicas)]
            taken = _handed_out | _blocks_held
            if all(p not in ephemeral and p not in taken and _bindable(p) for p in wanted):
                _blocks_held.update(wanted)
                return base
    raise StackError(f"no free block of {size} ports in {RESERVED_PORTS} after {attempts} tries")


def bound_listener(backlog: int = 128, attempts: int = 20) -> socket.socket:
    """A TCP listener on 127.0.0.1 on a free_port() (never the kernel's ephemeral range), bound
    and listening: the caller keeps the socket, so nothing can take the port."""
    for _ in range(attempts):
        try:
            return socket.create_server(("127.0.0.1", free_port()), backlog=backlog)
        except OSError:  # taken between the probe and the bind
            continue
    raise StackError(f"no free port in {RESERVED_PORTS} after {attempts} tries")


def _bindable(port: int) -> bool:
    """Nothing holds `port` over TCP (on 127.0.0.1 or all addresses) or UDP: a role's proxy
    events port (PROXY_EVENTS_PORT) is a UDP port from the same range, bound by a gunicorn
    master that another process of the same slice (a `devstack up` child) may have started."""
    probes = [
        (socket.SOCK_STREAM, "127.0.0.1"),
        (socket.SOCK_STREAM, "0.0.0.0"),  # noqa: S104 - a probe bind, closed at once
        (socket.SOCK_DGRAM, "127.0.0.1"),
    ]
    for kind, host in probes:
        with socket.socket(socket.AF_INET, kind) as sock:
            try:
                sock.bind((host, port))
            except OSError:
                return False
    return True


def port_open(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.2)
        return sock.connect_ex((host, port)) == 0


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def terminate_all(pids: list[int], timeout: float = 15) -> None:
    """SIGTERM each process (a role's pod drains its nginx, then its gunicorn), SIGKILL its
    process group after `timeout`; reaps our own children. Each gets its SIGTERM before any
    is waited for, so they drain side by side (as a cluster's pods do), not one by one."""
    alive = [pid for pid in pids if pid and pid_alive(pid)]
    for pid in alive:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while alive and time.monotonic() < deadline:
        for pid in alive:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)
        alive = [pid for pid in alive if pid_alive(pid)]
        if alive:
            time.sleep(0.05)
    for pid in alive:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)


def wait_until(
    predicate: Callable[[], bool], *, timeout: float, what: str, interval: float = 0.1
) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(interval)
    raise StackError(f"timed out after {timeout:.0f}s waiting for {what}")


def _verify(ca: str | None) -> str | bool:
    return ca or os.environ.get("DLOCK_CA_BUNDLE") or True


def ready(url: str, ca: str | None = None) -> bool:
    """200 on /health/ready; an https URL is verified against `ca` (else DLOCK_CA_BUNDLE)."""
    try:
        return requests.get(f"{url}/health/ready", timeout=2, verify=_verify(ca)).status_code == 200
    except requests.RequestException:
        return False


def live(url: str, ca: str | None = None) -> bool:
    """The process answers `/health/live` (it runs, whatever its dependencies do)."""
    try:
        return requests.get(f"{url}/health/live", timeout=2, verify=_verify(ca)).status_code == 200
    except requests.RequestException:
        return False


def readiness_checks(url: str, ca: str | None = None) -> str:
    """`/health/ready`'s checks as `name=STATE …` (for messages), or why there are none."""
    try:
        body = requests.get(f"{url}/health/ready", timeout=2, verify=_verify(ca)).json()
    except (requests.RequestException, ValueError) as exc:
        return f"readiness unanswered: {type(exc).__name__}"
    checks = body.get("checks") or (body.get("details") or {}).get("checks") or {}
    return " ".join(f"{name}={state}" for name, state in checks.items()) or "no checks"
