"""What the role's proxy answered itself, as aggregated events and a counter.

nginx answers some requests without the role: refusals (a client over its connection cap, a
foreign Host, a probe path asked with POST, a body over its route's limit, ...) and the answers
for an upstream that failed. For each it sends one small syslog datagram over UDP to
127.0.0.1:PROXY_EVENTS_PORT (deploy/nginx/events-on.conf.template): nginx cannot count, and a
disk line per refusal is what an attacker would like. The gunicorn master binds that port once
(`listen`, its `on_starting` hook in settings/gunicorn.py) and every worker reads the shared
socket in one daemon thread (`start`, `post_worker_init`), so the port is held for as long as
the role runs.

The receiver trusts nothing it reads: a datagram is at most DATAGRAM_BYTES, must be exactly
our fixed format with a reason of dlock.metrics.PROXY_REFUSAL_REASONS, a server of SERVERS, a
three-digit status and an IP address, else it is dropped unread. Per (reason, server) it
writes at most one `proxy_refused` line a PERIOD_S (`count`: how many datagrams it stands for;
`clients`: the busiest addresses, never a metric label) and adds the same count to
`dlock_proxy_refusals_total{reason}` (every reason's series at 0 from start-up).

Counts are a floor: a datagram the socket's receive buffer has no room for is dropped by the
kernel without a word, and so are those sent while the role was not running
(docs/operations.md "The proxy's own answers").
"""

from __future__ import annotations

import ipaddress
import logging
import os
import re
import socket
import threading
import time
from collections import Counter
from dataclasses import dataclass, field

from dlock.logs import log_event
from dlock.metrics import PROXY_REFUSAL_REASONS, proxy_refusals

PORT_ENV = "PROXY_EVENTS_PORT"
SERVERS = ("role", "default", "metrics")
PERIOD_S = 1.0
DATAGRAM_BYTES = 512  # ours are under 128; a longer one is truncated and then fails the format
RECEIVE_BUFFER_BYTES = 256 * 1024
TOP_CLIENTS = 3  # addresses named on a line
CLIENTS_TRACKED = 256  # distinct addresses counted per (reason, server) and period
# "<PRI>Mmm dd hh:mm:ss dlock_edge: dlock-edge-1 <reason> <server> <status> <client>" (nginx's
# syslog header with `nohostname`, then our log_format).
_LINE = re.compile(
    rb"<[0-9]{1,3}>[A-Z][a-z]{2} [ 0-9][0-9] [0-9]{2}:[0-9]{2}:[0-9]{2} dlock_edge: "
    rb"dlock-edge-1 ([a-z_]{1,32}) ([a-z]{1,16}) ([1-5][0-9]{2}) ([0-9A-Fa-f:.]{1,45})"
)
_REASONS = frozenset(PROXY_REFUSAL_REASONS)
_SERVERS = frozenset(SERVERS)


@dataclass(frozen=True)
class Answer:
    """One answer the proxy made itself, as its datagram says."""

    reason: str
    server: str
    status: int
    client: str


def parse(datagram: bytes) -> Answer | None:
    """The answer `datagram` describes, or None when it is not exactly our format."""
    if len(datagram) >= DATAGRAM_BYTES:
        return None
    match = _LINE.fullmatch(datagram.rstrip(b"\n"))
    if match is None:
        return None
    reason, server, status, client = (part.decode("ascii") for part in match.groups())
    if reason not in _REASONS or server not in _SERVERS:
        return None
    try:
        address = ipaddress.ip_address(client)
    except ValueError:
        return None
    return Answer(reason, server, int(status), str(address))


@dataclass
class _Tally:
    status: int
    count: int = 0
    clients: Counter[str] = field(default_factory=Counter)
    other_clients: int = 0


class Aggregator:
    """Answers counted per (reason, server) over a period; `flush` writes one line per key and
    adds the counts to the counter. One thread owns it (the receiver's)."""

    def __init__(self, period_s: float = PERIOD_S) -> None:
        self.period_s = period_s
        self.started = time.monotonic()
        self.tallies: dict[tuple[str, str], _Tally] = {}

    def add(self, answer: Answer) -> None:
        tally = self.tallies.setdefault((answer.reason, answer.server), _Tally(answer.status))
        tally.count += 1
        if answer.client in tally.clients or len(tally.clients) < CLIENTS_TRACKED:
            tally.clients[answer.client] += 1
        else:
            tally.other_clients += 1

    def due(self, now: float) -> bool:
        return now - self.started >= self.period_s

    def flush(self, now: float) -> None:
        tallies, self.tallies, self.started = self.tallies, {}, now
        for (reason, server), tally in tallies.items():
            proxy_refusals.labels(reason=reason).inc(tally.count)
            log_event(
                "proxy_refused",
                level=logging.WARNING,
                reason=reason,
                server=server,
                status=tally.status,
                count=tally.count,
                clients=dict(tally.clients.most_common(TOP_CLIENTS)),
                distinctClients=len(tally.clients) + (1 if tally.other_clients else 0),
            )


def configured_port(environ: dict[str, str] | None = None) -> int | None:
    """PROXY_EVENTS_PORT, or None when unset or empty (no proxy events: a role run bare)."""
    raw = (os.environ if environ is None else environ).get(PORT_ENV, "")
    if not raw:
        return None
    if not raw.isdigit() or not 0 < int(raw) < 65536:
        raise ValueError(f"{PORT_ENV}={raw!r}: want a UDP port number")
    return int(raw)


class Receiver:
    """The bound socket (made in the gunicorn master) and, in each worker, its reading thread."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RECEIVE_BUFFER_BYTES)
        self.sock.bind(("127.0.0.1", port))
        self.thread: threading.Thread | None = None

    def start(self) -> None:
        """In a worker: read and aggregate in a daemon thread."""
        self.thread = threading.Thread(target=self.run, name="proxy-events", daemon=True)
        self.thread.start()

    def run(self) -> None:
        aggregator = Aggregator()
        self.sock.settimeout(aggregator.period_s / 4)
        while True:
            try:
                answer = parse(self.sock.recv(DATAGRAM_BYTES))
            except (TimeoutError, BlockingIOError):  # another worker took it, or nothing came
                answer = None
            if answer is not None:
                aggregator.add(answer)
            now = time.monotonic()
            if aggregator.due(now):
                aggregator.flush(now)


_receiver: Receiver | None = None


def listen(server: object = None) -> None:
    """gunicorn `on_starting` (the master, once): bind PROXY_EVENTS_PORT when it is set. A port
    that cannot be bound stops the role from starting (its proxy would be counting into
    nothing)."""
    global _receiver
    port = configured_port()
    if port is not None and _receiver is None:
        _receiver = Receiver(port)


def start(worker: object = None) -> None:
    """gunicorn `post_worker_init` (each worker): start reading, when the master listens."""
    if _receiver is not None:
        _receiver.start()
