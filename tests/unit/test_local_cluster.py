"""deploy/local_cluster: reading a RayService as KubeRay would, the address plan, and (as root) a pod
network's name resolution and clean removal; no Ray."""

from __future__ import annotations

import ipaddress
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from deploy.local_cluster import manifest as mf
from deploy.local_cluster.cpu import PodCpu, shares_for
from deploy.local_cluster import netns
from deploy.local_cluster.netns import BENCHMARK_NET, PodNetwork, free_cluster_id, leftovers, subnet_for

ROOT = Path(__file__).resolve().parents[2]
CPU = ROOT / "kuberay" / "rayservice-cpu.yaml"
ALL_SECRETS = type("AnySecret", (dict,), {"__contains__": lambda self, k: True,
                                          "__getitem__": lambda self, k: f"secret-{k[0]}-{k[1]}"})()


def test_quantities_are_read_as_kubernetes_writes_them():
    assert mf.quantity_bytes("8Gi") == 8 * 2**30
    assert mf.quantity_bytes("512Mi") == 512 * 2**20
    assert mf.quantity_bytes("1G") == 10**9
    assert mf.quantity_cpus("500m") == 0.5 and mf.quantity_cpus("4") == 4.0
    with pytest.raises(mf.ManifestError, match="'8 GB'"):
        mf.quantity_bytes("8 GB")


def test_the_cpu_rayservice_is_run_as_the_operator_would():
    spec = mf.load(CPU, ALL_SECRETS)
    # The head: no logical CPUs (no replica there), its memory limit.
    head_args = spec.head.ray_start_args()
    assert "--num-cpus=0" in head_args and "--dashboard-host=0.0.0.0" in head_args
    # The workers: num-cpus and memory from the container limits, as KubeRay derives them.
    assert spec.workers.num_cpus == 4 and f"--memory={8 * 2**30}" in spec.workers.ray_start_args()
    assert "--num-cpus=4" in spec.workers.ray_start_args()
    # N+1 for two Ingress replicas spread one per pod.
    assert spec.worker_min_replicas >= 3 and spec.worker_replicas >= spec.worker_min_replicas
    assert spec.worker_max_replicas >= spec.worker_min_replicas
    # The container env reaches every node (HAProxy, its retry policy, Serve's ticks).
    for node in (spec.head, spec.workers):
        assert node.env["RAY_SERVE_ENABLE_HA_PROXY"] == "1"
        assert "RAY_SERVE_HAPROXY_RETRY_ON" in node.env
    assert spec.serve_port == 9527 and spec.auth_mode == "token"
    assert spec.gcs_ft["redisAddress"].endswith(":6379")
    assert mf.redis_password_ref(spec.gcs_ft) == ("serve-app-redis", "password")


def test_a_missing_secret_stops_the_pod_as_kubernetes_would(tmp_path):
    raw = yaml.safe_load(CPU.read_text())
    env = raw["spec"]["rayClusterConfig"]["headGroupSpec"]["template"]["spec"]["containers"][0]["env"]
    env.append({"name": "NEEDED", "valueFrom": {"secretKeyRef": {"name": "absent", "key": "k"}}})
    path = tmp_path / "rs.yaml"
    path.write_text(yaml.safe_dump(raw))
    with pytest.raises(mf.ManifestError, match="Secret 'absent'"):
        mf.load(path, {})


def test_rayStartParams_win_over_the_limits():
    node = mf.NodeSpec(group="g", head=False, start_params={"num-cpus": "2"}, env={}, num_cpus=3.5,
                       memory_bytes=2**30, num_gpus=1)
    args = node.ray_start_args()
    assert "--num-cpus=2" in args and "--num-gpus=1" in args and f"--memory={2**30}" in args


def test_fractional_cpu_limits_round_up_to_a_whole_logical_cpu():
    node = mf.NodeSpec(group="g", head=False, start_params={}, env={}, num_cpus=1.5, memory_bytes=2**30)
    assert "--num-cpus=2" in node.ray_start_args()


def test_addresses_stay_in_the_benchmarking_range():
    assert BENCHMARK_NET == ipaddress.ip_network("198.18.0.0/15")
    subnets = [subnet_for(i) for i in (0, 1, 511)]
    assert all(s.subnet_of(BENCHMARK_NET) for s in subnets)
    assert len(set(subnets)) == 3
    for bad in (-1, 512):
        with pytest.raises(ValueError, match=repr(bad)):
            subnet_for(bad)


