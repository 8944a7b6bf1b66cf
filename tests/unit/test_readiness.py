"""/readyz's probe (serve_app/readiness.py): it needs no key, so callers at the same time share one probe."""

from __future__ import annotations

import asyncio

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
