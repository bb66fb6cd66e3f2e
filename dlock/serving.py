"""Graceful drain for gunicorn: stop accepting at once, finish in-flight work, then exit.

Stock gunicorn already drains in-flight requests on SIGTERM, but the worker keeps its copy of
the listening socket open until the drain ends, so the kernel keeps completing handshakes that
nobody will serve (the client sees a connection, then a reset). And SIGINT is a quick shutdown.
Here both SIGTERM and SIGINT mean: close the listener now (new connections are refused), let
requests already accepted run to completion within `graceful_timeout`, then exit.
"""

from __future__ import annotations

import signal

from gunicorn.workers.gthread import ThreadWorker


class DrainingThreadWorker(ThreadWorker):
    def init_signals(self) -> None:
        super().init_signals()
        signal.signal(signal.SIGINT, self.handle_exit)  # Ctrl-C on the group: drain, too
        signal.siginterrupt(signal.SIGINT, False)

    def handle_exit(self, sig, frame) -> None:
        if self.alive:
            # Runs in the main loop, not in the signal handler: the poller is not re-entrant.
            self.method_queue.defer(self._close_listeners)
        super().handle_exit(sig, frame)

    def _close_listeners(self) -> None:
        self.set_accept_enabled(False)
        for listener in self.sockets:
            listener.close()
        self.log.info("draining: listener closed, %s connection(s) in flight", self.nr_conns)


def drain_on_sigint(arbiter) -> None:
    """gunicorn `when_ready` hook: the master treats SIGINT like SIGTERM (graceful stop)."""
    arbiter.handle_int = arbiter.handle_term
