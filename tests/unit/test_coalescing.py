"""Concurrent requests' records share calls to a model once enough calls are in flight."""

import asyncio
import functools

import pytest

from serve_app.coalescing import CallCoalescer
from serve_app.errors import InternalError, ModelUnavailable
from serve_app.schemas import TranslationPayload
from tests import support
from tests.unit.fakes import FakeTranslator, install


class GatedModel:
    """A model method whose calls wait until released, so a test decides when each returns."""

    def __init__(self):
        self.calls: list[tuple] = []
        self.release = asyncio.Event()
        self.cancelled = 0

    async def send(self, key, records):
        self.calls.append((key, list(records)))
        try:
            await self.release.wait()
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        return [f"{key}:{r}" for r in records], len(records)


def coalescer(model, *, max_records=4, max_inflight_calls=1):
    return CallCoalescer(model.send, lambda result, a, b: (result[0][a:b], result[1]),
                         max_records=max_records, max_inflight_calls=max_inflight_calls)


#: at every turn of the loop (the coalescer's state can move on at each one, and some tests check a passing state)
until = functools.partial(support.until, interval_s=0)


def test_below_the_limit_calls_go_out_at_once(loop):
    async def scenario():
        model = GatedModel()
        calls = coalescer(model, max_inflight_calls=3)
        tasks = [asyncio.ensure_future(calls.submit("en-pt", [f"r{i}"])) for i in range(3)]
        await until(lambda: len(model.calls) == 3)  # nobody waited for a companion
        model.release.set()
        return await asyncio.gather(*tasks), calls

    results, calls = loop.run_until_complete(scenario())
    assert results == [(["en-pt:r0"], 1), (["en-pt:r1"], 1), (["en-pt:r2"], 1)]
    assert calls.calls_sent == 3 and calls.inflight == 0


def test_at_the_limit_records_share_one_call_per_key_up_to_max_records(loop):
    async def scenario():
        model = GatedModel()
        calls = coalescer(model, max_records=4, max_inflight_calls=1)
        first = asyncio.ensure_future(calls.submit("en-pt", ["a"]))
        await until(lambda: len(model.calls) == 1)
        # while `first` is in flight: 5 one-record calls for en-pt, one two-record call for pt-en
        waiting = [asyncio.ensure_future(calls.submit("en-pt", [f"r{i}"])) for i in range(5)]
        other = asyncio.ensure_future(calls.submit("pt-en", ["x", "y"]))
        await until(lambda: all(not t.done() for t in waiting) and len(calls._pending) == 3)
        model.release.set()
        return await first, await asyncio.gather(*waiting), await other, model, calls

    first, waiting, other, model, calls = loop.run_until_complete(scenario())
    assert first == (["en-pt:a"], 1)
    # each caller gets exactly its records back, with the size of the call it rode in
    assert waiting == [(["en-pt:r0"], 4), (["en-pt:r1"], 4), (["en-pt:r2"], 4), (["en-pt:r3"], 4),
                       (["en-pt:r4"], 1)]
    assert other == (["pt-en:x", "pt-en:y"], 2)
    # one call per key, in the order the calls were opened; the fifth record opened a new one
    assert model.calls == [("en-pt", ["a"]), ("en-pt", ["r0", "r1", "r2", "r3"]), ("en-pt", ["r4"]),
                           ("pt-en", ["x", "y"])]
    assert calls.calls_sent == 4 and calls.records_sent == 8


def test_a_caller_that_gives_up_before_its_call_went_out_is_left_out_of_it(loop):
    async def scenario():
        model = GatedModel()
        calls = coalescer(model)
        first = asyncio.ensure_future(calls.submit("k", ["a"]))
        await until(lambda: len(model.calls) == 1)
        stays = asyncio.ensure_future(calls.submit("k", ["b"]))
        leaves = asyncio.ensure_future(calls.submit("k", ["c", "d"]))
        await until(lambda: len(calls._pending) == 1 and calls._pending[0].records == 3)
        leaves.cancel()
        with pytest.raises(asyncio.CancelledError):
            await leaves
        model.release.set()
        return await first, await stays, model

    first, stays, model = loop.run_until_complete(scenario())
    assert stays == (["k:b"], 1)
    assert model.calls == [("k", ["a"]), ("k", ["b"])]  # c and d were never sent


def test_a_sent_call_is_cancelled_only_when_every_caller_in_it_has_gone(loop):
    async def scenario():
        model = GatedModel()
        calls = coalescer(model, max_inflight_calls=1)
        blocker = asyncio.ensure_future(calls.submit("k", ["first"]))
        await until(lambda: len(model.calls) == 1)
        one, two = (asyncio.ensure_future(calls.submit("k", [r])) for r in ("x", "y"))
        await until(lambda: len(calls._pending) == 1 and len(calls._pending[0].waiters) == 2)
        blocker.cancel()  # its call had only this caller: cancelled on the model
        await until(lambda: len(model.calls) == 2)  # the slot freed: x and y went out as one call
        one.cancel()
        await asyncio.sleep(0)
        cancelled_while_two_waits = model.cancelled
        two.cancel()
        await until(lambda: model.cancelled == 2)
        for task in (blocker, one, two):
            with pytest.raises(asyncio.CancelledError):
                await task
        return cancelled_while_two_waits, calls

    cancelled_while_two_waits, calls = loop.run_until_complete(scenario())
    assert cancelled_while_two_waits == 1  # x left, but y still waited on the shared call
    assert calls.inflight == 0


