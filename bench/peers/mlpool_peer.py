"""MLPool contender: the model scored on MLPool's worker processes behind FastAPI, as its README shows.

    python -m bench.peers.mlpool_peer --workload embeddings --port 9561

One job per request (MLPool does not batch across requests); the pool has the
library's default worker count (CPU count - 1, one core left to the API).
"""

from __future__ import annotations

import os
from functools import partial

from fastapi import FastAPI

from bench.peers import contract
from bench.peers.models import WORKLOADS, load_model
from bench.peers.server_args import parse_server_args

MODEL = "model"


def score(model, texts: list[str]) -> list:
    return [list(map(float, o)) if not isinstance(o, str) else o for o in model(texts)]


def create_app(workload: str, pool) -> FastAPI:
    app = FastAPI()

    @app.post(WORKLOADS[workload].route)
    async def predict(body: dict) -> dict:
        job_id = await pool.create_job_async(
            score_model_function=score, model_name=MODEL, kwargs={"texts": contract.texts_of(workload, body)})
        return contract.response_of(workload, body, await pool.get_result_async(job_id))

    @app.get("/readyz")
    async def readyz() -> dict:
        return {"status": "ready"}

    return app


def main() -> None:
    import uvicorn
    from ml_pool import MLPool
    from ml_pool.config import Config

    args = parse_server_args(__doc__)
    workers = Config.WORKERS_COUNT
    threads = max(1, (os.cpu_count() or 1) // workers)
    with MLPool(models_to_load={MODEL: partial(load_model, args.workload, threads)}, nb_workers=workers) as pool:
        uvicorn.run(create_app(args.workload, pool), host="127.0.0.1", port=args.port, workers=1,
                    log_level="warning")


if __name__ == "__main__":
    main()
