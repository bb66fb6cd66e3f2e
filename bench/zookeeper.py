"""A private single-node ZooKeeper for the lock benchmark (issue 28), started as Redis is.

Debian's `zookeeper` package (`bash scripts/sysdeps.sh` installs it): the
standalone server class from /usr/share/java/zookeeper.jar (its manifest names every jar it
needs), a private config with `forceSync=yes` (every transaction-log write is fsynced before the
server answers, as PostgreSQL's commit and etcd's WAL are), its data directory beside the
benchmark's PostgreSQL data (same disk), a port from `devstack.common.free_port()`, the admin HTTP
server off. `stop()` ends it and nothing else.
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from devstack.common import wait_until

JAR = Path("/usr/share/java/zookeeper.jar")
MAIN = "org.apache.zookeeper.server.ZooKeeperServerMain"


@dataclass
class ZooKeeperServer:
    datadir: Path
    port: int
    heap_mb: int = 256
    process: subprocess.Popen | None = None

    @property
    def hosts(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def config(self) -> Path:
        return self.datadir.parent / f"{self.datadir.name}.cfg"

    @property
    def logfile(self) -> Path:
        return self.datadir.parent / f"{self.datadir.name}.log"

    def config_text(self) -> str:
        return "\n".join(
            [
                "tickTime=2000",
                f"dataDir={self.datadir}",
                f"clientPort={self.port}",
                "clientPortAddress=127.0.0.1",
                "forceSync=yes",  # fsync the transaction log before answering (the default)
                "maxClientCnxns=0",
                "admin.enableServer=false",
                "4lw.commands.whitelist=ruok,srvr",
                "",
            ]
        )

    def start(self, timeout: float = 60) -> ZooKeeperServer:
        java = shutil.which("java")
        if java is None or not JAR.exists():
            raise RuntimeError(
                "ZooKeeper not found: `bash scripts/sysdeps.sh` (apt-get install zookeeper)"
            )
        self.datadir.mkdir(parents=True, exist_ok=True)
        self.config.write_text(self.config_text())
        log = open(self.logfile, "ab")
        self.process = subprocess.Popen(
            [java, f"-Xmx{self.heap_mb}m", "-cp", str(JAR), MAIN, str(self.config)],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        wait_until(self._serving, timeout=timeout, what=f"zookeeper on {self.hosts}")
        return self

    def _serving(self) -> bool:
        if self.process is not None and self.process.poll() is not None:
            tail = self.logfile.read_text(errors="replace")[-2000:]
            raise RuntimeError(f"zookeeper exited with {self.process.returncode}:\n{tail}")
        return four_letter(self.port, b"ruok") == b"imok"

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def four_letter(port: int, word: bytes) -> bytes:
    """ZooKeeper's four-letter-word answer (`ruok` → `imok`), b"" when it does not answer."""
    import socket

    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1) as sock:
            sock.sendall(word)
            chunks = []
            while chunk := sock.recv(4096):
                chunks.append(chunk)
            return b"".join(chunks)
    except OSError:
        return b""


def version(port: int) -> str:
    for line in four_letter(port, b"srvr").decode(errors="replace").splitlines():
        if line.startswith("Zookeeper version:"):
            return line.split(":", 1)[1].split(",")[0].strip()
    return "?"


def write_count(port: int) -> int | None:
    """Write transactions so far in this epoch: the counter half of `srvr`'s Zxid (every create,
    delete or set is one transaction and one zxid; reads take none)."""
    for line in four_letter(port, b"srvr").decode(errors="replace").splitlines():
        if line.startswith("Zxid:"):
            return int(line.split(":", 1)[1].strip(), 16) & 0xFFFFFFFF
    return None
