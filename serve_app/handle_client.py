"""`HandleClient`: a model's own deployment, called through its DeploymentHandle (serve_app/model_clients.py
has the other clients and the `ModelClient` protocol they share).

It maps Ray's and Serve's failures to the service's errors, retries a call once after its replica died or
stopped, and bounds how long a call waits for a replica. A caller that knows better what should go again
asks for no retry after a death: the CallCoalescer (serve_app/coalescing.py), for a call several requests
share, since one of them may have sent the input that crashed the replica.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Optional

from deployments.errors import ReplicaStopped, describe_exception

from ._router_state import replicas_known, taken
from .crash_quarantine import CrashQuarantine
from .errors import InternalError, ModelUnavailable, Overloaded, ReplicaLost, ServeAppError

logger = logging.getLogger("serve_app")


class HandleClient:
    """A DeploymentHandle plus the error mapping. Model methods are idempotent, so a
    call whose replica died, or stopped before computing it, is retried once on another (or the restarted) replica.

    The CallCoalescer (serve_app/coalescing.py) steers that retry with `call`'s two keywords, which never reach
    the model. `retry_on_replica_death=False`: a call whose replica died raises `ReplicaLost` (503 + Retry-After)
    instead of going again; for a call several requests share, one of which may have sent the input that crashed
    the replica. `after_replica_death=True`: the call is the retry of such a call (one request's records of it):
    it waits for a replica as a retry does and counts as the one retry. A replica that stopped is no death: a call
    it did not compute is retried as ever. Records whose calls lost `MAX_DEATHS` (3) replicas within `quarantine_s`
    get ModelCrashed (500) instead of a retry, and every call with them does for that long; records answered are
    forgotten (serve_app/crash_quarantine.py). A shared call's death is counted by the coalescer, against each of
    its callers' records."""

    def __init__(self, name: str, handle: Any, *, retry_after_s: int = 2, retries_on_replica_death: int = 1,
                 retry_timeout_s: float = 8.0, quarantine_s: float = 600.0):
        self.name = name
        self.quarantine = CrashQuarantine(name, quarantine_s)
        self._handle = handle
        self._methods: dict[str, Any] = {}
        self._retry_after_s = retry_after_s
        self._retries = retries_on_replica_death
        self._retry_timeout_s = retry_timeout_s
        #: calls retried after a replica died, and how those retries ended (tests and logs read them)
        self.retried = 0
        self.retries_failed = 0
        #: calls cut short because a replica of this model failed while they waited (503 + Retry-After)
        self.cut_after_replica_failure = 0
        #: calls no replica took within retry_timeout_s (503 + Retry-After)
        self.cut_waiting_for_replica = 0
        # Resolved (and replaced) each time a call sees a replica of this model fail: the calls still
        # waiting then get at most retry_timeout_s more (see _first_attempt).
        self._replica_failed: Optional[asyncio.Future] = None
        #: when (time.monotonic()) a call of this model last returned: /readyz's evidence that a deployment
        #: whose probe found no free replica is busy, not stuck (serve_app/readiness.py)
        self.last_answer_at: Optional[float] = None

    def _method(self, method: str) -> Any:
        if method not in self._methods:
            self._methods[method] = self._handle.options(method_name=method)
        return self._methods[method]

    async def call(self, method: str, *args: Any, retry_on_replica_death: bool = True,
                   after_replica_death: bool = False, **kwargs: Any) -> Any:
        self.quarantine.check(method, args)
        result = await self._call(method, args, kwargs, retry_on_replica_death, after_replica_death)
        self.last_answer_at = time.monotonic()
        self.quarantine.answered(method, args)
        return result

    async def _call(self, method: str, args: tuple, kwargs: dict, retry: bool, after_death: bool) -> Any:
        from ray.exceptions import ActorDiedError, ActorUnavailableError, RayActorError, RayTaskError
        from ray.serve.exceptions import BackPressureError, DeploymentUnavailableError, RequestCancelledError

        attempt = 0
        if after_death:  # the retry of a call whose replica died: it waits as one
            attempt, self.retried = 1, self.retried + 1
        while True:
            handle = self._method(method)
            response = handle.remote(*args, **kwargs)
            try:
                if attempt == 0:
                    return await self._first_attempt(response, handle)
                # A retry waits for a healthy or restarted replica, but not forever: past retry_timeout_s
                # the caller gets 503 + Retry-After instead of a hang. A replica that took it computes it.
                accepted = taken(response)
                try:
                    async with asyncio.timeout(self._retry_timeout_s):
                        if accepted is None:  # (a response that cannot tell: the whole call is bounded)
                            return await response
                        await asyncio.wait((accepted,))
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
            except RequestCancelledError:  # Serve cancelled the call, not our caller (who gets CancelledError)
                raise ModelUnavailable(
                    f"{self.name} call was cancelled by Serve; retry after {self._retry_after_s} s.",
                    retry_after_s=self._retry_after_s,
                ) from None
            except (ActorDiedError, ActorUnavailableError, RayActorError, RayTaskError) as exc:
                # A replica's teardown fails what it did not compute with ReplicaStopped: retried as after its death
                stopped = isinstance(getattr(exc, "cause", None), ReplicaStopped)
                if isinstance(exc, RayTaskError) and not (stopped or isinstance(exc, RayActorError)):  # (Ray raises
                    raise self._task_error(exc, method) from None  # an actor's death as RayTaskError(ActorDiedError))
                if not stopped:  # (a stop is no failure: the other calls it holds get ReplicaStopped themselves)
                    self._signal_replica_failure()
                    shared = not (retry or after_death)  # (its callers' records are counted by the coalescer)
                    if not shared and (crashed := self.quarantine.died(method, args)) is not None:
                        raise crashed from None
                    if not retry:
                        raise self._lost(method, attempt, exc) from None
                if attempt < self._retries:
                    attempt, self.retried = attempt + 1, self.retried + 1
                    logger.warning("%s replica %s during %s; retrying once: %s", self.name,
                                   "stopped" if stopped else "died", method, type(exc).__name__)
                    continue
                self.retries_failed += 1
                raise self._unavailable(stopped) from None

    def _unavailable(self, stopped: bool, error: type[ModelUnavailable] = ModelUnavailable) -> ModelUnavailable:
        """The 503 of a call whose replica died (or stopped) and that goes no further here."""
        return error(f"{self.name} replica {'stopped' if stopped else 'failed'} while serving the request; retry "
                     f"after {self._retry_after_s} s.", retry_after_s=self._retry_after_s)

    def _lost(self, method: str, attempt: int, exc: BaseException) -> ReplicaLost:
        """What a call whose caller asked for no retry gets when its replica died (logged like a retry)."""
        if attempt:
            self.retries_failed += 1
        logger.warning("%s replica died during %s; not retried here, %s: %s", self.name, method,
                       "it was a retry already" if attempt else "its caller sends what goes again", type(exc).__name__)
        return self._unavailable(False, ReplicaLost)

    def _task_error(self, exc: Any, method: str) -> ServeAppError:
        """What the caller gets for an exception the model's method raised (a RayTaskError's `cause`)."""
        if isinstance(exc.cause, ServeAppError):  # one of our errors (e.g. job_not_found): passed on
            return exc.cause
        logger.error("%s.%s raised %s; the replica's log has the traceback", self.name, method, describe_exception(exc))
        return InternalError(f"{self.name} failed on this request; the error has been logged.")

    def _signal_replica_failure(self) -> None:
        if self._replica_failed is not None and not self._replica_failed.done():
            self._replica_failed.set_result(None)
        self._replica_failed = None

    async def _first_attempt(self, response: Any, handle: Any) -> Any:
        """Await a call, bounding the two waits that are not computing: for a replica to take it,
        and after a replica of this model was seen failing.

        - Taken: a call that no replica has accepted after `retry_timeout_s`, while the router knows
          no running replica of the model, gets 503 + Retry-After instead of waiting in Serve's
          router. After a head restart in the middle of a downscale, Serve's recovering controller
          stopped every replica for ~17 s and calls waited there until clients gave up
          (tests/cluster). While the router knows replicas, a call waits for one to take it: a
          rolling update on two starved cores once held calls 5 s, with 4 Embedders known, and
          those must be answered (Serve's max_queued_requests and the request deadline bound it).
        - Failed: when a node is lost, Serve re-routes the calls that were on its replicas by itself
          (the caller sees no error), and on a CPU-starved cluster some were held 10+ s before the
          survivors answered them. So a call still waiting when another call through this client
          fails on a dead or unreachable replica waits at most `retry_timeout_s` more. That includes a call a
          healthy replica is computing: this client cannot tell it from one Serve holds to re-route, so a long
          call (a paragraph of many seconds) may get 503 + Retry-After when another replica of its model dies.
        Without a failure, calls that are merely slow once taken are never cut."""
        if self._replica_failed is None:
            self._replica_failed = asyncio.get_running_loop().create_future()
        failed = self._replica_failed
        call = asyncio.ensure_future(_resolve(response))
        accepted = taken(response)
        try:
            while accepted is not None and not accepted.done():
                done, _ = await asyncio.wait((call, failed, accepted), timeout=self._retry_timeout_s,
                                             return_when=asyncio.FIRST_COMPLETED)
                if done:
                    break
                known = replicas_known(handle)
                if not known:  # none running, or (None) a router this Ray version hides from us
                    self.cut_waiting_for_replica += 1
                    raise self._give_up(call, response, f"no replica took a call ({known} known) within",
                                        "has no replica free to take the request")
            if not call.done() and not failed.done():
                await asyncio.wait((call, failed), return_when=asyncio.FIRST_COMPLETED)
            if not call.done():
                await asyncio.wait((call,), timeout=self._retry_timeout_s)
            if call.done():
                return call.result()
        except asyncio.CancelledError:
            _discard(call)
            raise
        self.cut_after_replica_failure += 1
        raise self._give_up(call, response, "a call still waited, after a replica of it failed,",
                            "lost a replica while serving the request")

    def _give_up(self, call: asyncio.Future, response: Any, logged: str, told: str) -> ModelUnavailable:
        """Cancel a call cut short and return the 503 its caller gets."""
        _discard(call)
        response.cancel()
        logger.warning("%s: %s %g s; answered 503", self.name, logged, self._retry_timeout_s)
        return ModelUnavailable(f"{self.name} {told}; retry after {self._retry_after_s} s.",
                                retry_after_s=self._retry_after_s)

    async def deployment_status(self) -> tuple[str, str]:
        """(status, message) of this deployment as Serve's controller reports it."""
        from ray import serve

        app_name = serve.get_replica_context().app_name

        def ask() -> tuple[str, str]:
            app = serve.status().applications[app_name]
            deployment = app.deployments[self.name]
            return str(getattr(deployment.status, "value", deployment.status)), deployment.message or app.message

        return await asyncio.to_thread(ask)


async def _resolve(response: Any) -> Any:
    return await response


def _discard(task: asyncio.Future) -> None:
    """Cancel a call nobody awaits any more; Serve ends it with RequestCancelledError, which is
    retrieved here so that asyncio does not log "Task exception was never retrieved" for it."""
    task.cancel()
    task.add_done_callback(lambda done: done.cancelled() or done.exception())
