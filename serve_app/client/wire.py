"""What goes over the wire: request bodies, answers read back, the service's errors, job specs.

Shared by the client's two halves (sync.py, aio.py); no I/O here.
"""

from __future__ import annotations

import concurrent.futures
import email.utils
import math
import time
import uuid
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Callable, Optional, Sequence
from urllib.parse import quote

import httpx

#: statuses worth retrying: the server said "not now", not "never"
RETRYABLE_STATUSES = (503,)
#: a job submission's, whose `Idempotency-Key` makes sending it again safe: also a 504 (the ingress's deadline
#: passed, maybe after the JobManager wrote the job) and a 502; sent again, the server answers with that job
SUBMISSION_RETRYABLE_STATUSES = (502, 503, 504)
#: answers to a job poll that pass while the job runs on (overloaded, restarting, the ingress's deadline); a 500 or
#: a 4xx fails the job's future
PASSING_STATUSES = (502, 503, 504)


class ServeAppHTTPError(RuntimeError):
    """The service answered with an error; `error_type` is the project's stable code."""

    def __init__(self, status_code: int, error: str, error_type: str, retry_after_s: Optional[float] = None):
        super().__init__(f"{status_code} {error_type}: {error}")
        self.status_code = status_code
        self.error = error
        self.error_type = error_type
        self.retry_after_s = retry_after_s


#: request header of a job submission: the same on each retry of one `submit*()` call
IDEMPOTENCY_HEADER = "Idempotency-Key"

#: how long one attempt of a call or a job submission may take by default: longer than the service's
#: own deadline (ingress.model_timeout_s, 60 s), which answers 504 first (equal, the client timed out
#: first and sent the doomed request again)
SUBMIT_TIMEOUT_S = 90.0


def submission_headers(key: Optional[str] = None) -> dict[str, str]:
    """The caller's `key` for one submission, or a fresh one (its retries reuse the dict, hence the key)."""
    if key is not None and (not isinstance(key, str) or not key.strip()):
        raise ValueError(f"idempotency_key must be a non-blank string (or None: a fresh one), not {key!r}")
    return {IDEMPOTENCY_HEADER: uuid.uuid4().hex if key is None else key}


#: where a paged job result (GET /jobs/<id> beyond jobs.max_page_bytes) keeps its records
_PAGED_LISTS = ("result", "data", "outputs")


def merge_page(view: dict, page: dict) -> None:
    """Append the records of `page` (the next page of the same job) to `view`'s result."""
    for name in _PAGED_LISTS:
        if isinstance(page["result"].get(name), list):
            view["result"][name] += page["result"][name]
    view["page"] = page["page"]


def next_page(view: dict) -> dict:
    """The request (httpx `get` arguments) for `view`'s next result page: the job's path under the client's base URL,
    as every other call, with the link's query. The link's path carries the service's idea of its prefix, which a
    gateway that strips one leaves out: joined to a base URL with a path, it dropped that path."""
    return {"url": job_path(view["job_id"]), "params": dict(httpx.URL(view["page"]["next"]).params)}


def auth_headers(api_key: Optional[str]) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def checked_deadline(deadline_ms: Optional[int]) -> Optional[int]:
    if deadline_ms is not None and (isinstance(deadline_ms, bool) or not isinstance(deadline_ms, int)
                                    or deadline_ms < 1):
        raise ValueError(f"deadline_ms must be a whole number of milliseconds >= 1 (or None), not {deadline_ms!r}")
    return deadline_ms


def deadline_headers(deadline_ms: Optional[int], started: float) -> Optional[dict[str, str]]:
    """An attempt's `X-Request-Timeout-Ms`: what is left of the call's `deadline_ms` since `started`
    (time.monotonic()), so that a retry after a 503's wait does not ask for the whole budget again. None
    without a deadline; a 504 `timeout`, raised, once nothing is left."""
    if deadline_ms is None:
        return None
    left = deadline_ms - int((time.monotonic() - started) * 1000)
    if left < 1:
        raise ServeAppHTTPError(504, f"the call's deadline_ms={deadline_ms} passed before it was answered", "timeout")
    return {"X-Request-Timeout-Ms": str(left)}


def _texts(texts: Sequence[str]) -> list[str]:
    if isinstance(texts, str):  # a str is a Sequence[str] too: one text per character
        raise TypeError("texts must be a sequence of strings, not one string: pass [text]")
    return list(texts)


