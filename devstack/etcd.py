"""A private etcd: one member, or a cluster of several on loopback."""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import requests

from devstack import netcut
from devstack.common import StackError, wait_until
from devstack.tls import TlsFiles


@dataclass
class EtcdServer:
    """One etcd member. Alone it is a one-member cluster named `dlock`; in a cluster,
    `initial_cluster` is every member's `name=peer-url` and `name` is this member's. Given
    `tls`, clients reach it on https:// with that certificate (peers stay on loopback HTTP)."""

    datadir: Path
    client_port: int
    peer_port: int
    process: subprocess.Popen | None = None
    name: str = "dlock"
    initial_cluster: str = ""
    tls: TlsFiles | None = None

    @property
    def url(self) -> str:
        scheme = "https" if self.tls else "http"
        return f"{scheme}://127.0.0.1:{self.client_port}"

    @property
    def peer_url(self) -> str:
        return f"http://127.0.0.1:{self.peer_port}"

    @property
    def cut_tag(self) -> str:
        """Its cgroup's name (devstack.netcut): the experiment can partition it for real."""
        return netcut.tag_for(self.datadir)

    @property
    def logfile(self) -> Path:
        return self.datadir.parent / f"{self.datadir.name}.log"

    def command(self, binary: str) -> list[str]:
        # With TLS a client must present a certificate of the same CA (as in k8s/etcd.yaml).
        tls = (
            [
                "--cert-file", str(self.tls.certificate), "--key-file", str(self.tls.key),
                "--client-cert-auth", "--trusted-ca-file", str(self.tls.ca),
            ]
            if self.tls
            else []
        )  # fmt: skip
        return [
            binary,
            "--name",
            self.name,
            "--data-dir",
            str(self.datadir),
            "--listen-client-urls",
            self.url,
            "--advertise-client-urls",
            self.url,
            "--listen-peer-urls",
            self.peer_url,
            "--initial-advertise-peer-urls",
            self.peer_url,
            "--initial-cluster",
            self.initial_cluster or f"{self.name}={self.peer_url}",
            "--log-level",
            "warn",
            # the short election timeout lowers etcd's minimum lease TTL from 2 s to 1 s,
            # so ttlMillis=1000 sessions are honoured
            "--heartbeat-interval",
            "50",
            "--election-timeout",
            "500",
            *tls,
        ]

    def start(self, *, wait: bool = True) -> None:
        binary = shutil.which("etcd") or "/usr/bin/etcd"
        if not Path(binary).exists():
            raise StackError(
                "etcd not found: install it with `sudo apt-get install -y etcd-server`"
            )
        self.datadir.mkdir(parents=True, exist_ok=True)
        log = open(self.logfile, "ab")
        env = {**os.environ, "ETCD_UNSUPPORTED_ARCH": os.environ.get("ETCD_UNSUPPORTED_ARCH", "")}
        self.process = subprocess.Popen(
            netcut.wrap(self.command(binary), self.cut_tag),
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
        if wait:
            self.wait_healthy()

    def wait_healthy(self, timeout: float = 30) -> None:
        ca = str(self.tls.ca) if self.tls else None
        cert = (str(self.tls.client_certificate), str(self.tls.client_key)) if self.tls else None
        wait_until(
            lambda: etcd_healthy(self.url, ca=ca, cert=cert),
            timeout=timeout,
            what=f"etcd on {self.url}",
        )

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        netcut.release(self.cut_tag)


def etcd_cluster(
    datadir_root: Path, ports: list[tuple[int, int]], *, tls: TlsFiles | None = None
) -> list[EtcdServer]:
    """Members `dlock1..N` with (client, peer) ports; a single pair is the one-member `dlock`.
    `tls`: clients reach the members on https:// and present a certificate of the same CA."""
    if len(ports) == 1:
        client, peer = ports[0]
        return [EtcdServer(datadir_root / "etcd", client, peer, tls=tls)]
    members = [
        EtcdServer(datadir_root / f"etcd{n}", client, peer, name=f"dlock{n}", tls=tls)
        for n, (client, peer) in enumerate(ports, start=1)
    ]
    initial = ",".join(f"{m.name}={m.peer_url}" for m in members)
    for member in members:
        member.initial_cluster = initial
    return members


def etcd_healthy(url: str, *, ca: str | None = None, cert: tuple[str, str] | None = None) -> bool:
    try:
        answer = requests.get(f"{url}/health", timeout=1, verify=ca or True, cert=cert)
        return answer.status_code == 200
    except requests.RequestException:
        return False
