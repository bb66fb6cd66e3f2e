"""gunicorn's stock gthread worker, plus one thing for the drain behind the proxy.

On SIGTERM the worker closes its listening socket at once (the master closes its copy at the
same moment) and then drains as stock gthread does: requests in flight finish within
`graceful_timeout`. Stock gthread only stops polling the listener, so until the worker exits
the kernel still queues connections nobody will serve; the role's proxy would write a request
into one and see it reset ("sent, outcome unknown"). With the listener closed the proxy's
connect is refused, which it answers 503 OVERLOADED: nothing was forwarded, clients fail over.
It also logs `service_draining` (dlock.lifecycle). Framing, slow clients, limits: the proxy's
(deploy/nginx/, ARCHITECTURE decision 18).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gunicorn.workers.gthread import ThreadWorker

if TYPE_CHECKING:
    from types import FrameType


class DrainingThreadWorker(ThreadWorker):
    alive: bool  # gunicorn's Worker sets it in __init__ (untyped there)

    def set_accept_enabled(self, enabled: bool) -> None:
        if enabled and not self.alive:  # draining: the listener is closed for good
            return
        super().set_accept_enabled(enabled)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self.alive:
            self.alive = False
            super().set_accept_enabled(False)
            for listener in self.sockets:
                listener.close()
            from dlock.lifecycle import draining

            draining(self)
        super().handle_exit(sig, frame)
