"""A block of role ports given to a stack is never handed out again by free_port: `up` chooses
its own PostgreSQL's port after the block and before the roles bind, and once took the admin's
("port 23225 is taken by another process", a fresh-clone CI run)."""

from __future__ import annotations

import socket

import pytest

from devstack import common
from devstack.common import free_port, free_port_block


@pytest.fixture
def small_range(monkeypatch):
    """A 40-port range of this process's slice, so free_port runs through it (and starts over,
    as it does once every port was given) many times."""
    low = (
        common.RESERVED_PORTS.start
        + 10 * (common.RESERVED_PORTS.stop - common.RESERVED_PORTS.start) // 20
    )
    low -= low % 10
    monkeypatch.setattr(common, "RESERVED_PORTS", range(low, low + 40))
    monkeypatch.setattr(common, "_handed_out", set())
    monkeypatch.setattr(common, "_blocks_held", set())
    return common.RESERVED_PORTS


def test_free_port_never_returns_a_port_of_a_held_block(small_range):
    base = free_port_block(5)
    block = set(range(base + 1, base + 6))
    assert block <= set(small_range)
    given = {free_port(attempts=20) for _ in range(400)}
    assert given, "free_port returned nothing"
    assert not given & block, sorted(given & block)


def test_two_blocks_never_share_a_port(small_range):
    first = free_port_block(5, replicas=1)
    second = free_port_block(5, replicas=1)
    assert not set(range(first + 1, first + 6)) & set(range(second + 1, second + 6))


def unused(port: int) -> bool:
    """Nothing holds `port` on 127.0.0.1 over TCP or UDP."""
    for kind in (socket.SOCK_STREAM, socket.SOCK_DGRAM):
        with socket.socket(socket.AF_INET, kind) as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                return False
    return True


def test_a_port_held_over_udp_is_not_free(monkeypatch):
    """A role's events port is UDP: a TCP-only probe saw it free and could hand it to a second
    role (its master then cannot bind it and the role does not start)."""
    ours = next(p for p in common.RESERVED_PORTS if unused(p) and unused(p + 1))
    monkeypatch.setattr(common, "RESERVED_PORTS", range(ours, ours + 2))
    monkeypatch.setattr(common, "_handed_out", set())
    monkeypatch.setattr(common, "_blocks_held", set())
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as held:
        held.bind(("127.0.0.1", ours))
        assert {free_port(attempts=2000) for _ in range(20)} == {ours + 1}
