"""The background sweeper of the rail-proxy server process (never in management commands).

At start-up and every RAIL_SWEEP_INTERVAL_MS: `services.sweep_unresolved_intents()`. Any number
of proxy processes may sweep at once: rows are taken FOR UPDATE SKIP LOCKED and resolved by a
conditional UPDATE, so each intent is quarantined exactly once.
"""

from __future__ import annotations

import logging
import sys
import threading

from django.conf import settings
from django.db import connections

from dlock.logs import log_event

_started = threading.Event()
_stop = threading.Event()


def serving_http() -> bool:
    """True in a gunicorn worker or `runserver`; False in every other management command.

    gunicorn's arbiter module is loaded only by a running gunicorn (importing its worker classes,
    as dlock.serving does, does not load it)."""
    return "gunicorn.arbiter" in sys.modules or (len(sys.argv) > 1 and sys.argv[1] == "runserver")


def maybe_start() -> bool:
    if settings.ROLE != "railproxy" or not settings.RAIL_SWEEP_ENABLED or not serving_http():
        return False
    if _started.is_set():
        return False
    _started.set()
    thread = threading.Thread(target=_loop, name="rail-intent-sweeper", daemon=True)
    thread.start()
    return True


def sweep_once() -> int:
    from railproxy.services import sweep_unresolved_intents

    try:
        swept = sweep_unresolved_intents()
        if swept:
            log_event("rail_sweep", swept=swept)
        return swept
    except Exception as exc:  # the database may be down; the next round tries again
        log_event("rail_sweep_failed", level=logging.WARNING, error=type(exc).__name__)
        return 0
    finally:
        connections.close_all()  # hand the thread's connection back to the pool


def _loop() -> None:
    interval = settings.RAIL_SWEEP_INTERVAL_MS / 1000
    log_event("rail_sweeper_started", intervalMs=settings.RAIL_SWEEP_INTERVAL_MS)
    while not _stop.is_set():
        sweep_once()
        _stop.wait(interval)
