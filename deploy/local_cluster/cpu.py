"""CPU shares per pod: the local cluster's stand-in for each pod's CPU of its own.

On Kubernetes a pod's CPU request becomes its cgroup's `cpu.shares` (1024 per CPU), the head pod
has its CPU to itself, and a pod that starts (a replaced worker, a restarted head) starts on a node
whose CPUs its neighbours do not take. Here every node shares this machine's two cores with every
other node (12 logical worker CPUs on 2 cores) and with the test's clients, so a starting pod's
Python agents took 25-30 s to come up under load, and a raylet gives each agent 15 s before it
aborts: the pod never joined (tests/cluster, 2026-11-25). So each node runs in a cgroup of its
own: workers with their request's shares, the head and any pod still starting with the shares of
all workers together. A node's processes, and every process and thread they start, stay in its
cgroup.

cgroup v1 (`/sys/fs/cgroup/cpu`, `cpu.shares`) and v2 (`cpu.weight`) are supported; where neither
can be written (no root, no cpu controller) the cluster runs without, and says so.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Optional

V1_ROOT = Path("/sys/fs/cgroup/cpu")
V2_ROOT = Path("/sys/fs/cgroup")
#: Kubernetes' conversion: cpu.shares per requested CPU.
SHARES_PER_CPU = 1024


def shares_for(cpus: float) -> int:
    return max(2, int(cpus * SHARES_PER_CPU))


class PodCpu:
    """One cgroup per node under `sa<cluster>cpu`, created on demand, removed by `remove()`."""

    def __init__(self, cluster_id: int, root: Optional[Path] = None):
        self.name = f"sa{cluster_id}cpu"
        self.root, self.version = _controller(root)
        self.base = self.root / self.name if self.root else None

    @property
    def available(self) -> bool:
        return self.base is not None

    def path(self, node_index: int) -> Path:
        assert self.base is not None
        return self.base / f"n{node_index}"

    def wrap(self, node_index: int, shares: int, command: list[str]) -> list[str]:
        """`command` run inside node `node_index`'s cgroup (joined before exec, so nothing escapes)."""
        if not self.available:
            return command
        group = self.path(node_index)
        if self.version == 2 and not self.base.is_dir():
            # v2 gives a cgroup's children cpu.* files only where it enables the controller for them
            self.base.mkdir()
            (self.base / "cgroup.subtree_control").write_text("+cpu")
        group.mkdir(parents=True, exist_ok=True)
        self.set_shares(node_index, shares)
        return ["sh", "-c", 'echo $$ > "$0" && exec "$@"', str(group / "cgroup.procs"), *command]

    def set_shares(self, node_index: int, shares: int) -> None:
        if not self.available:
            return
        group = self.path(node_index)
        if self.version == 1:
            (group / "cpu.shares").write_text(str(shares))
        else:  # v2: weight 1-10000 maps shares 2-262144 (systemd's and the kernel's conversion)
            (group / "cpu.weight").write_text(str(1 + ((min(shares, 262144) - 2) * 9999) // 262142))

    def remove(self, timeout_s: float = 15.0) -> None:
        """Kill whatever still runs in the cgroups, wait until they are empty (a cgroup with tasks
        cannot be removed; a killed process leaves when it has exited), then delete them."""
        if self.base is None or not self.base.is_dir():
            return
        deadline = time.monotonic() + timeout_s
        while True:
            pids = [int(p) for procs in self.base.rglob("cgroup.procs") for p in procs.read_text().split()]
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            if not pids or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        remove_tree(self.base)


def remove_tree(base: Path) -> None:
    if not base.is_dir():
        return
    for child in sorted((p for p in base.iterdir() if p.is_dir()), reverse=True):
        remove_tree(child)
    try:
        base.rmdir()  # cgroupfs: rmdir, not unlink of the control files
    except OSError:
        pass


def stale_groups(cluster_id: int) -> list[Path]:
    """The cgroup folders a (dead) cluster `cluster_id` may have left."""
    root, _ = _controller(None)
    return [root / f"sa{cluster_id}cpu"] if root is not None and (root / f"sa{cluster_id}cpu").is_dir() else []


def _controller(root: Optional[Path]) -> tuple[Optional[Path], int]:
    if root is not None:
        return root, 1 if (root / "cpu.shares").exists() else 2
    if (V1_ROOT / "cpu.shares").exists() and _writable(V1_ROOT):
        return V1_ROOT, 1
    controllers = V2_ROOT / "cgroup.controllers"
    if controllers.exists() and "cpu" in controllers.read_text().split() and _writable(V2_ROOT):
        try:  # children of the root may use the cpu controller
            (V2_ROOT / "cgroup.subtree_control").write_text("+cpu")
        except OSError:
            return None, 0
        return V2_ROOT, 2
    return None, 0


def _writable(path: Path) -> bool:
    probe = path / ".sa-probe"
    try:
        probe.mkdir(exist_ok=True)
        probe.rmdir()
        return True
    except OSError:
        return False

