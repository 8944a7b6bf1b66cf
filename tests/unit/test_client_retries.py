"""serve_app.client's retries and its job poller, from a second read-only review (2026-11-30): a job submission is
sent again (same Idempotency-Key) after a 502/504, a call's deadline shrinks on each retry, a malformed answer or a
broken result page fails the job's future in both clients instead of stopping the sync poller or polling forever,
an error body that is not an object keeps its status, and closing the async client stops its jobs' pollers."""

from __future__ import annotations

import asyncio
import dataclasses
import time

import httpx
import pytest

from serve_app.client import AsyncClient, Client, ServeAppHTTPError

from .test_client import FAST_POLL, NO_WAIT, FakeJobServer, overloaded, translation_ok


class TimesOutOnceAfterWriting(FakeJobServer):
    """The first POST writes the job, then answers 504 (the ingress's deadline passed); a POST with a key already
    seen answers with that key's job, as the JobManager does (docs/jobs.md)."""

    def __init__(self):
        super().__init__(polls_before_done=0)
        self.keys: dict[str, str] = {}
        self.posts = 0

    def __call__(self, request):
        if request.method != "POST":
            return super().__call__(request)
        self.posts += 1
        key = request.headers["Idempotency-Key"]
        if key in self.keys:
            return httpx.Response(200, json={"job_id": self.keys[key], "status": "queued"})
        answer = super().__call__(request)
        self.keys[key] = answer.json()["job_id"]
        return httpx.Response(504, json={"error": "deadline", "error_type": "timeout"}) if self.posts == 1 else answer


def test_a_submission_is_sent_again_after_a_504_and_makes_one_job():
    server = TimesOutOnceAfterWriting()
    with Client(transport=httpx.MockTransport(server), retry=FAST_POLL) as client:
        assert client.submit_translation(["a"], source="en", target="pt").result(timeout=10) == ["A"]
    assert server.posts == 2 and len(server.jobs) == 1

    async def scenario():
        async with AsyncClient(transport=httpx.MockTransport(TimesOutOnceAfterWriting()), retry=FAST_POLL) as aio:
            return await asyncio.wait_for(await aio.submit_translation(["b"], source="en", target="pt"), 10)
    assert asyncio.run(scenario()) == ["B"]


def test_each_retry_asks_for_what_is_left_of_the_deadline_and_none_is_sent_once_it_passed():
    sent, pause_s = [], [0.05]

    def handler(request):
        sent.append(int(request.headers["X-Request-Timeout-Ms"]))
        time.sleep(pause_s[0])
        return overloaded() if len(sent) < 3 else translation_ok(request)
    with Client(transport=httpx.MockTransport(handler), retry=NO_WAIT) as client:
        assert client.translate(["a"], source="en", target="pt", deadline_ms=2000) == ["A"]
    assert sent[0] <= 2000 and sent[1] <= sent[0] - 40 and sent[2] <= sent[1] - 40
    sent.clear()
    pause_s[0] = 0.25
    with Client(transport=httpx.MockTransport(handler), retry=NO_WAIT) as client:
        with pytest.raises(ServeAppHTTPError) as raised:
            client.translate(["a"], source="en", target="pt", deadline_ms=200)  # 503 after 0.25 s: none left
    assert raised.value.status_code == 504 and raised.value.error_type == "timeout" and len(sent) == 1


def test_no_retry_waits_past_the_call_s_deadline(monkeypatch):
    """A 503 asking for 2 s against deadline_ms=300: the client slept the 2 s, then raised the 504 (2.17 s for a
    300 ms deadline in a review). Now it raises it at once, without the wait, sync and async alike."""
    import tenacity

    slept = []
    monkeypatch.setattr(tenacity.nap.time, "sleep", slept.append)  # (the sync loop's sleep, were it to wait)
    handler = lambda request: overloaded(retry_after="2")  # noqa: E731
    with Client(transport=httpx.MockTransport(handler)) as client:
        with pytest.raises(ServeAppHTTPError) as raised:
            client.translate(["a"], source="en", target="pt", deadline_ms=300)
    assert raised.value.status_code == 504 and "would pass" in str(raised.value) and slept == []

    async def scenario():
        async with AsyncClient(transport=httpx.MockTransport(handler)) as aio:
            return await asyncio.wait_for(aio.translate(["a"], source="en", target="pt", deadline_ms=300), 1.5)
    with pytest.raises(ServeAppHTTPError, match="would pass"):
        asyncio.run(scenario())  # (sleeping the 2 s would be a TimeoutError here)
    with Client(transport=httpx.MockTransport(scripted_after_wait := _ok_after_one_503())) as client:
        assert client.translate(["a"], source="en", target="pt", deadline_ms=60_000) == ["A"]  # a wait that fits
    assert scripted_after_wait.calls == 2 and len(slept) == 1


