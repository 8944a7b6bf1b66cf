"""A small typed client for serve-app over HTTP, sync and async.

    from serve_app.client import Client

    with Client("http://127.0.0.1:9527") as client:
        client.translate(["Life is like a box of chocolates."], source="en", target="pt")
        # -> ["A vida é como uma caixa de chocolates."]
        client.embed(["The food was delicious."])          # -> [[0.01, ...384 floats]]
        client.predict("iris", [{"sepal_length_cm": 5.1, "sepal_width_cm": 3.5,
                                 "petal_length_cm": 1.4, "petal_width_cm": 0.2}])
        # -> [{"species": "setosa", "confidence": 0.98, ...}]   (your own model, `models:`)

        # Jobs: submit now, collect later (POST /jobs; the future polls GET /jobs/<id>)
        job = client.submit_translation(many_texts, source="en", target="pt")
        job.job_id, job.status()                   # -> "queued" | "running" | ...
        job.result(timeout=600)                    # -> the translated texts; job.cancel() cancels it

    async with AsyncClient("http://127.0.0.1:9527") as client:
        await client.translate(...)
        job = await client.submit_embeddings(texts)
        vectors = await job                         # or await job.cancel()

Retries: a 503 (overloaded, shutting down, model unavailable) is retried after the
`Retry-After` the server sends (capped by `max_retry_wait_s`), up to `max_retries`
times; so are connection errors. Nothing else is retried: a 4xx is the caller's
error and raises `ServeAppHTTPError` with the server's `error` and `error_type`.
The model routes are idempotent, so retrying is safe.

Inside the cluster, from another Serve deployment, skip HTTP and call the model
deployments through a handle (the same calls the ingress makes):

    from deployments.batching import Chunk
    translator = serve.get_deployment_handle("Translator", app_name="serve-app")
    texts, batch_size = await translator.translate.remote(Chunk("en", "pt", ["Hello."]))
    iris = serve.get_deployment_handle("Model.iris", app_name="serve-app")
    outputs, batch_size = await iris.predict.remote([{"sepal_length_cm": 5.1, ...}])
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence
from urllib.parse import quote

import httpx

#: statuses worth retrying: the server said "not now", not "never"
RETRYABLE_STATUSES = (503,)


class ServeAppHTTPError(RuntimeError):
    """The service answered with an error; `error_type` is the project's stable code."""

    def __init__(self, status_code: int, error: str, error_type: str, retry_after_s: Optional[float] = None):
        super().__init__(f"{status_code} {error_type}: {error}")
        self.status_code = status_code
        self.error = error
        self.error_type = error_type
        self.retry_after_s = retry_after_s


@dataclass(frozen=True)
class RetryPolicy:
    max_retries: int = 3
    #: wait when a 503 carries no Retry-After, or after a connection error
    default_wait_s: float = 1.0
    #: never wait longer than this for one retry, whatever Retry-After says
    max_retry_wait_s: float = 10.0

    #: first and largest wait between two polls of an unfinished job
    poll_interval_s: float = 0.2
    max_poll_interval_s: float = 2.0

    def done(self, response: httpx.Response, attempt: int) -> bool:
        """True: `response` is the answer. False: retry it. Raises the service's error when
        retrying cannot help (not a 503) or the retries are spent."""
        if response.status_code in (200, 202):
            return True
        if response.status_code not in RETRYABLE_STATUSES or attempt >= self.max_retries:
            raise _error(response)
        return False

    def wait_s(self, response: Optional[httpx.Response]) -> float:
        if response is not None:
            value = response.headers.get("Retry-After")
            try:
                return min(max(float(value), 0.0), self.max_retry_wait_s) if value else self.default_wait_s
            except ValueError:
                pass
        return min(self.default_wait_s, self.max_retry_wait_s)


def _auth_headers(api_key: Optional[str]) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def _deadline_headers(deadline_ms: Optional[int]) -> Optional[dict[str, str]]:
    return {"X-Request-Timeout-Ms": str(deadline_ms)} if deadline_ms else None


