"""The one error taxonomy of serve-app, mapped to HTTP statuses in one place.

Every error a client can see is a `ServeAppError` subclass; `install_error_handlers`
turns each into `{"error": "<human sentence>", "error_type": "<snake_case>"}` with
its status (and `Retry-After` where the client should come back later). Anything
else that escapes a route is logged with its traceback and answered as a 500
`internal_error` without leaking internals.
"""

from __future__ import annotations

import logging
from typing import Any, Optional

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from deployments.errors import describe_exception

logger = logging.getLogger("serve_app")

#: where an error response records its `error_type` in the ASGI scope, for the access log and metrics
ERROR_TYPE_SCOPE_KEY = "serve_app.error_type"


class ServeAppError(Exception):
    status_code: int = 500
    error_type: str = "internal_error"

    def __init__(self, message: str, *, retry_after_s: Optional[int] = None):
        super().__init__(message)
        self.message = message
        self.retry_after_s = retry_after_s

    def __reduce__(self):
        # Keep retry_after_s when the error crosses a Ray call (pickled by the deployment that
        # raised it, re-raised by the ingress with its status and Retry-After intact).
        return _rebuild_error, (type(self), self.message, self.retry_after_s)

    def to_response(self, scope: Optional[dict] = None) -> JSONResponse:
        """The JSON response; `scope` (the ASGI scope) records the error type for the access log."""
        if scope is not None:
            scope[ERROR_TYPE_SCOPE_KEY] = self.error_type
        headers = {}
        if self.retry_after_s is not None:
            headers["Retry-After"] = str(int(self.retry_after_s))
        # a message quoting the request (a field's name in a validation error) may hold a lone surrogate, which
        # JSON in UTF-8 cannot carry: written as \udc00, not a 500
        message = self.message.encode("utf-8", "backslashreplace").decode("utf-8")
        return JSONResponse(
            status_code=self.status_code,
            content={"error": message, "error_type": self.error_type},
            headers=headers,
        )


def _rebuild_error(cls: type, message: str, retry_after_s: Optional[int]) -> "ServeAppError":
    return cls(message, retry_after_s=retry_after_s)


class InvalidRequest(ServeAppError):
    """The body is not what the schema says (422)."""

    status_code = 422
    error_type = "invalid_request"


class BodyTimeout(ServeAppError):
    """The request's body did not arrive within ingress.body_timeout_s."""

    status_code = 408
    error_type = "body_timeout"


class CorsRefused(ServeAppError):
    """A browser's CORS preflight from an origin, with a method or headers, that ingress.cors_origins does not allow."""

    status_code = 400
    error_type = "cors_refused"


class UnsupportedLanguagePair(ServeAppError):
    status_code = 400
    error_type = "unsupported_language_pair"


class UnsupportedModel(ServeAppError):
    status_code = 400
    error_type = "unsupported_model"


class PayloadTooLarge(ServeAppError):
    status_code = 413
    error_type = "payload_too_large"


class Unauthorized(ServeAppError):
    """No API key was sent while the service requires one (401)."""

    status_code = 401
    error_type = "unauthorized"


class Forbidden(ServeAppError):
    """An API key was sent but it is not one of the configured keys (403)."""

    status_code = 403
    error_type = "forbidden"


class NotFound(ServeAppError):
    status_code = 404
    error_type = "not_found"


class ModelNotFound(ServeAppError):
    """`/models/<name>/predict` names no registered model (404)."""

    status_code = 404
    error_type = "model_not_found"


class MethodNotAllowed(ServeAppError):
    status_code = 405
    error_type = "method_not_allowed"


class Overloaded(ServeAppError):
    """Queues are full; the client should retry after Retry-After seconds (503)."""

    status_code = 503
    error_type = "overloaded"


class ModelUnavailable(ServeAppError):
    """No healthy replica of a model could answer (503)."""

    status_code = 503
    error_type = "model_unavailable"


class ReplicaLost(ModelUnavailable):
    """The replica computing a call died and the call was not sent again, as its caller asked
    (serve_app/handle_client.py): the CallCoalescer, which then sends each request's records of a
    shared call alone. A client sees the 503 `model_unavailable` of any lost replica."""


class ModelCrashed(ServeAppError):
    """Records whose calls lost several replicas: taken to crash the model (a segfault, out of memory), they are
    refused for `ingress.crash_quarantine_s` rather than take more replicas down (serve_app/crash_quarantine.py);
    a job holding them fails."""

    status_code = 500
    error_type = "model_crashed"


class ShuttingDown(ServeAppError):
    """The ingress is draining before a stop; another replica (or a restart) will answer."""

    status_code = 503
    error_type = "shutting_down"


class NotReady(ServeAppError):
    status_code = 503
    error_type = "not_ready"


class RequestTimeout(ServeAppError):
    status_code = 504
    error_type = "timeout"


class InternalError(ServeAppError):
    status_code = 500
    error_type = "internal_error"


def describe_validation_errors(errors: list[dict[str, Any]]) -> str:
    parts = []
    for err in errors[:5]:
        if err.get("type") == "json_invalid":  # its loc is the character offset alone
            position = err.get("loc", ("", ""))[-1]
            parts.append(f"the body is not valid JSON ({(err.get('ctx') or {}).get('error', 'invalid')} at "
                         f"character {position})")
            continue
        loc = [str(p) for p in err.get("loc", ()) if p not in ("body",)]
        where = ".".join(loc) if loc else "body"
        parts.append(f"{where}: {err.get('msg', 'invalid')}")
    more = f" (and {len(errors) - 5} more)" if len(errors) > 5 else ""
    return "Invalid request: " + "; ".join(parts) + more


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(ServeAppError)
    async def _serve_app_error(request: Request, exc: ServeAppError) -> JSONResponse:
        return exc.to_response(request.scope)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = list(exc.errors())
        media_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
        if any(tuple(e.get("loc", ())) == ("body",) for e in errors) and not (
                media_type == "application/json" or media_type.endswith("+json")):
            # FastAPI reads a body as JSON only when it says so; its own message said the object was no object
            return InvalidRequest(
                f"Invalid request: the body must be JSON sent with Content-Type: application/json (got "
                f"{media_type or 'no Content-Type'!r}).").to_response(request.scope)
        return InvalidRequest(describe_validation_errors(errors)).to_response(request.scope)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        if exc.status_code == 404:
            return NotFound("No such route.").to_response(request.scope)
        if exc.status_code == 400:
            # FastAPI's own 400 is a body it could not decode (e.g. invalid UTF-8).
            return InvalidRequest(f"Invalid request body: {exc.detail}").to_response(request.scope)
        if exc.status_code == 405:
            response = MethodNotAllowed("Method not allowed on this route.").to_response(request.scope)
            response.headers.update(exc.headers or {})  # Allow: the route's methods (RFC 9110)
            return response
        err = ServeAppError(str(exc.detail))
        err.status_code = exc.status_code
        err.error_type = "http_error"
        return err.to_response(request.scope)

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        return unexpected_error(request.scope, exc)


def unexpected_error(scope: dict, exc: BaseException) -> JSONResponse:
    """An error no handler maps: logged without its message (it may quote the request), answered 500.

    The ingress's outermost middleware answers with it too (middleware.RequestObserver): Starlette's
    handler for `Exception` re-raises after answering, and Serve then logs the exception with its message."""
    logger.error("unhandled error on %s %s: %s", scope.get("method"), scope.get("path"), describe_exception(exc))
    return InternalError("Internal error; it has been logged.").to_response(scope)
