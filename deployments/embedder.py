"""The Embedder deployment: MiniLM sentence embeddings, batched across requests."""

from __future__ import annotations

import logging
from concurrent.futures import Future
from typing import Union

import numpy as np
from ray import serve

from .backends.embedding import load_embedder
from .batch_config import EMBEDDER_BATCH, model_deployment_options
from .batching import count_records, run_joined
from .replica import ModelReplica, cpu_share, threads_for_share
from .settings import EmbeddingSettings

logger = logging.getLogger("ray.serve")


@serve.deployment(**model_deployment_options("Embedder", EMBEDDER_BATCH))
class Embedder(ModelReplica):
    deployment_name = "Embedder"
    default_batch = EMBEDDER_BATCH

    def __init__(self, settings: dict):
        self.settings = EmbeddingSettings(**settings)
        threads = threads_for_share(cpu_share(), self.settings.num_threads)
        self.model = load_embedder(self.settings, threads)
        self.model.embed(["warm up", "a slightly longer sentence to warm up the model"])
        self._init_replica()
        logger.info("Embedder ready: model=%s threads=%d", self.model.model_path, threads)

    def _batched_methods(self):
        return [self._embed_batch, self._embed_background_batch]

    async def embed(self, texts: list[str], background: bool = False) -> tuple[np.ndarray, list[int], int]:
        """Embed texts; returns vectors (n x dims float32), token counts and the largest batch used.

        `background=True` (job inputs) queues the texts behind interactive requests."""
        batched = self._embed_background_batch if background else self._embed_batch
        results = await self._submit_pieces(batched, texts, list)
        vectors = np.concatenate([v for (v, _), _ in results]) if len(results) > 1 else results[0][0][0]
        return vectors, [t for (_, tokens), _ in results for t in tokens], max(b for _, b in results)

    def _embed_items(self, items: list[list[str]]) -> list[Union[tuple[np.ndarray, list[int]], Exception]]:
        """On the model thread: one batch of calls; each call's vectors and token counts, or (the batch
        raised, and so did the call alone) its exception (deployments/batching.run_joined)."""
        def embed(texts: list[str]) -> tuple[np.ndarray, list[int]]:
            return self.model.embed(texts, max_batch_tokens=self.batch_config.max_batch_tokens)

        return run_joined(items, embed, lambda result, start, stop: (result[0][start:stop], result[1][start:stop]),
                          self.deployment_name)

    # Interactive and job inputs enter separately; the model queue joins what waits into the next
    # batch and runs interactive batches first.
    @serve.batch(
        max_batch_size=EMBEDDER_BATCH.max_batch_size,
        batch_wait_timeout_s=EMBEDDER_BATCH.batch_wait_timeout_s,
        batch_size_fn=count_records,
    )
    async def _embed_batch(self, items: list[list[str]]) -> list[Future]:
        return self._enqueue(items, self._embed_items)

    @serve.batch(
        max_batch_size=EMBEDDER_BATCH.max_batch_size,
        batch_wait_timeout_s=EMBEDDER_BATCH.batch_wait_timeout_s,
        batch_size_fn=count_records,
    )
    async def _embed_background_batch(self, items: list[list[str]]) -> list[Future]:
        return await self._enqueue_background(items, self._embed_items)

    def ready(self) -> dict:
        return {"deployment": self.deployment_name, "ready_at": self.ready_at}

    def info(self) -> dict:
        return {
            "deployment": self.deployment_name,
            "backend": "onnx" if self.settings.engine == "onnx" else "transformers",
            "model": self.settings.model_name,
            "dimensions": self.model.dimensions,
            "batching": self.batching_info(),
            "details": self.model.describe(),
        }
