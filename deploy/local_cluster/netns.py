"""Network namespaces as pods: each Ray node of the local cluster gets its own network stack and
address, on a bridge that stands in for the pod network.

Addresses come from 198.18.0.0/15 only (RFC 2544, reserved for benchmarking: never routed to
anyone), one /24 per cluster. Every name this module creates starts with `sa` and carries the
cluster's id, and a state file records it, so `cleanup_stale()` can remove what a killed run left
behind without touching anything it did not make. Needs root (CAP_NET_ADMIN) and iproute2.
"""

from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import json
import os
import re
import shutil
import signal
import socket
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from serve_app.status import own_folder

from .cpu import remove_tree, stale_groups

#: RFC 2544's benchmarking range: the only addresses the harness uses.
BENCHMARK_NET = ipaddress.ip_network("198.18.0.0/15")
#: Per-namespace files `ip netns exec` mounts over /etc (iproute2's convention).
NETNS_ETC = Path("/etc/netns")
#: Where each live cluster records the namespaces and links it made (for cleanup_stale).
STATE_DIR = Path("/tmp/serve-app-netns")


class NetnsError(RuntimeError):
    """A namespace or link could not be made (no root, no iproute2, a name taken)."""


#: The names this module gives namespaces (sa<cluster>n<node>) and links (sa<cluster>v<node>, sa<cluster>br).
OUR_NAME = re.compile(r"sa\d+(n\d+|v\d+|br)")


def state_dir() -> Path:
    """STATE_DIR (made 0700 if missing), refused unless only this user may write in it: its records name the
    namespaces, links and processes that cleanup_stale, run as root, removes and kills."""
    if not own_folder(STATE_DIR):
        info = STATE_DIR.lstat()
        raise NetnsError(f"{STATE_DIR} is not a folder only this user may write in (mode "
                         f"{oct(info.st_mode & 0o777)}, owner uid {info.st_uid}): remove it and start again")
    return STATE_DIR


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    done = subprocess.run(["ip", *args], capture_output=True, text=True)
    if check and done.returncode != 0:
        raise NetnsError(f"`ip {' '.join(args)}` failed: {done.stderr.strip()}")
    return done


def subnet_for(cluster_id: int) -> ipaddress.IPv4Network:
    """The /24 of cluster `cluster_id` (0-511) inside 198.18.0.0/15."""
    subnets = list(BENCHMARK_NET.subnets(new_prefix=24))
    if not 0 <= cluster_id < len(subnets):
        raise ValueError(f"cluster_id {cluster_id!r} is outside 0..{len(subnets) - 1}")
    return subnets[cluster_id]


