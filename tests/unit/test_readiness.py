"""/readyz's probe (serve_app/readiness.py): it needs no key, so callers at the same time share one probe."""

from __future__ import annotations

import asyncio
import time

from serve_app.readiness import Readiness


class CountingClient:
    name = "Embedder"

    def __init__(self) -> None:
        self.calls = 0

    async def call(self, method: str, *args, **kwargs) -> dict:
        assert method == "ready"
        self.calls += 1
        await asyncio.sleep(0.05)
        return {"deployment": self.name}


def test_callers_at_the_same_time_share_one_probe_and_a_later_caller_probes_again():
    async def scenario():
        readiness, client = Readiness(timeout_s=2.0), CountingClient()
        together = await asyncio.gather(*(readiness.states([client]) for _ in range(50)))
        assert together == [{"Embedder": "ready"}] * 50 and client.calls == 1
        assert await readiness.states([client]) == {"Embedder": "ready"} and client.calls == 2
        # a caller that gives up (its client gone) does not cancel the probe another waits on
        first, second = (asyncio.ensure_future(readiness.states([client])) for _ in range(2))
        await asyncio.sleep(0.01)
        first.cancel()
        assert await second == {"Embedder": "ready"} and client.calls == 3

    asyncio.run(scenario())


class BusyClient:
    """A deployment whose `ready` call waits behind work (`raises`: or is refused), with Serve's `status`."""
    name = "Translator"

    def __init__(self, status: str, message: str = "", raises: Exception | None = None,
                 answered_s_ago: float | None = 1.0) -> None:
        self.status, self.message, self.raises = status, message, raises
        #: as HandleClient keeps it: when a call of the deployment last returned
        self.last_answer_at = None if answered_s_ago is None else time.monotonic() - answered_s_ago

    async def call(self, method: str, *args, **kwargs) -> dict:
        if self.raises is not None:
            raise self.raises
        await asyncio.sleep(10)
        return {}

    async def deployment_status(self) -> tuple[str, str]:
        return self.status, self.message


def test_a_deployment_serving_but_saturated_is_ready_busy_and_one_still_starting_is_loading():
    """Every replica at its limit (the probe is an ordinary request and waits) is not `loading`: Serve's
    controller says whether the replicas were constructed, and calls still being answered that they are
    not stuck. /readyz counts `ready (busy: ...)` as ready."""
    from serve_app.api import public_state
    from serve_app.errors import Overloaded

    async def state(client) -> str:
        return (await Readiness(timeout_s=0.05).states([client]))[client.name]

    for status in ("HEALTHY", "UPSCALING", "DOWNSCALING"):
        busy = asyncio.run(state(BusyClient(status)))
        assert busy == ("ready (busy: no replica answered in time; "
                        f"Serve reports it {status}, and its calls are answered)")
        assert public_state(busy) == "ready"
    full = asyncio.run(state(BusyClient("UPSCALING", raises=Overloaded("Translator is at capacity"))))
    assert full == "ready (busy: its queue is full; Serve reports it UPSCALING, and its calls are answered)"
    # HEALTHY, but nothing answered for a while (a hung model thread, replicas the controller has not yet
    # seen die) or ever: not ready
    for ago in (None, 45.0):
        assert asyncio.run(state(BusyClient("HEALTHY", answered_s_ago=ago))) == "loading (no replica answered in time)"
    assert asyncio.run(state(BusyClient("UPDATING"))) == "loading (no replica answered in time)"
    assert asyncio.run(state(BusyClient("UPDATING", raises=Overloaded("Translator is at capacity")))) == \
        "unavailable: Translator is at capacity"
    failed = asyncio.run(state(BusyClient("DEPLOY_FAILED", "Failed to start. ModelLoadError: no weights")))
    assert failed.startswith("failed: DEPLOY_FAILED") and public_state(failed) == "failed"


class GatedClient(CountingClient):
    """A busy deployment: its `ready` call returns once `gate` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = asyncio.Event()

    async def call(self, method: str, *args, **kwargs) -> dict:
        self.calls += 1
        await self.gate.wait()
        return {}


def test_callers_while_a_probe_runs_get_the_last_answer_at_once_if_it_is_recent():
    """A keyless flood of /readyz held a connection per caller for the whole probe (seconds while models are
    busy), enough to fill the slots HAProxy gives an Ingress replica ahead of every tenant's requests."""
    async def scenario():
        readiness, client = Readiness(timeout_s=2.0), GatedClient()
        client.gate.set()
        assert await readiness.states([client]) == {"Embedder": "ready"} and client.calls == 1
        client.gate.clear()
        probe = asyncio.ensure_future(readiness.states([client]))  # a new probe, held until the gate opens
        await asyncio.sleep(0.01)
        flood = await asyncio.wait_for(asyncio.gather(*(readiness.states([client]) for _ in range(50))), 1.0)
        assert flood == [{"Embedder": "ready"}] * 50 and client.calls == 2 and not probe.done()
        opened = time.monotonic()
        client.gate.set()
        assert await probe == {"Embedder": "ready"}
        assert readiness._last[0] < opened  # an answer is as old as its probe's start, not its end
        # an answer older than a probe's longest time is not given: callers wait for the probe
        readiness._last = (time.monotonic() - 10, {"Embedder": "loading (no replica answered in time)"})
        client.gate.clear()
        waiting = [asyncio.ensure_future(readiness.states([client])) for _ in range(3)]
        await asyncio.sleep(0.05)
        assert not any(w.done() for w in waiting) and client.calls == 3
        client.gate.set()
        assert await asyncio.gather(*waiting) == [{"Embedder": "ready"}] * 3

    asyncio.run(scenario())


def test_shared_probes_and_info_calls_carry_no_caller_s_request_context():
    """Serve files a handle call under the request in whose context it is made, and cancels it when that request's
    client goes away: /readyz's shared probe and the shared `info` call had the first caller's request, so its
    client leaving failed every other caller waiting on them (as test_coalescing checks for model calls)."""
    from ray.serve.context import _RequestContext, _serve_request_context

    from serve_app.model_info import ModelInfo

    class Recording:
        name = "Embedder"

        def __init__(self):
            self.contexts = []

        async def call(self, method: str, *args, **kwargs) -> dict:
            self.contexts.append((method, _serve_request_context.get()))
            await asyncio.sleep(0.01)
            return {"deployment": self.name}

    async def as_request(request_id, awaitable):
        _serve_request_context.set(_RequestContext(request_id=request_id, _internal_request_id=request_id))
        return await awaitable

    async def scenario():
        client = Recording()
        await as_request("A", Readiness(timeout_s=2.0).states([client]))
        await as_request("B", ModelInfo().get(client))
        return client.contexts

    assert asyncio.run(scenario()) == [("ready", None), ("info", None)]
