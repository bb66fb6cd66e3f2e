"""A throwaway certificate authority and one server certificate for `make up TLS=1`.

The openssl command line makes both under `.run/tls/`: `ca.crt` (what every client verifies
against: DLOCK_CA_BUNDLE) and `server.crt`/`server.key` (what each role's proxy presents, for
127.0.0.1 and localhost). Kept across `make up` like the secret key; delete the directory to get
new ones. Development only: in Kubernetes the certificate is a Secret (`dlock-tls`) mounted into
each proxy sidecar (docs/security.md).
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from devstack.common import StackError

DAYS = 30


@dataclass(frozen=True)
class TlsFiles:
    ca: Path
    certificate: Path
    key: Path

    @property
    def client_certificate(self) -> Path:
        """What a client presents to a server that verifies its clients (etcd)."""
        return self.ca.parent / "client.crt"

    @property
    def client_key(self) -> Path:
        return self.ca.parent / "client.key"


def _openssl(*args: str, cwd: Path) -> None:
    openssl = shutil.which("openssl")
    if openssl is None:
        raise StackError("TLS needs the openssl command (apt-get install openssl)")
    done = subprocess.run([openssl, *args], cwd=cwd, capture_output=True, text=True)
    if done.returncode != 0:
        raise StackError(f"openssl {args[0]} failed: {done.stderr.strip()}")


def stack_tls(run: Path, env: Mapping[str, str]) -> TlsFiles | None:
    """The stack's TLS files when it runs with TLS (`make up TLS=1`: DLOCK_TLS=1), else None."""
    return ensure_tls(run / "tls") if env.get("DLOCK_TLS") == "1" else None


def ensure_tls(directory: Path, names: tuple[str, ...] = ("127.0.0.1", "localhost")) -> TlsFiles:
    """The CA and server certificate under `directory`, made once."""
    files = TlsFiles(directory / "ca.crt", directory / "server.crt", directory / "server.key")
    if files.ca.exists() and files.certificate.exists() and files.key.exists():
        if not files.client_certificate.exists() and (directory / "ca.key").exists():
            _client_certificate(directory)
        return files
    directory.mkdir(parents=True, exist_ok=True)
    directory.chmod(0o700)
    _openssl(
        "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
        "-nodes", "-keyout", "ca.key", "-out", "ca.crt", "-days", str(DAYS),
        "-subj", "/CN=dlock development CA",
        "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign",
        cwd=directory,
    )  # fmt: skip
    san = ",".join(f"IP:{n}" if n.replace(".", "").isdigit() else f"DNS:{n}" for n in names)
    _signed(
        directory,
        "server",
        f"subjectAltName={san}\nbasicConstraints=CA:FALSE\n"
        # clientAuth too: etcd's HTTP gateway dials its own gRPC listener with the server's
        # certificate, which a member with --client-cert-auth verifies as a client's
        "keyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth,clientAuth\n",
    )
    _client_certificate(directory)
    for path in directory.iterdir():
        path.chmod(0o600)
    # nginx reads the key as root before it drops to its worker user; the CA is public.
    files.ca.chmod(0o644)
    files.certificate.chmod(0o644)
    return files


def _signed(directory: Path, name: str, extensions: str) -> None:
    """<name>.key and <name>.crt (CN "dlock development <name>", with `extensions`), signed by
    the CA in `directory`; <name>.csr and <name>.ext stay beside them."""
    (directory / f"{name}.ext").write_text(extensions)
    _openssl(
        "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
        "-keyout", f"{name}.key", "-out", f"{name}.csr",
        "-subj", f"/CN=dlock development {name}",
        cwd=directory,
    )  # fmt: skip
    _openssl(
        "x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
        "-CAcreateserial", "-out", f"{name}.crt", "-days", str(DAYS),
        "-extfile", f"{name}.ext",
        cwd=directory,
    )  # fmt: skip


def _client_certificate(directory: Path) -> None:
    """client.crt/client.key: the stack's client identity, signed by the same CA."""
    _signed(
        directory,
        "client",
        "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\n"
        "extendedKeyUsage=clientAuth\n",
    )
    for name in ("client.key", "client.crt", "client.csr", "client.ext"):
        (directory / name).chmod(0o600)
