"""Fake model clients that stand in for DeploymentHandles in unit tests."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np

from serve_app.api import set_service
from serve_app.service import Service
from serve_app.settings import load_settings


class FakeTranslator:
    name = "Translator"

    def __init__(self, pairs=("en-pt", "pt-en"), delay_s: float = 0.0, fail: Exception | None = None):
        self.pairs = list(pairs)
        self.delay_s = delay_s
        self.fail = fail
        self.calls: list[Any] = []
        #: the `background` flag of each compute call (job records are True)
        self.backgrounds: list[bool] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self.cancelled = 0

    async def call(self, method: str, *args: Any, background: bool = False) -> Any:
        if method == "info":
            return {"deployment": "Translator", "backend": "fake", "model": "fake-mt",
                    "language_pairs": self.pairs, "batching": {"max_batch_size": 8}, "details": {}}
        if method == "ready":
            return {"deployment": "Translator"}
        chunk = args[0]
        self.calls.append(chunk)
        self.backgrounds.append(background)
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            if self.delay_s:
                await asyncio.sleep(self.delay_s)
            if self.fail is not None:
                raise self.fail
            return [f"[{chunk.target}] {t}" for t in chunk.texts], len(chunk.texts)
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        finally:
            self.in_flight -= 1


class FakeEmbedder:
    name = "Embedder"

    def __init__(self, dims: int = 4, never_ready: bool = False):
        self.dims = dims
        self.never_ready = never_ready
        self.calls: list[list[str]] = []
        self.backgrounds: list[bool] = []

    async def call(self, method: str, *args: Any, background: bool = False) -> Any:
        if method == "info":
            return {"deployment": "Embedder", "backend": "fake", "model": "all-MiniLM-L6-v2",
                    "dimensions": self.dims, "batching": {"max_batch_size": 8}, "details": {}}
        if method == "ready":
            if self.never_ready:
                await asyncio.sleep(3600)
            return {}
        texts = args[0]
        self.calls.append(texts)
        self.backgrounds.append(background)
        vectors = np.stack([np.full(self.dims, float(len(t)), dtype=np.float32) for t in texts])
        return vectors, [len(t.split()) + 2 for t in texts], len(texts)


def install(translator=None, embedder=None, **settings) -> tuple[FakeTranslator, FakeEmbedder]:
    translator = translator or FakeTranslator()
    embedder = embedder or FakeEmbedder()
    set_service(Service(load_settings(settings), translator=translator, embedder=embedder))
    return translator, embedder
