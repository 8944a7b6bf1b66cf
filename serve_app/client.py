"""A small typed client for serve-app over HTTP, sync and async.

    from serve_app.client import Client

    with Client("http://127.0.0.1:9527") as client:
        client.translate(["Life is like a box of chocolates."], source="en", target="pt")
        # -> ["A vida é como uma caixa de chocolates."]
        client.embed(["The food was delicious."])          # -> [[0.01, ...384 floats]]
        client.predict("iris", [{"sepal_length_cm": 5.1, "sepal_width_cm": 3.5,
                                 "petal_length_cm": 1.4, "petal_width_cm": 0.2}])
        # -> [{"species": "setosa", "confidence": 0.98, ...}]   (your own model, `models:`)

    async with AsyncClient("http://127.0.0.1:9527") as client:
        await client.translate(...)

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
import time
from dataclasses import dataclass
from typing import Any, Optional, Sequence
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

    def done(self, response: httpx.Response, attempt: int) -> bool:
        """True: `response` is the answer. False: retry it. Raises the service's error when
        retrying cannot help (not a 503) or the retries are spent."""
        if response.status_code == 200:
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
    result = response.json()["result"]
    if len(result) != expected:
        raise ServeAppHTTPError(response.status_code, f"{len(result)} results for {expected} records", "bad_response")
    return [r["text"] for r in result]


def _predict_path(model: str) -> str:
    return f"/models/{quote(model, safe='')}/predict"


def _outputs(response: httpx.Response, expected: int) -> list[dict]:
    outputs = response.json()["outputs"]
    if len(outputs) != expected:
        raise ServeAppHTTPError(response.status_code, f"{len(outputs)} outputs for {expected} inputs", "bad_response")
    return outputs


def _vectors(response: httpx.Response) -> list[list[float]]:
    return [d["embedding"] for d in sorted(response.json()["data"], key=lambda d: d["index"])]


class Client:
    """Blocking client. `timeout_s` bounds each HTTP attempt; retries add their waits."""

    def __init__(self, base_url: str = "http://127.0.0.1:9527", *, timeout_s: float = 60.0,
                 api_key: Optional[str] = None, retry: RetryPolicy = RetryPolicy(),
                 transport: Optional[httpx.BaseTransport] = None):
        self._http = httpx.Client(base_url=base_url, timeout=timeout_s, headers=_auth_headers(api_key),
                                  transport=transport)
        self.retry = retry

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
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

    def models(self) -> list[dict]:
        return self._http.get("/v1/models").raise_for_status().json()["data"]

    def ready(self) -> bool:
        return self._http.get("/readyz").status_code == 200


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

    async def models(self) -> list[dict]:
        return (await self._http.get("/v1/models")).raise_for_status().json()["data"]

    async def ready(self) -> bool:
        return (await self._http.get("/readyz")).status_code == 200
