"""The `make run` launcher's stop, told to every Ingress replica at once.

A handle call reaches the one replica that Serve's router picks, and under load the router prefers a
replica that has already drained (it has nothing in flight): drain calls sent through a handle reached
1 of 2 Ingress replicas in CI, and the other replica's requests lost their connection at the shutdown.
So the launcher (serve_app/run.py) owns a named actor instead. Every Ingress replica that finds it at
start waits on it (an actor call that returns when the stop begins: an event, no polling), drains, and
reports back under its Serve replica id; the launcher waits for a report from each Ingress replica alive
and watching (past its constructor, which registers it before it takes a request) when the stop began
(`drain`, below), not for as many reports: a replica that starts during the stop has nothing to drain and
reports at once, and must not stand in for a busy one; one still loading its models is not waited for.

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
        #: the replicas that watch for the stop (their constructor got that far), and those that did at the stop
        self._watching: set[str] = set()
        self._watching_at_stop: Optional[set[str]] = None

    async def watching(self, replica: str) -> None:
        """`replica` watches for the stop: from now on its requests are drained at the stop."""
        self._watching.add(replica)

    async def wait_for_stop(self) -> float:
        """Returns (the drain timeout in seconds) when the stop begins; at once after it began."""
        await self._stop.wait()
        return self._timeout_s

    async def stop(self, timeout_s: float) -> None:
        self._timeout_s = timeout_s
        if self._watching_at_stop is None:
            self._watching_at_stop = set(self._watching)
        self._stop.set()

    async def report(self, replica: str, result: dict) -> None:
        async with self._reported:
            self._reports[replica] = result
            self._reported.notify_all()

    def watched(self, replicas: Collection[str]) -> set[str]:
        """Of `replicas`, those that watched for the stop when it began (all that watch, before it)."""
        return set(replicas) & (self._watching if self._watching_at_stop is None else self._watching_at_stop)

    async def reports(self, expected: Union[int, Collection[str]], timeout_s: float) -> dict[str, dict]:
        """The reports once every replica in `expected` (their ids) that watched for the stop when it began, or
        `expected` replicas whichever they are, has sent one; or those in after `timeout_s`. A replica still in its
        constructor at the stop (loading its models) has taken no request: it is not waited for."""
        if not isinstance(expected, int):
            expected = self.watched(expected)

        def arrived() -> bool:
            if isinstance(expected, int):
                return len(self._reports) >= expected
            return expected <= self._reports.keys()

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
    try:  # before the replica takes a request: from then on, the stop waits for its report
        ray.get(signal.watching.remote(replica), timeout=30)
    except Exception as exc:  # noqa: BLE001 - the launcher is gone: nothing to drain for
        logger.info("Ingress drain watch not started: %r", exc)
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


def _ingress_replicas(app_names: list[str], say: Callable[[str], None]) -> Union[set[str], int]:
    """The Ingress replicas of the config's applications that are alive now, by the id each reports
    under (its Serve replica id): Serve names each replica's actor `SERVE_REPLICA::<app>#<deployment>#<id>`.
    By id, not by count: a replica that starts during the stop (the autoscaler adding one under load)
    reports at once and would otherwise take the place of a busy one still draining. Should the names
    not read, the RUNNING replicas' count (serve.status; an application without an Ingress has none)."""
    from ray import serve

    try:
        from ray.serve._private.common import ReplicaID

        ids = {ReplicaID.from_full_id_str(actor["name"]) for actor in ray.util.list_named_actors(all_namespaces=True)
               if ReplicaID.is_full_id_str(actor["name"])}
        return {r.unique_id for r in ids if r.deployment_id.name == "Ingress" and r.deployment_id.app_name in app_names}
    except Exception as exc:  # noqa: BLE001 - Ray's naming changed: count instead
        say(f"serve-app: could not list the Ingress replicas by id ({exc!r}); counting them")
    applications = serve.status().applications
    ingresses = (applications[name].deployments.get("Ingress") for name in app_names if name in applications)
    return sum(int(ingress.replica_states.get("RUNNING", 0)) for ingress in ingresses if ingress is not None)


def drain(signal_actor: "ray.actor.ActorHandle", app_names: list[str], timeout_s: float,
          say: Callable[[str], None] = print) -> None:
    """The launcher's stop: every Ingress replica of `app_names` drains at once; wait for each one's report."""
    try:
        replicas = _ingress_replicas(app_names, say)
    except Exception as exc:  # the stop still goes out: whoever reports is waited for until the timeout
        say(f"serve-app: could not find the Ingress replicas ({exc!r})")
        replicas = 1
    try:
        ray.get(signal_actor.stop.remote(timeout_s))
        drained = ray.get(signal_actor.reports.remote(replicas, timeout_s + 10))
        if isinstance(replicas, int):
            done, expected = len(drained), replicas
        else:  # (those still in their constructor at the stop took no request: not waited for, not counted)
            watched = ray.get(signal_actor.watched.remote(replicas))
            done, expected = len(watched & drained.keys()), len(watched)
        say(f"serve-app: drained {done} of {expected} Ingress replica(s): {drained}")
    except Exception as exc:  # a failed drain must not prevent the shutdown
        say(f"serve-app: could not drain ({exc!r}); stopping anyway")