def _embeddings_body(texts: Sequence[str], model: Optional[str]) -> dict[str, Any]:
    body: dict[str, Any] = {"input": list(texts)}
    if model:
        body["model"] = model
    return body


def _translation_body(texts: Sequence[str], source: str, target: str, ids: Optional[Sequence[str]]) -> dict:
    ids = list(ids) if ids is not None else [str(i) for i in range(len(texts))]
    if len(ids) != len(texts):
        raise ValueError(f"{len(ids)} ids for {len(texts)} texts")
    return {"payload": {"fromLang": source, "toLang": target,
                        "records": [{"id": i, "text": t} for i, t in zip(ids, texts)]}}


def _error(response: httpx.Response) -> ServeAppHTTPError:
    try:
        body = response.json()
        error, error_type = str(body.get("error", response.text)), str(body.get("error_type", "unknown"))
    except ValueError:
        error, error_type = response.text, "unknown"
    retry_after = response.headers.get("Retry-After")
    return ServeAppHTTPError(response.status_code, error, error_type,
                             float(retry_after) if retry_after and retry_after.isdigit() else None)


def _translations(response: httpx.Response, expected: int) -> list[str]:
    return _texts_of(response.json(), expected)


def _texts_of(body: dict, expected: int) -> list[str]:
    result = body["result"]
    if len(result) != expected:
        raise ServeAppHTTPError(200, f"{len(result)} results for {expected} records", "bad_response")
    return [r["text"] for r in result]


def _predict_path(model: str) -> str:
    return f"/models/{quote(model, safe='')}/predict"


def _outputs(response: httpx.Response, expected: int) -> list[dict]:
    return _outputs_of(response.json(), expected)


def _outputs_of(body: dict, expected: int) -> list[dict]:
    outputs = body["outputs"]
    if len(outputs) != expected:
        raise ServeAppHTTPError(200, f"{len(outputs)} outputs for {expected} inputs", "bad_response")
    return outputs


def _vectors(response: httpx.Response) -> list[list[float]]:
    return _vectors_of(response.json())


def _vectors_of(body: dict) -> list[list[float]]:
    return [d["embedding"] for d in sorted(body["data"], key=lambda d: d["index"])]


#: job states after which nothing changes
FINISHED_JOB_STATES = ("succeeded", "failed", "cancelled")


@dataclass(frozen=True)
class JobSpec:
    """What to submit to POST /jobs, and how to read the finished job's result."""

    task: str
    payload: dict
    parse: Callable[[dict], Any]

    @staticmethod
    def translation(texts: Sequence[str], source: str, target: str, ids: Optional[Sequence[str]]) -> "JobSpec":
        body = _translation_body(texts, source, target, ids)
        return JobSpec("translation", body["payload"], lambda result, n=len(texts): _texts_of(result, n))

    @staticmethod
    def embeddings(texts: Sequence[str], model: Optional[str]) -> "JobSpec":
        return JobSpec("embeddings", _embeddings_body(texts, model), _vectors_of)

    @staticmethod
    def predict(model: str, inputs: Sequence[dict]) -> "JobSpec":
        return JobSpec(model, {"inputs": list(inputs)}, lambda result, n=len(inputs): _outputs_of(result, n))


def _job_outcome(view: dict, parse: Callable[[dict], Any]) -> Any:
    """A finished job's value: its parsed result, or the error it failed with."""
    if view["status"] == "succeeded":
        return parse(view["result"])
    if view["status"] == "failed":
        error = view.get("error") or {}
        raise ServeAppHTTPError(200, error.get("error", "the job failed"), error.get("error_type", "unknown"))
    raise JobCancelled(f"job {view['job_id']} was cancelled")


class JobCancelled(concurrent.futures.CancelledError):
    """The job was cancelled (by DELETE /jobs/<id>, from this client or another)."""


def _checked(response: httpx.Response, *ok: int) -> dict:
    if response.status_code not in ok:
        raise _error(response)
    return response.json()


