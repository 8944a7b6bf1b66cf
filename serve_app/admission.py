"""Admission control at the ingress: a bound on model requests in flight, shared fairly between API keys.

`AdmissionControl` answers 503 + Retry-After, before the body is read, when this ingress replica
already holds `limit()` model requests and its waiting room (`max_waiting()` requests, each for at
most `max_wait_s()`) is full, and, with several API keys configured, at once when the request's key
already holds its fair share of them: a client flooding the service with one key is shed while other
keys' requests still get in. A request in the waiting room takes the next slot that frees, oldest
first, so clients that ignore Retry-After wait for capacity instead of spending it on refusals.
`DRAIN` counts the admitted requests and refuses new ones while the replica stops.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Callable, Optional

from .errors import Overloaded, ShuttingDown
from .observability import SHED_SCOPE_KEY, route_path


class DrainState:
    """Model requests in flight on this ingress replica, and whether it is draining.

    Module-level (not on the middleware instance) so that `Ingress._drain()` sees the
    same counter the middleware keeps: Serve pickles the app, but this module is
    imported, not copied, in the replica.
    """

    def __init__(self) -> None:
        self.in_flight = 0
        self.draining = False
        #: requests waiting for a slot, oldest first: each future is handed a slot (True) or a refusal (False)
        self.waiting: deque[asyncio.Future] = deque()

    def release(self) -> None:
        """An admitted request finished: its slot goes to the oldest live waiter (in_flight stays), else
        back to the pool. A draining replica refuses its waiters here too: `drain` runs on another thread,
        and its refusal reaches the loop after the flag (or missed a waiter that came in between)."""
        if self.draining:
            self._refuse_waiting()
        while self.waiting:
            waiter = self.waiting.popleft()
            if not waiter.done():
                waiter.set_result(True)
                return
        self.in_flight -= 1

    def leave(self, waiter: asyncio.Future) -> None:
        """A waiter that gave up leaves the waiting room at once (else its place counts until a release)."""
        try:
            self.waiting.remove(waiter)
        except ValueError:
            pass  # release() or drain() took it out already

    def _refuse_waiting(self) -> None:
        while self.waiting:
            waiter = self.waiting.popleft()
            if not waiter.done():
                waiter.set_result(False)

    async def drain(self, timeout_s: float, poll_s: float = 0.05) -> dict:
        """Refuse new model requests (503 shutting_down) and wait for admitted ones to finish."""
        import asyncio
        import time

        self.draining = True
        try:  # the waiting room is refused at once (503 shutting_down), on the waiters' own loop: the
            # launcher's drain runs this on a thread of its own (drain_signal.py)
            self.waiting[0].get_loop().call_soon_threadsafe(self._refuse_waiting)
        except IndexError:
            pass  # nobody waits
        start = time.monotonic()
        at_start = self.in_flight
        while self.in_flight > 0 and time.monotonic() - start < timeout_s:
            await asyncio.sleep(poll_s)
        return {"in_flight_at_start": at_start, "in_flight_left": self.in_flight,
                "waited_s": round(time.monotonic() - start, 3)}


DRAIN = DrainState()

#: The routes admission control governs (model work): these exact paths, and `<prefix><name>/predict` under
#: these prefixes (not a model's card, `GET /models/<id>`). serve_app/proxy_shedding.py gives HAProxy the same.
MODEL_PATHS = ("/translation", "/embeddings", "/v1/embeddings", "/jobs")
MODEL_PATH_PREFIXES = ("/models/",)
MODEL_PATH_SUFFIX = "/predict"


def fair_share(limit: int, active_keys: int, configured_keys: int) -> int:
    """Slots one key may hold: `limit` split between the keys with requests in flight (the
    requesting one counted) plus one more, so that a key that is not in flight yet always finds
    room; never more parts than there are keys that could come, and at least one slot.

    One key flooding alone (of 2+ configured) holds half the slots; when a second key arrives it
    is admitted at once, and the first key's new requests are shed until it is back under its
    share (admitted requests always finish). With one configured key there is no one to share
    with: the whole limit."""
    if configured_keys <= 1:
        return limit
    return max(1, limit // min(active_keys + 1, configured_keys))


def _hold(held: dict[str, int], key: Optional[str]) -> None:
    """One more of what `held` counts for `key` (None: no key, nothing counted)."""
    if key is not None:
        held[key] = held.get(key, 0) + 1


def _release(held: dict[str, int], key: Optional[str]) -> None:
    """One fewer; a key holding none is not listed."""
    if key is not None:
        if left := held[key] - 1:
            held[key] = left
        else:
            del held[key]


class AdmissionControl:
    """Sheds load at the door: beyond `limit()` requests in flight on this ingress
    replica a model request waits in the waiting room (`max_waiting()`, up to `max_wait_s()`),
    beyond that, or beyond its API key's `fair_share` of either, it is answered 503 +
    Retry-After at once (JSON body) instead of queueing toward a timeout. Admitted requests
    always run to completion. Keyed requests wait too (within their key's share of the room):
    HAProxy sends each replica what it holds, waiting room included (proxy_shedding.py).

    Ray's proxy would otherwise queue excess requests without bound, or (with
    `max_queued_requests` on the ingress) answer a plain-text 503 with no
    Retry-After; shedding here gives clients the project's error body.

    The key is the one ApiKeyAuth (the next middleware out) identified: `key_of(scope)`;
    None (no keys configured) is not shared out.
    """

    def __init__(self, app, limit: Callable[[], int], retry_after_s: Callable[[], int],
                 paths: tuple[str, ...] = MODEL_PATHS,
                 prefixes: tuple[str, ...] = MODEL_PATH_PREFIXES,
                 key_of: Callable[[dict], Optional[str]] = lambda scope: None,
                 configured_keys: Callable[[], int] = lambda: 0,
                 max_waiting: Callable[[], int] = lambda: 0, max_wait_s: Callable[[], float] = lambda: 0.0):
        self.app = app
        self.limit = limit
        self.retry_after_s = retry_after_s
        self.paths = paths
        #: model routes with a variable part (`<prefix><name>/predict`)
        self.prefixes = prefixes
        self.key_of = key_of
        self.configured_keys = configured_keys
        self.max_waiting = max_waiting
        self.max_wait_s = max_wait_s
        #: key id -> its requests in flight here, and in the waiting room (keys with none are not listed)
        self.per_key: dict[str, int] = {}
        self.waiting_per_key: dict[str, int] = {}
        self.shed = 0
        #: of `shed`, those refused for their key's share while the replica had room
        self.shed_fair_share = 0

    @property
    def in_flight(self) -> int:
        return DRAIN.in_flight

    async def __call__(self, scope, receive, send):
        path = route_path(scope) if scope["type"] == "http" else ""
        # A CORS preflight (OPTIONS) costs no model time: it neither takes nor waits for a slot.
        if scope["type"] != "http" or scope.get("method") == "OPTIONS" or (
                path not in self.paths and not (path.startswith(self.prefixes) and path.endswith(MODEL_PATH_SUFFIX))):
            return await self.app(scope, receive, send)
        retry = self.retry_after_s()
        if DRAIN.draining:
            return await self._refuse(scope, receive, send, retry)
        limit = self.limit()
        key = self.key_of(scope)
        full = DRAIN.in_flight >= limit or bool(DRAIN.waiting)
        # A key past its share of the slots, or (full: it would wait) of the waiting room, is shed at once; other keys
        # still get in. A waiter handed a slot is admitted whatever its key holds: the room shares the turns.
        room = self.max_waiting()
        if key is not None and (self._over_share(self.waiting_per_key, key, room) if full and room
                                else not full and self._over_share(self.per_key, key, limit)):
            self.shed_fair_share += 1
            self.shed += 1
            scope[SHED_SCOPE_KEY] = "fair_share"
            message = (f"This API key holds its share of the service's capacity; retry after {retry} s "
                       "(other keys' requests are still admitted).")
            return await Overloaded(message, retry_after_s=retry).to_response(scope)(scope, receive, send)
        if full and not await self._wait_for_slot(key):
            self.shed += not DRAIN.draining  # a drain that began while it waited is not a shed
            return await self._refuse(scope, receive, send, retry)
        if not full:  # a waiter was handed its slot by the request that finished
            DRAIN.in_flight += 1
        _hold(self.per_key, key)
        try:
            await self.app(scope, receive, send)
        finally:
            DRAIN.release()
            _release(self.per_key, key)

    def _over_share(self, held: dict[str, int], key: str, limit: int) -> bool:
        """Whether `key` holds its fair share of `limit` (`held`: what each key holds of it) or more."""
        return held.get(key, 0) >= fair_share(limit, len(held) + (key not in held), self.configured_keys())

    async def _wait_for_slot(self, key: Optional[str]) -> bool:
        """The replica is full: whether a slot came within max_wait_s (False at once when the waiting
        room is full too; False when the wait ran out, or the replica began to drain)."""
        if len(DRAIN.waiting) >= self.max_waiting():
            return False
        waiter = asyncio.get_running_loop().create_future()
        DRAIN.waiting.append(waiter)
        _hold(self.waiting_per_key, key)
        try:
            return await self._waited(waiter)
        finally:
            _release(self.waiting_per_key, key)

    async def _waited(self, waiter: asyncio.Future) -> bool:
        try:
            await asyncio.wait_for(asyncio.shield(waiter), self.max_wait_s())
        except asyncio.TimeoutError:
            pass
        except BaseException:  # the request's task was cancelled (client gone, shutdown)
            if not waiter.cancel() and waiter.result():
                DRAIN.release()  # it had just been handed a slot: pass it on
            DRAIN.leave(waiter)
            raise
        if waiter.cancel():  # the wait ran out: its place goes to the next request
            DRAIN.leave(waiter)
            return False
        return waiter.result()

    async def _refuse(self, scope, receive, send, retry: int):
        """503 shutting_down while the replica drains, else 503 overloaded; both with Retry-After."""
        scope[SHED_SCOPE_KEY] = "draining" if DRAIN.draining else "capacity"
        if DRAIN.draining:
            error = ShuttingDown(f"The service is shutting down; retry after {retry} s.", retry_after_s=retry)
        else:
            error = Overloaded(f"The service is at capacity ({self.in_flight} requests in flight, "
                               f"{len(DRAIN.waiting)} waiting); retry after {retry} s.", retry_after_s=retry)
        return await error.to_response(scope)(scope, receive, send)
