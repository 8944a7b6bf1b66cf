"""Coalesced calls that fail: a caller who left must not fail the ones who stayed, and the calls of their own
that follow a failed shared call keep to the in-flight limit (serve_app/coalescing.py)."""

import asyncio

from serve_app.coalescing import CallCoalescer
from serve_app.errors import InternalError
from tests.unit.test_coalescing import GatedModel, coalescer, until


def test_a_caller_who_left_after_the_call_went_out_does_not_fail_the_one_who_stayed(loop):
    """A (bad input) and B share a sent call; A's client goes; the model raises on A's record. B's
    records go again alone, so B gets its own answer, not A's error."""
    async def scenario():
        gates, sent = {"a": asyncio.Event(), "shared": asyncio.Event()}, []

        async def send(key, records):
            sent.append(list(records))
            if len(sent) <= 2:  # the first call, then the shared one, wait for the test
                await gates["a" if records == ["a"] else "shared"].wait()
            if "bad" in records:
                raise InternalError("Translator failed; logged.")
            return list(records), len(records)

        calls = CallCoalescer(send, lambda r, a, b: (r[0][a:b], r[1]), max_records=8, max_inflight_calls=1)
        first = asyncio.ensure_future(calls.submit(None, ["a"]))
        await until(lambda: len(sent) == 1)
        bad, good = (asyncio.ensure_future(calls.submit(None, [text])) for text in ("bad", "good"))
        await until(lambda: len(calls._pending) == 1 and calls._pending[0].records == 2)
        gates["a"].set()
        await first
        await until(lambda: len(sent) == 2)  # the shared call is out
        bad.cancel()
        await asyncio.sleep(0)
        gates["shared"].set()
        return await good, sent, calls

    good, sent, calls = loop.run_until_complete(scenario())
    assert good == (["good"], 1)
    assert sent == [["a"], ["bad", "good"], ["good"]] and calls.calls_sent == 3 and calls.records_sent == 4


def test_a_caller_who_left_after_its_call_was_taken_off_the_queue_is_not_sent(loop):
    """Two callers share a pending call. One is cancelled as the call in flight returns: it leaves after the
    shared call's task was made, before the task first ran. Only the other's records go."""
    async def scenario():
        gate, sent, waiting = asyncio.Event(), [], {}

        async def send(key, records):
            sent.append(list(records))
            if records == ["first"]:
                await gate.wait()
                # before this call's end reaches the coalescer, which then makes the shared call's task
                asyncio.get_running_loop().call_soon(waiting["gone"].cancel)
            return [f"{key}:{r}" for r in records], len(records)

        calls = CallCoalescer(send, lambda r, a, b: (r[0][a:b], r[1]), max_records=4, max_inflight_calls=1)
        first = asyncio.ensure_future(calls.submit("k", ["first"]))
        await until(lambda: len(sent) == 1)
        waiting["gone"], stays = (asyncio.ensure_future(calls.submit("k", [text])) for text in ("gone", "stays"))
        await until(lambda: len(calls._pending) == 1 and calls._pending[0].records == 2)
        gate.set()
        await first
        return await stays, waiting["gone"].cancelled(), sent, calls

    stays, left, sent, calls = loop.run_until_complete(scenario())
    assert left and stays == (["k:stays"], 1)
    assert sent == [["first"], ["stays"]] and calls.records_sent == 2 and calls.inflight == 0


def test_calls_of_their_own_after_a_failed_shared_call_keep_to_the_in_flight_limit_and_are_counted(loop):
    """A model failing for everyone: the shared call of 8 callers fails, then each caller's records go
    alone, at most max_inflight_calls (1) at a time, and every call is counted."""
    async def scenario():
        gate, sent, now, most = asyncio.Event(), [], [0], [0]

        async def send(key, records):
            sent.append(list(records))
            now[0] += 1
            most[0] = max(most[0], now[0])
            try:
                await gate.wait()
                await asyncio.sleep(0)
                raise InternalError("Translator failed; logged.")
            finally:
                now[0] -= 1

        calls = CallCoalescer(send, lambda r, a, b: r, max_records=8, max_inflight_calls=1)
        first = asyncio.ensure_future(calls.submit(None, ["a"]))
        await until(lambda: len(sent) == 1)
        shared = [asyncio.ensure_future(calls.submit(None, [f"r{i}"])) for i in range(8)]
        await until(lambda: len(calls._pending) == 1 and calls._pending[0].records == 8)
        gate.set()
        await asyncio.gather(first, *shared, return_exceptions=True)
        return shared, sent, most[0], calls

    shared, sent, most, calls = loop.run_until_complete(scenario())
    assert all(isinstance(s.exception(), InternalError) for s in shared)
    assert len(sent) == 10 and most == 1  # the shared call, then its 8 callers one at a time
    assert calls.calls_sent == 10 and calls.records_sent == 17 and calls.inflight == 0


def test_a_bug_past_the_call_s_handling_is_a_500_for_its_callers_not_a_cancellation(loop):
    """A result the slicing fails on (a model returning None) ended the shared call's task with an exception, and its
    callers' futures were cancelled: each request was taken for one whose client had gone (499) and got no answer."""
    async def send(key, records):
        return None

    async def scenario():
        calls = CallCoalescer(send, lambda r, a, b: (r[0][a:b], r[1]), max_records=8, max_inflight_calls=1)
        return await asyncio.gather(*(calls.submit(None, [text]) for text in ("a", "b")), return_exceptions=True)

    outcomes = loop.run_until_complete(scenario())
    assert all(isinstance(o, InternalError) for o in outcomes), outcomes
