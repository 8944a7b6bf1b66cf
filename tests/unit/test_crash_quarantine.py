"""Records that crash the model (a segfault, the OOM killer, a custom model's os._exit) are refused once calls
with them lost three replicas, for ingress.crash_quarantine_s (serve_app/crash_quarantine.py): a retrying client or a
job no longer takes replicas down every few seconds. A replica lost to anything else costs a call one death and is
still retried and waited out."""

import asyncio

import pytest

from deployments.batching import Chunk
from serve_app.crash_quarantine import MAX_DEATHS, MAX_REMEMBERED, CrashQuarantine
from serve_app.errors import ModelCrashed, ModelUnavailable
from serve_app.handle_client import HandleClient
from serve_app.schemas import TranslationPayload
from serve_app.service import Service
from serve_app.settings import load_settings
from tests.unit.fakes import FakeEmbedder
from tests.unit.test_coalescing import until
from tests.unit.test_coalescing_replica_deaths import CrashingDeployment
from tests.unit.test_jobs import _finished, _runner
from tests.unit.test_reliability import _died, _Handle


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def test_records_are_refused_from_their_third_death_for_quarantine_s_then_forgotten():
    clock = Clock()
    quarantine = CrashQuarantine("Translator", 60, clock=clock)
    quarantine.check("translate", (["a"],))  # nothing died: nothing refused
    assert quarantine.died("translate", (["a"],)) is None
    assert quarantine.died("translate", (["a"],)) is None
    quarantine.check("translate", (["a"],))
    clock.now += 50
    crashed = quarantine.died("translate", (["a"],))  # the third within 60 s
    assert isinstance(crashed, ModelCrashed) and crashed.status_code == 500 and crashed.error_type == "model_crashed"
    assert "3 Translator replicas died" in crashed.message and "refused for 60 s" in crashed.message
    with pytest.raises(ModelCrashed):
        quarantine.check("translate", (["a"],))
    quarantine.check("translate", (["a", "b"],))  # other records, or the same under another method, go
    quarantine.check("embed", (["a"],))
    assert quarantine.refused == 1
    clock.now += 59  # refused for 60 s from the third death, not from the first
    with pytest.raises(ModelCrashed):
        quarantine.check("translate", (["a"],))
    clock.now += 1
    quarantine.check("translate", (["a"],))  # forgotten, count and all: it may reach a replica again
    assert quarantine.died("translate", (["a"],)) is None


def test_deaths_further_apart_than_quarantine_s_are_not_counted_together_and_memory_is_bounded():
    clock = Clock()
    quarantine = CrashQuarantine("Embedder", 10, clock=clock)
    for _ in range(5):  # a node lost every 10 s under the same records: never three within 10 s
        assert quarantine.died("embed", (["x"],)) is None
        assert quarantine.died("embed", (["x"],)) is None
        clock.now += 10
    for i in range(MAX_REMEMBERED + 5):
        quarantine.died("embed", ([str(i)],))
    assert len(quarantine._deaths) == MAX_REMEMBERED


def test_the_handle_client_stops_retrying_at_the_third_death_and_then_refuses_without_sending():
    handle = _Handle([_died(), _died(), _died(), "answer"])
    client = HandleClient("Translator", handle, retry_after_s=3, quarantine_s=600)
    with pytest.raises(ModelUnavailable) as first:  # the call and its retry died: 503, as ever
        asyncio.run(client.call("translate", ["poison"]))
    assert first.value.status_code == 503 and first.value.retry_after_s == 3
    with pytest.raises(ModelCrashed):  # sent again: the third death, no retry
        asyncio.run(client.call("translate", ["poison"]))
    assert len(handle.sent) == 3
    with pytest.raises(ModelCrashed):  # refused: no replica reached
        asyncio.run(client.call("translate", ["poison"]))
    assert len(handle.sent) == 3 and client.quarantine.refused == 1
    assert asyncio.run(client.call("translate", ["fine"])) == "answer"


def test_a_replica_lost_once_per_call_is_never_quarantined():
    """A node lost now and then: each call's replica dies once and its retry is answered."""
    handle = _Handle([_died(), "answer", _died(), "answer", _died(), "answer"])
    client = HandleClient("Translator", handle)
    assert [asyncio.run(client.call("translate", [f"x{i}"])) for i in range(3)] == ["answer"] * 3
    assert client.quarantine.refused == 0 and client.quarantine._deaths == {}  # answered: forgotten


def _request(service, *texts):
    payload = TranslationPayload.model_validate(
        {"fromLang": "en", "toLang": "pt", "records": [{"id": str(i), "text": t} for i, t in enumerate(texts)]})
    return service.translate(payload)


def test_a_client_retrying_a_crashing_request_costs_three_replicas_then_gets_500_and_others_are_answered():
    deployment = CrashingDeployment()
    deployment.gate.set()
    service = Service(load_settings({}), translator=HandleClient("Translator", deployment), embedder=FakeEmbedder())

    async def scenario():
        outcomes = []
        for _ in range(5):  # a client retrying its 503s, as serve_app/client does
            try:
                outcomes.append(await _request(service, "one", "poison"))
            except (ModelUnavailable, ModelCrashed) as exc:
                outcomes.append(type(exc))
        fine = await _request(service, "one", "two")
        return outcomes, [record.text for record in fine[0].result]

    outcomes, fine = asyncio.run(scenario())
    assert outcomes == [ModelUnavailable, ModelCrashed, ModelCrashed, ModelCrashed, ModelCrashed]
    assert deployment.deaths() == 3
    assert fine == ["[pt] one", "[pt] two"]


