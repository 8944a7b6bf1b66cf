"""ASGI middleware: body limits, admission control, API keys, CORS, access log and metrics."""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import TYPE_CHECKING, Any, Callable, Optional, Sequence

from .admission import DRAIN, AdmissionControl, DrainState  # noqa: F401  (re-exported: one DRAIN per process)
from .auth import REQUEST_KEY_ID, KeySet
from .errors import (
    ERROR_TYPE_SCOPE_KEY, BodyTimeout, CorsRefused, Forbidden, PayloadTooLarge, Unauthorized, unexpected_error,
)
from .observability import route_path

if TYPE_CHECKING:  # pragma: no cover
    from .observability import RequestRecorder

#: routes that never need an API key (to GET or HEAD): probes, and the API's own description
OPEN_PATHS = ("/healthz", "/readyz", "/docs", "/docs/oauth2-redirect", "/redoc", "/openapi.json")
#: the methods that carry no body: BodySizeLimit reads none, and OPEN_PATHS answer them without a key
READ_METHODS = ("GET", "HEAD")


class BodySizeLimit:
    """Buffers at most `max_body_bytes` of a request body, for at most `body_timeout_s`; beyond that
    answers 413, or 408 `body_timeout`.

    Checks Content-Length up front and counts chunked bodies as they arrive, so a huge body costs at
    most the limit in memory. Admission has given the request its slot by now (the cheap refusal
    comes first), so a body that stalls would otherwise hold that slot without a bound.
    """

    def __init__(self, app, get_limit: Callable[[], int], get_timeout_s: Callable[[], float]):
        self.app = app
        self.get_limit = get_limit
        self.get_timeout_s = get_timeout_s

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["method"] in (*READ_METHODS, "OPTIONS") or route_path(scope) in OPEN_PATHS:
            return await self.app(scope, receive, send)  # no body to read (an open path takes none: 405 at once)
        limit = self.get_limit()
        for name, value in scope.get("headers", []):
            if name == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    declared = 0
                if declared > limit:
                    return await self._reject(scope, receive, send, limit)
        timeout_s = self.get_timeout_s()
        try:
            async with asyncio.timeout(timeout_s):
                payload = await self._read(receive, limit)
        except TimeoutError:
            error = BodyTimeout(f"The request's body did not arrive within {timeout_s:g} s.")
            return await error.to_response(scope)(scope, receive, send)
        if payload is None:  # the client went away mid-body: nobody to answer
            scope[ERROR_TYPE_SCOPE_KEY] = "client_disconnected"
            return
        if len(payload) > limit:
            return await self._reject(scope, receive, send, limit)
        sent = False

        async def replay():
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": payload, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    @staticmethod
    async def _read(receive, limit: int) -> Optional[bytes]:
        """The body; None if the client disconnected. Stops reading once past `limit` bytes (413 follows)."""
        chunks, size, more = [], 0, True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return None
            body = message.get("body", b"")
            size += len(body)
            chunks.append(body)
            if size > limit:
                break
            more = message.get("more_body", False)
        return b"".join(chunks)

    async def _reject(self, scope, receive, send, limit):
        response = PayloadTooLarge(f"Request body is larger than the limit of {limit} bytes.").to_response(scope)
        await response(scope, receive, send)


# --- authentication, CORS -----------------------------------------------------------------


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
    return KeySet.of(keys).identify(presented) is not None


#: Where ApiKeyAuth leaves the caller's identity, for the routes, the job store and admission
#: control: `request.state.api_key_id` (scope["state"]["api_key_id"]), the id of the API key the
#: request carried (serve_app.auth.key_id: a hash prefix, never the key), or None when no keys are
#: configured. Stable interface: the jobs routes scope jobs with it; do not rename.
API_KEY_ID_STATE = "api_key_id"


def api_key_id_of(scope) -> Optional[str]:
    """The id of the API key this request was authenticated with (None: keys are off)."""
    return (scope.get("state") or {}).get(API_KEY_ID_STATE)