def test_secret_volumes_are_known_by_mount_path():
    spec = mf.load(CPU, ALL_SECRETS)
    for node in (spec.head, spec.workers):
        keys_file = node.env["SERVE_APP_INGRESS_API_KEYS_FILE"]
        assert any(keys_file.startswith(m + "/") and name == "serve-app-api-key"
                   for m, name in node.secret_mounts.items()), node.secret_mounts


def test_the_head_detects_a_lost_pod_in_seconds():
    """GCS's node health checks decide how long calls to a lost pod's replicas wait (tests/cluster)."""
    for path in (CPU, ROOT / "kuberay" / "rayservice-gpu.yaml"):
        env = mf.load(path, ALL_SECRETS).head.env
        detect_ms = int(env["RAY_health_check_failure_threshold"]) * max(
            int(env["RAY_health_check_period_ms"]), int(env["RAY_health_check_timeout_ms"]))
        assert detect_ms <= 10_000, (path.name, detect_ms)


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("ip") is None, reason="network namespaces need root and iproute2")
def test_a_pod_network_resolves_names_as_a_pod_and_leaves_nothing_behind():
    """Each pod resolves its own hostname to its address and asks no name server (the machine's is
    outside 198.18.0.0/15: a query to it waited 10 s and made Ray's agents miss the raylet's 15 s);
    removing the network leaves no namespace or link."""
    net = PodNetwork(free_cluster_id())
    try:
        net.create_bridge()
        ns, address = net.add_node(0, {"serve-app-redis": net.gateway})
        code = ("import socket, time; t = time.monotonic(); own = socket.gethostbyname(socket.gethostname())\n"
                "try:\n    socket.getaddrinfo('name.invalid', 80); other = 'resolved'\n"
                "except OSError:\n    other = 'unresolved'\n"
                "print(own, socket.gethostbyname('serve-app-redis'), other, time.monotonic() - t)")
        out = subprocess.run(["ip", "netns", "exec", ns, sys.executable, "-c", code], capture_output=True, text=True,
                             timeout=60, check=True).stdout.split()
        assert out[:3] == [address, net.gateway, "unresolved"]
        assert float(out[3]) < 2.0, f"name lookups took {out[3]} s"
        assert sorted(leftovers(net.cluster_id)) == sorted([ns, net.bridge, f"sa{net.cluster_id}v0"])
    finally:
        net.remove()
    assert leftovers(net.cluster_id) == []


def test_pods_get_cpu_shares_as_their_requests_say(tmp_path):
    (tmp_path / "cpu.shares").write_text("1024")  # a cgroup v1 cpu controller's root
    cpu = PodCpu(7, root=tmp_path)
    command = cpu.wrap(2, shares_for(4), ["ray", "start"])
    group = tmp_path / "sa7cpu" / "n2"
    assert command[-2:] == ["ray", "start"] and str(group / "cgroup.procs") in command
    assert (group / "cpu.shares").read_text() == "4096"
    cpu.set_shares(2, shares_for(0.5))
    assert (group / "cpu.shares").read_text() == "512"


