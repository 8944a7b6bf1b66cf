"""How the HTTP side calls a model, wherever it runs, and how its failures map to errors.

Routes depend on the small `ModelClient` protocol, not on Ray: a `HandleClient` over a
DeploymentHandle (the model's own deployment; serve_app/handle_client.py), a `LocalClient` (a model
placed in this Ingress), a `ViaIngressClient` (from the JobManager to a model placed in the Ingress),
or in unit tests a fake. Which one a model gets is chosen in serve_app/placement.py; the JobManager
wraps each in a `BackgroundClient`, which marks its compute calls as job work.
(Not to be confused with serve_app/client.py: the HTTP client for users of the service.)
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Protocol

from deployments.errors import ReplicaStopped, describe_exception

from .errors import InternalError, ServeAppError, ShuttingDown

logger = logging.getLogger("serve_app")

#: The name of the Ingress deployment (serve_app/ingress.py), which models with `placement: ingress` live in.
INGRESS_DEPLOYMENT = "Ingress"


class ModelClient(Protocol):
    name: str

    async def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """Call `method` on the model deployment and return its result.

        Cancelling the awaiting task cancels the call (its queued records are dropped)."""


class LocalClient:
    """A model placed in this process (`placement: ingress`): the model replica object itself,
    called directly on this replica's event loop, with HandleClient's error mapping.

    Cancelling the awaiting task cancels the call as through a handle: its records still waiting
    in the model queue are dropped, never computed."""

    def __init__(self, name: str, replica: Any, retry_after_s: int = 2, journal: Any = None):
        self.name = name
        self.replica = replica
        self._retry_after_s = retry_after_s
        #: its view of the process's crash journal (serve_app/crash_journal.py), which the callers of its compute
        #: methods hold their records in: the Service's coalescers, Ingress.call_placed. None: not journaled
        self.journal = journal

    async def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        try:
            result = getattr(self.replica, method)(*args, **kwargs)
            if asyncio.iscoroutine(result):
                result = await result
            return result
        except (ServeAppError, asyncio.CancelledError):
            raise
        except ReplicaStopped:  # the Ingress replica it is placed in is stopping: another one will answer
            raise ShuttingDown(f"{self.name} stopped with this replica; retry after {self._retry_after_s} s.",
                               retry_after_s=self._retry_after_s) from None
        except Exception as exc:
            logger.error("%s.%s raised %s", self.name, method, describe_exception(exc))
            raise InternalError(f"{self.name} failed on this request; the error has been logged.") from None

    async def deployment_status(self) -> tuple[str, str]:
        """(status, message) in the terms of Serve's deployment status: the model shares this
        replica's fate, so it is HEALTHY unless its own health check fails."""
        try:
            self.replica.check_health()
        except Exception as exc:
            return "UNHEALTHY", str(exc)
        return "HEALTHY", ""


class ViaIngressClient:
    """From another deployment (the JobManager), a model placed in the Ingress: each call goes to
    `Ingress.call_placed(name, method, ...)` through `ingress`, a client of the Ingress
    deployment, so job work reaches the same model queues (at background priority) as requests."""

    def __init__(self, name: str, ingress: Any):
        self.name = name
        self._ingress = ingress

    async def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        return await self._ingress.call("call_placed", self.name, method, *args, **kwargs)

    async def deployment_status(self) -> tuple[str, str]:
        return await self._ingress.deployment_status()


#: model methods that compute records (the ones that take `background=`)
COMPUTE_METHODS = frozenset({"translate", "embed", "predict"})


class BackgroundClient:
    """A model client whose compute calls are marked `background=True`: they queue behind
    interactive requests in the model replicas."""

    def __init__(self, inner: ModelClient):
        self.name = inner.name
        self._inner = inner

    async def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        if method in COMPUTE_METHODS:
            kwargs["background"] = True
        return await self._inner.call(method, *args, **kwargs)

    def __getattr__(self, name: str) -> Any:  # deployment_status, retried, ...
        return getattr(self._inner, name)
