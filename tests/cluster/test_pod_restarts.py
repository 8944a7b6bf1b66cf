"""A pod whose Ray node dies while it starts is started again, as the kubelet restarts a failed
container (deploy/local_cluster/node.py). In CI a rejoining worker's raylet aborted 20 s into its
start (WaitForDashboardAgentPorts: its dashboard agent, importing on two shared cores, was late);
here the raylet is killed as soon as it exists, so the path runs on every cluster run. Runs after
tests/cluster/test_cluster.py, on the same cluster (conftest.py)."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from tests.support import wait_for

from .helpers import NODE_START_BOUND_S, ready, running_by_node, wait_full_strength

pytestmark = pytest.mark.cluster


def _raylet_pid(cluster, node):
    for pid in cluster.network.pids(node.namespace):
        try:
            if Path(f"/proc/{pid}/comm").read_text().strip() == "raylet":
                return pid
        except OSError:  # exited meanwhile
            continue
    return None


def test_a_pod_whose_raylet_dies_while_starting_is_started_again(cluster, figures):
    ready(cluster)
    by_node = running_by_node(cluster)
    # The worker with the fewest replicas: the test is about the node, not about replacing replicas.
    victim = min(cluster.workers, key=lambda w: sum(nodes[w.address] for nodes in by_node.values()))
    failed_before = len(victim.failed_starts)
    cluster.kill_node(victim)
    started_at = time.monotonic()
    cluster.start_node(victim)
    raylet = wait_for(lambda: _raylet_pid(cluster, victim), 60, "the starting pod's raylet", 0.05)
    os.kill(raylet, signal.SIGKILL)
    # Its `ray start` gives up on the node (before it registered: 30 s of asking GCS for it; after:
    # its --block loop sees the raylet gone) and exits; then the kubelet's part begins.
    wait_for(lambda: victim.exited, 90, "the failed `ray start` to exit", 0.2)
    exited_at = time.monotonic()
    cluster.wait_nodes(len(cluster.nodes), NODE_START_BOUND_S)
    figures["cluster_raylet_died_while_starting"] = {
        "ray_start_exited_after_s": round(exited_at - started_at, 1),
        "node_alive_after_s": round(time.monotonic() - started_at, 1),
        "failed_starts": victim.failed_starts[failed_before:]}
    assert len(victim.failed_starts) == failed_before + 1, victim.failed_starts
    assert victim.alive and not victim.starting
    wait_full_strength(cluster, 300)  # and the service is whole again for whatever runs next
