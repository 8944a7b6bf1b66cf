"""deploy/local_cluster: when a started pod counts as joined, and a `ray start` that fails before it
joins started again as the kubelet would; real child processes stand in for `ray start`, no Ray."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from deploy.local_cluster import cluster as cl
from deploy.local_cluster import node as nd
from deploy.local_cluster.manifest import NodeSpec
from deploy.local_cluster.view import DashboardView

WORKER = NodeSpec(group="workers", head=False, start_params={}, env={}, num_cpus=4, memory_bytes=8 * 2**30)


def _raylet(address: str, state: str, start_ms: float) -> dict:
    return {"raylet": {"nodeManagerAddress": address, "state": state, "startTimeMs": str(int(start_ms))}}


class _Listed(DashboardView):
    def __init__(self, nodes: list[dict]):
        self.listed = nodes

    def ray_nodes(self) -> list[dict]:
        return self.listed


def _exiting(code: int) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", f"raise SystemExit({code})"])
    proc.wait()
    return proc


def test_the_lost_node_listed_alive_is_not_its_successor(tmp_path):
    """CI: the dashboard listed a lost worker ALIVE after its restart began, so the restarted pod
    counted as joined while its raylet had aborted, and no replica ever reached it."""
    node = nd.Node(1, WORKER, "ns", "198.18.1.11", tmp_path)
    node.launched(subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"]))
    try:
        lost = _raylet("198.18.1.11", "ALIVE", node.launched_ms - 60_000)
        view = _Listed([lost, _raylet("198.18.1.11", "DEAD", node.launched_ms + 500), _raylet("198.18.1.12", "ALIVE", 0)])
        assert view.youngest_alive_raylets() == {"198.18.1.11": int(lost["raylet"]["startTimeMs"]), "198.18.1.12": 0}
        assert not node.joined_as(view.youngest_alive_raylets().get(node.address))
        view.listed.append(_raylet("198.18.1.11", "ALIVE", node.launched_ms + 2_000))
        assert node.joined_as(view.youngest_alive_raylets().get(node.address))
        node.starting = False  # joined: any ALIVE raylet at its address is it
        assert node.joined_as(0) and not node.joined_as(None)
    finally:
        node.proc.kill()
        node.proc.wait()


def test_a_ray_start_that_exits_before_joining_is_started_again_then_fails(tmp_path, monkeypatch):
    monkeypatch.setattr(nd, "START_RETRY_PAUSES_S", (0.0, 0.0))
    killed, started, logged = [], [], []
    monkeypatch.setattr(cl, "kill_namespace_processes", lambda ns: killed.append(ns) or [])
    cluster = cl.LocalCluster.__new__(cl.LocalCluster)
    worker = nd.Node(1, WORKER, "sa-ns1", "198.18.1.11", tmp_path)
    cluster.nodes, cluster.log = [worker], logged.append
    cluster.youngest_alive_raylets = lambda: {}

    def start_node(node):
        started.append(node.name)
        node.log_path.write_text(f"start {len(started)}\nWaitForDashboardAgentPorts: check failed\n")
        node.launched(_exiting(1))

    cluster.start_node = start_node
    start_node(worker)
    with pytest.raises(RuntimeError, match=r"worker-1's `ray start` exited \(1\).*start 3"):
        cluster.wait_nodes(1, timeout_s=30)
    assert started == ["worker-1"] * 3 and killed == ["sa-ns1"] * 2
    assert [f.split(" | ")[0] for f in worker.failed_starts] == ["start 1", "start 2"]
    assert "starting it again in 0 s (start 2)" in logged[0]


def test_a_restarted_pod_joins_once_its_own_raylet_is_alive(tmp_path, monkeypatch):
    monkeypatch.setattr(nd, "START_RETRY_PAUSES_S", (0.0,))
    monkeypatch.setattr(cl, "kill_namespace_processes", lambda ns: [])
    cluster = cl.LocalCluster.__new__(cl.LocalCluster)
    worker = nd.Node(1, WORKER, "sa-ns1", "198.18.1.11", tmp_path)
    cluster.nodes, cluster.log = [worker], lambda line: None
    listed = {"198.18.1.11": int(time.time() * 1000) - 60_000}  # the lost raylet, still listed ALIVE
    cluster.youngest_alive_raylets = lambda: dict(listed)
    procs = []

    def start_node(node):
        if procs:  # the second start joins
            procs.append(subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"]))
            node.launched(procs[-1])
            listed[node.address] = int(node.launched_ms) + 1_000
        else:
            procs.append(_exiting(1))
            node.launched(procs[-1])

    cluster.start_node = start_node
    shares = []
    cluster.cpu = type("Cpu", (), {"set_shares": lambda self, i, s: shares.append((i, s))})()
    cluster.worker_shares = 512
    start_node(worker)
    try:
        cluster.wait_nodes(1, timeout_s=30)
        assert len(procs) == 2 and len(worker.failed_starts) == 1 and not worker.starting
        assert shares == [(1, 512)]
    finally:
        procs[-1].kill()
        procs[-1].wait()


def test_a_head_whose_ray_start_exits_first_is_started_again_not_waited_on_for_the_timeout(tmp_path, monkeypatch):
    """`LocalCluster.start` waited only for the head's dashboard: a head whose `ray start` exited (a raylet abort on
    two loaded cores) was noticed after the whole 180 s timeout, with no log. It now waits as for any node."""
    monkeypatch.setattr(nd, "START_RETRY_PAUSES_S", (0.0,))
    monkeypatch.setattr(cl, "kill_namespace_processes", lambda ns: [])
    head_spec = NodeSpec(group="head", head=True, start_params={}, env={}, num_cpus=1, memory_bytes=2**30)
    cluster = cl.LocalCluster.__new__(cl.LocalCluster)
    head = nd.Node(0, head_spec, "sa-ns0", "198.18.1.10", tmp_path)
    cluster.nodes, cluster.log = [head], lambda line: None
    listed: dict = {}
    cluster.youngest_alive_raylets = lambda: dict(listed)
    procs = []

    def start_node(node):
        procs.append(_exiting(1) if not procs else subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"]))
        node.launched(procs[-1])
        if len(procs) > 1:
            listed[node.address] = int(node.launched_ms) + 1_000

    cluster.start_node = start_node
    start_node(head)
    try:
        cluster.wait_nodes(1, timeout_s=30)
        assert len(procs) == 2 and len(head.failed_starts) == 1 and not head.starting
    finally:
        procs[-1].kill()
        procs[-1].wait()
    import inspect
    assert "self.wait_nodes(1, timeout_s)" in inspect.getsource(cl.LocalCluster.start)  # the head goes through it
