"""`GET /readyz`: is every model (and the job store) ready, and if not, why not."""

from __future__ import annotations

import asyncio
import logging
import re
from typing import Optional

from .errors import ServeAppError
from .model_clients import ModelClient

logger = logging.getLogger("serve_app")


class Readiness:
    """Probes each deployment with its `ready` call, within `timeout_s` (ingress.readiness_timeout_s)."""

    def __init__(self, timeout_s: float):
        self.timeout_s = timeout_s
        self._reported_failures: set[tuple] = set()
        self._probing: Optional[asyncio.Future] = None

    async def states(self, clients: list[ModelClient]) -> dict[str, str]:
        """Each model deployment's state: `ready`, or why not. Callers at the same time share one probe:
        /readyz needs no key, and a flood of it costs one call per deployment at a time, not one per request."""
        if self._probing is None or self._probing.done():
            self._probing = asyncio.ensure_future(self._states(clients))
        return await asyncio.shield(self._probing)

    async def _states(self, clients: list[ModelClient]) -> dict[str, str]:
        """Each model deployment's state, probed.

        A deployment that no replica answers for is asked about at Serve's controller: when
        Serve gave up on it (DEPLOY_FAILED after repeated constructor failures, e.g. missing
        weights), the state is `failed: <Serve's message>` instead of a silent `loading`."""
        async def probe(client: ModelClient) -> str:
            try:
                async with asyncio.timeout(self.timeout_s):
                    await client.call("ready")
                return "ready"
            except TimeoutError:
                failure = await self._deployment_failure(client)
                return f"failed: {failure}" if failure else "loading (no replica answered in time)"
            except ServeAppError as exc:
                failure = await self._deployment_failure(client)
                return f"failed: {failure}" if failure else f"unavailable: {exc.message}"

        states = await asyncio.gather(*(probe(c) for c in clients))
        return {c.name: s for c, s in zip(clients, states)}

    async def _deployment_failure(self, client: ModelClient) -> Optional[str]:
        status = getattr(client, "deployment_status", None)
        if status is None:
            return None
        try:
            async with asyncio.timeout(self.timeout_s):
                state, message = await status()
        except Exception:  # the controller is busy or unreachable: say nothing rather than guess
            return None
        if state in ("DEPLOY_FAILED", "UNHEALTHY"):
            message = summarise_failure(message)
            key = (client.name, state, message)
            if key not in self._reported_failures:  # once per distinct failure, not per probe
                self._reported_failures.add(key)
                logger.error("/readyz: deployment %s is %s: %s", client.name, state, message)
            return f"{state}: {message}"[:2000]
        return None


_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_EXCEPTION_LINE = re.compile(r"^\s*([\w.]*(?:Error|Exception|Exit)\w*): (.+)$")


def summarise_failure(message: str) -> str:
    """Serve's DEPLOY_FAILED message is a sentence plus a remote traceback; keep the sentence
    and the exception it ends with (`ModelLoadError: model folder '/models/x' does not exist`)."""
    text = _ANSI.sub("", message or "")
    lines = text.splitlines()
    headline = lines[0].strip() if lines else ""
    headline = headline.split(" See controller logs")[0].removesuffix(" Error:").strip()
    cause = ""
    for line in reversed(lines):
        m = _EXCEPTION_LINE.match(line)
        if m:
            cause = f"{m.group(1).rsplit('.', 1)[-1]}: {m.group(2).strip()}"
            break
    return f"{headline} Cause: {cause}" if cause else headline or text[:500]
