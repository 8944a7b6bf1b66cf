"""ASGI middleware: body limits, admission control, API keys, CORS, access log and metrics."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import time
import uuid
from typing import TYPE_CHECKING, Any, Callable, Optional, Sequence

from .errors import ERROR_TYPE_SCOPE_KEY, Forbidden, Overloaded, PayloadTooLarge, ShuttingDown, Unauthorized

if TYPE_CHECKING:  # pragma: no cover
    from .observability import RequestRecorder


class BodySizeLimit:
    """Buffers at most `max_body_bytes` of a request body; beyond that answers 413.

    Checks Content-Length up front and counts chunked bodies as they arrive, so
    a huge body costs at most the limit in memory.
    """

    def __init__(self, app, get_limit: Callable[[], int]):
        self.app = app
        self.get_limit = get_limit

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["method"] in ("GET", "HEAD", "OPTIONS"):
            return await self.app(scope, receive, send)
        limit = self.get_limit()
        for name, value in scope.get("headers", []):
            if name == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    declared = 0
                if declared > limit:
                    return await self._reject(scope, receive, send, limit)
        chunks, size, more = [], 0, True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            body = message.get("body", b"")
            size += len(body)
            if size > limit:
                return await self._reject(scope, receive, send, limit)
            chunks.append(body)
            more = message.get("more_body", False)
        payload = b"".join(chunks)
        sent = False

        async def replay():
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": payload, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    async def _reject(self, scope, receive, send, limit):
        response = PayloadTooLarge(f"Request body is larger than the limit of {limit} bytes.").to_response(scope)
        await response(scope, receive, send)


class AdmissionControl:
    """Sheds load at the door: beyond `limit()` requests in flight on this ingress
    replica, a model route answers 503 + Retry-After at once (JSON body) instead of
    queueing toward a timeout. Admitted requests always run to completion.

    Ray's proxy would otherwise queue excess requests without bound, or (with
    `max_queued_requests` on the ingress) answer a plain-text 503 with no
    Retry-After; shedding here gives clients the project's error body.
    """

    def __init__(self, app, limit: Callable[[], int], retry_after_s: Callable[[], int],
                 paths: tuple[str, ...] = ("/translation", "/embeddings", "/v1/embeddings", "/jobs"),
                 prefixes: tuple[str, ...] = ("/models/",)):
        self.app = app
        self.limit = limit
        self.retry_after_s = retry_after_s
        self.paths = paths
        #: model routes with a variable part (`/models/<name>/predict`)
        self.prefixes = prefixes
        self.shed = 0

    @property
    def in_flight(self) -> int:
        return DRAIN.in_flight

    async def __call__(self, scope, receive, send):
        path = scope.get("path") or ""
        if scope["type"] != "http" or (path not in self.paths and not path.startswith(self.prefixes)):
            return await self.app(scope, receive, send)
        if DRAIN.draining:
            retry = self.retry_after_s()
            response = ShuttingDown(
                f"The service is shutting down; retry after {retry} s.", retry_after_s=retry
            ).to_response(scope)
            return await response(scope, receive, send)
        if DRAIN.in_flight >= self.limit():
            self.shed += 1
            retry = self.retry_after_s()
            response = Overloaded(
                f"The service is at capacity ({self.in_flight} requests in flight); retry after {retry} s.",
                retry_after_s=retry,
            ).to_response(scope)
            return await response(scope, receive, send)
        DRAIN.in_flight += 1
        try:
            await self.app(scope, receive, send)
        finally:
            DRAIN.in_flight -= 1


class DrainState:
    """Model requests in flight on this ingress replica, and whether it is draining.

    Module-level (not on the middleware instance) so that `Ingress.drain()` sees the
    same counter the middleware keeps: Serve pickles the app, but this module is
    imported, not copied, in the replica.
    """

    def __init__(self) -> None:
        self.in_flight = 0
        self.draining = False

    async def drain(self, timeout_s: float, poll_s: float = 0.05) -> dict:
        """Refuse new model requests (503 shutting_down) and wait for admitted ones to finish."""
        import asyncio
        import time

        self.draining = True
        start = time.monotonic()
        at_start = self.in_flight
        while self.in_flight > 0 and time.monotonic() - start < timeout_s:
            await asyncio.sleep(poll_s)
        return {"in_flight_at_start": at_start, "in_flight_left": self.in_flight,
                "waited_s": round(time.monotonic() - start, 3)}


DRAIN = DrainState()


# --- authentication, CORS -----------------------------------------------------------------

#: routes that never need an API key: probes, and the API's own description
OPEN_PATHS = ("/healthz", "/readyz", "/docs", "/docs/oauth2-redirect", "/redoc", "/openapi.json")


def _header(scope, name: bytes) -> Optional[str]:
    for key, value in scope.get("headers", []):
        if key.lower() == name:
            return value.decode("latin-1")
    return None


def presented_key(scope) -> Optional[str]:
    """The API key a request carries: `Authorization: Bearer <key>` or `X-API-Key: <key>`."""
    auth = _header(scope, b"authorization")
    if auth:
        scheme, _, credentials = auth.strip().partition(" ")
        if scheme.lower() == "bearer" and credentials.strip():
            return credentials.strip()
    key = _header(scope, b"x-api-key")
    return key.strip() if key and key.strip() else None


def key_matches(presented: str, keys: Sequence[str]) -> bool:
    """Constant-time: digests of equal length, compared against every key without stopping early."""
    digest = hashlib.sha256(presented.encode("utf-8", "surrogatepass")).digest()
    matched = False
    for key in keys:
        matched |= hmac.compare_digest(digest, hashlib.sha256(key.encode("utf-8")).digest())
    return matched


class ApiKeyAuth:
    """Optional API-key authentication: off while `keys()` is empty.

    401 (with `WWW-Authenticate: Bearer`) when no key is sent, 403 when the key is not
    one of the configured ones; OPEN_PATHS and CORS preflights pass without a key.
    """

    def __init__(self, app, keys: Callable[[], Sequence[str]], open_paths: tuple[str, ...] = OPEN_PATHS):
        self.app = app
        self.keys = keys
        self.open_paths = open_paths

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope.get("path") in self.open_paths or scope["method"] == "OPTIONS":
            return await self.app(scope, receive, send)
        keys = self.keys()
        if not keys:
            return await self.app(scope, receive, send)
        presented = presented_key(scope)
        if presented is None:
            response = Unauthorized(
                "An API key is required: send `Authorization: Bearer <key>` or `X-API-Key: <key>`."
            ).to_response(scope)
            response.headers["WWW-Authenticate"] = 'Bearer realm="serve-app"'
            return await response(scope, receive, send)
        if not key_matches(presented, keys):
            return await Forbidden("The API key is not valid.").to_response(scope)(scope, receive, send)
        await self.app(scope, receive, send)


class LazyCORS:
    """Starlette's CORSMiddleware with origins read from the settings at request time.

    The app object is built (and pickled into the replica) before its settings are known,
    so the real middleware is created on first use, once per distinct origin list. With
    no origins configured it adds nothing: browsers then refuse cross-origin calls.
    """

    def __init__(self, app, origins: Callable[[], Sequence[str]]):
        self.app = app
        self.origins = origins
        self._built: dict[tuple[str, ...], Any] = {}

    async def __call__(self, scope, receive, send):
        origins = tuple(self.origins())
        if scope["type"] != "http" or not origins:
            return await self.app(scope, receive, send)
        if origins not in self._built:
            from starlette.middleware.cors import CORSMiddleware

            self._built[origins] = CORSMiddleware(
                self.app, allow_origins=list(origins), allow_methods=["GET", "POST"],
                allow_headers=["Authorization", "Cache-Control", "Content-Type", "X-API-Key", "X-Request-Timeout-Ms"],
                expose_headers=["X-Batch-Records", "X-Cache", "X-Request-ID", "Retry-After"], max_age=600,
            )
        await self._built[origins](scope, receive, send)


# --- observability ------------------------------------------------------------------------

class RequestObserver:
    """Outermost middleware: one JSON access-log line and the ingress metrics per HTTP request.

    The request id is the one Serve's proxy assigned (`x-request-id`, also sent back to the
    client); the error type is what the error handlers recorded in the scope.
    """

    def __init__(self, app, recorder: "RequestRecorder", enabled: Callable[[], bool]):
        self.app = app
        self.recorder = recorder
        self.enabled = enabled

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        start = time.perf_counter()
        # Behind Serve's proxy the request carries the id the proxy assigned, and the proxy
        # adds it to the response itself; only a bare app (tests, plain uvicorn) adds it here.
        proxied = _header(scope, b"x-request-id") is not None
        request_id = request_id_of(scope)
        status = {"code": 500}

        async def send_observed(message):
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
                if not proxied:
                    message.setdefault("headers", []).append((b"x-request-id", request_id.encode("latin-1")))
            await send(message)

        try:
            await self.app(scope, receive, send_observed)
        except asyncio.CancelledError:
            # The client went away (Serve cancels the request): 499 as nginx logs it.
            status["code"] = 499
            scope.setdefault(ERROR_TYPE_SCOPE_KEY, "client_disconnected")
            raise
        except Exception:
            status["code"] = 500
            scope.setdefault(ERROR_TYPE_SCOPE_KEY, "internal_error")
            raise
        finally:
            self.recorder.record(
                scope, request_id=request_id, status=status["code"],
                seconds=time.perf_counter() - start, log=self.enabled(),
            )


def request_id_of(scope) -> str:
    """Serve's request id: the proxy puts it in the `x-request-id` request header."""
    rid = _header(scope, b"x-request-id")
    if rid:
        return rid
    try:
        from ray.serve.context import _get_serve_request_context

        rid = _get_serve_request_context().request_id
    except Exception:  # pragma: no cover - outside Serve
        rid = ""
    return rid or uuid.uuid4().hex
