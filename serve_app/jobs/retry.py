"""What a running job waits out instead of failing: the job store restarting, and a model that
answers 503 for a while (a replica or node lost, every replica busy). Both through tenacity. Not records that
crash the model: their chunk fails its job (ModelCrashed)."""

from __future__ import annotations

import logging
from typing import Awaitable, Callable, TypeVar

import tenacity

from ..errors import ModelCrashed, ServeAppError
from .settings import JobSettings

logger = logging.getLogger("ray.serve")
T = TypeVar("T")

#: how long a running job retries a store call (Redis restarting) before it leaves the job to resume
STORE_RETRY_S = 120.0


def transient(exc: BaseException) -> bool:
    """A model error a job waits out: a 503 that says when to come back (Overloaded, ModelUnavailable)."""
    return isinstance(exc, ServeAppError) and exc.status_code == 503 and exc.retry_after_s is not None


def _outage(exc: BaseException) -> bool:
    """A store call's error to wait out: any but a cancellation and the store's own answer (a ServeAppError)."""
    return isinstance(exc, Exception) and not isinstance(exc, ServeAppError)


class StoreUnreachable(Exception):
    """A running job's store call still failed after STORE_RETRY_S: the job is left as stored
    (queued or running), for the runner's maintenance sweep to run again; never the job's failure."""


async def store_write(call: Callable[[], Awaitable[T]]) -> T:
    """A store call (read or write) of a running job: retried on any error while the store restarts
    (up to STORE_RETRY_S), then raised as `StoreUnreachable`; except the store's answer that the job
    passed a bound (a ServeAppError: the job's own failure), raised at once."""
    try:
        return await _retrying(call, tenacity.retry_if_exception(_outage),
                               STORE_RETRY_S, tenacity.wait_exponential(multiplier=0.25, max=5.0),
                               "job store call failed")
    except ServeAppError:
        raise
    except Exception as exc:
        raise StoreUnreachable(_name(exc)) from exc


async def model_call(call: Callable[[], Awaitable[T]], jobs: JobSettings, records: tuple[int, int]) -> T:
    """A chunk's model call (of `records`, start and stop): retried while the model answers a transient 503, up to
    jobs.model_retry_s; any other error is raised at once. Records that crash the model are one: at the third
    replica lost to them, ModelCrashed (serve_app/crash_quarantine.py), which names them here."""
    try:
        return await _retrying(call, tenacity.retry_if_exception(transient), jobs.model_retry_s,
                               tenacity.wait_exponential(multiplier=0.5, max=5.0), "job chunk's model call failed")
    except ModelCrashed as exc:
        raise ModelCrashed(f"{exc.message} (The job's records {records[0]}-{records[1] - 1}.)") from None


async def _retrying(call: Callable[[], Awaitable[T]], retry: tenacity.retry_base, seconds: float,
                    wait: tenacity.wait.wait_base, what: str) -> T:
    retrying = tenacity.AsyncRetrying(
        retry=retry, stop=tenacity.stop_after_delay(seconds), wait=wait, reraise=True,
        before_sleep=lambda state: logger.warning(
            "%s (%s); retrying in %.1f s", what, _name(state.outcome.exception()), state.next_action.sleep))

    async def attempt() -> T:  # a coroutine function: tenacity awaits only those
        return await call()

    return await retrying(attempt)


def _name(exc: BaseException) -> str:
    return exc.error_type if isinstance(exc, ServeAppError) else type(exc).__name__
