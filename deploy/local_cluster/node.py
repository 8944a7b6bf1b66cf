"""One Ray node of the local cluster: a pod's network namespace, address, spec and `ray start --block`
process, and what the kubelet would do when that process fails before the node joins."""

from __future__ import annotations

import contextlib
import subprocess
import time
from pathlib import Path
from typing import Optional

from . import manifest as mf

#: A pod whose `ray start` exits before its node joins is started again after these pauses (CrashLoopBackOff's
#: 10 s, doubling); after them it has failed. KubeRay (autoscaler v2: restartPolicy Never) replaces such a pod
#: instead, which also costs scheduling and the image's start (docs/deploy.md).
#: On two shared cores a raylet can abort at start-up: it gives the dashboard agent ~15 s to report
#: its ports, and the agent's imports took 25 s in one CI run (raylet.err: WaitForDashboardAgentPorts).
START_RETRY_PAUSES_S = (10.0, 20.0, 40.0)


class Node:
    """One Ray node: its namespace, address, spec, log and `ray start --block` process."""

    def __init__(self, index: int, spec: mf.NodeSpec, namespace: str, address: str, workdir: Path):
        self.index, self.spec, self.namespace, self.address = index, spec, namespace, address
        self.name = "head" if spec.head else f"worker-{index}"
        #: what its `ray start` processes print, one start after the other
        self.log_path = Path(workdir) / f"{self.name}.log"
        self.proc: Optional[subprocess.Popen] = None
        #: started and not yet ALIVE: its cgroup has the starting pod's CPU shares (cpu.py)
        self.starting = False
        #: when its latest `ray start` was launched (ms since the epoch): only a raylet started after
        #: it is this node (the dashboard can list the lost one at its address as ALIVE a while)
        self.launched_ms = 0.0
        #: the end of the log of each `ray start` that exited before its node joined (all of them, for the figures)
        self.failed_starts: list[str] = []
        #: of those, since the node last joined: its restarts left count from there, as the kubelet's backoff resets
        self.failed_in_a_row = 0
        #: when to start it again after such an exit (time.monotonic())
        self.restart_at: Optional[float] = None
        #: its pod is being deleted (kubelet.py): out of the Service's endpoints until it starts again
        self.terminating = False

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def exited(self) -> bool:
        return self.proc is not None and self.proc.poll() is not None

    def launched(self, proc: subprocess.Popen) -> None:
        self.proc, self.starting, self.launched_ms, self.restart_at = proc, True, time.time() * 1000, None
        self.terminating = False

    def may_start_again(self) -> bool:
        """Exited before it joined, with a restart left."""
        return self.exited and self.starting and self.failed_in_a_row < len(START_RETRY_PAUSES_S)

    def failed_start(self) -> float:
        """Record an exit before joining; the pause before the next start, in seconds."""
        self.failed_starts.append(self.log_tail())
        self.failed_in_a_row += 1
        pause_s = START_RETRY_PAUSES_S[self.failed_in_a_row - 1]
        self.restart_at = time.monotonic() + pause_s
        return pause_s

    def joined(self) -> None:
        self.starting, self.failed_in_a_row = False, 0

    def reap(self, timeout_s: float = 10) -> None:
        """Wait up to `timeout_s` for its `ray start` to exit (after its processes were killed)."""
        if self.proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=timeout_s)

    def due_for_restart(self) -> bool:
        if self.restart_at is None or time.monotonic() < self.restart_at:
            return False
        self.restart_at = None
        return True

    def joined_as(self, youngest_alive_ms: Optional[int]) -> bool:
        """ALIVE in the cluster: a raylet at its address, started after its latest `ray start` if it
        is still starting (1 s of slack for the clock's rounding)."""
        return youngest_alive_ms is not None and (not self.starting or youngest_alive_ms >= self.launched_ms - 1000)

    def log_tail(self, lines: int = 5) -> str:
        text = self.log_path.read_text(errors="replace").splitlines() if self.log_path.exists() else []
        return " | ".join(line.strip() for line in text[-lines:])
