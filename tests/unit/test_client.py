"""serve_app.client against a mock transport: what is retried, what is raised."""

import asyncio

import httpx
import pytest

from serve_app.client import AsyncClient, Client, JobCancelled, RetryPolicy, ServeAppHTTPError

NO_WAIT = RetryPolicy(max_retries=3, default_wait_s=0.0, max_retry_wait_s=0.0)


def translation_ok(request: httpx.Request) -> httpx.Response:
    import json
    records = json.loads(request.content)["payload"]["records"]
    return httpx.Response(200, json={"result": [{"id": r["id"], "text": r["text"].upper()} for r in records]})


def overloaded(retry_after="1"):
    return httpx.Response(503, headers={"Retry-After": retry_after},
                          json={"error": "at capacity", "error_type": "overloaded"})


def scripted(*responses):
    calls = []

    def handler(request):
        calls.append(request)
        step = responses[min(len(calls) - 1, len(responses) - 1)]
        if isinstance(step, Exception):
            raise step
        return step(request) if callable(step) else step

    return handler, calls


def test_503_is_retried_after_retry_after_then_succeeds():
    handler, calls = scripted(overloaded(), overloaded(), translation_ok)
    with Client(transport=httpx.MockTransport(handler), retry=NO_WAIT) as client:
        assert client.translate(["a", "b"], source="en", target="pt") == ["A", "B"]
    assert len(calls) == 3


def test_503_beyond_max_retries_raises_with_the_error_type():
    handler, calls = scripted(overloaded())
    with Client(transport=httpx.MockTransport(handler), retry=NO_WAIT) as client:
        with pytest.raises(ServeAppHTTPError) as err:
            client.translate(["a"], source="en", target="pt")
    assert err.value.status_code == 503 and err.value.error_type == "overloaded" and err.value.retry_after_s == 1
    assert len(calls) == 4  # 1 + 3 retries


@pytest.mark.parametrize("status, error_type", [(400, "unsupported_language_pair"), (422, "invalid_request"),
                                                (413, "payload_too_large"), (504, "timeout")])
def test_client_errors_are_not_retried(status, error_type):
    handler, calls = scripted(httpx.Response(status, json={"error": "no", "error_type": error_type}))
    with Client(transport=httpx.MockTransport(handler), retry=NO_WAIT) as client:
        with pytest.raises(ServeAppHTTPError, match=error_type):
            client.translate(["a"], source="en", target="de")
    assert len(calls) == 1


def test_connection_errors_are_retried():
    handler, calls = scripted(httpx.ConnectError("refused"), translation_ok)
    with Client(transport=httpx.MockTransport(handler), retry=NO_WAIT) as client:
        assert client.translate(["x"], source="en", target="pt") == ["X"]
    assert len(calls) == 2


def test_retry_after_is_honoured_and_capped():
    policy = RetryPolicy(default_wait_s=1.5, max_retry_wait_s=5, jitter=0.0)
    assert policy.wait_s(httpx.Response(503, headers={"Retry-After": "2"})) == 2
    assert policy.wait_s(httpx.Response(503, headers={"Retry-After": "120"})) == 5
    assert policy.wait_s(httpx.Response(503)) == 1.5
    assert policy.wait_s(None) == 1.5


def test_waits_have_jitter_within_their_cap():
    policy = RetryPolicy(max_retry_wait_s=5)  # jitter 0.2: 2 s becomes 2-2.4 s
    waits = [policy.wait_s(httpx.Response(503, headers={"Retry-After": "2"})) for _ in range(200)]
    assert all(2 <= w <= 2.4 for w in waits) and len(set(waits)) > 100
    capped = [policy.wait_s(httpx.Response(503, headers={"Retry-After": "60"})) for _ in range(200)]
    assert all(4 <= w <= 5 for w in capped) and len(set(capped)) > 100  # at the cap, still spread


def test_retry_after_in_seconds_or_as_a_date_and_nothing_unreadable():
    from email.utils import format_datetime
    from datetime import datetime, timedelta, timezone

    from serve_app.client.wire import retry_after_s

    assert retry_after_s("2") == 2 and retry_after_s("0.5") == 0.5 and retry_after_s("-3") == 0
    in_5_s = format_datetime(datetime.now(timezone.utc) + timedelta(seconds=5), usegmt=True)
    assert 3 <= retry_after_s(in_5_s) <= 5
    assert all(retry_after_s(v) is None for v in (None, "", "nan", "inf", "soon"))
    policy = RetryPolicy(default_wait_s=1.5, jitter=0.0)
    assert policy.wait_s(httpx.Response(503, headers={"Retry-After": "nan"})) == 1.5  # was NaN: a crash


