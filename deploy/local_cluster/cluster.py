"""A multi-node Ray cluster on one machine, run from a RayService manifest as KubeRay runs it.

Each Ray node lives in a network namespace of its own (deploy/local_cluster/netns.py), with its own
address and its own Serve proxy on the serve port, as pods do. The head and every worker are
started with the manifest's rayStartParams, resources and container env (manifest.py); the Serve
application is submitted as the operator submits it: serveConfigV2 PUT to the head's dashboard
REST API, then polled until every application is RUNNING. With gcsFaultToleranceOptions, a real
`redis-server` stores GCS state and the head gets the variables KubeRay injects.

`stop()` kills every process in every namespace, the Redis server, and removes the namespaces
and the bridge; it runs on any exit of `with LocalCluster(...)`.
"""

from __future__ import annotations

import os
import secrets as _secrets
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Callable, Optional

import httpx

from . import manifest as mf
from .cpu import PodCpu, shares_for
from .kubelet import PodDeletion, delete_pod
from .netns import PodNetwork, free_cluster_id, kill_namespace_processes
from .node import Node
from .pod_secrets import UserSecrets
from .view import DashboardView, wait_until

ROOT = Path(__file__).resolve().parents[2]
GCS_PORT = 6379
DASHBOARD_PORT = 8265
#: KubeRay's fixed metrics export port in every Ray container.
METRICS_PORT = 8080
#: KubeRay gives workers this much time to wait for a restarted head when GCS FT is on (600 s).
WORKER_GCS_RECONNECT_TIMEOUT_S = "600"


def _bin(name: str) -> str:
    return str(Path(sys.executable).with_name(name))


