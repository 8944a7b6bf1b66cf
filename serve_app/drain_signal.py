"""The `make run` launcher's stop, told to every Ingress replica at once.

A handle call reaches the one replica that Serve's router picks, and under load the router prefers a
replica that has already drained (it has nothing in flight): drain calls sent through a handle reached
1 of 2 Ingress replicas in CI, and the other replica's requests lost their connection at the shutdown.
So the launcher (serve_app/run.py) owns a named actor instead. Every Ingress replica that finds it at
start waits on it (an actor call that returns when the stop begins: an event, no polling), drains, and
reports back under its Serve replica id; the launcher waits for a report from each Ingress replica alive
when the stop began (serve_app/run.py), not for as many reports: a replica that starts during the stop has
nothing to drain and reports at once, and must not stand in for a busy one.

Without the launcher (`serve run`, a KubeRay RayService) there is no such actor and nothing waits.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from typing import Awaitable, Callable, Collection, Optional, Union

import ray

#: The actor's name in Serve's namespace (where the launcher and the replicas both run).
NAME = "serve_app_drain_signal"
NAMESPACE = "serve"

logger = logging.getLogger("ray.serve")


class Signal:
    """The stop, and the drained replicas' reports."""

    def __init__(self) -> None:
        self._stop = asyncio.Event()
        self._timeout_s = 30.0
        self._reports: dict[str, dict] = {}
        self._reported = asyncio.Condition()

    async def wait_for_stop(self) -> float:
        """Returns (the drain timeout in seconds) when the stop begins; at once after it began."""
        await self._stop.wait()
        return self._timeout_s

    async def stop(self, timeout_s: float) -> None:
        self._timeout_s = timeout_s
        self._stop.set()

    async def report(self, replica: str, result: dict) -> None:
        async with self._reported:
            self._reports[replica] = result
            self._reported.notify_all()

    async def reports(self, expected: Union[int, Collection[str]], timeout_s: float) -> dict[str, dict]:
        """The reports once every replica in `expected` (their ids), or `expected` replicas whichever
        they are, has sent one; or those in after `timeout_s`."""
        def arrived() -> bool:
            if isinstance(expected, int):
                return len(self._reports) >= expected
            return set(expected) <= self._reports.keys()

        async with self._reported:
            try:
                await asyncio.wait_for(self._reported.wait_for(arrived), timeout_s)
            except asyncio.TimeoutError:
                pass
            return dict(self._reports)


DrainSignal = ray.remote(num_cpus=0)(Signal)


def create() -> "ray.actor.ActorHandle":
    """The launcher's signal, before it starts Serve (its replicas look it up when they start)."""
    return DrainSignal.options(name=NAME, namespace=NAMESPACE).remote()


def watch(replica: str, drain: Callable[[float], Awaitable[dict]]) -> Optional[threading.Thread]:
    """In an Ingress replica: if the launcher's signal exists, a daemon thread that waits for the stop,
    runs `drain(timeout_s)` and reports the result under `replica`. None without a launcher."""
    if not ray.is_initialized():  # a plain object in a unit test: no Ray to look in
        return None
    try:
        signal = ray.get_actor(NAME, namespace=NAMESPACE)
    except ValueError:
        return None

    def _wait_drain_report() -> None:
        try:
            timeout_s = ray.get(signal.wait_for_stop.remote())
            result = asyncio.run(drain(timeout_s))
            ray.get(signal.report.remote(replica, result))
        except Exception as exc:  # the launcher is gone (its actor with it): nothing to drain for
            logger.info("Ingress drain watch ended: %r", exc)

    thread = threading.Thread(target=_wait_drain_report, name="serve-app-drain-watch", daemon=True)
    thread.start()
    return thread
