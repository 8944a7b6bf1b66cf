"""What the routes do, apart from HTTP: check a request, cut it into model calls (through the
response cache), answer it; the jobs, readiness and /v1/models through the same model clients."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import sys
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Hashable, Optional, TypeVar

import numpy as np

from deployments.backends.segments import CutText
from deployments.batching import Chunk, split

from .cache import ResponseCache, storable
from .calls import check_dimensions, check_text_lengths, gather_limited, resolve_pair
from .coalescing import CallCoalescer
from .custom_models import CustomModel, custom_models
from .errors import ModelNotFound, NotFound, PayloadTooLarge, RequestTimeout, UnsupportedModel
from .handle_client import HandleClient
from .model_clients import ModelClient
from .model_info import ModelInfo
from .readiness import Readiness
from .schemas import (
    Embedding, EmbeddingsRequest, EmbeddingsResponse, EmbeddingsUsage, PredictResponse, TranslatedRecord,
    TranslationPayload, TranslationResponse,
)
from .settings import AppSettings

logger = logging.getLogger("serve_app")
T = TypeVar("T")

@dataclass(frozen=True)
class Computed:
    """How a response was made. `batch_records`: records in the largest model batch its
    computed texts rode in (0: nothing was computed, every text came from the cache).
    `cache`: `hit` (every text from the response cache), `miss` (none), `partial`, or None
    when the cache is off."""

    batch_records: int
    cache: Optional[str] = None


#: what `_through_cache` computes: texts -> (one value per text, largest batch)
Compute = Callable[[list[str]], Awaitable[tuple[list[Any], int]]]


class Service:
    def __init__(self, settings: AppSettings, translator: ModelClient, embedder: ModelClient,
                 models: Optional[dict[str, ModelClient]] = None,
                 cache: Optional[ResponseCache] = None, jobs: Optional[ModelClient] = None):
        self.settings = settings
        self.translator = translator
        self.embedder = embedder
        #: the JobManager deployment (None: jobs.enabled is false)
        self.jobs = jobs
        #: the response cache (None: off); per ingress replica, see serve_app/cache.py
        self.cache = cache
        self._info = ModelInfo()  # (serve_app/model_info.py)
        self._readiness = Readiness(settings.ingress.readiness_timeout_s)
        #: custom models (`models:`) by name: their deployment's client and module (schemas only)
        self.custom_models = custom_models(settings, models or {})
        # Concurrent requests' records share calls to the models once max_inflight_calls_per_model
        # are in flight (serve_app/coalescing.py): fewer handle calls, each fuller. A model in a deployment
        # of its own (a HandleClient; not one placed here, nor the jobs' BackgroundClient) also keeps an input
        # that crashes its replica from failing the others who shared the call, and refuses a caller's records
        # that crashed it before they share a call (serve_app/crash_quarantine.py); one placed here journals each
        # caller's records on this node while it waits, and refuses those that crashed it (crash_journal.py).
        def coalesced(client: ModelClient, method: str, arg_of, slice_result, max_records: int) -> CallCoalescer:
            return CallCoalescer.of_method(
                client.call, method, arg_of, slice_result, max_records=max_records,
                max_inflight_calls=self.limits.max_inflight_calls_per_model,
                replica_retry_timeout_s=self.limits.replica_retry_timeout_s,
                quarantine=client.quarantine if isinstance(client, HandleClient) else None,
                journal=getattr(client, "journal", None))

        self._translate_calls = coalesced(
            translator, "translate", lambda pair, texts: Chunk(pair[0], pair[1], texts),
            lambda result, start, stop: (result[0][start:stop], result[1]), self.limits.records_per_call)
        self._embed_calls = coalesced(
            embedder, "embed", lambda _, texts: texts,
            lambda result, start, stop: (result[0][start:stop], result[1][start:stop], result[2]),
            self.limits.inputs_per_embedding_call)
        self._predict_calls = {
            name: coalesced(model.client, "predict", lambda _, items: items,
                            lambda result, start, stop: (result[0][start:stop], result[1]),
                            self.limits.inputs_per_predict_call)
            for name, model in self.custom_models.items()}

    @property
    def limits(self):
        return self.settings.ingress

    async def model_info(self, client: ModelClient, *, fresh: bool = False) -> dict:
        return await self._info.get(client, fresh=fresh)

    def deadline_s(self, requested_s: Optional[float] = None) -> float:
        """The request's deadline: the client's (X-Request-Timeout-Ms) capped by `model_timeout_s`."""
        cap = self.limits.model_timeout_s
        return cap if requested_s is None else min(float(requested_s), cap)

    @contextlib.asynccontextmanager
    async def _deadline(self, requested_s: Optional[float] = None):
        """One deadline over all of a request's model calls. When it passes, every call still
        pending is cancelled (and with it the records queued in the model's batch queue)."""
        timeout_s = self.deadline_s(requested_s)
        try:
            async with asyncio.timeout(timeout_s):
                yield
        except TimeoutError:
            raise RequestTimeout(f"The request did not finish within {timeout_s:g} s.") from None

    async def _with_deadline(self, work: Awaitable[T], requested_s: Optional[float] = None) -> T:
        async with self._deadline(requested_s):
            return await work

    async def _through_cache(self, task: str, texts: list[str], key: Callable[[str], Hashable],
                             compute: Compute, read: bool, write: bool) -> tuple[list[Any], Computed]:
        """One value per text: from the cache where it holds one (`read`), else computed, each
        distinct missing text once, and stored (`write`). Order is the texts' order."""
        if self.cache is None:
            values, batch = await compute(texts)
            return values, Computed(batch)
        keys = [key(t) for t in texts]
        found = self.cache.lookup(task, keys) if read else [None] * len(texts)
        todo = list(dict.fromkeys(t for t, v in zip(texts, found) if v is None))
        computed: dict[str, Any] = {}
        batch = 0
        if todo:
            values, batch = await compute(todo)
            computed = dict(zip(todo, values))
            if write:  # not a translation the model cut short (a failed second pass: it may come whole later)
                self.cache.store((key(t), storable(v)) for t, v in computed.items() if not isinstance(v, CutText))
        hits = len(texts) - sum(v is None for v in found)
        status = "hit" if hits == len(texts) else "miss" if hits == 0 else "partial"
        return [computed[t] if v is None else v for t, v in zip(texts, found)], Computed(batch, status)

    async def validate_translation(self, payload: TranslationPayload) -> tuple[list[str], dict, str, str]:
        """Check a translation against the limits and the model's pairs: (texts, model info,
        source, target), or the error (413, 400) the request gets."""
        records = payload.records
        if len(records) > self.limits.max_records_per_request:
            raise PayloadTooLarge(
                f"{len(records)} records in one request; the limit is {self.limits.max_records_per_request}."
            )
        texts = [r.text for r in records]
        check_text_lengths(texts, self.limits.max_text_chars, "records.text")
        info = await self.model_info(self.translator)
        source, target = resolve_pair(payload.fromLang, payload.toLang, info["language_pairs"])
        return texts, info, source, target

    def validate_embeddings(self, request: EmbeddingsRequest) -> tuple[list[str], str]:
        """Check an embeddings request against the limits and the served model: (texts, model name)."""
        texts = request.texts()
        if len(texts) > self.limits.max_embedding_inputs:
            raise PayloadTooLarge(
                f"{len(texts)} inputs in one request; the limit is {self.limits.max_embedding_inputs}."
            )
        check_text_lengths(texts, self.limits.max_text_chars, "input")
        name = self.settings.embeddings.model_name
        if request.model is not None and request.model.lower() not in _model_aliases(name):
            raise UnsupportedModel(f"Model {request.model!r} is not served here; use {name!r} or omit 'model'.")
        return texts, name

    def validate_predict(self, name: str, inputs: list[Any]) -> tuple[CustomModel, list[dict]]:
        """Check a custom-model request: the model exists (404), the inputs fit the limit (413) and
        its `Input` schema (422). Returns the model and the validated inputs."""
        model = self.custom_models.get(name)
        if model is None:
            served = ", ".join(repr(n) for n in sorted(self.custom_models)) or "none"
            raise ModelNotFound(f"No model named {name!r} is served here; models: {served}.")
        if len(inputs) > self.limits.max_predict_inputs:
            raise PayloadTooLarge(
                f"{len(inputs)} inputs in one request; the limit is {self.limits.max_predict_inputs}."
            )
        return model, model.validate(inputs)

    async def translate(self, payload: TranslationPayload, timeout_s: Optional[float] = None, *,
                        read_cache: bool = True, write_cache: bool = True) -> tuple[TranslationResponse, Computed]:
        records = payload.records
        async with self._deadline(timeout_s):
            texts, info, source, target = await self.validate_translation(payload)

            async def compute(todo: list[str]) -> tuple[list[str], int]:
                calls = [
                    (lambda piece=piece: self._translate_calls.submit((source, target), piece))
                    for piece in split(todo, self.limits.records_per_call)
                ]
                results = await gather_limited(calls, self.limits.max_inflight_calls_per_request)
                return [text for texts_out, _ in results for text in texts_out], max(size for _, size in results)

            # Interned: every entry's key shares these (the cache counts only the text's bytes).
            model, source, target = (sys.intern(s) for s in (f"{info['backend']}:{info['model']}", source, target))
            translated, computed = await self._through_cache(
                "translation", texts, lambda text: ("translation", model, source, target, text), compute,
                read_cache, write_cache)
        return TranslationResponse(
            result=[TranslatedRecord(id=r.id, text=t) for r, t in zip(records, translated)]
        ), computed

    async def embed(self, request: EmbeddingsRequest, timeout_s: Optional[float] = None, *,
                    read_cache: bool = True, write_cache: bool = True) -> tuple[EmbeddingsResponse, Computed]:
        texts, name = self.validate_embeddings(request)

        async def compute(todo: list[str]) -> tuple[list[tuple[np.ndarray, int]], int]:
            calls = [
                (lambda piece=piece: self._embed_calls.submit(None, piece))
                for piece in split(todo, self.limits.inputs_per_embedding_call)
            ]
            results = await gather_limited(calls, self.limits.max_inflight_calls_per_request)
            per_text = [(vector, count) for vectors, counts, _ in results for vector, count in zip(vectors, counts)]
            return per_text, max(b for _, _, b in results)

        async with self._deadline(timeout_s):  # one deadline over the model-info lookup and the vectors
            if request.dimensions is not None:
                check_dimensions(name, request.dimensions, (await self.model_info(self.embedder))["dimensions"])
            embedded, computed = await self._through_cache(
                "embeddings", texts, lambda text: ("embeddings", name, text), compute, read_cache, write_cache)
        tokens = sum(count for _, count in embedded)
        data = [
            Embedding(index=i, embedding=_encode(vector, request.encoding_format))
            for i, (vector, _) in enumerate(embedded)
        ]
        return EmbeddingsResponse(
            data=data, model=name, usage=EmbeddingsUsage(prompt_tokens=tokens, total_tokens=tokens)
        ), computed

    async def predict(self, name: str, inputs: list[Any],
                      timeout_s: Optional[float] = None) -> tuple[PredictResponse, int]:
        """Run the custom model `name` on `inputs` (validated against its module's `Input`);
        returns its outputs in the inputs' order and the largest model batch they rode in."""
        model, items = self.validate_predict(name, inputs)
        coalescer = self._predict_calls[name]
        calls = [
            (lambda piece=piece: coalescer.submit(None, piece))
            for piece in split(items, self.limits.inputs_per_predict_call)
        ]
        results = await self._with_deadline(
            gather_limited(calls, self.limits.max_inflight_calls_per_request), timeout_s)
        outputs = [output for outputs, _ in results for output in outputs]
        return PredictResponse(model=name, outputs=outputs), max(size for _, size in results)

    def _job_manager(self) -> ModelClient:
        if self.jobs is None:
            raise NotFound("Jobs are off on this service (jobs.enabled is false).")
        return self.jobs

    async def submit_job(self, task: str, payload: dict, request_id: Optional[str] = None, owner: str = "anonymous",
                         idempotency_key: Optional[str] = None) -> dict:
        """Queue a job (validated now: 4xx at once, as the task's route would answer); its view.
        The same `idempotency_key` (else `request_id`), task and payload again return the same job
        (serve_app/jobs/runner.py). `owner`: the caller's API key id; only it sees the job."""
        return await self._with_deadline(self._job_manager().call(
            "submit", task, payload, request_id, owner, idempotency_key))

    async def job(self, job_id: str, owner: str = "anonymous", offset: Optional[int] = None,
                  limit: Optional[int] = None) -> dict:
        return await self._with_deadline(self._job_manager().call("get", job_id, owner, offset, limit))

    async def cancel_job(self, job_id: str, owner: str = "anonymous") -> dict:
        return await self._with_deadline(self._job_manager().call("cancel", job_id, owner))

    async def readiness(self) -> dict[str, str]:
        """Each model deployment's state (and the JobManager's): `ready`, or why not (serve_app/readiness.py)."""
        return await self._readiness.states([
            self.translator, self.embedder, *(m.client for m in self.custom_models.values()),
            *([self.jobs] if self.jobs is not None else [])])

    async def models(self) -> list[dict[str, Any]]:
        custom = list(self.custom_models.values())
        translator, embedder, *infos = await self._with_deadline(asyncio.gather(
            self.model_info(self.translator, fresh=True), self.model_info(self.embedder, fresh=True),
            *(self.model_info(m.client, fresh=True) for m in custom),
        ))
        return [
            {"id": translator["model"], "task": "translation", "deployment": translator["deployment"],
             "placement": self.settings.translation.placement,
             "backend": translator["backend"], "language_pairs": translator["language_pairs"],
             "batching": translator["batching"], "details": translator["details"]},
            {"id": embedder["model"], "task": "embeddings", "deployment": embedder["deployment"],
             "placement": self.settings.embeddings.placement,
             "backend": embedder["backend"], "dimensions": embedder["dimensions"],
             "batching": embedder["batching"], "details": embedder["details"]},
        ] + [model.card(info) for model, info in zip(custom, infos)]


def _model_aliases(name: str) -> set[str]:
    """The names a request may give the embedding model, lower case (a request's is compared lower-cased)."""
    return {name.lower(), f"sentence-transformers/{name}".lower()}


def _encode(vector: np.ndarray, encoding_format: str) -> Any:
    if encoding_format == "base64":
        return base64.b64encode(np.asarray(vector, dtype="<f4").tobytes()).decode("ascii")
    return vector.tolist()
