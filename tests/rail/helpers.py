"""Extra processes for the rail tests: another proxy on the same paydb, a garbage-answering rail."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

from devstack.common import bound_listener, free_port
from devstack.roles import RoleProcess
from tests.conftest import LiveStack


def start_proxy(stack: LiveStack, **env: str) -> RoleProcess:
    """A second rail-proxy process against the stack's paydb and stub (unless overridden)."""
    port = free_port()
    proc = RoleProcess(
        "railproxy", port, {**stack.env, **env}, stack.logdir / f"railproxy-{port}.log"
    )
    return proc.start()


@contextlib.contextmanager
def stub_answering_garbage() -> Iterator[str]:
    """A tiny TCP server that answers every request `200 OK` with a body that is not JSON."""
    listener = bound_listener(backlog=8)
    stop = threading.Event()

    def serve() -> None:
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                continue
            with conn:
                conn.settimeout(2)
                with contextlib.suppress(OSError):
                    conn.recv(65536)
                    conn.sendall(
                        b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 9\r\n"
                        b"Connection: close\r\n\r\nthanks!!!"
                    )

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    finally:
        stop.set()
        thread.join(2)
        listener.close()