class JobFuture(concurrent.futures.Future):
    """A job submitted with `Client.submit*`: a `concurrent.futures.Future` whose result is the
    job's result (parsed like the matching blocking call's), resolved by the client's poller.

    `result(timeout)` waits for it; a failed job raises `ServeAppHTTPError` with the job's
    `error_type`; `cancel()` cancels the job on the server (DELETE /jobs/<id>)."""

    def __init__(self, client: "Client", job_id: str, parse: Callable[[dict], Any]):
        super().__init__()
        self.job_id = job_id
        self._client = client
        self._parse = parse

    def status(self) -> str:
        """`queued`, `running`, `succeeded`, `failed` or `cancelled`, as the server says now."""
        return self._client.job(self.job_id)["status"]

    def cancel(self) -> bool:
        if self.done():
            return False
        try:
            self._client.cancel_job(self.job_id)
        except ServeAppHTTPError as exc:
            if exc.error_type == "job_finished":
                return False  # it finished first; the poller resolves it
            raise
        return super().cancel()

    def _resolve(self, view: dict) -> None:
        try:
            self.set_result(_job_outcome(view, self._parse))
        except concurrent.futures.InvalidStateError:
            pass  # cancelled meanwhile
        except JobCancelled:
            super().cancel()  # cancelled by someone else
        except Exception as exc:
            self._fail(exc)

    def _fail(self, exc: BaseException) -> None:
        try:
            self.set_exception(exc)
        except concurrent.futures.InvalidStateError:
            pass


class _JobPoller:
    """One thread per client polls GET /jobs/<id> for every pending JobFuture, backing off from
    `poll_interval_s` to `max_poll_interval_s` while nothing changes."""

    def __init__(self, client: "Client"):
        self._client = client
        self._pending: dict[str, JobFuture] = {}
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._closed = False
        self._thread: Optional[threading.Thread] = None

    def watch(self, future: JobFuture) -> None:
        with self._lock:
            if self._closed:
                raise RuntimeError("the client is closed")
            self._pending[future.job_id] = future
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="serve-app-jobs", daemon=True)
                self._thread.start()
        self._wake.set()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            pending, self._pending = list(self._pending.values()), {}
        self._wake.set()
        for future in pending:
            future._fail(RuntimeError("the client was closed before the job finished"))

    def _run(self) -> None:
        policy = self._client.retry
        interval = policy.poll_interval_s
        while True:
            with self._lock:
                if self._closed or not self._pending:
                    self._thread = None
                    return
                pending = list(self._pending.values())
            changed = False
            for future in pending:
                if future.done():  # cancelled by the caller
                    changed = True
                    self._forget(future)
                    continue
                try:
                    view = self._client.job(future.job_id)
                except ServeAppHTTPError as exc:  # 404: expired or the job store restarted
                    if exc.status_code != 503:
                        future._fail(exc)
                        self._forget(future)
                        changed = True
                    continue
                except httpx.TransportError:
                    continue  # the service may be restarting: keep polling
                if view["status"] in FINISHED_JOB_STATES:
                    future._resolve(view)
                    self._forget(future)
                    changed = True
            interval = policy.poll_interval_s if changed else min(interval * 2, policy.max_poll_interval_s)
            self._wake.wait(interval)
            self._wake.clear()

    def _forget(self, future: JobFuture) -> None:
        with self._lock:
            self._pending.pop(future.job_id, None)


