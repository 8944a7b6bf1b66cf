"""When the client tries again: tenacity's retry loop with the service's own advice.

Retried: a 503 (the service said "not now": overloaded, shutting down, a model restarting) and a
transport error (connection refused or reset, a timeout); a job submission, which its Idempotency-Key makes
safe to send again, also after a 502 or 504. Not retried: anything else, which is an answer. Each wait is
the 503's `Retry-After` (seconds or an HTTP date; else `default_wait_s`), lengthened by up to `jitter` of it
at random so that clients turned away together do not return together, and capped by `max_retry_wait_s`
(at the cap, spread over its last `jitter`). A call stops after `max_retries` retries, or when its next wait
would pass `deadline_s` or the call's own `deadline_ms` (a 504 `timeout` then; both counted from the call's
start); each attempt's timeout is at most what remains.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass
from typing import Optional

import httpx
import tenacity

from .wire import RETRYABLE_STATUSES, ServeAppHTTPError, retry_after_s


@dataclass(frozen=True)
class RetryPolicy:
    max_retries: int = 3
    #: wait when a 503 carries no Retry-After, or after a connection error
    default_wait_s: float = 1.0
    #: never wait longer than this for one retry, whatever Retry-After says
    max_retry_wait_s: float = 10.0
    #: each wait is lengthened by up to this fraction of it, at random (still capped)
    jitter: float = 0.2
    #: the longest one call may take, its retries and their waits included (None: no bound)
    deadline_s: Optional[float] = 120.0

    #: first and largest wait between two polls of an unfinished job
    poll_interval_s: float = 0.2
    max_poll_interval_s: float = 2.0

    def wait_s(self, response: Optional[httpx.Response]) -> float:
        """The wait before retrying after `response` (None: a transport error)."""
        advised = retry_after_s(response.headers.get("Retry-After")) if response is not None else None
        wait, cap = (self.default_wait_s if advised is None else advised), self.max_retry_wait_s
        if wait >= cap:  # longer than this client waits: spread below the cap, so retries do not come together
            return random.uniform(cap * (1 - self.jitter), cap)
        return random.uniform(wait, min(wait * (1 + self.jitter), cap))  # never sooner than Retry-After

    def _wait(self, state: tenacity.RetryCallState) -> float:
        outcome = state.outcome
        return self.wait_s(None if outcome is None or outcome.failed else outcome.result())

    def _options(self, statuses: tuple[int, ...], deadline_ms: Optional[int]) -> dict:
        stop = tenacity.stop_after_attempt(self.max_retries + 1)
        if self.deadline_s is not None:
            stop = stop | tenacity.stop_before_delay(self.deadline_s)
        call_s = None if deadline_ms is None else deadline_ms / 1000
        if call_s is not None:  # no wait past the call's own deadline (it slept a whole Retry-After, then gave up)
            stop = stop | tenacity.stop_before_delay(call_s)

        def out_of_retries(state: tenacity.RetryCallState) -> httpx.Response:
            """The last response (the caller raises the service's error), or the last transport error, re-raised;
            a 504 `timeout` if the call's deadline_ms would pass before the next attempt."""
            if call_s is not None and state.seconds_since_start + state.upcoming_sleep >= call_s:
                raise ServeAppHTTPError(504, f"the call's deadline_ms={deadline_ms} would pass before it was "
                                        "answered (the service asked to wait longer)", "timeout")
            return state.outcome.result()

        return dict(
            stop=stop,
            wait=self._wait,
            retry=(tenacity.retry_if_exception_type(httpx.TransportError)
                   | tenacity.retry_if_result(lambda response: response.status_code in statuses)),
            retry_error_callback=out_of_retries,
        )

    def retrying(self, statuses: tuple[int, ...] = RETRYABLE_STATUSES,
                 deadline_ms: Optional[int] = None) -> tenacity.Retrying:
        """The retry loop of one call (`deadline_ms`: the caller's own deadline, from now)."""
        return tenacity.Retrying(**self._options(statuses, deadline_ms))

    def async_retrying(self, statuses: tuple[int, ...] = RETRYABLE_STATUSES,
                       deadline_ms: Optional[int] = None) -> tenacity.AsyncRetrying:
        return tenacity.AsyncRetrying(**self._options(statuses, deadline_ms))

    def attempt_timeout(self, timeout_s: float, started: float) -> float:
        """One attempt's timeout: `timeout_s`, or what remains of the deadline if less."""
        if self.deadline_s is None:
            return timeout_s
        return max(min(timeout_s, self.deadline_s - (time.monotonic() - started)), 0.001)
