"""BentoML contender: the model in a BentoML service with adaptive batching (`batchable=True`).

Runs in its own virtual environment (.bench-venvs/bentoml), started by the harness as

    BENCH_WORKLOAD=embeddings bentoml serve bench.peers.bentoml_service:Embeddings --port 9561

or, by bench/gpu/engines.py's `--bentoml`, as `LengthMix` (translation of issue 25's length mix).
The batch cap is serve-app's (BENCH_MAX_BATCH where the harness sets one); BentoML's dispatcher picks the wait itself (adaptive),
bounded by its default max_latency_ms. Its contract is BentoML's own: the API method's
name is the route and the JSON body is its arguments: {"texts": [...]}.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import bentoml
import numpy as np

from bench.peers.models import load_model, project_batching

WORKLOAD = os.environ.get("BENCH_WORKLOAD", "embeddings")
MAX_BATCH = int(os.environ.get("BENCH_MAX_BATCH", 0)) or project_batching(WORKLOAD)[0]
#: Seconds one request may take before BentoML gives up on it (long queues at 128 clients).
TIMEOUT_S = 300


@bentoml.service(workers=1, traffic={"timeout": TIMEOUT_S})
class Embeddings:
    def __init__(self) -> None:
        self.run = load_model(WORKLOAD)

    @bentoml.api(batchable=True, max_batch_size=MAX_BATCH)
    def embeddings(self, texts: list[str]) -> np.ndarray:
        return np.stack(self.run(texts))


@bentoml.service(workers=1, traffic={"timeout": TIMEOUT_S})
class Translation:
    def __init__(self) -> None:
        self.run = load_model(WORKLOAD)

    @bentoml.api(batchable=True, max_batch_size=MAX_BATCH)
    def translation(self, texts: list[str]) -> list[str]:
        return self.run(texts)


@bentoml.service(workers=1, traffic={"timeout": TIMEOUT_S})
class LengthMix:
    """bench/gpu/engines.py's backend (the model in BENCH_MODEL_DIR on BENCH_DEVICE: cpu, one thread, unless set)
    with each sentence's drawn output length (BENCH_LENGTHS: a JSON file, text -> tokens); a batch decodes its
    rows' largest draw, as a real model's batch runs until its longest output ends."""

    def __init__(self) -> None:
        from bench.gpu.common import SOURCE, TARGET
        from bench.gpu.continuous import make_backend

        self.backend = make_backend(os.environ["BENCH_MODEL_DIR"], os.environ.get("BENCH_DEVICE", "cpu"))
        self.backend.lengths = json.loads(Path(os.environ["BENCH_LENGTHS"]).read_text())
        self.languages = (SOURCE, TARGET)

    @bentoml.api(batchable=True, max_batch_size=MAX_BATCH)
    def translation(self, texts: list[str]) -> list[str]:
        return self.backend.translate(texts, *self.languages)
