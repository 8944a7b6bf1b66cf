"""How the ingress talks to the model deployments, and how their failures map to errors.

Routes depend on the small `ModelClient` protocol, not on Ray: in Serve it is a
`HandleClient` over a DeploymentHandle; in unit tests it is a fake.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Protocol

from .errors import InternalError, ModelUnavailable, Overloaded, ServeAppError

logger = logging.getLogger("serve_app")

#: The name of the Ingress deployment (serve_app/ingress.py), which models with `placement: ingress` live in.
INGRESS_DEPLOYMENT = "Ingress"


class ModelClient(Protocol):
    name: str

    async def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """Call `method` on the model deployment and return its result.

        Cancelling the awaiting task cancels the call (its queued records are dropped)."""


class HandleClient:
    """A DeploymentHandle plus the error mapping. Model methods are idempotent, so a
    call whose replica died is retried once on another (or the restarted) replica."""

    def __init__(self, name: str, handle: Any, *, retry_after_s: int = 2, retries_on_replica_death: int = 1,
                 retry_timeout_s: float = 8.0):
        self.name = name
        self._handle = handle
        self._methods: dict[str, Any] = {}
        self._retry_after_s = retry_after_s
        self._retries = retries_on_replica_death
        self._retry_timeout_s = retry_timeout_s
        #: calls retried after a replica died, and how those retries ended (tests and logs read them)
        self.retried = 0
        self.retries_failed = 0

    def _method(self, method: str) -> Any:
        if method not in self._methods:
            self._methods[method] = self._handle.options(method_name=method)
        return self._methods[method]

    async def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        from ray.exceptions import ActorDiedError, ActorUnavailableError, RayActorError, RayTaskError
        from ray.serve.exceptions import BackPressureError, DeploymentUnavailableError

        attempt = 0
        while True:
            response = self._method(method).remote(*args, **kwargs)
            try:
                if attempt == 0:
                    return await response
                # A retry waits for a healthy or restarted replica, but not forever: past
                # retry_timeout_s the caller gets 503 + Retry-After instead of a hang.
                try:
                    async with asyncio.timeout(self._retry_timeout_s):
                        return await response
                except TimeoutError:
                    response.cancel()
                    self.retries_failed += 1
                    logger.warning("%s: retry of %s found no replica within %g s", self.name, method,
                                   self._retry_timeout_s)
                    raise ModelUnavailable(
                        f"{self.name} has no healthy replica yet; retry after {self._retry_after_s} s.",
                        retry_after_s=self._retry_after_s,
                    ) from None
            except asyncio.CancelledError:
                response.cancel()
                raise
            except BackPressureError:
                raise Overloaded(
                    f"{self.name} is at capacity; retry after {self._retry_after_s} s.",
                    retry_after_s=self._retry_after_s,
                ) from None
            except DeploymentUnavailableError:
                raise ModelUnavailable(
                    f"{self.name} has no replica able to serve.", retry_after_s=self._retry_after_s
                ) from None
            except (ActorDiedError, ActorUnavailableError, RayActorError) as exc:
                if attempt < self._retries:
                    attempt += 1
                    self.retried += 1
                    logger.warning("%s replica died during %s; retrying once: %s", self.name, method,
                                   type(exc).__name__)
                    continue
                self.retries_failed += 1
                raise ModelUnavailable(
                    f"{self.name} replica failed while serving the request; retry after {self._retry_after_s} s.",
                    retry_after_s=self._retry_after_s,
                ) from None
            except RayTaskError as exc:
                if isinstance(exc.cause, ServeAppError):
                    # The deployment answered with one of our errors (e.g. job_not_found): pass it on.
                    raise exc.cause from None
                logger.error("%s.%s raised: %s", self.name, method, exc)
                raise InternalError(f"{self.name} failed on this request; the error has been logged.") from None

    async def deployment_status(self) -> tuple[str, str]:
        """(status, message) of this deployment as Serve's controller reports it."""
        from ray import serve

        app_name = serve.get_replica_context().app_name

        def ask() -> tuple[str, str]:
            app = serve.status().applications[app_name]
            deployment = app.deployments[self.name]
            return str(getattr(deployment.status, "value", deployment.status)), deployment.message or app.message

        return await asyncio.to_thread(ask)


class LocalClient:
    """A model placed in this process (`placement: ingress`): the model replica object itself,
    called directly on this replica's event loop, with HandleClient's error mapping.

    Cancelling the awaiting task cancels the call as through a handle: its records still waiting
    in the model queue are dropped, never computed."""

    def __init__(self, name: str, replica: Any):
        self.name = name
        self.replica = replica

    async def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        try:
            result = getattr(self.replica, method)(*args, **kwargs)
            if asyncio.iscoroutine(result):
                result = await result
            return result
        except (ServeAppError, asyncio.CancelledError):
            raise
        except Exception as exc:
            logger.error("%s.%s raised: %r", self.name, method, exc)
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