class LocalCluster(DashboardView):
    def __init__(self, manifest_path: Path, workdir: Path, *, workers: Optional[int] = None,
                 api_key: Optional[str] = None, log: Callable[[str], None] = print):
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.log = log
        self.secrets = UserSecrets(api_key)
        self.api_key, self.redis_password = self.secrets.api_key, self.secrets.redis_password
        self.ray_token = _secrets.token_hex(32)
        raw = mf.load(manifest_path, self.secrets)
        self.secrets.gcs_password_ref = mf.redis_password_ref(raw.gcs_ft) if raw.gcs_ft else None
        self.spec = raw
        self.worker_count = workers if workers is not None else max(raw.worker_replicas, raw.worker_min_replicas)
        self.network = PodNetwork(free_cluster_id())
        # Each pod's CPU (cpu.py): workers their request's shares; the head, and a pod still starting,
        # as much as all workers together (on a cluster they have CPUs nobody else takes).
        self.cpu = PodCpu(self.network.cluster_id)
        self.worker_shares = shares_for(raw.workers.num_cpus)
        self.own_cpu_shares = max(shares_for(raw.head.num_cpus), self.worker_shares * self.worker_count)
        # Fresh and 0700 (mkdtemp): Ray's template makes HAProxy's admin socket mode 666, and a folder others
        # could make first would let them swap haproxy.cfg before a reload (HAProxy runs as root here).
        self.haproxy_dir = Path(tempfile.mkdtemp(prefix=f"sah{self.network.cluster_id}-", dir="/tmp"))
        self.nodes: list[Node] = []
        self.redis_proc: Optional[subprocess.Popen] = None
        # RAY_external_storage_namespace: KubeRay uses the RayCluster's UID; one per local cluster.
        self.storage_namespace = _secrets.token_hex(8)

    # -- addresses ---------------------------------------------------------------------------
    @property
    def head(self) -> Node:
        return self.nodes[0]

    @property
    def workers(self) -> list[Node]:
        return self.nodes[1:]

    @property
    def dashboard_url(self) -> str:
        return f"http://{self.head.address}:{DASHBOARD_PORT}"

    def serve_url(self, node: Node) -> str:
        return f"http://{node.address}:{self.spec.serve_port}"

    @property
    def redis_host(self) -> str:
        """The Redis Service's name in gcsFaultToleranceOptions.redisAddress (resolves in every pod)."""
        return self.spec.gcs_ft.get("redisAddress", "redis:6379").rpartition(":")[0]

    @property
    def redis_port(self) -> int:
        return int(self.spec.gcs_ft.get("redisAddress", "redis:6379").rpartition(":")[2])

    def ray_auth_headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.ray_token}"} if self.spec.auth_mode == "token" else {}

    # -- life cycle ---------------------------------------------------------------------------
    def __enter__(self) -> "LocalCluster":
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self, timeout_s: float = 180) -> None:
        self.network.create_bridge()
        if self.spec.gcs_ft is not None:
            self.start_redis()
        hosts = {self.redis_host: self.network.gateway} if self.spec.gcs_ft is not None else {}
        ns, address = self.network.add_node(0, hosts)
        self.nodes.append(Node(0, self.spec.head, ns, address, self.workdir))
        for i in range(1, self.worker_count + 1):
            ns, address = self.network.add_node(i, hosts)
            self.nodes.append(Node(i, self.spec.workers, ns, address, self.workdir))
        self.start_node(self.head)
        # (not only its dashboard: a head whose `ray start` exits first is started again, or fails with its log at
        # once, instead of a timeout without a log after 180 s)
        self.wait_nodes(1, timeout_s)
        # One at a time: nodes on one machine share Ray's session folder, and each picks its socket
        # and log names by looking for free ones (two at once picked the same and one never registered).
        for count, node in enumerate(self.workers, start=2):
            self.start_node(node)
            self.wait_nodes(count, timeout_s)
        self.log(f"cluster up: head {self.head.address}, workers "
                 + ", ".join(n.address for n in self.workers)
                 + (f"; CPU shares: workers {self.worker_shares}, head and starting pods {self.own_cpu_shares}"
                    if self.cpu.available else "; no cpu cgroup controller: pods share the CPU without shares"))

    def _env(self, node: Node) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "SERVE_APP_"))}
        env.update({name: self.secrets.mounted(node.spec.secret_mounts, node.name, value, self.workdir)
                    for name, value in node.spec.env.items()})
        env["PATH"] = f"{Path(sys.executable).parent}:{env.get('PATH', '')}"
        # The code is this checkout's (the image has it installed; here an editable install may point
        # at another checkout of the same project).
        env["PYTHONPATH"] = str(ROOT)
        # Each pod has its own /tmp: HAProxy's files (Ray's default folder is machine-wide), in a short
        # folder, since HAProxy limits its socket paths (serve_app/proxy.py MAX_HAPROXY_SOCKET_PATH).
        pod_tmp = self.haproxy_dir / f"n{node.index}"
        pod_tmp.mkdir(parents=True, exist_ok=True)
        for var, leaf in (("RAY_SERVE_HAPROXY_CONFIG_FILE_LOC", "haproxy.cfg"),
                          ("RAY_SERVE_HAPROXY_SOCKET_PATH", "admin.sock"),
                          ("RAY_SERVE_HAPROXY_SERVER_STATE_BASE", ""),
                          ("RAY_SERVE_HAPROXY_SERVER_STATE_FILE", "server-state"),
                          ("RAY_SERVE_HAPROXY_METRICS_SOCKET_PATH", "metrics.sock")):
            env.setdefault(var, str(pod_tmp / leaf) if leaf else str(pod_tmp))
        if self.spec.auth_mode == "token":  # authOptions: KubeRay sets both in every container
            env.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=self.ray_token)
        if self.spec.gcs_ft is not None:
            env["RAY_external_storage_namespace"] = self.storage_namespace
            if node.spec.head:
                env["RAY_REDIS_ADDRESS"] = self.spec.gcs_ft["redisAddress"]
                env["REDIS_PASSWORD"] = self.redis_password
            else:
                env.setdefault("RAY_gcs_rpc_server_reconnect_timeout_s", WORKER_GCS_RECONNECT_TIMEOUT_S)
        return env

    def start_node(self, node: Node) -> None:
        args = [_bin("ray"), "start", "--block", f"--node-ip-address={node.address}",
                f"--metrics-export-port={METRICS_PORT}", "--disable-usage-stats",
                f"--object-store-memory={max(78 * 2**20, int(node.spec.memory_bytes * 0.3))}",
                *node.spec.ray_start_args(),
                # Every node's record of its cluster (ray_current_cluster) goes in this run's folder, not
                # /tmp/ray, where a later `ray.init()` with no address would join it, dead or alive (issue 30).
                f"--temp-dir={self.workdir / 'ray'}"]
        if node.spec.head:
            args += ["--head", f"--port={GCS_PORT}", f"--dashboard-port={DASHBOARD_PORT}"]
            # A restarted head is a new pod: its /tmp does not remember the last cluster's address, and
            # it cannot see the workers' processes. Here every node shares the machine's process table
            # and /tmp, and `ray start --head` refuses an address that the last start recorded while
            # processes with that --gcs-address run (the workers' raylets, kept by GCS fault tolerance).
            (self.workdir / "ray" / "ray_current_cluster").unlink(missing_ok=True)
            if self.spec.gcs_ft is not None:
                args.append(f"--redis-password={self.redis_password}")
        else:
            args.append(f"--address={self.head.address}:{GCS_PORT}")
        log = open(node.log_path, "ab")  # noqa: SIM115 - owned by the process
        command = self.cpu.wrap(node.index, self.own_cpu_shares, ["ip", "netns", "exec", node.namespace, *args])
        node.launched(subprocess.Popen(command, cwd=ROOT, env=self._env(node), stdout=log,
                                       stderr=subprocess.STDOUT, start_new_session=True))
        log.close()
        self.log(f"started {node.name} ({node.address}, {node.spec.ray_start_args()})")

    def restore(self, timeout_s: float = 180) -> list[str]:
        """Start the down nodes (head first) as the kubelet replaces lost pods, wait until ALIVE; their names.
        Redis first, if it is down (GCS cannot start without it)."""
        if self.spec.gcs_ft is not None and (self.redis_proc is None or self.redis_proc.poll() is not None):
            self.kill_redis()
            self.start_redis()
        down = [n for n in self.nodes if not n.alive]
        for node in sorted(down, key=lambda n: n.index):
            self.start_node(node)
            if node.spec.head:
                wait_until(lambda: httpx.get(f"{self.dashboard_url}/api/version", timeout=2,
                                        headers=self.ray_auth_headers()).status_code == 200,
                      timeout_s, "the head's dashboard")
        if down:
            self.wait_nodes(len(self.nodes), timeout_s)
        return [n.name for n in down]

    def kill_node(self, node: Node) -> int:
        """SIGKILL every process of `node` (raylet, workers, replicas, its proxy): a lost pod."""
        pids = kill_namespace_processes(node.namespace)
        node.reap()
        wait_until(lambda: not self.network.pids(node.namespace), 30, f"{node.name}'s processes to exit", 0.2)
        self.log(f"killed {node.name}: {len(pids)} processes")
        return len(pids)

    def delete_pod(self, node: Node) -> PodDeletion:
        """Delete `node`'s pod as the kubelet does: SIGTERM, then SIGKILL after its grace period (kubelet.py)."""
        return delete_pod(self, node)

    def start_redis(self) -> None:
        data = self.workdir / "redis"
        data.mkdir(parents=True, exist_ok=True)
        self.redis_proc = subprocess.Popen(
            ["redis-server", "--bind", self.network.gateway, "--port", str(self.redis_port),
             "--requirepass", self.redis_password, "--dir", str(data), "--appendonly", "yes",
             "--save", "", "--daemonize", "no", "--logfile", str(data / "redis.log")],
            start_new_session=True)
        self.network.own(self.redis_proc.pid)
        wait_until(lambda: _redis_ping(self.network.gateway, self.redis_port, self.redis_password), 20, "redis-server")

    def kill_redis(self) -> None:
        """SIGKILL redis-server: its pod lost (`start_redis` starts it again on its append-only file, as on its PVC)."""
        if self.redis_proc is not None:
            self.redis_proc.kill()
            self.redis_proc.wait()
            self.network.disown(self.redis_proc.pid)
            self.redis_proc = None

    def stop(self) -> None:
        for node in reversed(self.nodes):
            kill_namespace_processes(node.namespace)
            node.reap()
        self.kill_redis()
        self.cpu.remove()  # (before the network: removing that frees this cluster's id and cgroup name for others)
        self.network.remove()
        # Serve's logs (controller, proxies, replicas of every node) and Ray's own (GCS, raylets, agents,
        # dashboard; not the many worker logs) outlive the cluster, in the work folder.
        for logs in (self.workdir / "ray").glob("session_2*/logs"):
            if (logs / "serve").is_dir():
                shutil.copytree(logs / "serve", self.workdir / "serve-logs" / logs.parent.name, dirs_exist_ok=True)
            shutil.copytree(logs, self.workdir / "ray-logs" / logs.parent.name, dirs_exist_ok=True,
                            ignore=shutil.ignore_patterns("serve", "worker-*", "python-core-worker-*", "events",
                                                          "export_events"))
        shutil.rmtree(self.workdir / "ray", ignore_errors=True)
        shutil.rmtree(self.haproxy_dir, ignore_errors=True)

    def wait_nodes(self, count: int, timeout_s: float = 120) -> None:
        """Until `count` nodes are ALIVE and every node started here is among them, each node started
        since it last joined with a raylet younger than its `ray start`. A `ray start` that exits before
        its node joins is started again (START_RETRY_PAUSES_S); one that exits after, or too often,
        fails at once, with the end of its log."""
        def ready() -> bool:
            waiting = False
            for node in self.nodes:
                if node.restart_at is not None:
                    if node.due_for_restart():
                        self.start_node(node)
                elif node.may_start_again():
                    self._failed_start(node)
                elif node.exited:
                    raise RuntimeError(f"{node.name}'s `ray start` exited ({node.proc.returncode}): {node.log_tail()}")
                waiting = waiting or node.restart_at is not None
            alive = self.youngest_alive_raylets()
            if waiting or len(alive) < count or not all(n.joined_as(alive.get(n.address)) for n in self.nodes if n.alive):
                return False
            for node in self.nodes:  # joined: a worker now shares the CPU as its request says
                if node.starting:
                    node.joined()
                    if not node.spec.head:
                        self.cpu.set_shares(node.index, self.worker_shares)
            return True

        wait_until(ready, timeout_s, f"{count} ALIVE Ray nodes", errors=(httpx.HTTPError, ValueError, KeyError))

    def _failed_start(self, node: Node) -> None:
        """`node`'s `ray start` exited before it joined: its processes go, and it starts again after a
        pause, as KubeRay replaces the pod (here: the same namespace and address)."""
        kill_namespace_processes(node.namespace)
        pause_s = node.failed_start()
        self.log(f"{node.name}'s `ray start` exited ({node.proc.returncode}) before it joined; starting it "
                 f"again in {pause_s:.0f} s (start {node.failed_in_a_row + 1}): {node.failed_starts[-1]}")


def _redis_ping(host: str, port: int, password: str) -> bool:
    done = subprocess.run(["redis-cli", "-h", host, "-p", str(port), "--no-auth-warning", "-a", password, "ping"],
                          capture_output=True, text=True, timeout=5)
    return done.stdout.strip() == "PONG"