def test_on_cgroup_v2_the_clusters_group_enables_the_cpu_controller_for_its_pods(tmp_path):
    """cgroup v2 gives a child cpu.weight only where its parent's subtree_control has +cpu (the root's
    alone is not enough: the pods are the cluster group's children)."""
    cpu = PodCpu(7, root=tmp_path)  # no cpu.shares: a v2 root
    assert cpu.version == 2
    command = cpu.wrap(0, shares_for(4), ["ray", "start"])
    assert (tmp_path / "sa7cpu" / "cgroup.subtree_control").read_text() == "+cpu"
    assert (cpu.path(0) / "cpu.weight").read_text() == str(1 + ((4096 - 2) * 9999) // 262142)
    assert command[-2:] == ["ray", "start"]


@pytest.mark.skipif(os.geteuid() != 0 or PodCpu(0).base is None, reason="needs root and a cpu cgroup controller")
def test_a_pod_and_its_children_stay_in_its_cgroup_and_it_is_removed():
    cluster_id = free_cluster_id()
    cpu = PodCpu(cluster_id)
    proc = subprocess.Popen(cpu.wrap(0, 2048, ["sh", "-c", "sleep 30 & wait"]))
    try:
        procs = cpu.path(0) / "cgroup.procs"
        deadline = time.monotonic() + 10
        while len(procs.read_text().split()) < 2 and time.monotonic() < deadline:  # the shell and its sleep
            time.sleep(0.05)
        assert str(proc.pid) in procs.read_text().split() and len(procs.read_text().split()) == 2
    finally:
        for pid in procs.read_text().split():
            os.kill(int(pid), 9)
        proc.wait()
        deadline = time.monotonic() + 10
        while procs.read_text().split() and time.monotonic() < deadline:
            time.sleep(0.05)
        cpu.remove()
        (netns.STATE_DIR / f"{cluster_id}.json").unlink(missing_ok=True)  # the id's reservation
    assert not cpu.base.exists()


def test_two_clusters_starting_at_once_get_different_ids(tmp_path, monkeypatch):
    """The id is reserved (its state file created exclusively) when it is chosen, not when the bridge is."""
    monkeypatch.setattr(netns, "STATE_DIR", tmp_path / "state")
    first, second = free_cluster_id(), free_cluster_id()
    assert first != second
    (tmp_path / "state" / f"{first}.json").unlink()
    assert free_cluster_id() == first  # a released id is free again


def test_a_stop_asked_for_while_the_cluster_starts_stops_it_then(monkeypatch, tmp_path):
    """Start-up can take minutes (nodes, then Serve): Ctrl-C or SIGTERM then stops it at once, removing
    what was made, instead of waiting for the start to end."""
    import signal
    import time

    import deploy.local_cluster.__main__ as launcher

    stopped = []

    class SlowToStart:
        def __init__(self, *args, **kwargs):
            pass

        def __enter__(self):
            try:
                os.kill(os.getpid(), signal.SIGTERM)  # from here: after main() installed its handlers
                time.sleep(30)  # as LocalCluster.start waits for its nodes
            except BaseException:
                self.stop()  # LocalCluster.__enter__ stops on any exception
                raise

        def __exit__(self, *exc):
            pass

        def stop(self):
            stopped.append(time.monotonic())

    monkeypatch.setattr(launcher, "LocalCluster", SlowToStart)
    monkeypatch.setattr(launcher, "cleanup_stale", lambda: [])
    monkeypatch.setattr(launcher.tempfile, "mkdtemp", lambda **kwargs: str(tmp_path))
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        start = time.monotonic()
        assert launcher.main([]) == 130
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
    assert stopped and stopped[0] - start < 5


def test_a_node_gets_its_restarts_again_once_it_has_joined(tmp_path):
    """Restarts of a `ray start` that exits before joining count from the node's last join, as the kubelet's
    backoff resets once a container runs: a head restarted several times in one session keeps its restarts."""
    from deploy.local_cluster.node import START_RETRY_PAUSES_S, Node

    spec = mf.load(CPU, ALL_SECRETS).head
    node = Node(0, spec, "ns", "198.18.1.10", tmp_path)
    exited = subprocess.Popen([sys.executable, "-c", "pass"])
    exited.wait()
    for session in range(2):
        node.launched(exited)
        pauses = []
        while node.may_start_again():
            pauses.append(node.failed_start())
        assert pauses == list(START_RETRY_PAUSES_S), session
        node.joined()
    assert len(node.failed_starts) == 2 * len(START_RETRY_PAUSES_S)  # all of them kept, for the figures


def test_cleanup_acts_only_on_a_folder_of_this_user_s_and_on_names_it_gives(tmp_path, monkeypatch):
    """cleanup_stale runs as root and removes what the state files name: a folder others may write in is
    refused (another user could plant `{"links": ["eth0"], "namespaces": ["../../home"]}` there), and a
    name this module never gives is left alone even so."""
    import json

    state = tmp_path / "state"
    monkeypatch.setattr(netns, "STATE_DIR", state)
    monkeypatch.setattr(netns, "NETNS_ETC", tmp_path / "etc-netns")
    state.mkdir()
    state.chmod(0o777)
    with pytest.raises(netns.NetnsError, match="only this user may write"):
        netns.cleanup_stale()
    state.chmod(0o700)
    calls = []
    monkeypatch.setattr(netns, "_ip", lambda *args, check=True: calls.append(args))
    monkeypatch.setattr(netns, "kill_namespace_processes", lambda ns: calls.append(("kill", ns)))
    monkeypatch.setattr(netns, "stale_groups", lambda cluster_id: [])
    (state / "7.json").write_text(json.dumps({"pid": 2 ** 22 - 1, "namespaces": ["sa7n0", "../../home"],
                                              "links": ["sa7v0", "sa7br", "eth0"], "extra_pids": []}))
    assert netns.cleanup_stale() == ["sa7n0", "sa7v0", "sa7br"]
    assert ("link", "delete", "eth0") not in calls and ("kill", "../../home") not in calls
    assert netns.state_dir() == state and not (state / "7.json").exists()
