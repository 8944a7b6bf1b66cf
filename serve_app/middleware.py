"""ASGI middleware: reject oversized bodies with 413 before anything parses them."""

from __future__ import annotations

from typing import Callable

from .errors import PayloadTooLarge


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
