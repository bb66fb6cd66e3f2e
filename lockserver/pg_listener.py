"""One background thread per lock-server process: LISTEN for freed keys, run the reaper.

Waiters (L4 with waitMillis) block on a `threading.Event` without holding a pooled database
connection. A release, revoke, session close or lapse hands the key to the head of its queue
and NOTIFYs that waiter only (the grant channel, payload: its waiter id and grant); this thread
wakes that one waiter (`Parked.payload`). When the freeing statement ran in this process, the
thread that ran it wakes the waiter itself right after the commit (`hand_over`), without the
NOTIFY's round trip; the NOTIFY that follows is then a no-op here. The key channel (payload:
the key) is the fallback that wakes every waiter parked on a key, for a waiter the freeing
statement could not see yet.
The thread owns two psycopg connections of its own (never the request pool): one only
LISTENs, one runs the periodic housekeeping. It also tells the backend whether the database
answered lately, which separates "database down" (503 NOT_LEADER) from "pool exhausted"
(503 OVERLOADED).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import defaultdict
from collections.abc import Callable

import psycopg

from dlock.logs import log_event

logger = logging.getLogger("dlock.lockserver")


class Parked:
    """One parked acquire: woken by a NOTIFY meant for it alone (`payload`: the hand-off's
    grant, or its withdrawal) or to re-check its key. `cause`: who set the payload first,
    `direct` (the NOTIFY) or `local` (the freeing statement ran in this process)."""

    __slots__ = ("cause", "event", "key", "payload", "waiter_id")

    def __init__(self, key: str, waiter_id: str) -> None:
        self.key = key
        self.waiter_id = waiter_id
        self.event = threading.Event()
        self.payload: str | None = None
        self.cause = "direct"


# One housekeeping pass on the thread's own connection; the second argument wakes a waiter of
# this process that the pass handed a key to (`KeyListener.hand_over`, after the commit).
Housekeeping = Callable[[psycopg.Connection, Callable[[str], None]], None]


class KeyListener:
    """The LISTEN thread (see the module's docstring). `park`/`unpark` register a waiter of
    this process, `hand_over` wakes the one a grant payload names, `subscribe`/`unsubscribe`
    an event woken whenever the key's broadcast NOTIFY arrives."""

    def __init__(
        self,
        conn_params: dict,
        *,
        channel: str,
        grant_channel: str | None = None,
        housekeeping: Housekeeping | None = None,
        housekeeping_interval_s: float = 1.0,
    ) -> None:
        self._params = conn_params
        self._channel = channel
        self._grant_channel = grant_channel
        self._parked: dict[str, Parked] = {}
        self._housekeeping = housekeeping
        self._interval = housekeeping_interval_s
        self._subscribers: dict[str, set[threading.Event]] = defaultdict(set)
        self._guard = threading.Lock()
        self._stop = threading.Event()
        self._connected = threading.Event()
        self._db_up = True  # optimistic until the first failure
        self._read_only = False
        self._thread = threading.Thread(target=self._run, name="dlock-lock-listener", daemon=True)
        self._conns: list[psycopg.Connection] = []

    # ------------------------------------------------------------------ public

    def start(self, *, wait_s: float = 3.0) -> None:
        self._thread.start()
        self._connected.wait(wait_s)

    def close(self) -> None:
        self._stop.set()
        for conn in list(self._conns):
            with contextlib.suppress(Exception):
                conn.close()
        if self._thread.is_alive():
            self._thread.join(2)

    @property
    def db_up(self) -> bool:
        return self._db_up

    @property
    def parked_count(self) -> int:
        """Waiters of this process parked now."""
        with self._guard:
            return len(self._parked)

    def subscribe(self, key: str) -> threading.Event:
        event = threading.Event()
        with self._guard:
            self._subscribers[key].add(event)
        return event

    def park(self, key: str, waiter_id: str) -> Parked:
        """Subscribe a waiter before its queue entry exists, so no hand-off NOTIFY is missed."""
        parked = Parked(key, waiter_id)
        with self._guard:
            self._parked[waiter_id] = parked
            self._subscribers[key].add(parked.event)
        return parked

    def hand_over(self, payload: str, *, cause: str = "local") -> None:
        """Wake the waiter a grant payload names, if it is parked in this process and not woken
        yet (a late NOTIFY, or one for another process's waiter, is a no-op). Call only once
        the statement that made the payload has committed."""
        with self._guard:
            parked = self._parked.get(payload.split(" ", 1)[0])
            if parked is None or parked.payload is not None:
                return
            parked.payload = payload
            parked.cause = cause
        parked.event.set()

    def unpark(self, parked: Parked) -> None:
        with self._guard:
            self._parked.pop(parked.waiter_id, None)
        self.unsubscribe(parked.key, parked.event)

    def unsubscribe(self, key: str, event: threading.Event) -> None:
        with self._guard:
            events = self._subscribers.get(key)
            if events is not None:
                events.discard(event)
                if not events:
                    del self._subscribers[key]

    # ------------------------------------------------------------------ internals

    def _wake(self, key: str) -> None:
        with self._guard:
            events = list(self._subscribers.get(key, ()))
        for event in events:
            event.set()

    def _wake_all(self) -> None:
        """After a reconnect notifications may have been missed: every waiter re-checks."""
        with self._guard:
            events = [e for events in self._subscribers.values() for e in events]
        for event in events:
            event.set()

    def _connect(self) -> tuple[psycopg.Connection, psycopg.Connection]:
        listen = psycopg.connect(**self._params, autocommit=True)
        work = psycopg.connect(**self._params, autocommit=True)
        self._conns = [listen, work]
        listen.execute(f"LISTEN {self._channel}")
        if self._grant_channel is not None:
            listen.execute(f"LISTEN {self._grant_channel}")
        return listen, work

    def _run(self) -> None:
        backoff = 0.1
        while not self._stop.is_set():
            try:
                listen, work = self._connect()
            except Exception as exc:  # database down: report it, retry with backoff
                self._mark_down(exc)
                self._connected.set()
                self._stop.wait(backoff)
                backoff = min(backoff * 2, 2.0)
                continue
            backoff = 0.1
            if not self._db_up:
                log_event("lock_store_reconnected", backend="pg")
            self._db_up = True
            self._connected.set()
            self._wake_all()
            try:
                self._serve(listen, work)
            except Exception as exc:
                if not self._stop.is_set():
                    self._mark_down(exc)
            finally:
                for conn in (listen, work):
                    with contextlib.suppress(Exception):
                        conn.close()
                self._conns = []

    def _mark_down(self, exc: Exception) -> None:
        if self._db_up:
            log_event(
                "lock_store_unreachable",
                level=logging.WARNING,
                backend="pg",
                error=type(exc).__name__,
            )
        self._db_up = False
        self._wake_all()

    def _serve(self, listen: psycopg.Connection, work: psycopg.Connection) -> None:
        next_housekeeping = time.monotonic()
        while not self._stop.is_set():
            timeout = max(0.0, min(0.5, next_housekeeping - time.monotonic()))
            for notify in listen.notifies(timeout=timeout):
                if notify.channel == self._grant_channel:
                    self.hand_over(notify.payload, cause="direct")
                else:
                    self._wake(notify.payload)
            if self._housekeeping is not None and time.monotonic() >= next_housekeeping:
                next_housekeeping = time.monotonic() + self._interval
                try:
                    self._housekeeping(work, self.hand_over)
                    self._read_only = False
                except psycopg.errors.ReadOnlySqlTransaction:
                    if not self._read_only:  # a standby: nothing to reap; say so once
                        log_event("lock_store_read_only", level=logging.WARNING, backend="pg")
                    self._read_only = True
                except psycopg.OperationalError:
                    raise  # connection trouble: reconnect
                except Exception:  # a bug in one pass must not stop the listener
                    logger.exception("lock housekeeping failed", extra={"event": "log"})
            elif self._housekeeping is None:
                next_housekeeping = time.monotonic() + 0.5
                listen.execute("SELECT 1")  # notice a dead server even when idle
