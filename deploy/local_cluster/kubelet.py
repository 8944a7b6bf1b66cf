"""A pod deleted as the kubelet deletes it: out of the Service, SIGTERM, then SIGKILL after the grace period.

Kubernetes, on `kubectl delete pod` (and on a scale-down, a rollout, a node drain or an eviction):

1. marks the pod terminating: the endpoints controller takes it out of every Service at once
   (here: `Node.terminating`, which the tests' Service leaves out);
2. sends SIGTERM to the container's main process: `ray start --block`, which KubeRay's
   `bash -lc "...; ray start ... --block"` execs (the last command of a `bash -c` string is exec'd);
3. SIGKILLs it if it is still running when `terminationGracePeriodSeconds` (30 s unless the pod sets it)
   has passed. When the main process exits, the container stops and the runtime kills whatever it left.

The manifests declare no preStop hook, so there is none to run.
"""

from __future__ import annotations

import signal
import subprocess
import time
from dataclasses import dataclass
from typing import Optional

from .node import Node


@dataclass
class PodDeletion:
    """What a deletion took: when `ray start` exited (None: the grace period ran out first, and it was
    SIGKILLed), and how many processes it left for the runtime to kill."""

    grace_s: float
    stopped_after_s: Optional[float] = None
    left_behind: int = 0

    @property
    def graceful(self) -> bool:
        return self.stopped_after_s is not None


def delete_pod(cluster, node: Node) -> PodDeletion:
    """Delete `node`'s pod (see the module's docstring)."""
    began = time.monotonic()
    result = PodDeletion(grace_s=node.spec.termination_grace_s)
    node.terminating = True
    if node.alive:
        node.proc.send_signal(signal.SIGTERM)
        try:
            node.proc.wait(timeout=result.grace_s)
            result.stopped_after_s = round(time.monotonic() - began, 1)
        except subprocess.TimeoutExpired:
            node.proc.kill()
            node.proc.wait(timeout=10)
    result.left_behind = cluster.kill_node(node)  # the container runtime kills what `ray start` left
    cluster.log(f"deleted {node.name}'s pod: " + (f"`ray start` exited after {result.stopped_after_s} s"
                                                  if result.graceful else f"SIGKILLed after {result.grace_s:.0f} s")
                + f", {result.left_behind} processes left behind")
    return result