def test_a_call_whose_callers_all_left_before_it_started_frees_its_slot(loop):
    async def scenario():
        model = GatedModel()
        calls = coalescer(model, max_inflight_calls=1)
        gone = asyncio.ensure_future(calls.submit("k", ["a"]))
        await asyncio.sleep(0)  # submitted: its call's task exists but has not run yet
        [call_task] = [t for t in asyncio.all_tasks() if t.get_coro().__qualname__ == "CallCoalescer._run"]
        call_task.cancel()  # cancelled before it started: its body never runs
        with pytest.raises(asyncio.CancelledError):
            await gone  # the caller is not left waiting
        assert model.calls == []
        model.release.set()
        return await calls.submit("k", ["b"]), calls

    result, calls = loop.run_until_complete(scenario())
    assert result == (["k:b"], 1) and calls.inflight == 0


def _share_a_failing_call(loop, fails, shared_records):
    """One call in flight ("a"); `shared_records` (one list per caller) wait and go out together once it
    returns. `fails(sent, records)` is the error a call raises, or None. (first's result, the shared
    callers' results or errors, every call's records, the coalescer)"""
    async def scenario():
        gate = asyncio.Event()
        sent = []

        async def send(key, records):
            sent.append(list(records))
            await gate.wait()
            if (error := fails(sent, records)) is not None:
                raise error
            return list(records), len(records)

        calls = CallCoalescer(send, lambda r, a, b: (r[0][a:b], r[1]), max_records=8, max_inflight_calls=1)
        first = asyncio.ensure_future(calls.submit(None, ["a"]))
        await until(lambda: len(sent) == 1)
        shared = [asyncio.ensure_future(calls.submit(None, records)) for records in shared_records]
        total = sum(len(records) for records in shared_records)
        await until(lambda: len(calls._pending) == 1 and calls._pending[0].records == total)
        gate.set()
        return await first, await asyncio.gather(*shared, return_exceptions=True), sent, calls

    return loop.run_until_complete(scenario())


def test_the_service_s_error_reaches_every_caller_of_the_call(loop):
    first, shared, sent, _ = _share_a_failing_call(
        loop, lambda sent, records: ModelUnavailable("replica died", retry_after_s=2) if len(sent) > 1 else None,
        [["b"], ["c"]])
    assert first == (["a"], 1)
    assert [type(e) for e in shared] == [ModelUnavailable, ModelUnavailable] and len(sent) == 2  # not sent again


def test_one_caller_s_bad_input_fails_its_own_request_only(loop):
    """The model raised on a call that carried three requests' records: each goes again alone."""
    first, shared, sent, calls = _share_a_failing_call(
        loop, lambda sent, records: InternalError("Translator failed; logged.") if "bad" in records else None,
        [["b", "c"], ["bad"], ["d"]])
    assert first == (["a"], 1)
    assert shared[0] == (["b", "c"], 2) and isinstance(shared[1], InternalError) and shared[2] == (["d"], 1)
    assert sent == [["a"], ["b", "c", "bad", "d"], ["b", "c"], ["bad"], ["d"]] and calls.inflight == 0


def test_limits_are_checked_at_construction_and_submit(loop):
    with pytest.raises(ValueError, match="max_records and max_inflight_calls must be >= 1"):
        CallCoalescer(GatedModel().send, lambda r, a, b: r, max_records=0, max_inflight_calls=1)
    calls = coalescer(GatedModel(), max_records=2)
    with pytest.raises(ValueError, match="1..2 records, got 3"):
        loop.run_until_complete(calls.submit("k", ["a", "b", "c"]))


def test_concurrent_translation_requests_share_calls_and_each_gets_its_own_records(loop):
    translator = FakeTranslator(delay_s=0.05)
    install(translator=translator, ingress={"max_inflight_calls_per_model": 2})
    from serve_app.api import get_service

    async def scenario():
        service = await get_service()
        payloads = [TranslationPayload.model_validate(
            {"fromLang": "en", "toLang": "pt", "records": [{"id": str(i), "text": f"text {i}"}]}) for i in range(24)]
        return await asyncio.gather(*(service.translate(p) for p in payloads)), service

    results, service = loop.run_until_complete(scenario())
    assert [r.result[0].text for r, _ in results] == [f"[pt] text {i}" for i in range(24)]
    compute_calls = list(translator.calls)
    assert translator.max_in_flight <= 2
    assert len(compute_calls) < 24 / 2  # shared: 24 one-record requests, far fewer calls
    assert max(len(c.texts) for c in compute_calls) == service.limits.records_per_call


def test_a_call_carries_no_callers_request_context(loop):
    """Serve records a handle call under the request in whose context it is made, and cancels it when that
    request is cancelled (its client gone): a call shared by several callers must belong to none of them."""
    from ray.serve.context import _RequestContext, _serve_request_context

    seen = []

    async def send(key, records):
        seen.append((_serve_request_context.get(), list(records)))
        await asyncio.sleep(0.01)
        return list(records)

    async def caller(calls, request_id, records):
        _serve_request_context.set(_RequestContext(request_id=request_id, _internal_request_id=request_id))
        return await calls.submit("k", records)

    async def scenario():
        calls = CallCoalescer(send, lambda result, a, b: result[a:b], max_records=8, max_inflight_calls=1)
        first = asyncio.ensure_future(caller(calls, "A", ["a1"]))
        await until(lambda: len(seen) == 1)
        return await asyncio.gather(first, caller(calls, "B", ["b1"]), caller(calls, "C", ["c1"]))

    assert loop.run_until_complete(scenario()) == [["a1"], ["b1"], ["c1"]]
    assert [records for _, records in seen] == [["a1"], ["b1", "c1"]]
    assert [context for context, _ in seen] == [None, None]

