"""LitServe contender: a `LitAPI` (setup / decode_request / predict / encode_response) with batching
in a `LitServer`, as its README shows.

    python -m bench.peers.litserve_peer --workload embeddings --port 9561

LitServe runs its FastAPI/uvicorn front in one process and the model in an inference worker
process; requests are batched up to serve-app's batch cap after at most serve-app's batch wait
(`LitAPI(max_batch_size=..., batch_timeout=...)`: LitServe 0.2.19 deprecates passing them to
`LitServer`). Its batch counts requests, not texts, as mosec's does. Request bodies and
responses are serve-app's contract.
"""

from __future__ import annotations

import litserve as ls
from fastapi import HTTPException
from pydantic import ValidationError as BadBody

from bench.peers import contract
from bench.peers.models import WORKLOADS, load_model, peer_batching
from bench.peers.server_args import parse_server_args

#: Seconds a request may take (LitServe's default 30 s would fail deep queues; wrk's is 300 s).
TIMEOUT_S = 300


class ModelAPI(ls.LitAPI):
    def __init__(self, workload: str) -> None:
        batch, wait_s = peer_batching(workload)
        super().__init__(max_batch_size=batch, batch_timeout=wait_s, api_path=WORKLOADS[workload].route)
        self.workload = workload

    def setup(self, device: str) -> None:
        self.run = load_model(self.workload)

    def decode_request(self, request: dict) -> tuple[dict, list[str]]:
        try:
            return request, contract.texts_of(self.workload, request)
        except BadBody as exc:
            raise HTTPException(status_code=422, detail=str(exc)) from exc

    def predict(self, batch: list) -> list[tuple[dict, list]]:
        outputs = contract.outputs_per_request(self.run, [texts for _, texts in batch])
        return [(body, out) for (body, _), out in zip(batch, outputs)]

    def encode_response(self, output: tuple[dict, list]) -> dict:
        body, outputs = output
        return contract.response_of(self.workload, body, outputs)


def main() -> None:
    args = parse_server_args(__doc__)
    server = ls.LitServer(ModelAPI(args.workload), accelerator="cpu", workers_per_device=1, timeout=TIMEOUT_S)
    server.run(host="127.0.0.1", port=args.port, log_level="warning", generate_client_file=False)


if __name__ == "__main__":
    main()
