"""The ingress's waiting room (ingress.max_waiting_requests, max_wait_s): past max_inflight_requests a
request waits for the next free slot, oldest first, instead of a 503 at once; a full room or a wait that
runs out is 503 + Retry-After, and a drain refuses the room at once."""

import asyncio
import threading

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
    install(FakeTranslator(delay_s=1.0), ingress={"max_inflight_requests": 2, "max_waiting_requests": 1,
                                                  "max_wait_s": 10, "retry_after_s": 3})
    results = _send_all(client, 6)
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
        await asyncio.sleep(0)
        assert waiter.result() is False  # refused before the drain's wait
        DRAIN.release()  # the admitted request finishes: its slot is not handed on while draining
        await drained
        assert DRAIN.in_flight == 0 and not DRAIN.waiting
    try:
        asyncio.run(scenario())
    finally:
        DRAIN.in_flight, DRAIN.draining = 0, False