def embeddings_body(texts: Sequence[str], model: Optional[str]) -> dict[str, Any]:
    body: dict[str, Any] = {"input": _texts(texts)}
    if model:
        body["model"] = model
    return body


def translation_body(texts: Sequence[str], source: str, target: str, ids: Optional[Sequence[str]]) -> dict:
    texts = _texts(texts)
    ids = list(ids) if ids is not None else [str(i) for i in range(len(texts))]
    if len(ids) != len(texts):
        raise ValueError(f"{len(ids)} ids for {len(texts)} texts")
    return {"payload": {"fromLang": source, "toLang": target,
                        "records": [{"id": i, "text": t} for i, t in zip(ids, texts)]}}


def retry_after_s(value: Optional[str]) -> Optional[float]:
    """A `Retry-After` header in seconds: its number of seconds, or the time until its HTTP date (at
    least 0); None when absent or unreadable (`nan`, `inf`, anything else)."""
    if not value:
        return None
    try:
        seconds = float(value)
    except ValueError:
        try:
            seconds = (email.utils.parsedate_to_datetime(value) - datetime.now(timezone.utc)).total_seconds()
        except (TypeError, ValueError):
            return None
    return max(seconds, 0.0) if math.isfinite(seconds) else None


def error_of(response: httpx.Response) -> ServeAppHTTPError:
    try:
        body = response.json()
    except ValueError:
        body = None
    if not isinstance(body, dict):  # not JSON, or JSON but not the service's error object (a proxy's page)
        body = {}
    error, error_type = str(body.get("error", response.text)), str(body.get("error_type", "unknown"))
    return ServeAppHTTPError(response.status_code, error, error_type, retry_after_s(response.headers.get("Retry-After")))


def translations(response: httpx.Response, expected: int) -> list[str]:
    return texts_of(response.json(), expected)


def texts_of(body: dict, expected: int) -> list[str]:
    result = body["result"]
    if len(result) != expected:
        raise ServeAppHTTPError(200, f"{len(result)} results for {expected} records", "bad_response")
    return [r["text"] for r in result]


def job_path(job_id: str) -> str:
    return f"/jobs/{quote(job_id, safe='')}"


def answer(response: httpx.Response) -> httpx.Response:
    """`response` if it is the answer (200, 202); else the service's error, raised."""
    if response.status_code not in (200, 202):
        raise error_of(response)
    return response


def predict_path(model: str) -> str:
    return f"/models/{quote(model, safe='')}/predict"


def outputs(response: httpx.Response, expected: int) -> list[dict]:
    return outputs_of(response.json(), expected)


def outputs_of(body: dict, expected: int) -> list[dict]:
    items = body["outputs"]
    if len(items) != expected:
        raise ServeAppHTTPError(200, f"{len(items)} outputs for {expected} inputs", "bad_response")
    return items


def vectors(response: httpx.Response) -> list[list[float]]:
    return vectors_of(response.json())


def vectors_of(body: dict) -> list[list[float]]:
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
        body = translation_body(texts, source, target, ids)
        return JobSpec("translation", body["payload"], lambda result, n=len(texts): texts_of(result, n))

    @staticmethod
    def embeddings(texts: Sequence[str], model: Optional[str]) -> "JobSpec":
        return JobSpec("embeddings", embeddings_body(texts, model), vectors_of)

    @staticmethod
    def predict(model: str, inputs: Sequence[dict]) -> "JobSpec":
        return JobSpec(model, {"inputs": list(inputs)}, lambda result, n=len(inputs): outputs_of(result, n))


def job_outcome(view: dict, parse: Callable[[dict], Any]) -> Any:
    """A finished job's value: its parsed result, or the error it failed with."""
    if view["status"] == "succeeded":
        return parse(view["result"])
    if view["status"] == "failed":
        error = view.get("error") or {}
        raise ServeAppHTTPError(200, error.get("error", "the job failed"), error.get("error_type", "unknown"))
    raise JobCancelled(f"job {view['job_id']} was cancelled")


class JobCancelled(concurrent.futures.CancelledError):
    """The job was cancelled (by DELETE /jobs/<id>, from this client or another)."""


def checked(response: httpx.Response, *ok: int) -> dict:
    if response.status_code not in ok:
        raise error_of(response)
    return response.json()
