"""mosec contender: a mosec Server with one Worker and dynamic batching, as its README shows.

    python -m bench.peers.mosec_peer --workload embeddings --port 9561

mosec's Rust HTTP front queues the requests and hands batches of up to serve-app's batch cap,
after at most serve-app's batch wait, to one Python worker process that holds the model
(`append_worker(Worker, max_batch_size=..., max_wait_time=...)`). Its batch counts requests,
not texts: a batch of 16-text requests is up to 64 x 16 texts, run in passes of similar length
under serve-app's max_batch_tokens, as every contender's model call does (bench/peers/models.py).
Request bodies and responses are serve-app's contract; a body that fails validation answers 422,
and, by mosec's design (one status per batch), so does the rest of its batch (the benchmark sends
valid bodies only).
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

from mosec import Server, ValidationError, Worker
from pydantic import ValidationError as BadBody

from bench.peers import contract
from bench.peers.models import WORKLOADS, load_model, peer_batching
from bench.peers.server_args import parse_server_args

#: The worker processes are spawned: they read the workload from the environment.
WORKLOAD_ENV = "BENCH_WORKLOAD"
#: Seconds a request may wait in mosec (its default 3 s would fail deep queues; wrk's is 300 s).
TIMEOUT_S = 300


class Model(Worker):
    def __init__(self) -> None:
        super().__init__()
        self.workload = os.environ[WORKLOAD_ENV]
        self.run = load_model(self.workload)

    def deserialize(self, data: bytes) -> Any:
        body = super().deserialize(data)
        try:
            return body, contract.texts_of(self.workload, body)
        except BadBody as exc:
            raise ValidationError(str(exc)) from exc

    def forward(self, data: list) -> list[dict]:
        outputs = contract.outputs_per_request(self.run, [texts for _, texts in data])
        return [contract.response_of(self.workload, body, out) for (body, _), out in zip(data, outputs)]

    def serialize(self, data: dict) -> bytes:
        # Compact JSON, as every other contender answers (mosec's default indents by 2).
        return json.dumps(data).encode()


def main() -> None:
    args = parse_server_args(__doc__)
    os.environ[WORKLOAD_ENV] = args.workload
    # mosec reads its own options from argv and MOSEC_* (it ignores ours; --port is the same name).
    os.environ.setdefault("MOSEC_ADDRESS", "127.0.0.1")
    os.environ.setdefault("MOSEC_TIMEOUT", str(TIMEOUT_S * 1000))
    os.environ.setdefault("MOSEC_LOG_LEVEL", "warning")
    sys.argv = [sys.argv[0], "--port", str(args.port)]
    batch, wait_s = peer_batching(args.workload)
    server = Server()
    server.append_worker(Model, num=1, max_batch_size=batch, max_wait_time=round(wait_s * 1000),
                         route=WORKLOADS[args.workload].route)
    server.run()


if __name__ == "__main__":
    main()