def _ok_after_one_503():
    def handler(request):
        handler.calls += 1
        return overloaded(retry_after="1") if handler.calls == 1 else translation_ok(request)
    handler.calls = 0
    return handler


class Broken(FakeJobServer):
    """Job `job0`'s poll answers a 200 that is not JSON; job1 finishes, its result's second page fails with a 500;
    job2 finishes normally."""

    def __init__(self):
        super().__init__(polls_before_done=0)
        self.page_reads = 0

    def __call__(self, request):
        if request.method == "GET" and request.url.params.get("offset"):  # the second page
            self.page_reads += 1
            return httpx.Response(500, json={"error": "broken", "error_type": "internal_error"})
        answer = super().__call__(request)
        if request.method == "GET" and request.url.path.endswith("/job0"):
            return httpx.Response(200, text="<html>a proxy's page</html>")
        if request.method == "GET" and request.url.path.endswith("/job1"):
            return httpx.Response(200, json={**answer.json(), "page": {"next": "/jobs/job1?offset=1&limit=1"}})
        return answer


def test_a_malformed_answer_or_a_broken_page_fails_its_future_and_the_sync_poller_goes_on():
    server = Broken()
    with Client(transport=httpx.MockTransport(server), retry=FAST_POLL) as client:
        jobs = [client.submit_translation([t], source="en", target="pt") for t in "abc"]
        with pytest.raises(ValueError):  # JSONDecodeError: the poller thread had died and every future hung
            jobs[0].result(timeout=10)
        with pytest.raises(ServeAppHTTPError, match="internal_error"):  # it had been read again forever
            jobs[1].result(timeout=10)
        assert jobs[2].result(timeout=10) == ["C"]
    assert server.page_reads == 1

    async def scenario():
        async with AsyncClient(transport=httpx.MockTransport(Broken()), retry=FAST_POLL) as aio:
            jobs = [await aio.submit_translation([t], source="en", target="pt") for t in "ab"]
            return await asyncio.gather(*(asyncio.wait_for(job, 10) for job in jobs), return_exceptions=True)
    first, second = asyncio.run(scenario())
    assert isinstance(first, ValueError) and isinstance(second, ServeAppHTTPError)


@pytest.mark.parametrize("body", ['"Bad Gateway"', '["forbidden"]', "<html>502</html>"])
def test_an_error_body_that_is_not_the_service_s_object_keeps_its_status(body):
    with Client(transport=httpx.MockTransport(lambda request: httpx.Response(502, text=body))) as client:
        with pytest.raises(ServeAppHTTPError) as raised:
            client.models()
    assert raised.value.status_code == 502 and raised.value.error_type == "unknown" and raised.value.error == body


def test_closing_the_async_client_stops_its_jobs_pollers():
    async def scenario():
        client = AsyncClient(transport=httpx.MockTransport(FakeJobServer(polls_before_done=10**6)), retry=FAST_POLL)
        job = await client.submit_translation(["a"], source="en", target="pt")
        await client.aclose()
        with pytest.raises(RuntimeError, match="closed before the job finished"):
            await asyncio.wait_for(job, 5)
        assert job.done()
    asyncio.run(scenario())


def test_a_submission_the_client_gave_up_on_is_sent_again_under_its_own_key():
    """Retries run out (or the deadline) after the first POST was written: with a fresh key per submit*() the caller
    could only submit again, and the service made a second job. The caller's key makes it the first job."""
    server = TimesOutOnceAfterWriting()
    no_retry = dataclasses.replace(FAST_POLL, max_retries=0)
    with Client(transport=httpx.MockTransport(server), retry=no_retry) as client:
        with pytest.raises(ServeAppHTTPError, match="timeout"):
            client.submit_translation(["a"], source="en", target="pt", idempotency_key="order-7")
        again = client.submit_translation(["a"], source="en", target="pt", idempotency_key="order-7")
        assert again.result(timeout=10) == ["A"]
        with pytest.raises(ValueError, match="idempotency_key"):
            client.submit_predict("iris", [{}], idempotency_key=" ")
    assert server.posts == 2 and len(server.jobs) == 1 and list(server.keys) == ["order-7"]

    async def scenario():
        server = TimesOutOnceAfterWriting()
        async with AsyncClient(transport=httpx.MockTransport(server), retry=no_retry) as aio:
            with pytest.raises(ServeAppHTTPError):
                await aio.submit_embeddings(["b"], idempotency_key="k")
            await aio.submit_embeddings(["b"], idempotency_key="k")
        return server
    assert len(asyncio.run(scenario()).jobs) == 1