class Client:
    """Blocking client. `timeout_s` bounds each HTTP attempt; retries add their waits."""

    def __init__(self, base_url: str = "http://127.0.0.1:9527", *, timeout_s: float = 60.0,
                 api_key: Optional[str] = None, retry: RetryPolicy = RetryPolicy(),
                 transport: Optional[httpx.BaseTransport] = None):
        self._http = httpx.Client(base_url=base_url, timeout=timeout_s, headers=_auth_headers(api_key),
                                  transport=transport)
        self.retry = retry
        self._jobs = _JobPoller(self)

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        """Close the connection pool; jobs still pending fail in their futures (not on the server)."""
        self._jobs.close()
        self._http.close()

    def _post(self, path: str, body: dict, headers: Optional[dict] = None) -> httpx.Response:
        attempt = 0
        while True:
            response: Optional[httpx.Response] = None
            try:
                response = self._http.post(path, json=body, headers=headers)
                if self.retry.done(response, attempt):
                    return response
            except httpx.TransportError:
                if attempt >= self.retry.max_retries:
                    raise
            attempt += 1
            time.sleep(self.retry.wait_s(response))

    def translate(self, texts: Sequence[str], *, source: str, target: str,
                  ids: Optional[Sequence[str]] = None, deadline_ms: Optional[int] = None) -> list[str]:
        """Translated texts, in the order given."""
        response = self._post("/translation", _translation_body(texts, source, target, ids),
                              _deadline_headers(deadline_ms))
        return _translations(response, len(texts))

    def embed(self, texts: Sequence[str], *, model: Optional[str] = None) -> list[list[float]]:
        """One unit-length vector per text, in the order given."""
        return _vectors(self._post("/embeddings", _embeddings_body(texts, model)))

    def predict(self, model: str, inputs: Sequence[dict], *, deadline_ms: Optional[int] = None) -> list[dict]:
        """Your own model's outputs (an entry of `models:`), one per input, in the order given."""
        response = self._post(_predict_path(model), {"inputs": list(inputs)}, _deadline_headers(deadline_ms))
        return _outputs(response, len(inputs))

    def submit(self, task: str, payload: dict) -> JobFuture:
        """Submit a job (POST /jobs); the future's result is the job's result body, exactly what
        the task's route answers. Submission is validated at once: a bad payload raises here."""
        return self._submit(JobSpec(task, payload, lambda result: result))

    def submit_translation(self, texts: Sequence[str], *, source: str, target: str,
                           ids: Optional[Sequence[str]] = None) -> JobFuture:
        """`translate()` as a job: the future's result is the translated texts, in order."""
        return self._submit(JobSpec.translation(texts, source, target, ids))

    def submit_embeddings(self, texts: Sequence[str], *, model: Optional[str] = None) -> JobFuture:
        """`embed()` as a job: the future's result is one vector per text."""
        return self._submit(JobSpec.embeddings(texts, model))

    def submit_predict(self, model: str, inputs: Sequence[dict]) -> JobFuture:
        """`predict()` as a job: the future's result is one output per input."""
        return self._submit(JobSpec.predict(model, inputs))

    def _submit(self, spec: JobSpec) -> JobFuture:
        view = self._post("/jobs", {"task": spec.task, "payload": spec.payload}).json()
        future = JobFuture(self, view["job_id"], spec.parse)
        self._jobs.watch(future)
        return future

    def job(self, job_id: str) -> dict:
        """The job as GET /jobs/<id> shows it (status, progress, result once succeeded)."""
        return _checked(self._http.get(f"/jobs/{quote(job_id, safe='')}"), 200)

    def cancel_job(self, job_id: str) -> dict:
        return _checked(self._http.delete(f"/jobs/{quote(job_id, safe='')}"), 200)

    def models(self) -> list[dict]:
        return self._http.get("/v1/models").raise_for_status().json()["data"]

    def ready(self) -> bool:
        return self._http.get("/readyz").status_code == 200


class AsyncJob:
    """A job submitted with `AsyncClient.submit*`: `await job` gives its result (parsed like the
    matching call's); a failed job raises `ServeAppHTTPError`; `await job.cancel()` cancels it
    on the server (then awaiting it raises `JobCancelled`)."""

    def __init__(self, client: "AsyncClient", job_id: str, parse: Callable[[dict], Any]):
        self.job_id = job_id
        self._client = client
        self._task = asyncio.ensure_future(self._wait(parse))

    async def _wait(self, parse: Callable[[dict], Any]) -> Any:
        policy = self._client.retry
        interval = policy.poll_interval_s
        while True:
            try:
                view = await self._client.job(self.job_id)
            except httpx.TransportError:
                view = None  # the service may be restarting: keep polling
            if view is not None and view["status"] in FINISHED_JOB_STATES:
                return _job_outcome(view, parse)
            await asyncio.sleep(interval)
            interval = min(interval * 2, policy.max_poll_interval_s)

    def __await__(self):
        return self._task.__await__()

    def done(self) -> bool:
        return self._task.done()

    async def status(self) -> str:
        return (await self._client.job(self.job_id))["status"]

    async def cancel(self) -> bool:
        """Cancel the job on the server; False when it had already finished."""
        try:
            await self._client.cancel_job(self.job_id)
        except ServeAppHTTPError as exc:
            if exc.error_type == "job_finished":
                return False
            raise
        self._task.cancel()
        return True


