"""A model replica's health: Serve calls `check_health`, and a model that keeps failing fails it."""

from __future__ import annotations

from typing import Optional

#: model calls that must fail in a row before check_health reports the replica broken
FAILURES_BEFORE_UNHEALTHY = 3


class ReplicaHealth:
    """Model calls that failed in a row (every call of a batch failed, and the known-good call computed
    again after it failed too: the model is broken, not one input; model_queue.py), and the last
    error; Serve replaces a replica whose `check` raises."""

    def __init__(self, deployment: str):
        self.deployment = deployment
        self.failures_in_a_row = 0
        self.last_error: Optional[str] = None
        self.shut_down_done = False

    def failed(self, error: Optional[BaseException]) -> None:
        self.failures_in_a_row += 1
        self.last_error = repr(error)

    def succeeded(self) -> None:
        self.failures_in_a_row = 0

    def shut_down(self) -> None:
        """From the replica's destructor, which Serve runs at the end of its graceful shutdown, just
        before the controller kills it. A controller that restarts in between (a head restart during a
        downscale, tests/cluster) adopts the replica as RUNNING; it passes health checks but refuses every
        request ("Replica is shutting down") for good. After this, `check` fails, so Serve replaces it."""
        self.shut_down_done = True

    def check(self) -> None:
        if self.shut_down_done:
            raise RuntimeError(f"{self.deployment}: this replica finished its graceful shutdown and refuses "
                               "requests, but is still asked to serve (its controller restarted meanwhile): "
                               "replace it")
        if self.failures_in_a_row >= FAILURES_BEFORE_UNHEALTHY:
            raise RuntimeError(
                f"{self.deployment}: last {self.failures_in_a_row} model calls failed; "
                f"last error: {self.last_error}"
            )