class ApiKeyAuth:
    """API-key authentication: on while `keys()` (a serve_app.auth.KeySet) holds any key.

    401 (with `WWW-Authenticate: Bearer`) when no key is sent, 403 when the key is not
    one of the configured ones; GET and HEAD on OPEN_PATHS pass without a key (CORS preflights
    never get here: LazyCORS, outside, answers them). Any other method is refused before its body
    is read, so a keyless caller cannot hold a slot with a slow body.
    An admitted request carries its key's id in `request.state.api_key_id` and, for the
    response cache, in the context variable `serve_app.auth.REQUEST_KEY_ID`.
    """

    def __init__(self, app, keys: Callable[[], KeySet], open_paths: tuple[str, ...] = OPEN_PATHS):
        self.app = app
        self.keys = keys
        self.open_paths = open_paths

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        # A copy: a server may hand every request the same lifespan-state dict.
        scope["state"] = {**(scope.get("state") or {}), API_KEY_ID_STATE: None}
        keys = self.keys()
        presented = presented_key(scope) if keys else None
        # Open paths with a valid key still learn who calls (/readyz then shows details).
        ident = keys.identify(presented) if presented is not None else None
        if ident is not None or not keys or (route_path(scope) in self.open_paths and scope["method"] in READ_METHODS):
            return await self._call_as(ident, scope, receive, send)
        if presented is None:
            response = Unauthorized(
                "An API key is required: send `Authorization: Bearer <key>` or `X-API-Key: <key>`."
            ).to_response(scope)
            response.headers["WWW-Authenticate"] = 'Bearer realm="serve-app"'
            return await response(scope, receive, send)
        return await Forbidden("The API key is not valid.").to_response(scope)(scope, receive, send)

    async def _call_as(self, ident: Optional[str], scope, receive, send):
        scope["state"][API_KEY_ID_STATE] = ident
        token = REQUEST_KEY_ID.set(ident)
        try:
            await self.app(scope, receive, send)
        finally:
            REQUEST_KEY_ID.reset(token)


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
            self._built[origins] = _json_refusal_cors(
                self.app, allow_origins=list(origins), allow_methods=["GET", "POST", "DELETE"],
                # Any request header, for the allowed origins only: the OpenAI JavaScript SDK sends x-stainless-*
                # and others, and a preflight naming one header not listed was refused; the server ignores them.
                allow_headers=["*"],
                expose_headers=["X-Batch-Records", "X-Cache", "X-Request-ID", "Retry-After", "Location"], max_age=600,
            )
        await self._built[origins](scope, receive, send)


def _json_refusal_cors(app, **options):
    """Starlette's CORS middleware, whose refused preflight (400 `Disallowed CORS origin`) is plain text: here it is
    the taxonomy's JSON body, as every other error."""
    from starlette.middleware.cors import CORSMiddleware

    class JsonRefusalCORS(CORSMiddleware):
        def preflight_response(self, request_headers):
            response = super().preflight_response(request_headers)
            if response.status_code != 400:
                return response
            refused = CorsRefused(f"CORS preflight refused: {response.body.decode()} (ingress.cors_origins and "
                                  "the allowed methods and headers, docs/security.md).").to_response()
            refused.headers.update({k: v for k, v in response.headers.items()
                                    if k.lower() not in ("content-length", "content-type")})
            return refused

    return JsonRefusalCORS(app, **options)


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
        status = {"code": 500, "started": False}

        async def send_observed(message):
            if message["type"] == "http.response.start":
                status["code"], status["started"] = message["status"], True
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
        except Exception as exc:
            # Answered here, not re-raised: past the app, Serve would log the exception with its message.
            response = unexpected_error(scope, exc)
            if not status["started"]:  # else the client sees its response cut short
                await response(scope, receive, send_observed)
        finally:
            if not status["started"] and scope.get(ERROR_TYPE_SCOPE_KEY) == "client_disconnected":
                status["code"] = 499  # (also when the body stopped mid-way: BodySizeLimit answers nobody)
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
