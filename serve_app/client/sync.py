"""The blocking client: `Client`, and `JobFuture` (a job as a concurrent.futures.Future,
resolved by one polling thread per client)."""

from __future__ import annotations

import concurrent.futures
import threading
import time
from typing import Any, Callable, Optional, Sequence

import httpx

from .retry import RetryPolicy
from .wire import (
    FINISHED_JOB_STATES, PASSING_STATUSES, RETRYABLE_STATUSES, SUBMISSION_RETRYABLE_STATUSES, SUBMIT_TIMEOUT_S,
    JobCancelled, JobSpec, ServeAppHTTPError, answer, auth_headers, checked, checked_deadline, deadline_headers,
    embeddings_body, job_outcome, job_path, merge_page, next_page, outputs, predict_path, submission_headers,
    translation_body, translations, vectors,
)


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
            self.set_result(job_outcome(view, self._parse))
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
        try:
            self._poll()
        except BaseException as exc:  # never a future left waiting on a poller that is gone
            with self._lock:
                pending, self._pending, self._thread = list(self._pending.values()), {}, None
            for future in pending:
                future._fail(exc)
            raise

    def _poll(self) -> None:
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
                    if view["status"] not in FINISHED_JOB_STATES:
                        continue
                    view = self._client._whole(view)
                except httpx.TransportError:
                    continue  # the service may be restarting: keep polling
                except ServeAppHTTPError as exc:  # 404: expired; a 502/503/504 (a deadline) may pass: poll on
                    if exc.status_code in PASSING_STATUSES:
                        continue
                    future._fail(exc)
                except Exception as exc:  # noqa: BLE001 - a malformed answer fails its job's future, as in aio.py
                    future._fail(exc)
                else:
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
    """Blocking client. `timeout_s` bounds each HTTP attempt (`submit_timeout_s` a job
    submission's); `retry.deadline_s` bounds a whole call, its retries and waits included."""

    def __init__(self, base_url: str = "http://127.0.0.1:9527", *, timeout_s: float = SUBMIT_TIMEOUT_S,
                 api_key: Optional[str] = None, retry: RetryPolicy = RetryPolicy(),
                 transport: Optional[httpx.BaseTransport] = None, submit_timeout_s: float = SUBMIT_TIMEOUT_S):
        self._http = httpx.Client(base_url=base_url, timeout=timeout_s, headers=auth_headers(api_key),
                                  transport=transport)
        self.retry = retry
        self.timeout_s = timeout_s
        self.submit_timeout_s = submit_timeout_s
        self._jobs = _JobPoller(self)

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        """Close the connection pool; jobs still pending fail in their futures (not on the server)."""
        self._jobs.close()
        self._http.close()

    def _post(self, path: str, body: dict, headers: Optional[dict] = None, timeout_s: Optional[float] = None,
              deadline_ms: Optional[int] = None, statuses: tuple[int, ...] = RETRYABLE_STATUSES) -> httpx.Response:
        started, timeout = time.monotonic(), self.timeout_s if timeout_s is None else timeout_s

        def attempt() -> httpx.Response:
            sent = {**(headers or {}), **(deadline_headers(deadline_ms, started) or {})}
            return self._http.post(path, json=body, headers=sent,
                                   timeout=self.retry.attempt_timeout(timeout, started))

        return answer(self.retry.retrying(statuses, deadline_ms)(attempt))

    def translate(self, texts: Sequence[str], *, source: str, target: str,
                  ids: Optional[Sequence[str]] = None, deadline_ms: Optional[int] = None) -> list[str]:
        """Translated texts, in the order given."""
        response = self._post("/translation", translation_body(texts, source, target, ids),
                              deadline_ms=checked_deadline(deadline_ms))
        return translations(response, len(texts))

    def embed(self, texts: Sequence[str], *, model: Optional[str] = None) -> list[list[float]]:
        """One unit-length vector per text, in the order given."""
        return vectors(self._post("/embeddings", embeddings_body(texts, model)))

    def predict(self, model: str, inputs: Sequence[dict], *, deadline_ms: Optional[int] = None) -> list[dict]:
        """Your own model's outputs (an entry of `models:`), one per input, in the order given."""
        response = self._post(predict_path(model), {"inputs": list(inputs)}, deadline_ms=checked_deadline(deadline_ms))
        return outputs(response, len(inputs))

    def submit(self, task: str, payload: dict, *, idempotency_key: Optional[str] = None) -> JobFuture:
        """Submit a job (POST /jobs); the future's result is the job's result body, exactly what
        the task's route answers. Submission is validated at once: a bad payload raises here.
        `idempotency_key` (every submit*): the same key sent again (after this client gave up on its
        retries) answers with the job the first submission made, not a second one; default: a fresh key."""
        return self._submit(JobSpec(task, payload, lambda result: result), idempotency_key)

    def submit_translation(self, texts: Sequence[str], *, source: str, target: str,
                           ids: Optional[Sequence[str]] = None, idempotency_key: Optional[str] = None) -> JobFuture:
        """`translate()` as a job: the future's result is the translated texts, in order."""
        return self._submit(JobSpec.translation(texts, source, target, ids), idempotency_key)

    def submit_embeddings(self, texts: Sequence[str], *, model: Optional[str] = None,
                          idempotency_key: Optional[str] = None) -> JobFuture:
        """`embed()` as a job: the future's result is one vector per text."""
        return self._submit(JobSpec.embeddings(texts, model), idempotency_key)

    def submit_predict(self, model: str, inputs: Sequence[dict], *, idempotency_key: Optional[str] = None) -> JobFuture:
        """`predict()` as a job: the future's result is one output per input."""
        return self._submit(JobSpec.predict(model, inputs), idempotency_key)

    def _submit(self, spec: JobSpec, idempotency_key: Optional[str] = None) -> JobFuture:
        view = self._post("/jobs", {"task": spec.task, "payload": spec.payload}, submission_headers(idempotency_key),
                          self.submit_timeout_s, statuses=SUBMISSION_RETRYABLE_STATUSES).json()
        future = JobFuture(self, view["job_id"], spec.parse)
        self._jobs.watch(future)
        return future

    def job(self, job_id: str) -> dict:
        """The job as GET /jobs/<id> shows it (status, progress, result once succeeded; a large
        result's first page, see `page.next`)."""
        return checked(self._http.get(job_path(job_id)), 200)

    def _whole(self, view: dict) -> dict:
        """A finished job's view with every page of its result."""
        while (view.get("page") or {}).get("next"):
            merge_page(view, checked(self._http.get(**next_page(view)), 200))
        return view

    def cancel_job(self, job_id: str) -> dict:
        return checked(self._http.delete(job_path(job_id)), 200)

    def models(self) -> list[dict]:
        return checked(self._http.get("/v1/models"), 200)["data"]

    def ready(self) -> bool:
        return self._http.get("/readyz").status_code == 200
