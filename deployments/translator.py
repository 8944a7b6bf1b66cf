"""The Translator deployment: holds one translation backend and batches records into it."""

from __future__ import annotations

import asyncio
import logging

from ray import serve

from serve_app.settings import TranslationSettings

from ._config import TRANSLATOR_BATCH, model_deployment_options
from ._replica import ModelReplica, cpu_share, threads_for_share
from .backends import load_translation_backend
from .batching import Chunk, count_records, run_grouped, split

logger = logging.getLogger("ray.serve")


@serve.deployment(**model_deployment_options("Translator", TRANSLATOR_BATCH))
class Translator(ModelReplica):
    deployment_name = "Translator"
    default_batch = TRANSLATOR_BATCH

    def __init__(self, settings: dict):
        self.settings = TranslationSettings(**settings)
        threads = threads_for_share(cpu_share(), self.settings.num_threads)
        self.backend = load_translation_backend(self.settings, threads)
        self.backend.warm_up()
        self._init_replica()
        logger.info("Translator ready: backend=%s model=%s threads=%d",
                    self.backend.name, self.backend.model_id, threads)

    def _batched_methods(self):
        return [self._translate_batch]

    async def translate(self, chunk: Chunk) -> tuple[list[str], int]:
        """Translate one chunk; returns the texts and the largest model batch they rode in."""
        pieces = split(chunk.texts, self.batch_config.max_batch_size)
        results = await asyncio.gather(
            *(self._translate_batch(Chunk(chunk.source, chunk.target, piece)) for piece in pieces)
        )
        return [text for texts, _ in results for text in texts], max(size for _, size in results)

    @serve.batch(
        max_batch_size=TRANSLATOR_BATCH.max_batch_size,
        batch_wait_timeout_s=TRANSLATOR_BATCH.batch_wait_timeout_s,
        batch_size_fn=count_records,
    )
    async def _translate_batch(self, chunks: list[Chunk]) -> list[tuple[list[str], int]]:
        self._batch_started(chunks)
        records = count_records(chunks)
        keys = [(c.source, c.target) for c in chunks]

        def run():
            return run_grouped(keys, [c.texts for c in chunks],
                               lambda pair, texts: self.backend.translate(texts, pair[0], pair[1]))

        outputs = await self._run_model(run, records)
        return [(texts, records) for texts in outputs]

    def ready(self) -> dict:
        return {"deployment": self.deployment_name, "ready_at": self.ready_at}

    def info(self) -> dict:
        return {
            "deployment": self.deployment_name,
            "backend": self.backend.name,
            "model": self.backend.model_id,
            "language_pairs": [str(p) for p in self.backend.supported_pairs()],
            "batching": self.batching_info(),
            "details": self.backend.describe(),
        }