def test_a_call_outlasts_the_services_own_deadline_by_default():
    """The service answers 504 at ingress.model_timeout_s; a client timing out at the same moment would
    send the doomed request again instead of reporting the 504."""
    from serve_app.settings import load_settings

    deadline = load_settings(None).ingress.model_timeout_s
    import inspect

    assert all(inspect.signature(cls).parameters["timeout_s"].default > deadline for cls in (Client, AsyncClient))


def test_ids_and_deadline_are_sent():
    seen = {}

    def handler(request):
        import json
        seen["records"] = json.loads(request.content)["payload"]["records"]
        seen["deadline"] = request.headers.get("X-Request-Timeout-Ms")
        return translation_ok(request)

    with Client(transport=httpx.MockTransport(handler)) as client:
        client.translate(["a"], source="en", target="pt", ids=["id-7"], deadline_ms=250)
    assert seen == {"records": [{"id": "id-7", "text": "a"}], "deadline": "250"}
    with pytest.raises(ValueError, match="2 ids for 1 texts"):
        Client().translate(["a"], source="en", target="pt", ids=["1", "2"])


def test_async_client_retries_and_orders_embeddings():
    def embeddings(request):
        return httpx.Response(200, json={"object": "list", "model": "m", "usage": {},
                                         "data": [{"index": 1, "embedding": [2.0]}, {"index": 0, "embedding": [1.0]}]})

    handler, calls = scripted(overloaded("0"), embeddings)

    async def go():
        async with AsyncClient(transport=httpx.MockTransport(handler), retry=NO_WAIT) as client:
            return await client.embed(["a", "b"])

    assert asyncio.run(go()) == [[1.0], [2.0]]
    assert len(calls) == 2


FAST_POLL = RetryPolicy(max_retries=3, default_wait_s=0.0, max_retry_wait_s=0.0,
                        poll_interval_s=0.001, max_poll_interval_s=0.005)


class FakeJobServer:
    """POST/GET/DELETE /jobs: each job reports `running` for `polls_before_done` GETs, then its end."""

    def __init__(self, end="succeeded", polls_before_done=3):
        import json
        self.json = json
        self.end, self.polls_before_done = end, polls_before_done
        self.jobs: dict[str, dict] = {}
        self.deleted: list[str] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        if request.method == "POST":
            body = self.json.loads(request.content)
            job_id = f"job{len(self.jobs)}"
            self.jobs[job_id] = {"body": body, "polls": 0, "status": "queued"}
            return httpx.Response(202, json={"job_id": job_id, "status": "queued"})
        job_id = request.url.path.rsplit("/", 1)[-1]
        job = self.jobs.get(job_id)
        if job is None:
            return httpx.Response(404, json={"error": "no such job", "error_type": "job_not_found"})
        if request.method == "DELETE":
            if job["status"] in ("succeeded", "failed", "cancelled"):
                return httpx.Response(409, json={"error": "finished", "error_type": "job_finished"})
            job["status"] = "cancelled"
            self.deleted.append(job_id)
            return httpx.Response(200, json={"job_id": job_id, "status": "cancelled"})
        job["polls"] += 1
        if job["status"] != "cancelled":
            job["status"] = self.end if job["polls"] > self.polls_before_done else "running"
        view = {"job_id": job_id, "status": job["status"], "result": None, "error": None}
        if job["status"] == "succeeded":
            records = job["body"]["payload"]["records"]
            view["result"] = {"result": [{"id": r["id"], "text": r["text"].upper()} for r in records]}
        if job["status"] == "failed":
            view["error"] = {"error": "model broke", "error_type": "internal_error"}
        return httpx.Response(200, json=view)


def test_submitted_jobs_resolve_their_futures_with_the_parsed_result():
    server = FakeJobServer()
    with Client(transport=httpx.MockTransport(server), retry=FAST_POLL) as client:
        jobs = [client.submit_translation([f"text {i}", "more"], source="en", target="pt") for i in range(3)]
        assert [job.result(timeout=10) for job in jobs] == [[f"TEXT {i}", "MORE"] for i in range(3)]
        raw = client.submit("translation", {"fromLang": "en", "toLang": "pt", "records": [{"id": "a", "text": "x"}]})
        assert raw.result(timeout=10) == {"result": [{"id": "a", "text": "X"}]}
    assert all(job["polls"] == 4 for job in server.jobs.values())


def test_a_failed_job_raises_its_error_type_and_cancel_deletes_on_the_server():
    with Client(transport=httpx.MockTransport(FakeJobServer(end="failed")), retry=FAST_POLL) as client:
        with pytest.raises(ServeAppHTTPError) as raised:
            client.submit_translation(["x"], source="en", target="pt").result(timeout=10)
        assert raised.value.error_type == "internal_error"
    server = FakeJobServer(polls_before_done=10**9)
    with Client(transport=httpx.MockTransport(server), retry=FAST_POLL) as client:
        job = client.submit_translation(["x"], source="en", target="pt")
        assert job.status() == "running"
        assert job.cancel() and job.cancelled()
        assert server.deleted == [job.job_id]


