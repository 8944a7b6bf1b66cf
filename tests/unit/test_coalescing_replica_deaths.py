"""An input that crashes a model replica's process must fail only its own request, not every request whose
records shared its call, and must cost no more replicas than a call of its own does: two (serve_app/coalescing.py,
serve_app/handle_client.py)."""

import asyncio

import pytest

from serve_app.coalescing import CallCoalescer
from serve_app.errors import ModelUnavailable, ReplicaLost
from serve_app.handle_client import HandleClient
from serve_app.model_clients import BackgroundClient
from serve_app.schemas import TranslationPayload
from serve_app.service import Service
from serve_app.settings import load_settings
from tests.unit.fakes import FakeEmbedder
from tests.unit.test_coalescing import until
from tests.unit.test_reliability import _died, _Handle, _RealResponses, _stopped

LOST = ReplicaLost("Model replica failed while serving the request; retry after 2 s.", retry_after_s=2)


class CrashingModel:
    """`send` of a model whose replica dies on every call that carries "poison" (a custom model calling os._exit
    on it): it raises ReplicaLost, as HandleClient does when the coalescer asks it not to retry. The calls after
    the first fail with `fails`, one each, whatever they carry (a replica killed by something else). The first
    call waits for `gate`."""

    def __init__(self, fails: tuple = ()):
        self.gate, self.fails = asyncio.Event(), list(fails)
        self.sent: list[tuple[list, dict]] = []
        self.in_flight = self.most_in_flight_after_the_shared_call = 0

    async def send(self, key, records, **how):
        self.sent.append((list(records), how))
        self.in_flight += 1
        if len(self.sent) > 2:  # the calls after the shared one
            self.most_in_flight_after_the_shared_call = max(self.most_in_flight_after_the_shared_call, self.in_flight)
        try:
            if len(self.sent) == 1:
                await self.gate.wait()
            for _ in range(3):  # time for other calls to be in flight at once, were they sent so
                await asyncio.sleep(0)
            if "poison" in records:
                raise LOST
            if len(self.sent) > 1 and self.fails:
                raise self.fails.pop(0)
            return [f"{key}:{r}" for r in records], len(records)
        finally:
            self.in_flight -= 1

    def poisoned(self) -> int:
        """Calls that carried the crashing input: each took a replica down."""
        return sum("poison" in records for records, _ in self.sent)


def share_a_call(loop, model: CrashingModel, shared_records: list[list], **options):
    """A call of ["a"] holds the one slot while `shared_records` (one list per caller) join one pending call,
    then it returns: the shared call goes out. Each caller's result or error, in order."""
    async def scenario():
        slicer = options.pop("slice_result", lambda r, a, b: (r[0][a:b], r[1]))
        calls = CallCoalescer(model.send, slicer, max_records=8, max_inflight_calls=1, isolate_replica_deaths=True,
                              **options)
        first = asyncio.ensure_future(calls.submit("k", ["a"]))
        await until(lambda: len(model.sent) == 1)
        shared = [asyncio.ensure_future(calls.submit("k", records)) for records in shared_records]
        await until(lambda: len(calls._pending) == 1 and len(calls._pending[0].waiters) == len(shared_records))
        model.gate.set()
        assert await first == (["k:a"], 1)
        return await asyncio.gather(*shared, return_exceptions=True), calls

    return loop.run_until_complete(scenario())


#: what the coalescer asks HandleClient.call for: a shared call is not retried after a death; each caller's records
#: alone are that call's retry
SHARED, RETRY = {"retry_on_replica_death": False}, {"retry_on_replica_death": False, "after_replica_death": True}


def test_callers_who_shared_a_call_with_a_crashing_input_are_answered_and_it_costs_two_replicas(loop):
    model = CrashingModel()
    (b, poison, cd), calls = share_a_call(loop, model, [["b"], ["poison"], ["c", "d"]])
    assert b == (["k:b"], 1) and cd == (["k:c", "k:d"], 2)
    assert isinstance(poison, ModelUnavailable) and poison.status_code == 503 and poison.retry_after_s == 2
    assert model.poisoned() == 2  # the shared call, then its own: as a call of its own and its one retry
    assert model.sent == [(["a"], {}), (["b", "poison", "c", "d"], SHARED),
                          (["b"], RETRY), (["poison"], RETRY), (["c", "d"], RETRY)]
    # one caller's call at a time: sent together, they could share the crashing input's replica and die with it
    assert model.most_in_flight_after_the_shared_call == 1
    assert calls.calls_sent == 5 and calls.inflight == 0


def test_a_replica_killed_under_a_shared_call_loses_no_caller(loop):
    """A plain death (a SIGKILL, a node lost): the shared call fails once, each caller's records alone succeed."""
    model = CrashingModel(fails=[LOST])
    results, calls = share_a_call(loop, model, [["b"], ["c", "d"], ["e"]])
    assert results == [(["k:b"], 1), (["k:c", "k:d"], 2), (["k:e"], 1)]
    assert [how for _, how in model.sent] == [{}, SHARED, RETRY, RETRY, RETRY] and calls.inflight == 0


