"""The ingress's waiting room (ingress.max_waiting_requests, max_wait_s): past max_inflight_requests a
request waits for the next free slot, oldest first, instead of a 503 at once; a full room or a wait that
runs out is 503 + Retry-After, and a drain refuses the room at once."""

import asyncio
import threading
import time

from serve_app.admission import DRAIN

from .fakes import FakeTranslator, install
from .test_api import assert_error, body, client  # noqa: F401 - the fixture


def _send_all(client, count):  # noqa: F811
    results = []

    def send():
        results.append(client.post("/translation", json=body([{"id": "1", "text": "hi"}])))

    threads = [threading.Thread(target=send) for _ in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def test_requests_past_the_limit_wait_for_a_slot_instead_of_a_503(client):  # noqa: F811
    translator, _ = install(FakeTranslator(delay_s=0.3), ingress={
        "max_inflight_requests": 2, "max_waiting_requests": 4, "max_wait_s": 10})
    results = _send_all(client, 6)
    assert sorted(r.status_code for r in results) == [200] * 6
    assert translator.max_in_flight == 2  # the limit still holds: the others waited their turn
    assert DRAIN.in_flight == 0 and not DRAIN.waiting


def test_a_full_waiting_room_is_refused_at_once(client):  # noqa: F811
    from serve_app.api import recorder

    install(FakeTranslator(delay_s=1.0), ingress={"max_inflight_requests": 2, "max_waiting_requests": 1,
                                                  "max_wait_s": 10, "retry_after_s": 3})
    before = recorder.shed["capacity"]
    results = _send_all(client, 6)
    assert recorder.shed["capacity"] - before == 3  # serve_app_shed_total{reason="capacity"}
    assert sorted(r.status_code for r in results) == [200, 200, 200, 503, 503, 503]
    for r in results:
        if r.status_code == 503:
            assert_error(r, 503, "overloaded")
            assert r.headers["Retry-After"] == "3"
    assert DRAIN.in_flight == 0 and not DRAIN.waiting


def test_a_wait_that_runs_out_is_503_and_leaves_no_slot_behind(client):  # noqa: F811
    install(FakeTranslator(delay_s=1.0), ingress={"max_inflight_requests": 1, "max_waiting_requests": 4,
                                                  "max_wait_s": 0.2})
    results = _send_all(client, 3)
    assert sorted(r.status_code for r in results) == [200, 503, 503]
    assert DRAIN.in_flight == 0 and not DRAIN.waiting
    assert client.post("/translation", json=body([{"id": "1", "text": "hi"}])).status_code == 200


def test_a_drain_refuses_the_waiting_room_at_once():
    async def scenario():
        loop = asyncio.get_running_loop()
        DRAIN.in_flight, DRAIN.draining = 1, False
        waiter = loop.create_future()
        DRAIN.waiting.append(waiter)
        drained = asyncio.ensure_future(DRAIN.drain(timeout_s=0.2, poll_s=0.01))
        assert await asyncio.wait_for(waiter, 1) is False and not drained.done()  # refused before the wait
        DRAIN.release()  # the admitted request finishes: its slot is not handed on while draining
        await drained
        assert DRAIN.in_flight == 0 and not DRAIN.waiting
    try:
        asyncio.run(scenario())
    finally:
        DRAIN.in_flight, DRAIN.draining = 0, False


def test_a_drain_from_another_thread_refuses_the_waiting_room_on_its_loop():
    """The launcher's drain runs on a thread of its own (drain_signal.py): a waiter is still refused at
    once, not when its own wait runs out."""
    async def scenario():
        loop = asyncio.get_running_loop()
        DRAIN.in_flight, DRAIN.draining = 1, False
        waiter = loop.create_future()
        DRAIN.waiting.append(waiter)
        def drain_later():
            time.sleep(0.1)  # this loop is asleep in its selector by then
            asyncio.run(DRAIN.drain(timeout_s=0.5, poll_s=0.01))

        drainer = threading.Thread(target=drain_later)
        start = time.monotonic()
        drainer.start()
        try:
            assert await asyncio.wait_for(waiter, 3) is False
            assert time.monotonic() - start < 1.5  # woken by the refusal, not by the 3 s timer
        finally:
            DRAIN.in_flight = 0
            await asyncio.to_thread(drainer.join)
        assert not DRAIN.waiting
    try:
        asyncio.run(scenario())
    finally:
        DRAIN.in_flight, DRAIN.draining = 0, False


def test_a_waiter_that_left_frees_its_place_in_the_waiting_room():
    """A request whose client left while it waited gives its place up at once, not at the next release."""
    import httpx

    from serve_app.api import app

    class Slow(FakeTranslator):
        async def call(self, method, *args, **kwargs):
            if method == "translate" and args[0].texts == ["slow"]:
                await asyncio.sleep(1.0)
            return await super().call(method, *args, **kwargs)

    install(Slow(), ingress={"max_inflight_requests": 1, "max_waiting_requests": 1, "max_wait_s": 5.0},
            cache={"enabled": False})

    async def scenario():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
            slow = asyncio.create_task(c.post("/translation", json=body([{"id": "1", "text": "slow"}])))
            while not DRAIN.in_flight:
                await asyncio.sleep(0.01)
            gone = asyncio.create_task(c.post("/translation", json=body([{"id": "1", "text": "gone"}])))
            while not DRAIN.waiting:
                await asyncio.sleep(0.01)
            gone.cancel()  # its client disconnects while it waits
            await asyncio.gather(gone, return_exceptions=True)
            late = await c.post("/translation", json=body([{"id": "1", "text": "late"}]))
            await slow
            return late.status_code

    assert asyncio.run(scenario()) == 200  # it waited in the place the gone one left, not a 503 at once
    assert DRAIN.in_flight == 0 and not DRAIN.waiting


def test_a_cors_preflight_neither_takes_nor_waits_for_a_slot(client):  # noqa: F811
    """Browsers send OPTIONS before a cross-origin POST, without a key: it costs no model time, so it is
    answered while the replica is full, and it holds no slot."""
    install(FakeTranslator(delay_s=1.0), ingress={"max_inflight_requests": 1, "max_waiting_requests": 0})
    results = []
    busy = threading.Thread(target=lambda: results.append(client.post("/translation", json=body(
        [{"id": "1", "text": "hi"}]))))
    busy.start()
    while not DRAIN.in_flight:
        time.sleep(0.01)
    preflight = client.options("/translation")
    assert preflight.status_code != 503 and DRAIN.in_flight == 1
    busy.join()
    assert results[0].status_code == 200 and DRAIN.in_flight == 0


def test_a_slot_freed_while_draining_is_not_handed_to_a_waiter():
    """`drain` runs on the launcher's thread: a request finishing before its refusal reached the loop (or a waiter
    that came in after the drain looked) was handed the slot and admitted on a draining replica."""
    async def scenario():
        DRAIN.in_flight, DRAIN.draining = 1, True  # the flag is set; the refusal has not run on this loop
        waiter = asyncio.get_running_loop().create_future()
        DRAIN.waiting.append(waiter)
        DRAIN.release()
        assert waiter.result() is False and DRAIN.in_flight == 0 and not DRAIN.waiting
    try:
        asyncio.run(scenario())
    finally:
        DRAIN.in_flight, DRAIN.draining = 0, False
        DRAIN.waiting.clear()


def test_a_model_s_card_is_not_model_work(client):  # noqa: F811
    """`GET /models/<id>` (the OpenAI SDK's models.retrieve without /v1) matched the `/models/` prefix of the predict
    routes: it took a slot and was shed with 503 when the replica was full."""
    install(FakeTranslator(), ingress={"max_inflight_requests": 1, "max_waiting_requests": 0})
    model_id = client.get("/models").json()["data"][0]["id"]
    DRAIN.in_flight = 1  # the replica is full
    try:
        assert client.get(f"/models/{model_id}").status_code == 200
        assert_error(client.post("/models/iris/predict", json={"inputs": []}), 503, "overloaded")
    finally:
        DRAIN.in_flight = 0
