"""Reliability and security behaviour of the ingress without Ray: API keys, CORS, deadlines,
input cleaning, access log and metrics tallies, replica-death retries, failed deployments.

Why this module is long: one short test per reliability rule of the ingress, all over the same fake model clients and app fixture.
"""

from __future__ import annotations

import asyncio
import json
import logging
from types import SimpleNamespace

import pytest
from fastapi.testclient import TestClient

from serve_app import api
from serve_app.api import app, set_service
from serve_app.errors import ModelUnavailable
from serve_app.middleware import key_matches, presented_key
from serve_app.handle_client import HandleClient
from serve_app.readiness import summarise_failure
from serve_app.settings import load_settings

from .fakes import FakeEmbedder, FakeTranslator, install

BODY = {"payload": {"fromLang": "en", "toLang": "pt", "records": [{"id": "1", "text": "hi"}]}}


@pytest.fixture
def client():
    with TestClient(app, raise_server_exceptions=False) as c:
        yield c
    set_service(None)


def assert_error(resp, status, error_type):
    assert resp.status_code == status, resp.text
    assert resp.json()["error_type"] == error_type and resp.json()["error"]


# --- API keys --------------------------------------------------------------------------------

def test_auth_is_off_by_default(client):
    install()
    assert client.post("/translation", json=BODY).status_code == 200


@pytest.mark.parametrize("headers, status, error_type", [
    ({}, 401, "unauthorized"),
    ({"Authorization": "Bearer wrong"}, 403, "forbidden"),
    ({"X-API-Key": "wrong"}, 403, "forbidden"),
    ({"Authorization": "Basic c2VjcmV0"}, 401, "unauthorized"),
    ({"Authorization": "Bearer k2"}, 200, None),
    ({"authorization": "bearer k1"}, 200, None),
    ({"X-API-Key": "k1"}, 200, None),
])
def test_api_keys(client, headers, status, error_type):
    install(ingress={"api_keys": "k1, k2"})
    resp = client.post("/translation", json=BODY, headers=headers)
    if error_type:
        assert_error(resp, status, error_type)
        if status == 401:
            assert resp.headers["WWW-Authenticate"].startswith("Bearer")
        assert "k1" not in resp.text
    else:
        assert resp.status_code == 200


def test_probes_and_docs_stay_open_with_auth_on(client):
    install(ingress={"api_keys": "k1"})
    for path in ("/healthz", "/readyz", "/openapi.json", "/docs"):
        assert client.get(path).status_code == 200, path
    assert_error(client.get("/v1/models"), 401, "unauthorized")
    assert_error(client.post("/embeddings", json={"input": "x"}), 401, "unauthorized")


def test_api_keys_from_the_environment(monkeypatch):
    monkeypatch.setenv("SERVE_APP_INGRESS_API_KEYS", "a,b")
    settings = load_settings({})
    assert settings.ingress.api_key_list() == ["a", "b"]
    assert "a,b" not in repr(settings.ingress) and "a,b" not in str(settings.model_dump())


def test_key_compare_and_extraction():
    assert key_matches("k2", ["k1", "k2"]) and not key_matches("k", ["k1", "k2"])
    assert presented_key({"headers": [(b"authorization", b"Bearer  tok ")]}) == "tok"
    assert presented_key({"headers": [(b"x-api-key", b"tok")]}) == "tok"
    assert presented_key({"headers": []}) is None


# --- CORS ----------------------------------------------------------------------------------------

def test_cors_is_off_unless_configured(client):
    install()
    resp = client.options("/translation", headers={"Origin": "https://evil.example",
                                                   "Access-Control-Request-Method": "POST"})
    assert "access-control-allow-origin" not in resp.headers
    resp = client.post("/translation", json=BODY, headers={"Origin": "https://evil.example"})
    assert "access-control-allow-origin" not in resp.headers