def test_refused_records_are_refused_before_they_share_a_call_and_reach_no_replica():
    """From a review: HandleClient checks the records of each call, and under load a call carries several requests'
    records, so refused records that shared one reached a replica, and took it down, every time. Each request's
    records are checked before they share a call (the coalescer's `refuse`), and the others' call goes without them."""
    deployment = CrashingDeployment()
    client = HandleClient("Translator", deployment)
    for _ in range(MAX_DEATHS):  # the deaths a retrying client cost before (as above)
        client.quarantine.died("translate", (Chunk("en", "pt", ["poison"]),))
    service = Service(load_settings({"ingress": {"max_inflight_calls_per_model": 1}}), translator=client,
                      embedder=FakeEmbedder())

    async def scenario():
        first = asyncio.ensure_future(_request(service, "first"))  # holds the one call slot: the others share
        await until(lambda: len(deployment.translations) == 1)
        shared = [asyncio.ensure_future(_request(service, *texts)) for texts in (["one"], ["poison"], ["two"])]
        pending = service._translate_calls._pending
        await until(lambda: shared[1].done() and pending and len(pending[0].waiters) == 2)
        deployment.gate.set()
        return await asyncio.gather(first, *shared, return_exceptions=True)

    first, one, poison, two = asyncio.run(scenario())
    assert isinstance(poison, ModelCrashed) and client.quarantine.refused == 1
    assert deployment.deaths() == 0 and deployment.translations[1:] == [["one", "two"]]
    assert [r.text for r in one[0].result] == ["[pt] one"] and [r.text for r in two[0].result] == ["[pt] two"]


class HeldDeployment(CrashingDeployment):
    """A call of ["hold"] waits for `release`: it holds the ingress's one call slot, so the requests sent meanwhile
    share the next call."""

    def __init__(self):
        super().__init__()
        self.gate.set()
        self.release, self.holding = asyncio.Event(), False

    async def answer(self, method, chunk=None):
        if method != "info" and chunk.texts == ["hold"]:
            self.holding = True
            await self.release.wait()
            self.holding = False
        return await super().answer(method, chunk)


def test_under_load_a_crashing_input_costs_three_replicas_and_the_others_are_never_refused():
    """From a review: under load the crashing input shares a call with other requests each time it is sent. The
    shared call's death was counted against the shared records, never seen again, so each attempt cost two replicas
    and counted one: six before it was refused. Now the coalescer counts it against each caller's records, and the
    records answered alone after it (the innocent ones) are forgotten."""
    deployment = HeldDeployment()
    client = HandleClient("Translator", deployment)
    service = Service(load_settings({"ingress": {"max_inflight_calls_per_model": 1}}), translator=client,
                      embedder=FakeEmbedder())

    async def attempt():
        deployment.release.clear()
        holder = asyncio.ensure_future(_request(service, "hold"))
        await until(lambda: deployment.holding)
        shared = [asyncio.ensure_future(_request(service, text)) for text in ("one", "poison", "two")]
        pending = service._translate_calls._pending
        await until(lambda: sum(len(c.waiters) for c in pending) + sum(s.done() for s in shared) == 3)
        deployment.release.set()
        await holder
        return await asyncio.gather(*shared, return_exceptions=True)

    async def scenario():
        return [await attempt() for _ in range(3)]

    attempts = asyncio.run(scenario())
    first, second, third = (poison for _, poison, _ in attempts)
    assert isinstance(first, ModelUnavailable) and first.status_code == 503  # (the lost replica's 503)
    assert isinstance(second, ModelCrashed) and isinstance(third, ModelCrashed)
    assert all([r.text for r in one[0].result] == ["[pt] one"] and [r.text for r in two[0].result] == ["[pt] two"]
               for one, _, two in attempts)
    assert deployment.deaths() == 3  # the shared call and the retry alone, then the shared call: refused
    assert len(client.quarantine._deaths) == 1  # the poison's records; "one" and "two" were forgotten


def test_a_job_whose_records_crash_the_model_fails_after_three_replicas_not_two_every_few_seconds(tmp_path):
    """The real HandleClient and Service under the job runner (which waits out 503s for model_retry_s)."""
    deployment = CrashingDeployment()
    deployment.gate.set()
    texts = [f"t{i}" for i in range(20)]
    texts[13] = "poison"

    async def scenario():
        runner, _, _ = await _runner(tmp_path, HandleClient("Translator", deployment), model_retry_s=300)
        body = {"fromLang": "en", "toLang": "pt", "records": [{"id": str(i), "text": t} for i, t in enumerate(texts)]}
        view = await _finished(runner, (await runner.submit("translation", body))["job_id"])
        await runner.stop()
        return view

    view = asyncio.run(scenario())
    assert view["status"] == "failed" and view["error"]["error_type"] == "model_crashed"
    assert "records 8-15" in view["error"]["error"]
    assert deployment.deaths() == 3