def test_async_jobs_are_awaitable_and_cancellable():
    async def scenario():
        server = FakeJobServer()
        async with AsyncClient(transport=httpx.MockTransport(server), retry=FAST_POLL) as client:
            job = await client.submit_translation(["a", "b"], source="en", target="pt")
            result = await job
            slow = FakeJobServer(polls_before_done=10**9)
            client._http._transport = httpx.MockTransport(slow)
            pending = await client.submit_translation(["c"], source="en", target="pt")
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(pending, 0.05)  # the caller's wait ends; the poller keeps polling
            assert not pending.done()
            assert await pending.cancel()
            with pytest.raises(JobCancelled):
                await pending
            return result, slow.deleted

    result, deleted = asyncio.run(scenario())
    assert result == ["A", "B"] and deleted == ["job0"]


def test_a_submission_carries_one_idempotency_key_across_its_retries_and_a_fresh_one_per_call():
    server = FakeJobServer()
    attempts = []

    def flaky(request):
        attempts.append(request)
        if len(attempts) == 1:
            raise httpx.ReadTimeout("the first attempt reached the service, its answer did not come back")
        if len(attempts) == 2:
            return overloaded("0")
        return server(request)

    with Client(transport=httpx.MockTransport(flaky), retry=FAST_POLL) as client:
        first = client.submit_translation(["x"], source="en", target="pt")
        second = client.submit_translation(["y"], source="en", target="pt")
        assert first.result(timeout=10) == ["X"] and second.result(timeout=10) == ["Y"]
    posts = [r for r in attempts if r.method == "POST"]
    keys = [r.headers["Idempotency-Key"] for r in posts]
    assert len(posts) == 4 and keys[0] == keys[1] == keys[2] != keys[3] and len(keys[0]) >= 32
    # a submission's own timeout outlasts the service's 60 s deadline; other calls keep theirs
    assert posts[0].extensions["timeout"]["read"] == 90.0
    assert client.submit_timeout_s > 60


def test_the_async_poller_waits_out_a_503_and_both_clients_read_every_page():
    pages = {
        "/jobs/job0": {"job_id": "job0", "status": "succeeded", "error": None,
                       "result": {"result": [{"id": "0", "text": "A"}]},
                       "page": {"offset": 0, "limit": 1, "records": 1, "next": "/jobs/job0?offset=1&limit=1"}},
        "/jobs/job0?offset=1&limit=1": {"job_id": "job0", "status": "succeeded", "error": None,
                                        "result": {"result": [{"id": "1", "text": "B"}]},
                                        "page": {"offset": 1, "limit": 1, "records": 1, "next": None}},
    }
    gets = []

    def handler(request):
        if request.method == "POST":
            return httpx.Response(202, json={"job_id": "job0", "status": "queued"})
        gets.append(request)
        if len(gets) == 1:
            return overloaded("0")  # the JobManager restarting: 503, then the job again
        path = request.url.raw_path.decode()
        return httpx.Response(200, json=pages[path])

    async def scenario():
        async with AsyncClient(transport=httpx.MockTransport(handler), retry=FAST_POLL) as client:
            return await (await client.submit_translation(["a", "b"], source="en", target="pt"))

    assert asyncio.run(scenario()) == ["A", "B"]
    gets.clear()
    gets.append(None)  # no 503 this time
    with Client(transport=httpx.MockTransport(handler), retry=FAST_POLL) as client:
        assert client.submit_translation(["a", "b"], source="en", target="pt").result(timeout=10) == ["A", "B"]


def test_a_call_stops_retrying_before_its_deadline():
    handler, calls = scripted(overloaded("5"), overloaded("5"), translation_ok)
    policy = RetryPolicy(max_retries=5, max_retry_wait_s=10, jitter=0.0, deadline_s=2.0)
    with Client(transport=httpx.MockTransport(handler), retry=policy) as client:
        with pytest.raises(ServeAppHTTPError) as err:
            client.translate(["x"], source="en", target="pt")
    # the first wait (Retry-After 5 s) would end past the 2 s deadline: one attempt, its 503 raised
    assert len(calls) == 1 and err.value.status_code == 503


def test_each_attempt_gets_at_most_what_remains_of_the_deadline():
    import time

    policy = RetryPolicy(deadline_s=10.0)
    started = time.monotonic() - 7.5
    assert 2.0 <= policy.attempt_timeout(60.0, started) <= 2.5
    assert policy.attempt_timeout(1.0, started) == 1.0
    assert RetryPolicy(deadline_s=None).attempt_timeout(60.0, started) == 60.0
