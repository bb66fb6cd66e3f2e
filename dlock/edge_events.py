"""What the role's proxy answered itself, as aggregated events and a counter.

nginx answers some requests without the role: refusals (a client over its connection cap, a
foreign Host, a probe path asked with POST, a body over its route's limit, ...) and the answers
for an upstream that failed. For each it sends one small syslog datagram over UDP to
127.0.0.1:PROXY_EVENTS_PORT (deploy/nginx/events-on.conf.template): nginx cannot count, and a
disk line per refusal is what an attacker would like. The gunicorn master binds that port once
and every worker forked from it reads the shared socket in one daemon thread
(dlock.edge_listener, `start`), so the port is held for as long as the role runs.

The receiver trusts nothing it reads: a datagram is at most DATAGRAM_BYTES, must be exactly
our fixed format with a reason of PROXY_REFUSAL_REASONS, a server of SERVERS, a
three-digit status and an IP address, else it is dropped unread. Per (reason, server) it
writes at most one `proxy_refused` line a PERIOD_S (`count`: how many datagrams it stands for;
`clients`: the busiest addresses, never a metric label) and adds the same count to
`dlock_proxy_refusals_total{reason}` (every reason's series at 0 from start-up).

Counts are a floor: a datagram the socket's receive buffer has no room for is dropped by the
kernel without a word, and so are those sent while the role was not running
(docs/operations.md "The proxy's own answers").
"""

from __future__ import annotations

import atexit
import collections
import ipaddress
import logging
import re
import socket
import threading
import time
from dataclasses import dataclass, field

from prometheus_client import REGISTRY, Counter

from dlock.logs import log_event

# What the proxy answered, as deploy/nginx/nginx.conf's $dlock_refused map names it: the label
# values of `dlock_proxy_refusals_total{reason}` (docs/operations.md "The proxy's own answers").
PROXY_REFUSAL_REASONS = (
    "overloaded",  # over limit_conn per_client or per_proxy: 503 OVERLOADED, nothing forwarded
    "connections_per_client",  # over PROXY_TCP_PER_CLIENT: closed at accept, nothing read
    "login_limited",  # the admin's log-in limit (limit_req): 429
    "foreign_host",  # a Host outside DJANGO_ALLOWED_HOSTS: 400
    "header_control",  # a control byte in a header dlock reads: 400
    "bad_request",  # nginx could not parse the request: 400
    "plain_http",  # plain HTTP on a TLS port: 400
    "http_version",  # neither HTTP/1.0 nor HTTP/1.1: 400
    "method",  # a method no route has: 405
    "probe_method",  # a probe or scrape path asked with another method than GET or HEAD: 405
    "slow_client",  # a body that did not arrive in time: 408 (the connection closed)
    "chunked_body",  # a transfer-coded request body: 411
    "body_too_large",  # over the route's body limit: 413
    "uri_too_long",  # 414
    "header_too_large",  # 431
    "not_found",  # the proxy's own paths, the monitoring listener's other paths: 404
    "proxy_error",  # the proxy failed: 500
    "upstream_unreachable",  # the role could not be reached: 503, nothing forwarded
    "upstream_timeout",  # the role did not answer in time: 504
    "upstream_failed",  # the role's answer was cut or malformed: 502
)
# Declared here, beside what moves it, and exported by a role whose proxy feeds it (`start`):
# dlock.metrics' rule holds (no id as a label, every series at 0 from start-up).
proxy_refusals = Counter(
    "dlock_proxy_refusals",
    "Requests the role's proxy answered itself (a refusal, or an upstream that failed), by "
    "reason; a floor: a datagram the role had no room for is not counted (dlock.edge_events).",
    ["reason"],
    registry=None,
)
for _reason in PROXY_REFUSAL_REASONS:
    proxy_refusals.labels(reason=_reason)
SERVERS = ("role", "default", "metrics")
PERIOD_S = 1.0
DATAGRAM_BYTES = 512  # ours are under 128; a longer one is truncated and then fails the format
TOP_CLIENTS = 3  # addresses named on a line
CLIENTS_TRACKED = 256  # distinct addresses counted per (reason, server) and period
DRAIN_AT_EXIT = 10_000  # datagrams an exiting worker reads at most
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
    clients: collections.Counter[str] = field(default_factory=collections.Counter)


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
            tally.clients[answer.client] += 1  # bounded: a spoofed-address spray adds no memory

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
                distinctClients=len(tally.clients),  # counted up to CLIENTS_TRACKED
            )


class Receiver:
    """In a worker: the reading thread over the socket the master bound (dlock.edge_listener)."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.thread: threading.Thread | None = None
        self.stopping = threading.Event()

    def start(self) -> None:
        """In a worker: read and aggregate in a daemon thread."""
        self.thread = threading.Thread(target=self.run, name="proxy-events", daemon=True)
        self.thread.start()

    def run(self) -> None:
        aggregator = Aggregator()
        self.sock.settimeout(aggregator.period_s / 4)
        while not self.stopping.is_set():
            try:
                answer = parse(self.sock.recv(DATAGRAM_BYTES))
            except (TimeoutError, BlockingIOError):  # another worker took it, or nothing came
                answer = None
            if answer is not None:
                aggregator.add(answer)
            now = time.monotonic()
            if aggregator.due(now):
                aggregator.flush(now)
        # What is already queued, then what this worker counted since its last line; bounded
        # (a receive buffer holds a few thousand), so a flood cannot hold the exit.
        self.sock.settimeout(0)
        for _ in range(DRAIN_AT_EXIT):
            try:
                answer = parse(self.sock.recv(DATAGRAM_BYTES))
            except BlockingIOError:
                break
            if answer is not None:
                aggregator.add(answer)
        aggregator.flush(time.monotonic())

    def stop(self) -> None:
        """In a worker that is exiting: write what it counted, within one read timeout."""
        self.stopping.set()
        if self.thread is not None:
            self.thread.join(PERIOD_S)


_receivers: list[Receiver] = []


def start(sock: socket.socket) -> None:
    """In a worker (dlock.edge_listener.read_in_child): export the counter, read `sock` in a
    thread, and write what is left when the worker exits."""
    if _receivers:
        return
    REGISTRY.register(proxy_refusals)
    receiver = Receiver(sock)
    _receivers.append(receiver)
    receiver.start()
    atexit.register(receiver.stop)