class AsyncClient:
    """The same API for asyncio code."""

    def __init__(self, base_url: str = "http://127.0.0.1:9527", *, timeout_s: float = 60.0,
                 api_key: Optional[str] = None, retry: RetryPolicy = RetryPolicy(),
                 transport: Optional[httpx.AsyncBaseTransport] = None):
        self._http = httpx.AsyncClient(base_url=base_url, timeout=timeout_s, headers=_auth_headers(api_key),
                                       transport=transport)
        self.retry = retry

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    async def _post(self, path: str, body: dict, headers: Optional[dict] = None) -> httpx.Response:
        attempt = 0
        while True:
            response: Optional[httpx.Response] = None
            try:
                response = await self._http.post(path, json=body, headers=headers)
                if self.retry.done(response, attempt):
                    return response
            except httpx.TransportError:
                if attempt >= self.retry.max_retries:
                    raise
            attempt += 1
            await asyncio.sleep(self.retry.wait_s(response))

    async def translate(self, texts: Sequence[str], *, source: str, target: str,
                        ids: Optional[Sequence[str]] = None, deadline_ms: Optional[int] = None) -> list[str]:
        response = await self._post("/translation", _translation_body(texts, source, target, ids),
                                    _deadline_headers(deadline_ms))
        return _translations(response, len(texts))

    async def embed(self, texts: Sequence[str], *, model: Optional[str] = None) -> list[list[float]]:
        return _vectors(await self._post("/embeddings", _embeddings_body(texts, model)))

    async def predict(self, model: str, inputs: Sequence[dict], *,
                      deadline_ms: Optional[int] = None) -> list[dict]:
        response = await self._post(_predict_path(model), {"inputs": list(inputs)}, _deadline_headers(deadline_ms))
        return _outputs(response, len(inputs))

    async def submit(self, task: str, payload: dict) -> AsyncJob:
        """Submit a job (POST /jobs); awaiting it gives the job's result body."""
        return await self._submit(JobSpec(task, payload, lambda result: result))

    async def submit_translation(self, texts: Sequence[str], *, source: str, target: str,
                                 ids: Optional[Sequence[str]] = None) -> AsyncJob:
        return await self._submit(JobSpec.translation(texts, source, target, ids))

    async def submit_embeddings(self, texts: Sequence[str], *, model: Optional[str] = None) -> AsyncJob:
        return await self._submit(JobSpec.embeddings(texts, model))

    async def submit_predict(self, model: str, inputs: Sequence[dict]) -> AsyncJob:
        return await self._submit(JobSpec.predict(model, inputs))

    async def _submit(self, spec: JobSpec) -> AsyncJob:
        view = (await self._post("/jobs", {"task": spec.task, "payload": spec.payload})).json()
        return AsyncJob(self, view["job_id"], spec.parse)

    async def job(self, job_id: str) -> dict:
        return _checked(await self._http.get(f"/jobs/{quote(job_id, safe='')}"), 200)

    async def cancel_job(self, job_id: str) -> dict:
        return _checked(await self._http.delete(f"/jobs/{quote(job_id, safe='')}"), 200)

    async def models(self) -> list[dict]:
        return (await self._http.get("/v1/models")).raise_for_status().json()["data"]

    async def ready(self) -> bool:
        return (await self._http.get("/readyz")).status_code == 200
