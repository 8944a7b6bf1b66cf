"""The Embedder deployment: MiniLM sentence embeddings, batched across requests."""

from __future__ import annotations

import logging

import numpy as np
from ray import serve

from serve_app.settings import EmbeddingSettings

from ._config import EMBEDDER_BATCH, model_deployment_options
from ._replica import ModelReplica, Priority, cpu_share, threads_for_share
from .backends.embedding import SentenceEmbedder
from .batching import count_records

logger = logging.getLogger("ray.serve")


@serve.deployment(**model_deployment_options("Embedder", EMBEDDER_BATCH))
class Embedder(ModelReplica):
    deployment_name = "Embedder"
    default_batch = EMBEDDER_BATCH

    def __init__(self, settings: dict):
        self.settings = EmbeddingSettings(**settings)
        threads = threads_for_share(cpu_share(), self.settings.num_threads)
        self.model = SentenceEmbedder(
            self.settings.model_path, device=self.settings.device,
            max_seq_tokens=self.settings.max_seq_tokens, num_threads=threads,
        )
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
        vectors = np.concatenate([v for v, _, _ in results]) if len(results) > 1 else results[0][0]
        return vectors, [t for _, tokens, _ in results for t in tokens], max(b for _, _, b in results)

    async def _embed_items(self, items: list[list[str]], priority: Priority) -> list[tuple[np.ndarray, list[int], int]]:
        self._batch_started(items)
        records = count_records(items)
        flat = [text for item in items for text in item]
        vectors, tokens = await self._run_model(lambda: self.model.embed_sorted(flat), records, priority)
        out, offset = [], 0
        for item in items:
            n = len(item)
            out.append((vectors[offset:offset + n], tokens[offset:offset + n], records))
            offset += n
        return out

    # Interactive and job inputs batch separately; the model thread runs interactive batches first.
    @serve.batch(
        max_batch_size=EMBEDDER_BATCH.max_batch_size,
        batch_wait_timeout_s=EMBEDDER_BATCH.batch_wait_timeout_s,
        batch_size_fn=count_records,
    )
    async def _embed_batch(self, items: list[list[str]]) -> list[tuple[np.ndarray, list[int], int]]:
        return await self._embed_items(items, Priority.INTERACTIVE)

    @serve.batch(
        max_batch_size=EMBEDDER_BATCH.max_batch_size,
        batch_wait_timeout_s=EMBEDDER_BATCH.batch_wait_timeout_s,
        batch_size_fn=count_records,
    )
    async def _embed_background_batch(self, items: list[list[str]]) -> list[tuple[np.ndarray, list[int], int]]:
        return await self._embed_items(items, Priority.BACKGROUND)

    def ready(self) -> dict:
        return {"deployment": self.deployment_name, "ready_at": self.ready_at}

    def info(self) -> dict:
        return {
            "deployment": self.deployment_name,
            "backend": "transformers",
            "model": self.settings.model_name,
            "dimensions": self.model.dimensions,
            "batching": self.batching_info(),
            "details": self.model.describe(),
        }
