"""deploy/local_cluster when things happen at once: a second Ctrl-C during the removal of a starting cluster, two
runs starting together after a crashed one (no Ray, no namespaces: the steps are faked)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from deploy.local_cluster import netns


@pytest.fixture
def processes():
    """Processes a test starts: killed after it, whatever happened."""
    started: list = []
    yield started
    for proc in started:
        proc.kill()
        proc.wait()


def test_a_second_signal_while_a_starting_cluster_is_removed_does_not_cut_the_removal_short(tmp_path, monkeypatch):
    """Ctrl-C while the cluster started, then again because the removal looked stuck: the second one raised inside
    `stop()`, after the nodes were killed, and left the namespaces, the bridge, Redis and HAProxy behind."""
    import os
    import signal
    import time as time_

    from deploy.local_cluster import __main__ as entry
    from deploy.local_cluster import cluster as cl

    removed = []

    class Slow:
        def __init__(self, name: str, seconds: float):
            self.name, self.seconds = name, seconds

        def remove(self):
            if self.name == "network":  # the second Ctrl-C, while the cluster is being removed
                os.kill(os.getpid(), signal.SIGINT)
            time_.sleep(self.seconds)
            removed.append(self.name)

    class Starting(cl.LocalCluster):
        def __init__(self, manifest, workdir, workers=None):
            self.workdir, self.haproxy_dir, self.nodes = Path(workdir), Path(workdir) / "haproxy", []
            self.network, self.cpu = Slow("network", 1.0), Slow("cpu", 0.0)
            self.kill_redis = lambda: removed.append("redis")

        def start(self, timeout_s: float = 180) -> None:
            os.kill(os.getpid(), signal.SIGINT)  # the first Ctrl-C, while starting
            time_.sleep(30)

    monkeypatch.setattr(entry, "LocalCluster", Starting)
    monkeypatch.setattr(entry, "cleanup_stale", lambda: [])
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        assert entry.main([]) == 130
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
    assert removed == ["redis", "cpu", "network"]


def test_two_runs_starting_at_once_do_not_remove_each_other_s_reservation(tmp_path, monkeypatch):
    """After a crashed run left its record, two runs start together and both clean it up: the slower one then removed
    the namespaces the faster had made under the id it reserved, and deleted that reservation."""
    import json
    import threading

    state = tmp_path / "state"
    monkeypatch.setattr(netns, "STATE_DIR", state)
    monkeypatch.setattr(netns, "NETNS_ETC", tmp_path / "etc-netns")
    netns.state_dir()
    (state / "1.json").write_text(json.dumps({"pid": 2 ** 22 - 1, "namespaces": ["sa1n0"], "links": ["sa1v0"],
                                              "extra_pids": []}))
    monkeypatch.setattr(netns, "_ip", lambda *args, check=True: None)
    monkeypatch.setattr(netns, "kill_namespace_processes", lambda ns: [])
    monkeypatch.setattr(netns, "stale_groups", lambda cluster_id: [])
    removing, real_remove = threading.Event(), netns._remove

    def slow_remove(namespaces, links):  # run B is inside its cleanup when run A starts
        if threading.current_thread().name == "run-B":
            removing.set()
            time.sleep(0.5)
        real_remove(namespaces, links)

    monkeypatch.setattr(netns, "_remove", slow_remove)
    b = threading.Thread(target=netns.cleanup_stale, name="run-B")
    b.start()
    assert removing.wait(5)
    cluster_id = netns.free_cluster_id()  # run A: cleans up, then reserves the lowest free id
    b.join(10)
    assert cluster_id == 1 and json.loads((state / "1.json").read_text())["pid"] == os.getpid()
    (state / "1.json").unlink()


def test_a_dead_run_s_redis_is_killed_but_not_a_process_that_got_its_pid_since(tmp_path, monkeypatch, processes):
    """cleanup_stale SIGKILLed every pid a dead run had recorded: one reused since (hours later, another program's)
    was killed too. A pid is now recorded with its start time, and killed only while both match."""
    import json
    import subprocess
    import sys

    state = tmp_path / "state"
    monkeypatch.setattr(netns, "STATE_DIR", state)
    monkeypatch.setattr(netns, "NETNS_ETC", tmp_path / "etc-netns")
    monkeypatch.setattr(netns, "_ip", lambda *args, check=True: None)
    monkeypatch.setattr(netns, "kill_namespace_processes", lambda ns: [])
    monkeypatch.setattr(netns, "stale_groups", lambda cluster_id: [])
    redis, stranger = (subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]) for _ in range(2))
    processes += [redis, stranger]
    network = netns.PodNetwork(netns.free_cluster_id())
    network.own(redis.pid)
    network.own(stranger.pid)
    record = json.loads(network.state_file.read_text())
    record["pid"] = 2 ** 22 - 1  # the run died
    record["extra_pids"][1][1] -= 1  # this pid's process started at another time: reused since
    network.state_file.write_text(json.dumps(record))
    netns.cleanup_stale()
    assert redis.wait(10) == -9 and stranger.poll() is None


def test_a_record_from_before_start_times_kills_only_a_redis_server(tmp_path, monkeypatch, processes):
    """Records written before start times were kept hold bare pids: the Redis of such a crashed run is still killed
    (a Redis left running keeps the next cluster's port), another program that got one of its pids is not."""
    import json
    import shutil
    import subprocess

    state = tmp_path / "state"
    monkeypatch.setattr(netns, "STATE_DIR", state)
    monkeypatch.setattr(netns, "_ip", lambda *args, check=True: None)
    monkeypatch.setattr(netns, "kill_namespace_processes", lambda ns: [])
    monkeypatch.setattr(netns, "stale_groups", lambda cluster_id: [])
    shutil.copy(shutil.which("sleep"), tmp_path / "redis-server")  # its process is named redis-server
    redis = subprocess.Popen([str(tmp_path / "redis-server"), "60"])
    stranger = subprocess.Popen([shutil.which("sleep"), "60"])
    processes += [redis, stranger]
    netns.state_dir()
    (state / "1.json").write_text(json.dumps({"pid": 2 ** 22 - 1, "namespaces": [], "links": [],
                                              "extra_pids": [redis.pid, stranger.pid]}))
    netns.cleanup_stale()
    assert redis.wait(10) == -9 and stranger.poll() is None


def test_a_stopping_cluster_empties_its_cgroup_before_it_frees_its_id():
    """Removing the network deletes the record, which frees the cluster's id: a run starting then took the id and put
    its head in the cgroup of that name, which the stopping run then emptied and removed."""
    from deploy.local_cluster import cluster as cl

    order = []
    stopping = cl.LocalCluster.__new__(cl.LocalCluster)
    stopping.nodes, stopping.workdir, stopping.haproxy_dir = [], Path("/nonexistent-sa"), Path("/nonexistent-sa/h")
    stopping.kill_redis = lambda: order.append("redis")
    stopping.cpu = type("Cpu", (), {"remove": lambda self: order.append("cgroup")})()
    stopping.network = type("Net", (), {"remove": lambda self: order.append("network")})()
    stopping.stop()
    assert order == ["redis", "cgroup", "network"]