@dataclass
class PodNetwork:
    """A bridge (the host side, gateway .1) and one namespace per node (.10, .11, ...)."""

    cluster_id: int
    namespaces: list[str] = field(default_factory=list)
    links: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.subnet = subnet_for(self.cluster_id)
        self.bridge = f"sa{self.cluster_id}br"
        self.gateway = str(self.subnet.network_address + 1)

    @property
    def state_file(self) -> Path:
        return STATE_DIR / f"{self.cluster_id}.json"

    #: processes outside the namespaces that belong to this cluster (its Redis server): [pid, its start time]
    extra_pids: list[list[int]] = field(default_factory=list)

    def _save(self) -> None:
        state_dir()
        self.state_file.write_text(json.dumps({"pid": os.getpid(), "namespaces": self.namespaces,
                                               "links": self.links, "extra_pids": self.extra_pids}))

    def own(self, pid: int) -> None:
        """Record a process outside the namespaces (killed by cleanup_stale if this run dies)."""
        self.extra_pids.append([pid, started_at(pid)])
        self._save()

    def disown(self, pid: int) -> None:
        """Forget a recorded process that has exited (its pid may be reused)."""
        self.extra_pids = [p for p in self.extra_pids if p[0] != pid]
        self._save()

    def create_bridge(self) -> None:
        self.links.append(self.bridge)
        self._save()
        _ip("link", "add", self.bridge, "type", "bridge")
        _ip("addr", "add", f"{self.gateway}/{self.subnet.prefixlen}", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")

    def address(self, index: int) -> str:
        return str(self.subnet.network_address + 10 + index)

    def add_node(self, index: int, hosts: dict[str, str] | None = None) -> tuple[str, str]:
        """Namespace `sa<cluster>n<index>` with address .(10+index); returns (namespace, address).

        `hosts` (name -> address) stand in for cluster DNS (a Service's name): `ip netns exec` mounts
        /etc/netns/<namespace>/hosts over /etc/hosts for the processes it starts."""
        ns, host_side = f"sa{self.cluster_id}n{index}", self._link(index)
        address = self.address(index)
        self.namespaces.append(ns)
        self.links.append(host_side)
        self._save()
        _ip("netns", "add", ns)
        etc = NETNS_ETC / ns
        etc.mkdir(parents=True, exist_ok=True)
        # As a pod's /etc/hosts: its own hostname resolves to its address (the kubelet writes that line).
        (etc / "hosts").write_text(f"127.0.0.1 localhost\n::1 localhost\n{address} {socket.gethostname()}\n" + "".join(
            f"{addr} {name}\n" for name, addr in (hosts or {}).items()))
        # No name server: a pod's cluster DNS answers at once, and the machine's resolver is outside
        # 198.18.0.0/15, where the nodes send nothing (a query to it would wait 2 x 5 s for no answer,
        # as Ray's dashboard agent did at every start, and a raylet gives its agents 15 s).
        (etc / "resolv.conf").write_text("# local cluster node: names come from hosts only\n"
                                         "nameserver 127.0.0.1\noptions timeout:1 attempts:1\n")
        _ip("link", "add", host_side, "type", "veth", "peer", "name", "eth0", "netns", ns)
        _ip("link", "set", host_side, "master", self.bridge)
        _ip("link", "set", host_side, "up")
        _ip("-n", ns, "addr", "add", f"{address}/{self.subnet.prefixlen}", "dev", "eth0")
        _ip("-n", ns, "link", "set", "eth0", "up")
        _ip("-n", ns, "link", "set", "lo", "up")
        _ip("-n", ns, "route", "add", "default", "via", self.gateway)
        return ns, address

    def _link(self, index: int) -> str:
        """The host end of node `index`'s veth pair, on the bridge."""
        return f"sa{self.cluster_id}v{index}"

    def set_link(self, index: int, up: bool) -> None:
        """Node `index` cut off from the bridge (a network partition: its processes live on, and nothing
        reaches them or comes from them; no connection is reset), or joined to it again."""
        _ip("link", "set", self._link(index), "up" if up else "down")

    def pids(self, ns: str) -> list[int]:
        """Every process living in namespace `ns` (a node's raylet, workers, agents, HAProxy...)."""
        done = _ip("netns", "pids", ns, check=False)
        return [int(p) for p in done.stdout.split()]

    def remove(self) -> None:
        """Delete every namespace and link this network made (idempotent)."""
        _remove(self.namespaces, self.links)
        self.namespaces, self.links = [], []
        self.state_file.unlink(missing_ok=True)


def leftovers(cluster_id: int) -> list[str]:
    """Namespaces and links of cluster `cluster_id` that still exist (none, once it is removed)."""
    prefix = f"sa{cluster_id}"
    namespaces = [line.split()[0] for line in _ip("netns", "list", check=False).stdout.splitlines() if line.strip()]
    links = [line.split(":")[1].strip().split("@")[0] for line in _ip("-o", "link", "show", check=False).stdout.splitlines()
             if ":" in line]
    return [name for name in namespaces + links if re.fullmatch(rf"{prefix}(n|v)\d+|{prefix}br", name)]


def kill_namespace_processes(ns: str) -> list[int]:
    """SIGKILL every process in namespace `ns`; their pids."""
    pids = [int(p) for p in _ip("netns", "pids", ns, check=False).stdout.split()]
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return pids


def started_at(pid: int) -> int:
    """When process `pid` started (clock ticks after boot; -1 if it is gone): a pid and its start time name one
    process, where a pid alone may have been reused since it was recorded."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return -1
    return int(stat[stat.rindex(")") + 2:].split()[19])


def _command(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def _remove(namespaces: list[str], links: list[str]) -> None:
    for ns in namespaces:
        _ip("netns", "delete", ns, check=False)  # its veth end goes with it, and the host end too
        shutil.rmtree(NETNS_ETC / ns, ignore_errors=True)
    for link in links:
        _ip("link", "delete", link, check=False)


@contextlib.contextmanager
def _records_locked():
    """The state folder's records, held by this process alone: two runs starting at once each removed a dead run's
    namespaces, and the slower one removed those the faster had just made under the id it reserved."""
    with open(state_dir() / ".lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def cleanup_stale() -> list[str]:
    """Remove the namespaces and links of clusters whose owning process is gone; their names."""
    if not STATE_DIR.exists():
        return []
    with _records_locked():
        return _cleanup_stale()


def _cleanup_stale() -> list[str]:
    removed: list[str] = []
    for state in state_dir().glob("*.json"):
        try:
            data = json.loads(state.read_text())
        except (OSError, ValueError):
            continue
        if _alive(data.get("pid", 0)):
            continue
        # (the folder is this user's alone; a name this module never gives is still not acted on)
        data["namespaces"] = [n for n in data.get("namespaces", []) if OUR_NAME.fullmatch(str(n))]
        data["links"] = [n for n in data.get("links", []) if OUR_NAME.fullmatch(str(n))]
        for ns in data.get("namespaces", []):
            kill_namespace_processes(ns)
        for recorded in data.get("extra_pids", []):
            pid, start = recorded if isinstance(recorded, list) else (recorded, None)
            if started_at(pid) != start if start is not None else _command(pid) != "redis-server":
                continue  # gone, or its pid is another process's now (a record from before start times: by name)
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        _remove(data.get("namespaces", []), data.get("links", []))
        removed += data.get("namespaces", []) + data.get("links", [])
        for group in stale_groups(int(state.stem)):
            remove_tree(group)
            removed.append(str(group))
        state.unlink(missing_ok=True)
    return removed


def free_cluster_id() -> int:
    """The lowest cluster id no live cluster on this machine uses, reserved for this process: its state
    file is created here, exclusively (two clusters starting at once would otherwise both take an id, and
    the one whose bridge then failed to be created would remove the other's on its way out)."""
    with _records_locked():
        _cleanup_stale()
        for cluster_id in range(1, 512):
            try:
                fd = os.open(state_dir() / f"{cluster_id}.json", os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
            except FileExistsError:
                continue
            with os.fdopen(fd, "w") as state:
                json.dump({"pid": os.getpid(), "namespaces": [], "links": [], "extra_pids": []}, state)
            return cluster_id
    raise RuntimeError(f"no free cluster id: 511 clusters recorded in {STATE_DIR}")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return pid > 0
