"""The model side's errors, and how any exception is described for a log.

Models raise plain exceptions (backends: `BackendError`, `ModelLoadError` in backends/base.py;
a user's module: whatever it raises); the ingress (serve_app/errors.py) maps what reaches it to
HTTP statuses. Both sides log exceptions through `describe_exception`, which never quotes an
exception's message: model code may put the request's texts in it.
"""

from __future__ import annotations

import traceback
from concurrent.futures import Future, InvalidStateError


class ModelContractError(RuntimeError):
    """A user's `predict` broke its contract (wrong number or shape of outputs)."""


class ReplicaStopped(RuntimeError):
    """The replica is stopping (its teardown ran: ModelReplica._shut_down): a call it refused, or one still waiting for
    the continuous decoder, was never computed. The ingress tries another replica once, as after a replica's death,
    then answers 503 + Retry-After (serve_app/handle_client.py)."""


def deliverable(exc: BaseException) -> BaseException:
    """`exc` as a caller's future may carry it. asyncio refuses StopIteration on a future (a TypeError in
    a callback: the caller would wait until its deadline), and a SystemExit or KeyboardInterrupt set there
    would stop the replica's event loop; those reach the caller as a RuntimeError caused by them."""
    if isinstance(exc, Exception) and not isinstance(exc, StopIteration):
        return exc
    wrapped = RuntimeError(f"the model raised {type(exc).__name__}")
    wrapped.__cause__ = exc
    return wrapped


def settle(future: Future, outcome) -> None:
    """Set a call's result, or its exception (`outcome` one, made deliverable), unless its caller cancelled it."""
    try:
        if isinstance(outcome, BaseException):
            future.set_exception(deliverable(outcome))
        else:
            future.set_result(outcome)
    except InvalidStateError:  # cancelled by its caller between the check and now
        pass


def describe_exception(exc: BaseException) -> str:
    """An exception for the log without its message: its class and, where Python still has it,
    where it was raised. Messages of model code may quote the request's texts (`KeyError: '<text>'`),
    which must not reach the logs; the class and line are enough to find the bug."""
    tb = exc.__traceback__
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:  # a TaskGroup's: its first failure
        exc = exc.exceptions[0]
        tb = exc.__traceback__ or tb
    cause = getattr(exc, "cause", None)  # a RayTaskError: the remote exception's class
    name = type(cause).__name__ if isinstance(cause, BaseException) else type(exc).__name__
    frames = traceback.extract_tb(tb)[-3:] if tb else []
    where = "; ".join(f"{f.filename}:{f.lineno} in {f.name}" for f in frames)
    return f"{name} (message withheld: it may quote the request)" + (f" at {where}" if where else "")