def test_cors_allows_only_configured_origins(client):
    install(ingress={"cors_origins": "https://app.example", "api_keys": "k1"})
    pre = client.options("/translation", headers={"Origin": "https://app.example",
                                                  "Access-Control-Request-Method": "POST",
                                                  "Access-Control-Request-Headers": "authorization,content-type"})
    assert pre.status_code == 200 and pre.headers["access-control-allow-origin"] == "https://app.example"
    sdk = client.options("/v1/embeddings", headers={  # the OpenAI JavaScript SDK's own headers pass too
        "Origin": "https://app.example", "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization,content-type,x-stainless-lang,x-stainless-retry-count"})
    assert sdk.status_code == 200 and "x-stainless-lang" in sdk.headers["access-control-allow-headers"]
    resp = client.post("/translation", json=BODY, headers={"Origin": "https://app.example", "X-API-Key": "k1"})
    assert resp.headers["access-control-allow-origin"] == "https://app.example"
    other = client.options("/translation", headers={"Origin": "https://evil.example",
                                                    "Access-Control-Request-Method": "POST"})
    assert other.headers.get("access-control-allow-origin") != "https://evil.example"
    # the refusal is the taxonomy's JSON, as every error (Starlette's was plain text)
    assert_error(other, 400, "cors_refused")
    assert "Disallowed CORS origin" in other.json()["error"] and "Origin" in other.headers["vary"]


# --- deadlines -----------------------------------------------------------------------------------

def test_deadline_header_gives_504_promptly_and_cancels(client):
    translator, _ = install(FakeTranslator(delay_s=5))
    resp = client.post("/translation", json=BODY, headers={"X-Request-Timeout-Ms": "100"})
    assert_error(resp, 504, "timeout")
    assert "0.1 s" in resp.json()["error"]
    assert translator.cancelled == 1


def test_deadline_header_is_capped_by_model_timeout(client):
    install(FakeTranslator(delay_s=5), ingress={"model_timeout_s": 0.2})
    resp = client.post("/translation", json=BODY, headers={"X-Request-Timeout-Ms": "600000"})
    assert_error(resp, 504, "timeout")
    assert "0.2 s" in resp.json()["error"]


@pytest.mark.parametrize("value", ["soon", "0", "-1", "1.5"])
def test_bad_deadline_header_is_422(client, value):
    install()
    assert_error(client.post("/translation", json=BODY, headers={"X-Request-Timeout-Ms": value}),
                 422, "invalid_request")


def test_deadline_applies_to_embeddings(client):
    class Slow(FakeEmbedder):
        async def call(self, method, *args):
            if method == "embed":
                await asyncio.sleep(5)
            return await super().call(method, *args)

    install(embedder=Slow())
    assert_error(client.post("/embeddings", json={"input": "x"}, headers={"X-Request-Timeout-Ms": "50"}),
                 504, "timeout")


# --- what reaches the model ---------------------------------------------------------------------

def test_control_characters_and_surrogates_never_reach_the_model(client):
    translator, embedder = install()
    raw = ('{"payload": {"fromLang": "en", "toLang": "pt", "records": ['
           '{"id": "1", "text": "a\\u0000b\\u001b[31mc\\ud800d\\te"}]}}')
    resp = client.post("/translation", content=raw, headers={"content-type": "application/json"})
    assert resp.status_code == 200, resp.text
    assert translator.calls[0].texts == ["a b [31mc\ufffdd\te"]
    assert client.post("/embeddings", json={"input": ["x\u0000y"]}).status_code == 200
    assert embedder.calls[0] == ["x y"]


# --- access log, metrics, request id ----------------------------------------------------------------

def test_one_json_access_log_line_per_request(client, caplog):
    install()
    caplog.set_level(logging.INFO, logger="ray.serve.serve_app.access")
    ok = client.post("/translation", json=BODY)
    bad = client.post("/translation", json={"payload": {}})
    lines = [json.loads(r.getMessage()) for r in caplog.records if r.name == "ray.serve.serve_app.access"]
    assert len(lines) == 2
    assert lines[0]["request_id"] == ok.headers["x-request-id"]
    assert lines[0]["route"] == "/translation" and lines[0]["status"] == 200 and lines[0]["records"] == 1
    assert lines[0]["error_type"] is None and lines[0]["latency_ms"] >= 0
    assert lines[1]["request_id"] == bad.headers["x-request-id"] and lines[1]["error_type"] == "invalid_request"


