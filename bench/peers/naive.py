"""Naive contender: FastAPI under uvicorn (one worker), the model called once per request.

    python -m bench.peers.naive --workload embeddings --port 9561

Sync routes, as most model APIs are written: FastAPI runs each in its thread pool.
"""

from __future__ import annotations

from fastapi import FastAPI

from bench.peers import contract
from bench.peers.models import WORKLOADS, load_model
from bench.peers.server_args import parse_server_args


def create_app(workload: str) -> FastAPI:
    run = load_model(workload)
    app = FastAPI()
    route = WORKLOADS[workload].route

    @app.post(route)
    def predict(body: dict) -> dict:
        return contract.response_of(workload, body, run(contract.texts_of(workload, body)))

    @app.get("/readyz")
    def readyz() -> dict:
        return {"status": "ready"}

    return app


def main() -> None:
    import uvicorn

    args = parse_server_args(__doc__)
    uvicorn.run(create_app(args.workload), host="127.0.0.1", port=args.port, workers=1, log_level="warning")


if __name__ == "__main__":
    main()
