"""The lock server's etcd client over TLS: a member on https:// is verified against
DLOCK_CA_BUNDLE, the bundle every dlock client verifies its peer with (issue 25 item 6), not
the system store and not requests' own REQUESTS_CA_BUNDLE. A real etcd serving the stack's
throwaway certificate."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest

from devstack.common import free_port
from devstack.etcd import EtcdServer
from devstack.tls import ensure_tls
from dlock.http import close_pools
from lockserver.etcd_client import EtcdClient, EtcdUnavailable
from lockserver.etcd_ops import delete, put

pytestmark = [pytest.mark.live]


@pytest.fixture(scope="module")
def tls_etcd():
    base = Path(tempfile.mkdtemp(prefix="dlock-etcd-tls-"))
    files = ensure_tls(base / "tls")
    server = EtcdServer(base / "data", free_port(), free_port(), tls=files)
    server.start()
    yield server, files
    server.stop()


def _as_a_new_process() -> None:
    """The process's pools read DLOCK_CA_BUNDLE when they are made (once, in a real role):
    remake them, as a process started with this environment would have them."""
    close_pools()


def _present_the_client_certificate(files, monkeypatch) -> None:
    monkeypatch.setenv("DLOCK_CLIENT_CERT", str(files.client_certificate))
    monkeypatch.setenv("DLOCK_CLIENT_KEY", str(files.client_key))


def _round_trip(client: EtcdClient, key: str) -> bytes | None:
    client.txn([], [put(key, b"over-tls")])
    found = client.range(key).first()
    return found.value if found else None


def test_a_member_on_https_is_verified_against_the_ca_bundle(tls_etcd, monkeypatch):
    server, files = tls_etcd
    assert server.url.startswith("https://")
    monkeypatch.setenv("DLOCK_CA_BUNDLE", str(files.ca))
    _present_the_client_certificate(files, monkeypatch)
    # requests' own variable names the system store: DLOCK_CA_BUNDLE still decides.
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", "/etc/ssl/certs/ca-certificates.crt")
    _as_a_new_process()
    client = EtcdClient(server.url)
    try:
        assert _round_trip(client, "tls/verified") == b"over-tls"
    finally:
        client.close()


def test_without_the_bundle_the_member_is_refused_and_nothing_written(tls_etcd, monkeypatch):
    server, files = tls_etcd
    monkeypatch.delenv("DLOCK_CA_BUNDLE", raising=False)
    _as_a_new_process()
    client = EtcdClient(server.url)
    try:
        with pytest.raises(EtcdUnavailable):
            _round_trip(client, "tls/unverified")
    finally:
        client.close()
    monkeypatch.setenv("DLOCK_CA_BUNDLE", str(files.ca))
    _present_the_client_certificate(files, monkeypatch)
    _as_a_new_process()
    trusted = EtcdClient(server.url)
    try:
        assert trusted.range("tls/unverified").first() is None
    finally:
        trusted.close()


def test_a_client_without_a_certificate_of_the_ca_is_refused_by_etcd(tls_etcd, monkeypatch):
    """etcd verifies its clients (--client-cert-auth, as in k8s/etcd.yaml): a lock server that
    verifies etcd but presents no client certificate writes nothing."""
    server, files = tls_etcd
    monkeypatch.setenv("DLOCK_CA_BUNDLE", str(files.ca))
    monkeypatch.delenv("DLOCK_CLIENT_CERT", raising=False)
    monkeypatch.delenv("DLOCK_CLIENT_KEY", raising=False)
    _as_a_new_process()
    client = EtcdClient(server.url)
    try:
        with pytest.raises(EtcdUnavailable):
            _round_trip(client, "tls/anonymous")
    finally:
        client.close()
    _present_the_client_certificate(files, monkeypatch)
    _as_a_new_process()
    trusted = EtcdClient(server.url)
    try:
        assert trusted.range("tls/anonymous").first() is None
        assert _round_trip(trusted, "tls/with-certificate") == b"over-tls"
    finally:
        trusted.close()


def test_a_watch_runs_over_tls_with_the_client_certificate(tls_etcd, monkeypatch):
    """Watches ride the same pools as calls: verified against DLOCK_CA_BUNDLE, showing the
    client certificate; without the certificate etcd refuses the watch too (EtcdUnavailable)."""
    server, files = tls_etcd
    monkeypatch.setenv("DLOCK_CA_BUNDLE", str(files.ca))
    _present_the_client_certificate(files, monkeypatch)
    _as_a_new_process()
    client = EtcdClient(server.url)
    try:
        written = client.txn([], [put("tls/watched", b"x")])
        client.txn([], [delete("tls/watched")])
        assert client.wait_for_change(
            ["tls/watched"], after_revision=written.revision, timeout_s=3600
        )
        revision, deleted = next(
            client.deletions(["tls/"], after_revision=written.revision, idle_timeout_s=3600)
        )
        assert revision > written.revision and deleted is not None
    finally:
        client.close()
    monkeypatch.delenv("DLOCK_CLIENT_CERT")
    monkeypatch.delenv("DLOCK_CLIENT_KEY")
    _as_a_new_process()
    anonymous = EtcdClient(server.url)
    try:
        with pytest.raises(EtcdUnavailable):
            anonymous.wait_for_change(["tls/watched"], after_revision=1, timeout_s=3600)
    finally:
        anonymous.close()
