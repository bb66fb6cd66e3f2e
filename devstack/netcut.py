"""A real network partition of one local process, on loopback: nftables drops every packet its
sockets send or receive, while the process itself keeps running (its timers fire, it notices it
lost its peers, it answers nobody).

Loopback has one address for everyone, so the cut cannot be by address. It is by cgroup: the
process is born in its own cgroup v2 group (`wrap` puts it there before it opens a socket, so
every socket it ever has is the group's), and `partitioned` adds an nftables table whose
`socket cgroupv2` rules drop what that group's sockets send (output) and what arrives for them
(input). Deleting the table heals the cut; established TCP connections then recover by
retransmission, as after a real partition.

Needs root, `nft` and cgroup v2 mounted under /sys/fs/cgroup (pure v2, or hybrid's
`unified`); `unavailable()` says what is missing. Without it, processes start unwrapped.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

CGROUP_FS = Path("/sys/fs/cgroup")  # nft resolves `socket cgroupv2` paths below this


def _cgroup2_mount() -> Path | None:
    try:
        mounts = Path("/proc/self/mounts").read_text().splitlines()
    except OSError:
        return None
    for line in mounts:
        fields = line.split()
        if len(fields) > 2 and fields[2] == "cgroup2":
            mount = Path(fields[1])
            if mount == CGROUP_FS or CGROUP_FS in mount.parents:
                return mount
    return None


def unavailable() -> str | None:
    """Why this machine cannot cut a process off, or None when it can."""
    if os.geteuid() != 0:
        return "not root (nftables and cgroups need it)"
    if shutil.which("nft") is None:
        return "no nft (apt-get install nftables)"
    mount = _cgroup2_mount()
    if mount is None:
        return "no cgroup v2 hierarchy under /sys/fs/cgroup"
    if not os.access(mount, os.W_OK):
        return f"{mount} is not writable"
    return None


def tag_for(anchor: Path) -> str:
    """A stable name for the process that owns `anchor` (its data directory): the stack that
    starts it and the experiment that cuts it compute the same one."""
    return "dlock-" + hashlib.sha1(str(anchor.resolve()).encode()).hexdigest()[:12]  # noqa: S324


def _group(tag: str) -> Path:
    mount = _cgroup2_mount()
    assert mount is not None
    return mount / tag


def wrap(command: list[str], tag: str) -> list[str]:
    """`command`, started inside the group `tag` (created if need be), when the machine can
    cut; unchanged otherwise. The shell joins the group, then execs: the pid stays the
    command's and no socket exists before the move."""
    if unavailable() is not None:
        return command
    group = _group(tag)
    group.mkdir(exist_ok=True)
    join = f'echo $$ > "{group}/cgroup.procs" 2>/dev/null; exec "$@"'
    return ["/bin/sh", "-c", join, "sh", *command]


def release(tag: str) -> None:
    """Remove the group `tag` once nothing lives in it (a stopped member's); a no-op where the
    machine cannot cut or the group still holds a process."""
    if unavailable() is not None:
        return
    with contextlib.suppress(OSError):
        _group(tag).rmdir()


def in_group(pid: int, tag: str) -> bool:
    """Whether process `pid` lives in the group `tag` (so a cut would reach it)."""
    try:
        lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
    except OSError:
        return False
    return any(line.startswith("0::") and line.rstrip().endswith("/" + tag) for line in lines)


def _nft(script: str) -> None:
    subprocess.run(["nft", "-f", "-"], input=script, text=True, check=True, capture_output=True)


@contextlib.contextmanager
def partitioned(tag: str) -> Iterator[None]:
    """Every packet to or from the group's sockets is dropped until the block ends."""
    reason = unavailable()
    if reason is not None:
        raise RuntimeError(f"cannot partition a process here: {reason}")
    mount = _cgroup2_mount()
    assert mount is not None
    path = (mount / tag).relative_to(CGROUP_FS)
    level = len((mount / tag).relative_to(mount).parts)
    table = tag.replace("-", "_")
    match = f'socket cgroupv2 level {level} "{path}"'
    _nft(
        f"table inet {table} {{\n"
        f"  chain out {{ type filter hook output priority -10; {match} drop; }}\n"
        f"  chain in {{ type filter hook input priority -10; {match} drop; }}\n"
        "}\n"
    )
    try:
        yield
    finally:
        _nft(f"delete table inet {table}\n")