def test_access_log_can_be_turned_off_and_counts_continue(client, caplog):
    install(ingress={"access_log": False})
    caplog.set_level(logging.INFO, logger="ray.serve.serve_app.access")
    before = api.recorder.errors[("/translation", "payload_too_large")]
    client.post("/translation", content=b"x" * 5_000_000, headers={"content-type": "application/json"})
    assert not [r for r in caplog.records if r.name == "ray.serve.serve_app.access"]
    assert api.recorder.errors[("/translation", "payload_too_large")] == before + 1


def test_proxy_request_id_is_kept(client, caplog):
    install()
    caplog.set_level(logging.INFO, logger="ray.serve.serve_app.access")
    resp = client.post("/translation", json=BODY, headers={"x-request-id": "proxy-id-1"})
    assert "x-request-id" not in resp.headers or resp.headers["x-request-id"] == "proxy-id-1"
    assert json.loads(caplog.records[-1].getMessage())["request_id"] == "proxy-id-1"


def test_errors_are_tallied_by_type_and_route(client):
    install(FakeTranslator(fail=ModelUnavailable("gone", retry_after_s=2)), ingress={"api_keys": "k"})
    before = dict(api.recorder.errors)
    client.post("/translation", json=BODY)
    client.post("/translation", json=BODY, headers={"X-API-Key": "k"})
    assert client.get("/nope").status_code == 401  # unknown paths need a key too: no route probing
    client.get("/nope", headers={"X-API-Key": "k"})
    after = api.recorder.errors
    assert after[("/translation", "unauthorized")] == before.get(("/translation", "unauthorized"), 0) + 1
    assert after[("/translation", "model_unavailable")] == before.get(("/translation", "model_unavailable"), 0) + 1
    assert after[("other", "not_found")] == before.get(("other", "not_found"), 0) + 1


# --- replica death: HandleClient against Ray's real exception types ---------------------------------

class _Response:
    def __init__(self, outcome):
        self.outcome = outcome
        self.cancelled = False

    def __await__(self):
        return self._run().__await__()

    async def _run(self):
        if isinstance(self.outcome, float):
            await asyncio.sleep(self.outcome)
            return "late"
        if isinstance(self.outcome, BaseException):
            raise self.outcome
        return self.outcome

    def cancel(self):
        self.cancelled = True


class _Handle:
    def __init__(self, outcomes):
        self.outcomes = list(outcomes)
        self.sent: list[_Response] = []

    def options(self, method_name):
        return self

    def remote(self, *args):
        self.sent.append(_Response(self.outcomes.pop(0)))
        return self.sent[-1]


def _died():
    from ray.exceptions import ActorDiedError

    return ActorDiedError()


def _stopped():
    """What a call gets from a replica whose teardown ran before it computed the call (deployments/replica.py)."""
    from ray.exceptions import RayTaskError

    from deployments.errors import ReplicaStopped

    return RayTaskError("translate", "Traceback ...", ReplicaStopped("decoding is shut down"), proctitle="replica",
                        pid=1, ip="127.0.0.1").as_instanceof_cause()


def _died_in_a_task():
    """An actor's death as Ray may raise it to a handle's caller (ray/serve/_private/router.py): a RayTaskError
    that is an ActorDiedError too. From a review: it was taken for the model's own error, a 500 and no retry."""
    from ray.exceptions import ActorDiedError, RayTaskError

    return RayTaskError("translate", "Traceback ...", ActorDiedError(), proctitle="replica", pid=1,
                        ip="127.0.0.1").as_instanceof_cause()


