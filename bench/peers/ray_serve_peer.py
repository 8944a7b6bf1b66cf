"""Ray Serve with nothing of serve-app on the request path: the ceiling of a server built on Serve here.

    python -m bench.peers.ray_serve_peer --workload embeddings --port 9561

One deployment as Serve's batching guide shows it: `__call__` takes the HTTP request, and a
`@serve.batch` method (serve-app's batch cap and wait) runs the model once per batch, in a
thread so that the replica keeps reading requests meanwhile. No FastAPI, no middleware, no
admission, cache, metrics or error taxonomy of ours. Request bodies and responses are
serve-app's contract (bench/peers/contract.py), as for mosec and LitServe.

Ray runs as `make run` runs it (serve_app/run.py): a Ray instance of its own without the
dashboard, HAProxy in front of the replicas where a binary exists, Serve's slowed control-plane
ticks and user code on the replica's own loop. So any gap between this and serve-app is
serve-app's own code, and any gap between this and mosec is Ray Serve's.

BENCH_SERVE_REPLICAS (default 2, `make run`'s Ingress at load) replicas, each with the model
on cores / replicas threads.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import tempfile
import threading
from pathlib import Path

REPLICAS_ENV = "BENCH_SERVE_REPLICAS"


def _replicas() -> int:
    value = os.environ.get(REPLICAS_ENV, "2")
    if not value.isdigit() or int(value) < 1:
        raise SystemExit(f"{REPLICAS_ENV}={value!r}: a whole number of replicas, at least 1")
    return int(value)


def deployment(workload: str, replicas: int):
    """The one deployment (`.bind()` it to serve it; its class is `.func_or_class`)."""
    from pydantic import ValidationError as BadBody
    from ray import serve
    from starlette.requests import Request
    from starlette.responses import JSONResponse

    from bench.peers import contract
    from bench.peers.models import load_model, project_batching

    batch, wait_s = project_batching(workload)
    threads = max(1, (os.cpu_count() or 1) // replicas)

    @serve.deployment(num_replicas=replicas, ray_actor_options={"num_cpus": 0}, max_ongoing_requests=1024)
    class Model:
        def __init__(self) -> None:
            self.run = load_model(workload, threads)

        @serve.batch(max_batch_size=batch, batch_wait_timeout_s=wait_s)
        async def compute(self, texts_per_request: list[list[str]]) -> list[list]:
            return await asyncio.to_thread(contract.outputs_per_request, self.run, texts_per_request)

        async def __call__(self, request: Request):
            if request.method != "POST":
                return JSONResponse({"ready": True})
            body = await request.json()
            try:
                texts = contract.texts_of(workload, body)
            except BadBody as exc:
                return JSONResponse({"error": str(exc)}, status_code=422)
            return JSONResponse(contract.response_of(workload, body, await self.compute(texts)))

    return Model


def main() -> None:
    from bench.peers.server_args import parse_server_args

    args = parse_server_args(__doc__)
    replicas = _replicas()
    run_dir = Path(tempfile.mkdtemp(prefix="rs-", dir="/tmp"))
    try:
        from serve_app.proxy import proxy_environment
        from serve_app.run import lean_serve_environment

        # Before `import ray`: Ray reads these when its modules load (as serve_app/run.py sets them).
        os.environ.update(proxy_environment("auto", run_dir)[1])
        os.environ.update(lean_serve_environment())
        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
        import ray
        from ray import serve

        stop = threading.Event()
        ray.init(address="local", include_dashboard=False, logging_level="WARNING", namespace="ray-serve-peer")
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, lambda *_: stop.set())
        serve.start(http_options={"host": "127.0.0.1", "port": args.port}, proxy_location="HeadOnly")
        serve.run(deployment(args.workload, replicas).bind(), name="peer", route_prefix="/", blocking=False)
        while not stop.wait(0.5):
            pass
        serve.shutdown()
        ray.shutdown()
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
