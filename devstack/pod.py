"""One role instance as "a pod": its gunicorn on a unix socket and its own nginx in front.

`python -m devstack.pod --nginx-conf CONF --nginx-prefix DIR --nginx-log LOG -- GUNICORN ARGV`
runs both as children in its own process group (the Kubernetes pod of k8s/*.yaml, where nginx is
a sidecar container), so everything that handles a role as one process keeps working: SIGTERM
or SIGINT drains (nginx first: its listener closes at once and the requests it holds finish,
then gunicorn stops), `killpg(SIGSTOP/SIGCONT/SIGKILL)` reaches both, and the exit status is
gunicorn's. If either child dies on its own the other is stopped and the pod exits. Development
tooling: the image runs gunicorn and nginx as two containers (k8s/), never this.

With `--log FILE`, gunicorn's output (the role's JSON lines) goes through a pipe into
logging's RotatingFileHandler on FILE: at most `--log-max-bytes` per file and `--log-backups`
older files (FILE.1, …), so a long-running local stack's logs stay capped. One writer per file:
the pod, never the role's worker processes.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import logging
import logging.handlers
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import FrameType
from typing import IO

from devstack.proxy import NGINX, worker_user

PR_SET_PDEATHSIG = 1
DRAIN_MARGIN_S = 5.0  # beyond nginx's own worker_shutdown_timeout before it is killed
LOG_MAX_BYTES = 64 * 1024 * 1024  # per file, FILE and each of its backups
LOG_BACKUPS = 3
UPSTREAM_POLL_S = 0.02
SIGNAL_REPEAT_S = 0.5  # a stop signal is sent again this often until the process exits


def copy_lines(source: IO[bytes], handler: logging.Handler) -> None:
    """Every line of `source` (until EOF) into `handler`, as written (no format of ours)."""
    for raw in iter(source.readline, b""):
        line = raw.decode(errors="replace").rstrip("\n")
        handler.emit(logging.makeLogRecord({"msg": line, "levelno": logging.INFO}))
    handler.close()


def children_of(pid: int) -> list[int]:
    """The processes whose parent is `pid` (from /proc)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            # "pid (comm) state ppid ...": comm may hold spaces and parentheses
            if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(stat.parent.name))
    return found


def stop_process(
    process: subprocess.Popen, signum: int, within_s: float, *, repeat_s: float = SIGNAL_REPEAT_S
) -> int:
    """Send `signum` every `repeat_s` until `process` exits; past `within_s`, SIGKILL it and
    its children together. Its exit status.

    nginx's master acts on a signal only when its loop wakes from sigsuspend: one that lands
    while it starts (after it installed its handlers, before its loop first waits) is acted on
    at the next signal: a single SIGQUIT sent 0-29 ms after the start was lost in 2 of 300
    starts (nginx then held the port until it was killed). A repeat changes nothing once nginx
    is stopping: it tells its workers once. A worker outlives a killed master and keeps the
    listener, so they die together."""
    deadline = time.monotonic() + within_s
    while process.poll() is None and time.monotonic() < deadline:
        process.send_signal(signum)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(min(repeat_s, max(0.0, deadline - time.monotonic())))
    if process.poll() is None:
        for pid in [*children_of(process.pid), process.pid]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    return process.wait()