@pytest.mark.parametrize("lost", [_died, _stopped, _died_in_a_task], ids=["died", "stopped", "died-in-task"])
def test_call_is_retried_once_after_replica_death(lost):
    handle = _Handle([lost(), "answer"])
    client = HandleClient("Translator", handle)
    assert asyncio.run(client.call("translate", "x")) == "answer"
    assert client.retried == 1 and len(handle.sent) == 2


@pytest.mark.parametrize("lost, told", [(_died, "failed"), (_stopped, "stopped")], ids=["died", "stopped"])
def test_second_death_is_503_with_retry_after(lost, told):
    client = HandleClient("Translator", _Handle([lost(), lost()]), retry_after_s=3)
    with pytest.raises(ModelUnavailable, match=f"Translator replica {told} while serving") as info:
        asyncio.run(client.call("translate", "x"))
    assert info.value.retry_after_s == 3 and info.value.status_code == 503


def test_a_call_serve_cancelled_under_a_live_caller_is_503_with_retry_after():
    from ray.serve.exceptions import RequestCancelledError

    client = HandleClient("Translator", _Handle([RequestCancelledError("r1")]), retry_after_s=3)
    with pytest.raises(ModelUnavailable) as info:
        asyncio.run(client.call("translate", "x"))
    assert info.value.retry_after_s == 3 and info.value.status_code == 503


def test_retry_waits_bounded_time_then_503():
    handle = _Handle([_died(), 30.0])
    client = HandleClient("Translator", handle, retry_timeout_s=0.1)
    with pytest.raises(ModelUnavailable):
        asyncio.run(client.call("translate", "x"))
    assert handle.sent[1].cancelled and client.retries_failed == 1


def test_a_retry_a_replica_took_is_not_cut_while_it_computes():
    """retry_timeout_s bounds a retry's wait for a replica, not its computing: a 10 s call retried after its replica
    died was cut at 8 s while the survivor computed it, and answered a 503 saying no replica was healthy."""
    class DiesThenComputes:
        def __init__(self):
            self.sent = 0

        def options(self, method_name):
            return self

        def remote(self, *args):
            self.sent += 1
            if self.sent == 1:
                return _Response(_died())
            return _RealResponses(accept_after_s=0.0, compute_s=0.6).remote(*args)

    client = HandleClient("Translator", DiesThenComputes(), retry_timeout_s=0.2)
    assert asyncio.run(client.call("translate", "x")) == "answer"
    assert client.retried == 1 and client.retries_failed == 0


def test_a_replica_failure_bounds_the_calls_still_waiting():
    """Serve re-routes calls from a lost node by itself; once any call through the client sees a replica
    fail, a call still waiting gets retry_timeout_s more, then 503 + Retry-After (tests/cluster)."""
    import time

    handle = _Handle([30.0, _died(), "retried"])
    client = HandleClient("Translator", handle, retry_after_s=2, retry_timeout_s=0.2)

    async def both():
        held = asyncio.create_task(client.call("translate", "held"))
        await asyncio.sleep(0.05)
        failing = asyncio.create_task(client.call("translate", "failing"))
        started = time.monotonic()
        results = await asyncio.gather(held, failing, return_exceptions=True)
        return results, time.monotonic() - started

    (held, failing), seconds = asyncio.run(both())
    assert isinstance(held, ModelUnavailable) and held.retry_after_s == 2
    assert failing == "retried"
    assert handle.sent[0].cancelled and client.cut_after_replica_failure == 1
    assert seconds < 5  # not the 30 s the held call would have taken


def test_slow_calls_are_not_cut_without_a_replica_failure():
    client = HandleClient("Translator", _Handle([0.3]), retry_timeout_s=0.05)
    assert asyncio.run(client.call("translate", "x")) == "late"
    assert client.cut_after_replica_failure == 0


