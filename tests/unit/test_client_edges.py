"""serve_app.client's edges found by a read-only review (2026-11-30): one string is not a list of texts, a wait
never comes before Retry-After, `models()` raises the service's errors, and a job is polled through a passing
502/503/504 (a 504 deadline) instead of failing its future while the job runs on; a 500 still fails it."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from serve_app.client import AsyncClient, Client, RetryPolicy, ServeAppHTTPError

from .test_client import FAST_POLL, FakeJobServer


def test_one_string_is_refused_instead_of_sent_as_one_text_per_character():
    sent = []
    with Client(transport=httpx.MockTransport(lambda request: sent.append(request))) as client:
        for call in (lambda: client.embed("The food was delicious."),
                     lambda: client.translate("Hi!", source="en", target="pt"),
                     lambda: client.submit_embeddings("Hi!"),
                     lambda: client.submit_translation("Hi!", source="en", target="pt")):
            with pytest.raises(TypeError, match="not one string"):
                call()
    assert sent == []


def test_a_wait_never_comes_before_retry_after_below_the_cap():
    policy = RetryPolicy(max_retry_wait_s=10.0, jitter=0.2)
    waits = [policy.wait_s(httpx.Response(503, headers={"Retry-After": "9"})) for _ in range(500)]
    assert min(waits) >= 9 and max(waits) <= 10
    capped = [policy.wait_s(httpx.Response(503, headers={"Retry-After": "60"})) for _ in range(500)]
    assert min(capped) >= 8 and max(capped) <= 10 and len(set(capped)) > 100


def test_models_raises_the_service_s_error_with_its_type():
    def refused(request):
        return httpx.Response(401, json={"error": "no key", "error_type": "unauthorized"})

    with Client(transport=httpx.MockTransport(refused)) as client:
        with pytest.raises(ServeAppHTTPError) as raised:
            client.models()
    assert raised.value.error_type == "unauthorized"

    async def scenario():
        async with AsyncClient(transport=httpx.MockTransport(refused)) as client:
            await client.models()

    with pytest.raises(ServeAppHTTPError, match="unauthorized"):
        asyncio.run(scenario())


class PassingErrors(FakeJobServer):
    """The first GETs of each job answer a 504 (the ingress's deadline on the JobManager call), then a 502."""

    def __init__(self):
        super().__init__(polls_before_done=1)
        self.errors: dict[str, int] = {}

    def __call__(self, request):
        if request.method == "GET":
            job_id = request.url.path.rsplit("/", 1)[-1]
            seen = self.errors[job_id] = self.errors.get(job_id, 0) + 1
            if seen <= 2:
                status, kind = (504, "timeout") if seen == 1 else (502, "bad_gateway")
                return httpx.Response(status, json={"error": "passing", "error_type": kind})
        return super().__call__(request)


def test_a_job_is_polled_through_a_passing_504_or_502_by_both_clients():
    with Client(transport=httpx.MockTransport(PassingErrors()), retry=FAST_POLL) as client:
        assert client.submit_translation(["a"], source="en", target="pt").result(timeout=10) == ["A"]

    async def scenario():
        async with AsyncClient(transport=httpx.MockTransport(PassingErrors()), retry=FAST_POLL) as client:
            return await asyncio.wait_for(await client.submit_translation(["b"], source="en", target="pt"), 10)

    assert asyncio.run(scenario()) == ["B"]


@pytest.mark.parametrize("bad", [0, -5, 2.5, True])
def test_a_deadline_must_be_whole_milliseconds_from_one(bad):
    """`deadline_ms=0` sent no deadline at all (the header was left out for any falsy value)."""
    sent = []
    with Client(transport=httpx.MockTransport(lambda request: sent.append(request))) as client:
        with pytest.raises(ValueError, match="deadline_ms must be"):
            client.translate(["a"], source="en", target="pt", deadline_ms=bad)
    assert sent == []


def test_result_pages_are_read_under_the_client_s_base_url_with_a_path():
    """Behind a gateway that strips a prefix (the service sets no root_path), `page.next` is /jobs/<id>?...: joined to
    the base URL http://gw/serve-app it became http://gw/jobs/..., a 404 for every result past one page."""
    seen = []

    def handler(request):
        seen.append(str(request.url))
        second = request.url.params.get("offset") == "1"
        return httpx.Response(200, json={"job_id": "j 1", "status": "succeeded", "error": None,
                                         "result": {"result": [{"id": str(int(second)), "text": "AB"[second]}]},
                                         "page": {"offset": int(second), "limit": 1, "records": 1,
                                                  "next": None if second else "/jobs/j%201?offset=1&limit=1"}})
    with Client("http://gw/serve-app", transport=httpx.MockTransport(handler)) as client:
        view = client._whole(client.job("j 1"))
    assert [r["text"] for r in view["result"]["result"]] == ["A", "B"]
    assert seen == ["http://gw/serve-app/jobs/j%201", "http://gw/serve-app/jobs/j%201?offset=1&limit=1"]
