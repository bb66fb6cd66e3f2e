"""A raw TCP server on 127.0.0.1 for tests whose peer must misbehave in ways no real server does
(silence, scripted bytes, a trickle): one listener, one accept thread, and every connection it
accepted kept so a test can count them."""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable

from devstack.common import bound_listener

Handler = Callable[[socket.socket, tuple[str, int]], None]  # (connection, peer address)


class LoopbackServer:
    """Accepts connections for ever; each goes to `handle` — in a thread of its own when
    `threaded`, else in the accept thread, one connection at a time. With no handler a
    connection is held open and never answered (a stalled or partitioned peer)."""

    def __init__(self, handle: Handler | None = None, *, threaded: bool = True) -> None:
        self.handle = handle
        self.threaded = threaded
        self.accepted: list[socket.socket] = []
        self.sock = bound_listener()
        self.port = self.sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, peer = self.sock.accept()
            except OSError:  # the listener was closed
                return
            self.accepted.append(conn)
            if self.handle is None:
                continue  # held open here; dropped by `close`
            if self.threaded:
                threading.Thread(target=self.handle, args=(conn, peer), daemon=True).start()
            else:
                self.handle(conn, peer)

    def close(self) -> None:
        """Stop accepting; drop the connections held unanswered (a handler owns its own)."""
        self.sock.close()
        if self.handle is None:
            for conn in self.accepted:
                conn.close()