def test_no_replica_to_take_the_retry_ends_the_other_callers_at_once(loop):
    """After the death, the first caller's call alone finds no replica within retry_timeout_s (the 503 HandleClient
    gives): the others would wait as long each, one after another, so they get that 503 without being sent."""
    none_yet = ModelUnavailable("Model has no healthy replica yet; retry after 2 s.", retry_after_s=2)
    model = CrashingModel(fails=[LOST, none_yet])
    results, _ = share_a_call(loop, model, [["b"], ["c"], ["d"]])
    assert all(isinstance(r, ModelUnavailable) for r in results), results
    assert results[0] is results[1] is results[2]  # the same 503: not the shared call's ReplicaLost
    assert [records for records, _ in model.sent] == [["a"], ["b", "c", "d"], ["b"]]


def test_the_callers_not_sent_again_within_the_retry_s_time_get_the_503_of_the_lost_replica(loop):
    """From a review: one caller at a time had no bound of its own, so the last of 8 (32 for embeddings) waited for
    every call before it, each up to replica_retry_timeout_s to be taken, and got a 504 at its deadline. Past that
    time the callers not sent again get the shared call's 503 + Retry-After, as a failed retry did."""
    class Slow(CrashingModel):
        async def send(self, key, records, **how):
            if len(self.sent) >= 2:  # each caller's call alone takes 50 ms
                await asyncio.sleep(0.05)
            return await super().send(key, records, **how)

    model = Slow(fails=[LOST])
    results, calls = share_a_call(loop, model, [["b"], ["c"], ["d"], ["e"]], replica_retry_timeout_s=0.08)
    assert results[:2] == [(["k:b"], 1), (["k:c"], 1)] and results[2] is results[3] is LOST, results
    assert [records for records, _ in model.sent] == [["a"], ["b", "c", "d", "e"], ["b"], ["c"]]
    assert calls.inflight == 0


def test_a_result_that_cannot_be_cut_fails_its_own_caller_only_when_they_go_again_one_at_a_time(loop):
    """From a review: `_slice` raising on one caller's result escaped the chain, and every caller left got a 500."""
    def slicer(result, start, stop):
        if result[0] == ["k:c"]:
            raise ValueError("a result this caller's share cannot be cut from")
        return result[0][start:stop], result[1]

    results, _ = share_a_call(loop, CrashingModel(fails=[LOST]), [["b"], ["c"], ["d"]], slice_result=slicer)
    assert results[0] == (["k:b"], 1) and isinstance(results[1], ValueError) and results[2] == (["k:d"], 1)


def test_a_caller_who_leaves_while_the_others_go_again_one_at_a_time_is_skipped(loop):
    model = CrashingModel(fails=[LOST])

    async def scenario():
        calls = CallCoalescer(model.send, lambda r, a, b: (r[0][a:b], r[1]), max_records=8, max_inflight_calls=1,
                              isolate_replica_deaths=True)
        first = asyncio.ensure_future(calls.submit("k", ["a"]))
        await until(lambda: len(model.sent) == 1)
        b, c, d = (asyncio.ensure_future(calls.submit("k", [text])) for text in "bcd")
        await until(lambda: len(calls._pending) == 1 and len(calls._pending[0].waiters) == 3)
        model.gate.set()
        await until(lambda: [records for records, _ in model.sent][-1:] == [["b"]])  # b's call alone is out
        b.cancel()
        c.cancel()
        return await first, await d, b.cancelled() and c.cancelled()

    first, d, left = loop.run_until_complete(scenario())
    assert first == (["k:a"], 1) and d == (["k:d"], 1) and left
    assert [records for records, _ in model.sent] == [["a"], ["b", "c", "d"], ["b"], ["d"]]


def test_the_client_retries_a_death_unless_asked_not_to_and_never_hands_the_keywords_to_the_model():
    """The first call's replica dies (ActorDiedError). Retries on: retried once, as ever. Off: ReplicaLost (503)."""
    class Handle(_Handle):
        """Also keeps the keywords each call handed the model."""

        def __init__(self, outcomes):
            super().__init__(outcomes)
            self.kwargs: list[dict] = []

        def remote(self, *args, **kwargs):
            self.kwargs.append(kwargs)
            return super().remote(*args)

    handle = Handle([_died(), "answer"])
    client = HandleClient("Model", handle)
    assert asyncio.run(client.call("predict", ["x"], retry_on_replica_death=True)) == "answer"
    assert client.retried == 1 and len(handle.sent) == 2 and handle.kwargs == [{}, {}]

    handle = Handle([_died(), "answer"])
    client = HandleClient("Model", handle, retry_after_s=3)
    with pytest.raises(ReplicaLost) as lost:
        asyncio.run(client.call("predict", ["x"], retry_on_replica_death=False))
    assert lost.value.status_code == 503 and lost.value.retry_after_s == 3
    assert lost.value.error_type == "model_unavailable"  # what a client sees of any lost replica
    assert len(handle.sent) == 1 and client.retried == 0 and handle.kwargs == [{}]


