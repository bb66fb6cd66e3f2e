"""The etcd client's watches on dlock's urllib3 stack (issue 41 item 4): a change wakes the
watcher, a member that is gone or dies under the watch is EtcdUnavailable (never a hang), a
refused member hands the watch to the next, and the stream's connection is closed on return
(which cancels the watchers server-side). Real etcd; a raw socket plays the dying member."""

from __future__ import annotations

import socket
import threading
import uuid
from collections.abc import Callable

import pytest

from devstack import free_port
from lockserver.etcd_client import EtcdClient, EtcdUnavailable, delete, put

pytestmark = [pytest.mark.etcd]


def _changed_key(client: EtcdClient) -> tuple[str, int]:
    """A key put and then deleted: (key, the revision before its deletion)."""
    key = f"watch/{uuid.uuid4().hex}"
    written = client.txn([], [put(key, "v")])
    client.txn([], [delete(key)])
    return key, written.revision


def test_a_deletion_after_the_revision_wakes_the_watch(etcd_server):
    client = EtcdClient(etcd_server.url)
    try:
        key, before = _changed_key(client)
        # no wall clock: the deletion is replayed from before + 1, so the watch returns on it
        assert client.wait_for_change([key], after_revision=before, timeout_s=3600)
        seen = next(client.deletions([key], after_revision=before, idle_timeout_s=3600))
        assert seen[0] > before and seen[1] is not None and seen[1].key == key
    finally:
        client.close()


def test_a_member_that_refuses_is_etcd_unavailable_not_a_hang():
    client = EtcdClient(f"http://127.0.0.1:{free_port()}")  # nothing listens there
    try:
        with pytest.raises(EtcdUnavailable):
            client.wait_for_change(["k"], after_revision=1, timeout_s=3600)
        with pytest.raises(EtcdUnavailable):
            next(client.deletions(["k/"], after_revision=1, idle_timeout_s=3600))
    finally:
        client.close()


def test_a_refused_member_hands_the_watch_to_the_next(etcd_server):
    dead = f"http://127.0.0.1:{free_port()}"
    client = EtcdClient(f"{dead},{etcd_server.url}")
    try:
        key, before = _changed_key(client)
        client._member = 0  # the dead member first
        assert client.wait_for_change([key], after_revision=before, timeout_s=3600)
        assert client.url == etcd_server.url
    finally:
        client.close()


class _OneConnection:
    """A listening socket that takes one connection, reads the whole request, then does
    `then`."""

    def __init__(self, then: Callable[[socket.socket], None]) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        self.then = then
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        conn, _ = self.listener.accept()
        with conn:
            request = b""
            while b"\r\n\r\n" not in request:
                request += conn.recv(65536)
            head, _, body = request.partition(b"\r\n\r\n")
            length = next(
                int(line.split(b":", 1)[1])
                for line in head.split(b"\r\n")
                if line.lower().startswith(b"content-length:")
            )
            while len(body) < length:  # the watch's create requests, sent after the head
                body += conn.recv(65536)
            self.then(conn)

    def close(self) -> None:
        self.thread.join()
        self.listener.close()


def test_a_member_that_dies_before_answering_is_etcd_unavailable_not_a_hang():
    member = _OneConnection(lambda conn: None)  # closes the connection without a word
    client = EtcdClient(member.url)
    try:
        with pytest.raises(EtcdUnavailable):
            client.wait_for_change(["k"], after_revision=1, timeout_s=3600)
        assert client.url == member.url  # one member: nowhere else to go
    finally:
        client.close()
        member.close()


def test_a_member_that_dies_mid_stream_is_etcd_unavailable_not_a_hang():
    def created_then_reset(conn: socket.socket) -> None:
        line = b'{"result":{"header":{"revision":"5"},"created":true}}\n'
        conn.sendall(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
            + f"{len(line):x}\r\n".encode()
            + line
            + b"\r\n"
        )
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")

    member = _OneConnection(created_then_reset)  # the close with linger 0 is a reset
    client = EtcdClient(member.url)
    try:
        with pytest.raises(EtcdUnavailable):
            client.wait_for_change(["k"], after_revision=1, timeout_s=3600)
    finally:
        client.close()
        member.close()


def test_the_watch_connection_is_closed_when_the_change_is_seen():
    closed = threading.Event()

    def event_then_wait_for_the_close(conn: socket.socket) -> None:
        line = b'{"result":{"header":{"revision":"6"},"events":[{"type":"DELETE"}]}}\n'
        conn.sendall(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
            + f"{len(line):x}\r\n".encode()
            + line
            + b"\r\n"
        )
        if conn.recv(1) == b"":  # the client closed its end: the server's stream ends
            closed.set()

    member = _OneConnection(event_then_wait_for_the_close)
    client = EtcdClient(member.url)
    try:
        assert client.wait_for_change(["k"], after_revision=1, timeout_s=3600)
    finally:
        client.close()
        member.close()  # joins the member: it has seen the close (or the test fails below)
    assert closed.is_set()