def test_a_call_given_up_leaves_no_unretrieved_error_behind():
    """Serve ends a cancelled call with RequestCancelledError; the client retrieves it, so asyncio
    logs no "Task exception was never retrieved" for every disconnected request."""
    import gc

    from ray.serve.exceptions import RequestCancelledError

    class EndsInError(_Response):
        async def _run(self):
            try:
                await asyncio.sleep(30)
            except asyncio.CancelledError:
                raise RequestCancelledError("r1") from None

    class Handle(_Handle):
        def remote(self, *args):
            self.sent.append(EndsInError(None))
            return self.sent[-1]

    unretrieved = []

    async def disconnect():
        asyncio.get_running_loop().set_exception_handler(lambda loop, context: unretrieved.append(context))
        call = asyncio.create_task(HandleClient("Translator", Handle([])).call("translate", "x"))
        await asyncio.sleep(0.05)
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
        await asyncio.sleep(0.05)
        gc.collect()  # an unretrieved task error is reported when the task is collected
        await asyncio.sleep(0)

    asyncio.run(disconnect())
    assert not unretrieved


class _RealResponses:
    """Serve's own DeploymentResponse (no Ray started): its `_replica_result_future` is what the router
    resolves once a replica accepts the call (HandleClient bounds that wait)."""

    def __init__(self, accept_after_s=None, compute_s=0.0, replicas=None):
        self.accept_after_s, self.compute_s = accept_after_s, compute_s
        self.sent = []
        if replicas is not None:  # the router's state as serve_app/_router_state.py reads it
            self.known = {f"replica-{i}": object() for i in range(replicas)}
            request_router = SimpleNamespace(curr_replicas=self.known)
            self._router = SimpleNamespace(_asyncio_router=SimpleNamespace(_request_router=request_router))

    def options(self, method_name):
        return self

    def remote(self, *args):
        import concurrent.futures
        import threading

        from ray.serve._private.common import RequestMetadata
        from ray.serve.handle import DeploymentResponse

        taken = concurrent.futures.Future()
        compute_s = self.compute_s

        class Result:  # what a replica hands back once it accepted the call
            async def get_async(self):
                await asyncio.sleep(compute_s)
                return "answer"

            def cancel(self):
                pass

        if self.accept_after_s is not None:
            threading.Timer(self.accept_after_s, lambda: taken.set_result(Result())).start()
        response = DeploymentResponse(taken, RequestMetadata(request_id="r", internal_request_id="i"))
        self.sent.append(response)
        return response


def test_a_call_no_replica_takes_is_503_with_retry_after_not_a_hang():
    """After a head restart in the middle of a downscale, every replica of the Embedder was stopping
    and calls waited in Serve's router for a new one until clients gave up (tests/cluster)."""
    import time

    handle = _RealResponses(accept_after_s=None)
    client = HandleClient("Embedder", handle, retry_after_s=2, retry_timeout_s=0.2)
    started = time.monotonic()
    with pytest.raises(ModelUnavailable) as info:
        asyncio.run(client.call("embed", ["x"]))
    assert info.value.retry_after_s == 2 and info.value.status_code == 503
    assert time.monotonic() - started < 2
    assert handle.sent[0].cancelled() and client.cut_waiting_for_replica == 1


def test_a_call_taken_late_or_computing_long_is_not_cut():
    # taken 0.1 s in, well before retry_timeout_s (a loaded machine delays the accepting thread), computing past it
    handle = _RealResponses(accept_after_s=0.1, compute_s=1.8)
    client = HandleClient("Embedder", handle, retry_timeout_s=1.5)
    assert asyncio.run(client.call("embed", ["x"])) == "answer"
    assert client.cut_waiting_for_replica == 0 and client.cut_after_replica_failure == 0


def test_a_call_waits_for_a_replica_while_the_router_knows_some():
    """A rolling update on two starved cores held calls 5 s before one of 4 known Embedders took
    them (tests/cluster); they are answered, not cut at retry_timeout_s."""
    handle = _RealResponses(accept_after_s=0.7, replicas=4)
    client = HandleClient("Embedder", handle, retry_timeout_s=0.2)
    assert asyncio.run(client.call("embed", ["x"])) == "answer"
    assert client.cut_waiting_for_replica == 0


