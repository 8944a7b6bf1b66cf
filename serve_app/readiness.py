"""`GET /readyz`: is every model (and the job store) ready, and if not, why not."""

from __future__ import annotations

import asyncio
import logging
import re
import time
from typing import Optional

from .coalescing import shared_task
from .errors import Overloaded, ServeAppError
from .model_clients import ModelClient

logger = logging.getLogger("serve_app")

#: Serve's deployment states once its replicas have been constructed (their models loaded and warmed up) and
#: pass their health checks: autoscaling, which saturation starts, moves HEALTHY to UPSCALING.
SERVING = frozenset({"HEALTHY", "UPSCALING", "DOWNSCALING"})
#: ... and a call of it returned within this many seconds: busy, not stuck (a hung model thread fails
#: its health check only after minutes; dead replicas, after a health-check period)
BUSY_EVIDENCE_S = 30.0


class Readiness:
    """Probes each deployment with its `ready` call, within `timeout_s` (ingress.readiness_timeout_s)."""

    def __init__(self, timeout_s: float):
        self.timeout_s = timeout_s
        self._reported_failures: set[tuple] = set()
        self._probing: Optional[asyncio.Future] = None
        #: (time.monotonic() when it was known, the states) of the last probe that completed
        self._last: Optional[tuple[float, dict[str, str]]] = None

    async def states(self, clients: list[ModelClient]) -> dict[str, str]:
        """Each model deployment's state: `ready`, or why not. /readyz needs no key, so a flood of it must
        cost neither calls nor connections: a caller that finds no probe running starts one and waits for it;
        callers while one runs share it, and get the last probe's answer at once if that probe began at most two
        probes' longest time (2 x 2 x timeout_s) + 1 s ago. Else a probe of busy models (up to 2 x timeout_s)
        held each caller's connection, and keyless callers could fill every slot HAProxy gives an Ingress
        replica (serve_app/proxy_shedding.py)."""
        if self._probing is None or self._probing.done():
            began = time.monotonic()  # (what it finds is as old as its start: a deployment may answer at once)
            self._probing = shared_task(self._states(clients))  # no caller's: one leaving must not cancel it
            self._probing.add_done_callback(lambda probe: self._keep(probe, began))
        elif self._last is not None and time.monotonic() - self._last[0] <= 4 * self.timeout_s + 1.0:
            return dict(self._last[1])
        return dict(await asyncio.shield(self._probing))

    def _keep(self, probe: asyncio.Future, began: float) -> None:
        if not probe.cancelled() and probe.exception() is None:
            self._last = (began, probe.result())

    async def _states(self, clients: list[ModelClient]) -> dict[str, str]:
        """Each model deployment's state, probed.

        A deployment that no replica answers for is asked about at Serve's controller: when
        Serve gave up on it (DEPLOY_FAILED after repeated constructor failures, e.g. missing
        weights), the state is `failed: <Serve's message>` instead of a silent `loading`. When
        the controller reports it serving (HEALTHY or autoscaling: replicas constructed, models
        loaded and warmed up, health checks passing) and its calls are being answered, the probe
        only waited behind real work: the state is `ready (busy: ...)`, so a saturated service is
        not also taken out of rotation."""
        async def probe(client: ModelClient) -> str:
            try:
                async with asyncio.timeout(self.timeout_s):
                    await client.call("ready")
                return "ready"
            except TimeoutError:
                return await self._unanswered(client, "no replica answered in time",
                                              "loading (no replica answered in time)")
            except Overloaded as exc:  # Serve's queue for the deployment is full
                return await self._unanswered(client, "its queue is full", f"unavailable: {exc.message}")
            except ServeAppError as exc:
                failure = await self._deployment_failure(client)
                return f"failed: {failure}" if failure else f"unavailable: {exc.message}"

        states = await asyncio.gather(*(probe(c) for c in clients))
        return {c.name: s for c, s in zip(clients, states)}

    async def _unanswered(self, client: ModelClient, busy: str, otherwise: str) -> str:
        """The state of a deployment whose `ready` call found no free replica (`busy` says how)."""
        state, failure = await self._controller_state(client)
        if failure:
            return f"failed: {failure}"
        answered = getattr(client, "last_answer_at", None)
        if state in SERVING and answered is not None and time.monotonic() - answered <= BUSY_EVIDENCE_S:
            return f"ready (busy: {busy}; Serve reports it {state}, and its calls are answered)"
        return otherwise

    async def _deployment_failure(self, client: ModelClient) -> Optional[str]:
        return (await self._controller_state(client))[1]

    async def _controller_state(self, client: ModelClient) -> tuple[Optional[str], Optional[str]]:
        """(Serve's status of the deployment, or None; why it failed, or None)."""
        status = getattr(client, "deployment_status", None)
        if status is None:
            return None, None
        try:
            async with asyncio.timeout(self.timeout_s):
                state, message = await status()
        except Exception:  # the controller is busy or unreachable: say nothing rather than guess
            return None, None
        if state in ("DEPLOY_FAILED", "UNHEALTHY"):
            message = summarise_failure(message)
            key = (client.name, state, message)
            if key not in self._reported_failures:  # once per distinct failure, not per probe
                self._reported_failures.add(key)
                logger.error("/readyz: deployment %s is %s: %s", client.name, state, message)
            return state, f"{state}: {message}"[:2000]
        return state, None


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
