"""The asyncio client: `AsyncClient`, and `AsyncJob` (a job you await)."""

from __future__ import annotations

import asyncio
import time
import weakref
from typing import Any, Callable, Optional, Sequence

import httpx

from .retry import RetryPolicy
from .wire import (
    FINISHED_JOB_STATES, PASSING_STATUSES, RETRYABLE_STATUSES, SUBMISSION_RETRYABLE_STATUSES, SUBMIT_TIMEOUT_S,
    JobCancelled, JobSpec, ServeAppHTTPError, answer, auth_headers, checked, checked_deadline, deadline_headers,
    embeddings_body, job_outcome, job_path, merge_page, next_page, outputs, predict_path, submission_headers,
    translation_body, translations, vectors,
)

class AsyncJob:
    """A job submitted with `AsyncClient.submit*`: `await job` gives its result (parsed like the
    matching call's); a failed job raises `ServeAppHTTPError`; `await job.cancel()` cancels it
    on the server (then awaiting it raises `JobCancelled`)."""

    def __init__(self, client: "AsyncClient", job_id: str, parse: Callable[[dict], Any]):
        self.job_id = job_id
        self._client = client
        self._closed = False  # by `AsyncClient.aclose()`
        self._task = asyncio.ensure_future(self._wait(parse))
        client._jobs.add(self)

    async def _wait(self, parse: Callable[[dict], Any]) -> Any:
        policy = self._client.retry
        interval = policy.poll_interval_s
        while True:
            try:
                view = await self._client.job(self.job_id)
                if view["status"] in FINISHED_JOB_STATES:
                    return job_outcome(await self._client._whole(view), parse)
            except httpx.TransportError:
                pass  # the service may be restarting: keep polling
            except ServeAppHTTPError as exc:  # a 502/503/504 (a deadline) may pass, as for the sync poller
                if exc.status_code not in PASSING_STATUSES:
                    raise
            await asyncio.sleep(interval)
            interval = min(interval * 2, policy.max_poll_interval_s)

    def __await__(self):
        return self._result().__await__()

    async def _result(self) -> Any:
        # Shielded: a caller's timeout (asyncio.wait_for) ends its wait, not the poller; awaiting again works.
        try:
            return await asyncio.shield(self._task)
        except asyncio.CancelledError:
            if self._task.cancelled() and self._closed:
                raise RuntimeError("the client was closed before the job finished") from None
            if self._task.cancelled():  # `cancel()` stopped the poller: the job was cancelled
                raise JobCancelled(f"job {self.job_id} was cancelled") from None
            raise

    def _close(self) -> None:
        """The client closes: the poller stops (the job itself runs on, on the server)."""
        self._closed = True
        self._task.cancel()

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
    """The same API as `Client` (serve_app/client/sync.py) for asyncio code."""

    def __init__(self, base_url: str = "http://127.0.0.1:9527", *, timeout_s: float = SUBMIT_TIMEOUT_S,
                 api_key: Optional[str] = None, retry: RetryPolicy = RetryPolicy(),
                 transport: Optional[httpx.AsyncBaseTransport] = None, submit_timeout_s: float = SUBMIT_TIMEOUT_S):
        self._http = httpx.AsyncClient(base_url=base_url, timeout=timeout_s, headers=auth_headers(api_key),
                                       transport=transport)
        self.retry = retry
        self.timeout_s = timeout_s
        self.submit_timeout_s = submit_timeout_s
        self._jobs: "weakref.WeakSet[AsyncJob]" = weakref.WeakSet()  # their pollers stop when the client closes

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the connection pool; awaiting a job still pending then raises (the job runs on, on the server)."""
        for job in list(self._jobs):
            job._close()
        await self._http.aclose()

    async def _post(self, path: str, body: dict, headers: Optional[dict] = None, timeout_s: Optional[float] = None,
                    deadline_ms: Optional[int] = None,
                    statuses: tuple[int, ...] = RETRYABLE_STATUSES) -> httpx.Response:
        started, timeout = time.monotonic(), self.timeout_s if timeout_s is None else timeout_s

        async def attempt() -> httpx.Response:
            sent = {**(headers or {}), **(deadline_headers(deadline_ms, started) or {})}
            return await self._http.post(path, json=body, headers=sent,
                                         timeout=self.retry.attempt_timeout(timeout, started))

        return answer(await self.retry.async_retrying(statuses, deadline_ms)(attempt))

    async def translate(self, texts: Sequence[str], *, source: str, target: str,
                        ids: Optional[Sequence[str]] = None, deadline_ms: Optional[int] = None) -> list[str]:
        response = await self._post("/translation", translation_body(texts, source, target, ids),
                                    deadline_ms=checked_deadline(deadline_ms))
        return translations(response, len(texts))

    async def embed(self, texts: Sequence[str], *, model: Optional[str] = None) -> list[list[float]]:
        return vectors(await self._post("/embeddings", embeddings_body(texts, model)))

    async def predict(self, model: str, inputs: Sequence[dict], *,
                      deadline_ms: Optional[int] = None) -> list[dict]:
        response = await self._post(predict_path(model), {"inputs": list(inputs)},
                                    deadline_ms=checked_deadline(deadline_ms))
        return outputs(response, len(inputs))

    async def submit(self, task: str, payload: dict, *, idempotency_key: Optional[str] = None) -> AsyncJob:
        """Submit a job (POST /jobs); awaiting it gives the job's result body."""
        return await self._submit(JobSpec(task, payload, lambda result: result), idempotency_key)

    async def submit_translation(self, texts: Sequence[str], *, source: str, target: str,
                                 ids: Optional[Sequence[str]] = None,
                                 idempotency_key: Optional[str] = None) -> AsyncJob:
        return await self._submit(JobSpec.translation(texts, source, target, ids), idempotency_key)

    async def submit_embeddings(self, texts: Sequence[str], *, model: Optional[str] = None,
                                idempotency_key: Optional[str] = None) -> AsyncJob:
        return await self._submit(JobSpec.embeddings(texts, model), idempotency_key)

    async def submit_predict(self, model: str, inputs: Sequence[dict], *,
                             idempotency_key: Optional[str] = None) -> AsyncJob:
        return await self._submit(JobSpec.predict(model, inputs), idempotency_key)

    async def _submit(self, spec: JobSpec, idempotency_key: Optional[str] = None) -> AsyncJob:
        view = (await self._post("/jobs", {"task": spec.task, "payload": spec.payload},
                                 submission_headers(idempotency_key), self.submit_timeout_s,
                                 statuses=SUBMISSION_RETRYABLE_STATUSES)).json()
        return AsyncJob(self, view["job_id"], spec.parse)

    async def job(self, job_id: str) -> dict:
        return checked(await self._http.get(job_path(job_id)), 200)

    async def _whole(self, view: dict) -> dict:
        while (view.get("page") or {}).get("next"):
            merge_page(view, checked(await self._http.get(**next_page(view)), 200))
        return view

    async def cancel_job(self, job_id: str) -> dict:
        return checked(await self._http.delete(job_path(job_id)), 200)

    async def models(self) -> list[dict]:
        return checked(await self._http.get("/v1/models"), 200)["data"]

    async def ready(self) -> bool:
        return (await self._http.get("/readyz")).status_code == 200