def test_a_waiting_call_is_cut_once_the_router_knows_no_replica():
    import time

    handle = _RealResponses(accept_after_s=None, replicas=2)
    client = HandleClient("Embedder", handle, retry_after_s=2, retry_timeout_s=0.2)

    async def replicas_stopped_after(seconds):
        call = asyncio.create_task(client.call("embed", ["x"]))
        await asyncio.sleep(seconds)
        handle.known.clear()  # the controller's update: none running
        started = time.monotonic()
        with pytest.raises(ModelUnavailable):
            await call
        return time.monotonic() - started

    assert asyncio.run(replicas_stopped_after(0.5)) < 2  # at the next check (retry_timeout_s), not never
    assert client.cut_waiting_for_replica == 1 and handle.sent[0].cancelled()


def test_actor_unavailable_is_retried_too():
    from ray.exceptions import ActorUnavailableError

    handle = _Handle([ActorUnavailableError("net", b"\x00" * 16), "ok"])
    assert asyncio.run(HandleClient("Translator", handle).call("translate", "x")) == "ok"


# --- a deployment Serve gave up on ---------------------------------------------------------------

SERVE_MESSAGE = (
    "The deployment failed to start 3 times in a row. This may be due to a problem with its constructor or "
    "initial health check failing. See controller logs for details. Error:\n\x1b[36mray::ServeReplica:serve-app:"
    "Embedder.initialize_and_get_metadata()\x1b[39m (pid=1)\n  File \"x.py\", line 1, in f\n"
    "deployments.backends.base.ModelLoadError: embedding model folder not found: /models/minilm")


def test_failure_summary_keeps_the_cause_and_path():
    summary = summarise_failure(SERVE_MESSAGE)
    assert summary.endswith("Cause: ModelLoadError: embedding model folder not found: /models/minilm")
    assert "\x1b" not in summary and "pid=" not in summary


def test_readyz_names_a_failed_deployment_and_its_path(client, caplog):
    class Failed(FakeEmbedder):
        async def deployment_status(self):
            return "DEPLOY_FAILED", SERVE_MESSAGE

    install(embedder=Failed(never_ready=True), ingress={"readiness_timeout_s": 0.1})
    caplog.set_level(logging.ERROR, logger="serve_app")
    for _ in range(2):
        resp = client.get("/readyz")
        assert_error(resp, 503, "not_ready")
    state = resp.json()["models"]["Embedder"]
    assert state.startswith("failed: DEPLOY_FAILED") and "/models/minilm" in state
    assert resp.json()["models"]["Translator"] == "ready"
    logged = [r for r in caplog.records if "/models/minilm" in r.getMessage()]
    assert len(logged) == 1  # logged once, not on every probe



def test_drain_refuses_new_requests_and_waits_for_admitted_ones():
    import asyncio

    from fastapi.testclient import TestClient

    from serve_app import middleware
    from serve_app.api import app, set_service

    from .fakes import FakeTranslator, install

    async def scenario():
        state = middleware.DrainState()
        state.in_flight = 2

        async def finish_later():
            await asyncio.sleep(0.1)
            state.in_flight = 0

        task = asyncio.create_task(finish_later())
        result = await state.drain(timeout_s=5, poll_s=0.01)
        await task
        return state, result

    state, result = asyncio.run(scenario())
    assert state.draining and result["in_flight_at_start"] == 2 and result["in_flight_left"] == 0
    assert 0.05 <= result["waited_s"] < 2

    install(FakeTranslator())
    middleware.DRAIN.draining = True
    try:
        with TestClient(app, raise_server_exceptions=False) as client:
            resp = client.post("/translation", json={"payload": {"fromLang": "en", "toLang": "pt",
                                                                 "records": [{"id": "1", "text": "hi"}]}})
            assert resp.status_code == 503 and resp.json()["error_type"] == "shutting_down"
            assert "Retry-After" in resp.headers
            ready = client.get("/readyz")
            assert ready.status_code == 503 and "draining" in str(ready.json()["models"])
            assert client.get("/healthz").status_code == 200
    finally:
        middleware.DRAIN.draining = False
        set_service(None)
