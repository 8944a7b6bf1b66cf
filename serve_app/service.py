"""What the routes do, apart from HTTP: limits, language pairs, cutting requests into calls."""

from __future__ import annotations

import asyncio
import base64
import time
from typing import Any, Awaitable, Callable, Optional, Sequence, TypeVar

import numpy as np

from deployments.batching import Chunk, split

from .clients import ModelClient
from .errors import PayloadTooLarge, RequestTimeout, ServeAppError, UnsupportedLanguagePair, UnsupportedModel
from .schemas import (
    Embedding, EmbeddingsRequest, EmbeddingsResponse, EmbeddingsUsage, TranslatedRecord,
    TranslationPayload, TranslationResponse, normalise_language,
)
from .settings import AppSettings

T = TypeVar("T")

#: how long the ingress trusts its copy of a model's supported pairs
MODEL_INFO_TTL_S = 30.0


def resolve_pair(source: str, target: str, supported: Sequence[str]) -> tuple[str, str]:
    """Map the request's codes onto a supported `src-tgt` pair.

    Codes are case-insensitive and `_` equals `-`; a regional code such as
    `pt-BR` falls back to its language (`pt`) when the model has no regional pair.
    """
    src, tgt = normalise_language(source), normalise_language(target)
    pairs = set(supported)
    for s in dict.fromkeys((src, src.split("-")[0])):
        for t in dict.fromkeys((tgt, tgt.split("-")[0])):
            if f"{s}-{t}" in pairs:
                return s, t
    listed = ", ".join(sorted(pairs)[:50]) + (" ..." if len(pairs) > 50 else "")
    raise UnsupportedLanguagePair(
        f"Unsupported language pair {source!r} -> {target!r}. Supported pairs: {listed}."
    )


def check_text_lengths(texts: Sequence[str], limit: int, field: str) -> None:
    for i, text in enumerate(texts):
        if len(text) > limit:
            raise PayloadTooLarge(
                f"{field}[{i}] has {len(text)} characters; the limit is {limit}."
            )


async def gather_limited(calls: Sequence[Callable[[], Awaitable[T]]], limit: int) -> list[T]:
    """Run calls with at most `limit` in flight; the first failure cancels the rest."""
    semaphore = asyncio.Semaphore(limit)

    async def run(call: Callable[[], Awaitable[T]]) -> T:
        async with semaphore:
            return await call()

    try:
        async with asyncio.TaskGroup() as group:
            tasks = [group.create_task(run(c)) for c in calls]
    except* ServeAppError as errors:
        raise errors.exceptions[0] from None
    return [t.result() for t in tasks]


class Service:
    def __init__(self, settings: AppSettings, translator: ModelClient, embedder: ModelClient):
        self.settings = settings
        self.translator = translator
        self.embedder = embedder
        self._info: dict[str, tuple[float, dict]] = {}

    @property
    def limits(self):
        return self.settings.ingress

    async def model_info(self, client: ModelClient, *, fresh: bool = False) -> dict:
        cached = self._info.get(client.name)
        if cached and not fresh and time.monotonic() - cached[0] < MODEL_INFO_TTL_S:
            return cached[1]
        info = await client.call("info")
        self._info[client.name] = (time.monotonic(), info)
        return info

    async def _with_deadline(self, work: Awaitable[T]) -> T:
        timeout_s = self.limits.model_timeout_s
        try:
            async with asyncio.timeout(timeout_s):
                return await work
        except TimeoutError:
            raise RequestTimeout(f"The request did not finish within {timeout_s:g} s.") from None

    async def translate(self, payload: TranslationPayload) -> tuple[TranslationResponse, int]:
        records = payload.records
        if len(records) > self.limits.max_records_per_request:
            raise PayloadTooLarge(
                f"{len(records)} records in one request; the limit is {self.limits.max_records_per_request}."
            )
        texts = [r.text for r in records]
        check_text_lengths(texts, self.limits.max_text_chars, "records.text")
        info = await self._with_deadline(self.model_info(self.translator))
        source, target = resolve_pair(payload.fromLang, payload.toLang, info["language_pairs"])
        calls = [
            (lambda piece=piece: self.translator.call("translate", Chunk(source, target, piece)))
            for piece in split(texts, self.limits.records_per_call)
        ]
        results = await self._with_deadline(gather_limited(calls, self.limits.max_inflight_calls_per_request))
        translated = [text for texts_out, _ in results for text in texts_out]
        batch = max(size for _, size in results)
        return TranslationResponse(
            result=[TranslatedRecord(id=r.id, text=t) for r, t in zip(records, translated)]
        ), batch

    async def embed(self, request: EmbeddingsRequest) -> tuple[EmbeddingsResponse, int]:
        texts = request.texts()
        if len(texts) > self.limits.max_embedding_inputs:
            raise PayloadTooLarge(
                f"{len(texts)} inputs in one request; the limit is {self.limits.max_embedding_inputs}."
            )
        check_text_lengths(texts, self.limits.max_text_chars, "input")
        name = self.settings.embeddings.model_name
        if request.model is not None and request.model not in _model_aliases(name):
            raise UnsupportedModel(f"Model {request.model!r} is not served here; use {name!r} or omit 'model'.")
        calls = [
            (lambda piece=piece: self.embedder.call("embed", piece))
            for piece in split(texts, self.limits.inputs_per_embedding_call)
        ]
        results = await self._with_deadline(gather_limited(calls, self.limits.max_inflight_calls_per_request))
        vectors = np.concatenate([v for v, _, _ in results]) if len(results) > 1 else results[0][0]
        tokens = sum(sum(t) for _, t, _ in results)
        batch = max(b for _, _, b in results)
        data = [
            Embedding(index=i, embedding=_encode(vector, request.encoding_format))
            for i, vector in enumerate(vectors)
        ]
        return EmbeddingsResponse(
            data=data, model=name, usage=EmbeddingsUsage(prompt_tokens=tokens, total_tokens=tokens)
        ), batch

    async def readiness(self) -> dict[str, str]:
        """Each model deployment's state: `ready`, or why not."""
        async def probe(client: ModelClient) -> str:
            try:
                async with asyncio.timeout(self.limits.readiness_timeout_s):
                    await client.call("ready")
                return "ready"
            except TimeoutError:
                return "loading (no replica answered in time)"
            except ServeAppError as exc:
                return f"unavailable: {exc.message}"

        clients = [self.translator, self.embedder]
        states = await asyncio.gather(*(probe(c) for c in clients))
        return {c.name: s for c, s in zip(clients, states)}

    async def models(self) -> list[dict[str, Any]]:
        translator, embedder = await self._with_deadline(
            asyncio.gather(self.model_info(self.translator, fresh=True), self.model_info(self.embedder, fresh=True))
        )
        return [
            {"id": translator["model"], "task": "translation", "deployment": translator["deployment"],
             "backend": translator["backend"], "language_pairs": translator["language_pairs"],
             "batching": translator["batching"], "details": translator["details"]},
            {"id": embedder["model"], "task": "embeddings", "deployment": embedder["deployment"],
             "backend": embedder["backend"], "dimensions": embedder["dimensions"],
             "batching": embedder["batching"], "details": embedder["details"]},
        ]


def _model_aliases(name: str) -> set[str]:
    return {name, name.lower(), f"sentence-transformers/{name}", f"sentence-transformers/{name}".lower()}


def _encode(vector: np.ndarray, encoding_format: str) -> Any:
    if encoding_format == "base64":
        return base64.b64encode(np.asarray(vector, dtype="<f4").tobytes()).decode("ascii")
    return vector.tolist()