def _die_with_parent() -> None:
    """In the child, before exec: killed if the pod process dies without stopping it."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except OSError:  # not glibc: the pod's own stop path still ends both children
        pass


def _main_directives() -> str:
    """nginx in the foreground; started as root, its worker runs as `worker_user()`."""
    user = worker_user()
    return "daemon off;" + (f" user {user};" if user else "")


class Pod:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.stopping = False
        self.gunicorn: subprocess.Popen | None = None
        self.nginx: subprocess.Popen | None = None
        self.copier: threading.Thread | None = None

    def start(self) -> None:
        if not self.args.log:
            self.gunicorn = subprocess.Popen(self.args.gunicorn, preexec_fn=_die_with_parent)
        else:
            handler = logging.handlers.RotatingFileHandler(
                self.args.log,
                maxBytes=self.args.log_max_bytes,
                backupCount=self.args.log_backups,
                encoding="utf-8",
            )
            handler.setFormatter(logging.Formatter("%(message)s"))
            self.gunicorn = subprocess.Popen(
                self.args.gunicorn,
                preexec_fn=_die_with_parent,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
            )
            assert self.gunicorn.stdout is not None
            self.copier = threading.Thread(
                target=copy_lines, args=(self.gunicorn.stdout, handler), daemon=True
            )
            self.copier.start()
        self._wait_for_upstream()
        if self.stopping:  # stopped while gunicorn started: nginx is not started at all
            return
        self.nginx = subprocess.Popen(
            [
                NGINX,
                "-p",
                self.args.nginx_prefix,
                "-c",
                self.args.nginx_conf,
                "-e",
                self.args.nginx_log,
                "-g",
                _main_directives(),
            ],
            preexec_fn=_die_with_parent,
        )

    def _wait_for_upstream(self) -> None:
        """Until gunicorn has made its socket (or exited): nginx listens only then, so a client
        meanwhile is refused at connect (nothing sent, nothing logged) instead of being answered
        503 with a `crit` line per request for the missing socket (nginx logs ENOENT at crit)."""
        if not self.args.upstream_socket:
            return
        socket_path = Path(self.args.upstream_socket)
        assert self.gunicorn
        while not (socket_path.exists() or self.stopping or self.gunicorn.poll() is not None):
            time.sleep(UPSTREAM_POLL_S)

    def on_signal(self, signum: int, _frame: FrameType | None) -> None:
        if signum == signal.SIGHUP:  # reload both
            for child in (self.nginx, self.gunicorn):
                if child and child.poll() is None:
                    child.send_signal(signal.SIGHUP)
            return
        self.stopping = True

    def run(self) -> int:
        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(signum, self.on_signal)
        self.start()
        assert self.gunicorn
        while not self.stopping:
            assert self.nginx  # started unless the pod was already stopping
            if self.gunicorn.poll() is not None:
                sys.stderr.write(f"[pod] gunicorn exited with {self.gunicorn.returncode}\n")
                self._stop_nginx(graceful=False)
                return self.gunicorn.returncode or 1
            if self.nginx.poll() is not None:
                sys.stderr.write(f"[pod] nginx exited with {self.nginx.returncode}\n")
                self._stop_gunicorn()
                return 1
            time.sleep(0.1)
        self._stop_nginx(graceful=True)
        code = self._stop_gunicorn()
        if self.copier is not None:
            self.copier.join(5)  # gunicorn's last lines
        return code

    def _stop_nginx(self, *, graceful: bool) -> None:
        """SIGQUIT: nginx closes its listener at once and lets requests in flight finish
        (worker_shutdown_timeout); SIGTERM: at once. Killed with its workers past the drain."""
        if self.nginx is not None:
            signum = signal.SIGQUIT if graceful else signal.SIGTERM
            stop_process(self.nginx, signum, self.args.drain_timeout + DRAIN_MARGIN_S)

    def _stop_gunicorn(self) -> int:
        """SIGTERM: gunicorn closes its listener and finishes what it holds (graceful_timeout)."""
        assert self.gunicorn
        if self.gunicorn.poll() is None:
            self.gunicorn.send_signal(signal.SIGTERM)
        try:
            return self.gunicorn.wait(self.args.drain_timeout + DRAIN_MARGIN_S)
        except subprocess.TimeoutExpired:
            self.gunicorn.kill()
            return self.gunicorn.wait()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m devstack.pod")
    parser.add_argument("--nginx-conf", required=True)
    parser.add_argument("--nginx-prefix", required=True)
    parser.add_argument("--nginx-log", required=True)
    parser.add_argument("--drain-timeout", type=float, default=30.0)
    parser.add_argument("--log", help="gunicorn's output into this file, rotated")
    parser.add_argument("--log-max-bytes", type=int, default=LOG_MAX_BYTES)
    parser.add_argument("--log-backups", type=int, default=LOG_BACKUPS)
    parser.add_argument("--upstream-socket", help="start nginx once gunicorn has made this socket")
    parser.add_argument("gunicorn", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    if args.gunicorn[:1] == ["--"]:
        args.gunicorn = args.gunicorn[1:]
    if not args.gunicorn:
        parser.error("give the gunicorn command after --")
    return Pod(args).run()


if __name__ == "__main__":
    raise SystemExit(main())
