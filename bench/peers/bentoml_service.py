"""BentoML contender: the model in a BentoML service with adaptive batching (`batchable=True`).

Runs in its own virtual environment (.bench-venvs/bentoml), started by the harness as

    BENCH_WORKLOAD=embeddings bentoml serve bench.peers.bentoml_service:Embeddings --port 9561

The batch cap is serve-app's; BentoML's dispatcher picks the wait itself (adaptive),
bounded by its default max_latency_ms. Its contract is BentoML's own: the API method's
name is the route and the JSON body is its arguments: {"texts": [...]}.
"""

from __future__ import annotations

import os

import bentoml
import numpy as np

from bench.peers.models import load_model, project_batching

WORKLOAD = os.environ.get("BENCH_WORKLOAD", "embeddings")
MAX_BATCH, _WAIT_S = project_batching(WORKLOAD)
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
