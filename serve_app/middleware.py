"""ASGI middleware: reject oversized bodies with 413 before anything parses them."""

from __future__ import annotations

from typing import Callable

from .errors import Overloaded, PayloadTooLarge


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
        response = PayloadTooLarge(f"Request body is larger than the limit of {limit} bytes.").to_response()
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
                 paths: tuple[str, ...] = ("/translation", "/embeddings", "/v1/embeddings")):
        self.app = app
        self.limit = limit
        self.retry_after_s = retry_after_s
        self.paths = paths
        self.in_flight = 0
        self.shed = 0

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope.get("path") not in self.paths:
            return await self.app(scope, receive, send)
        if self.in_flight >= self.limit():
            self.shed += 1
            retry = self.retry_after_s()
            response = Overloaded(
                f"The service is at capacity ({self.in_flight} requests in flight); retry after {retry} s.",
                retry_after_s=retry,
            ).to_response()
            return await response(scope, receive, send)
        self.in_flight += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.in_flight -= 1
