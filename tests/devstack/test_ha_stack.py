"""`make up … ETCD_MEMBERS=3 REPLICAS=2`: replicas on port + 100, every URL in stack.env, a real
three-member etcd cluster; `make down` stops it all."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
import requests

from devstack.common import REPLICA_PORT_STEP, URL_ENV, free_port, pid_alive, port_open, ready
from devstack.envfile import read_env
from devstack.etcd import etcd_cluster
from devstack.stack import TopologyMismatch, down, up

pytestmark = [pytest.mark.live, pytest.mark.slow]


def test_two_replicas_of_each_role_listen_on_port_plus_100_and_are_all_listed(
    run_dir, replica_ports
):
    env = up("pg", replicas=2, run=run_dir, ports=replica_ports)

    written = read_env(run_dir / "stack.env")
    for role in ("lockserver", "payments", "railproxy"):
        first, second = replica_ports[role], replica_ports[role] + REPLICA_PORT_STEP
        urls = [f"http://127.0.0.1:{first}", f"http://127.0.0.1:{second}"]
        assert written[URL_ENV[role]] == ",".join(urls) == env[URL_ENV[role]]
        assert all(ready(url) for url in urls)
    assert written["RAIL_STUB_URL"] == f"http://127.0.0.1:{replica_ports['railstub']}"
    assert not port_open(replica_ports["railstub"] + REPLICA_PORT_STEP)  # one rail, the outside

    with pytest.raises(TopologyMismatch, match="REPLICAS=2"):
        up(replicas=1, run=run_dir)

    pids = [int(p.read_text()) for p in (run_dir / "pids").glob("*.pid")]
    assert len(pids) == 8  # 2 x 3 replicated roles, the rail stub, the admin (never replicated)
    assert written["ADMIN_URL"] == f"http://127.0.0.1:{replica_ports['admin']}"
    assert not port_open(replica_ports["admin"] + REPLICA_PORT_STEP)
    down(run=run_dir)
    assert not any(pid_alive(pid) for pid in pids)
    assert not any(port_open(port) for port in replica_ports.values())
    assert not any(port_open(port + REPLICA_PORT_STEP) for port in replica_ports.values())


@pytest.mark.etcd
def test_three_etcd_members_form_one_cluster_and_survive_the_loss_of_one():
    root = Path(tempfile.mkdtemp(prefix="dlock-etcd-cluster-"))
    members = etcd_cluster(root, [(free_port(), free_port()) for _ in range(3)])
    try:
        for member in members:
            member.start(wait=False)
        for member in members:
            member.wait_healthy()
        listed = requests.post(f"{members[0].url}/v3/cluster/member/list", json={}, timeout=5)
        names = sorted(m["name"] for m in listed.json()["members"])
        assert names == ["dlock1", "dlock2", "dlock3"]
        members[0].stop()
        members[1].wait_healthy(timeout=10)  # two of three are a quorum
    finally:
        for member in members:
            member.stop()