def test_a_replica_that_stopped_is_no_death_a_call_not_to_retry_is_still_retried():
    """A stop (a downscale, a rolling update) is no input's doing: the shared call goes again whole, as ever."""
    client = HandleClient("Model", _Handle([_stopped(), "answer"]))
    assert asyncio.run(client.call("predict", ["x"], retry_on_replica_death=False)) == "answer"
    assert client.retried == 1


def test_a_call_after_a_death_waits_for_a_replica_as_the_retry_does_and_is_not_retried_again():
    """A first call waits while the router knows replicas (a busy rolling update); the retry of a call whose replica
    died waits at most retry_timeout_s to be taken, then 503. A call after a death is that retry."""
    import time

    handle = _RealResponses(accept_after_s=None, replicas=2)
    client = HandleClient("Model", handle, retry_timeout_s=0.2)
    started = time.monotonic()
    with pytest.raises(ModelUnavailable, match="no healthy replica yet"):
        asyncio.run(client.call("predict", ["x"], after_replica_death=True))
    assert time.monotonic() - started < 2 and handle.sent[0].cancelled()
    assert client.retried == 1 and client.retries_failed == 1

    client = HandleClient("Model", _Handle([_died(), "answer"]))
    with pytest.raises(ReplicaLost):
        asyncio.run(client.call("predict", ["x"], retry_on_replica_death=False, after_replica_death=True))
    assert client.retried == 1 and client.retries_failed == 1


class CrashingDeployment:
    """A Translator deployment's handle, minus Ray: a call whose records carry "poison" kills the replica computing
    it (ActorDiedError); the first translate call waits for `gate` (it holds the ingress's one call slot)."""

    def __init__(self):
        self.gate = asyncio.Event()
        self.translations: list[list[str]] = []

    def options(self, method_name):
        deployment = self

        class Method:
            def remote(self, *args, **kwargs):
                return Response(deployment.answer(method_name, *args))

        return Method()

    async def answer(self, method, chunk=None):
        if method == "info":
            return {"deployment": "Translator", "backend": "fake", "model": "fake-mt", "language_pairs": ["en-pt"],
                    "batching": {}, "details": {}}
        self.translations.append(list(chunk.texts))
        if len(self.translations) == 1:
            await self.gate.wait()
        if "poison" in chunk.texts:
            raise _died()
        return [f"[pt] {t}" for t in chunk.texts], len(chunk.texts)

    def deaths(self) -> int:
        return sum("poison" in texts for texts in self.translations)


class Response:
    def __init__(self, work):
        self.task = asyncio.ensure_future(work)

    def __await__(self):
        return self.task.__await__()

    def cancel(self):
        self.task.cancel()


def _translate_with_one_call_slot(translator, deployment: CrashingDeployment) -> list:
    service = Service(load_settings({"ingress": {"max_inflight_calls_per_model": 1}}), translator=translator,
                      embedder=FakeEmbedder())

    def payload(*texts):
        return TranslationPayload.model_validate(
            {"fromLang": "en", "toLang": "pt", "records": [{"id": str(i), "text": t} for i, t in enumerate(texts)]})

    async def scenario():
        first = asyncio.ensure_future(service.translate(payload("first")))
        await until(lambda: len(deployment.translations) == 1)
        shared = [asyncio.ensure_future(service.translate(payload(*texts)))
                  for texts in (["one"], ["poison"], ["two", "three"])]
        pending = service._translate_calls._pending
        await until(lambda: pending and len(pending[0].waiters) == 3)
        deployment.gate.set()
        return await asyncio.gather(first, *shared, return_exceptions=True)

    return asyncio.run(scenario())


def test_through_the_ingress_only_the_crashing_input_s_request_fails_and_jobs_keep_the_whole_call_retry():
    """The ingress's calls to a model deployment (a HandleClient) isolate the crash; the JobManager's
    (BackgroundClient) and a model placed in the Ingress (LocalClient, whose crash is the Ingress's) do not."""
    def texts(outcome):
        return outcome if isinstance(outcome, BaseException) else [r.text for r in outcome[0].result]

    deployment = CrashingDeployment()
    first, one, poison, two = _translate_with_one_call_slot(HandleClient("Translator", deployment), deployment)
    assert texts(first) == ["[pt] first"] and texts(one) == ["[pt] one"] and texts(two) == ["[pt] two", "[pt] three"]
    assert isinstance(poison, ModelUnavailable) and poison.retry_after_s == 2
    assert deployment.deaths() == 2

    jobs = CrashingDeployment()
    first, *shared = _translate_with_one_call_slot(BackgroundClient(HandleClient("Translator", jobs)), jobs)
    assert all(isinstance(r, ModelUnavailable) for r in shared)  # today's: the whole call, retried once, died twice
    whole = sorted(["one", "poison", "two", "three"])
    assert jobs.deaths() == 2 and [sorted(texts) for texts in jobs.translations[1:]] == [whole, whole]
