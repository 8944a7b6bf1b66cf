"""The contenders of bench/gpu/engines.py, each `await translate(text)` over one backend, no Ray."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from bench.gpu.common import SOURCE, TARGET, pct


class StaticEngine:
    """@serve.batch's batching over `backend.translate`, on one model thread."""

    def __init__(self, backend, batch: int, wait_s: float):
        self.backend, self.batch, self.wait_s = backend, batch, wait_s
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="static-model")
        self._queue: asyncio.Queue | None = None
        self.batches: list[int] = []

    async def close(self) -> None:
        if self._queue is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        self._pool.shutdown()

    async def translate(self, text: str) -> str:
        if self._queue is None:
            self._queue = asyncio.Queue()
            self._task = asyncio.get_running_loop().create_task(self._run())
        future = asyncio.get_running_loop().create_future()
        await self._queue.put((text, future))
        return await future

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            batch = [await self._queue.get()]
            closes = loop.time() + self.wait_s
            while len(batch) < self.batch and (left := closes - loop.time()) > 0:
                try:
                    batch.append(await asyncio.wait_for(self._queue.get(), left))
                except asyncio.TimeoutError:
                    break
            self.batches.append(len(batch))
            try:
                out = await loop.run_in_executor(self._pool, self.backend.translate, [t for t, _ in batch],
                                                 SOURCE, TARGET)
            except Exception as exc:  # noqa: BLE001 - every caller of the batch gets it
                for _, future in batch:
                    future.set_exception(exc)
                continue
            for (_, future), text in zip(batch, out):
                future.set_result(text)


class StreamerEngine:
    """service_streamer's ThreadedStreamer (`batch`, `max_latency` = `wait_s`) in front of `backend.translate`
    (its README's use); each request from its own thread, as Flask runs it, with no 20 s limit on its wait."""

    def __init__(self, backend, batch: int, wait_s: float):
        from service_streamer import ThreadedStreamer

        self.streamer = ThreadedStreamer(lambda texts: backend.translate(texts, SOURCE, TARGET), batch, wait_s)
        self._pool = ThreadPoolExecutor(256, thread_name_prefix="streamer-client")

    async def close(self) -> None:
        self._pool.shutdown()

    async def translate(self, text: str) -> str:
        return await asyncio.get_running_loop().run_in_executor(
            self._pool, lambda: self.streamer.submit([text]).result(None)[0])


class ContinuousEngine:
    """ContinuousScheduler with each sentence's drawn length."""

    def __init__(self, backend, batch: int, join_interval_steps: int = 1, cuda_graphs: bool = True):
        from deployments.continuous_batching import ContinuousScheduler

        self.backend, self.steps = backend, []  # every StepOutcome
        self.starts: list[float] = []  # when each of `steps` began (perf_counter)
        began = time.perf_counter()
        self.scheduler = ContinuousScheduler(backend, max_running_sequences=batch, max_cached_tokens=None,
                                             max_new_tokens=200, join_interval_steps=join_interval_steps,
                                             cuda_graphs=cuda_graphs, on_step=self._record)
        self.scheduler.limits = lambda text, ids: (backend.lengths[text], backend.lengths[text])
        self.warm_up_s = round(time.perf_counter() - began, 2)  # the scheduler warms its decoder up
        self.warm_up_captures = getattr(self.scheduler.decoder, "captures", None)

    def _record(self, outcome) -> None:
        # When its iteration began (the scheduler's monotonic stamp) on perf_counter's clock. Not "now minus
        # its seconds": the event loop can take the GIL between the step's end and this callback, and a
        # request's last step then looked as if it began after the request was answered (CI, 2026-11-29).
        # One expression calls no Python code, so no other thread runs between the two clocks' reads.
        self.starts.append(time.perf_counter() - time.monotonic() + self.scheduler.iteration_began)
        self.steps.append(outcome)

    async def close(self) -> None:
        self.scheduler.shutdown()

    async def recorded(self, timeout_s: float = 5.0) -> None:
        """Once the iteration under way has ended: a step's callers are answered before its outcome reaches
        `_record`, so right after the last answer the last step may not be in `steps` yet (a slowest request
        counted one step short of its tokens on a loaded machine)."""
        deadline = time.monotonic() + timeout_s
        while self.scheduler.iteration_began is not None and time.monotonic() < deadline:
            await asyncio.sleep(0.001)

    async def translate(self, text: str) -> str:
        (out, _batch) = await asyncio.wrap_future(self.scheduler.submit([text], SOURCE, TARGET))
        return out[0]

    def step_figures(self, since: int) -> dict:
        ok = [o for o in self.steps[since:] if o.running and not o.failed]
        if not ok:
            return {}
        plain, joined = [o.seconds for o in ok if not o.joined], [o.seconds for o in ok if o.joined]
        decoder = self.scheduler.decoder
        return {"engine": type(decoder).__name__, "graphs_captured": getattr(decoder, "captures", None),
                "column_shifts": getattr(decoder, "shifts", None), "steps": len(ok),
                "mean_running": round(statistics.mean(o.running for o in ok), 1), "steps_with_joins": len(joined),
                "step_ms_p50_without_joins": round(1000 * pct(plain, 0.5), 2) if plain else None,
                "step_ms_p50_with_joins": round(1000 * pct(joined, 0.5), 2) if joined else None}


def life_of(starts: list[float], outcomes: list, start: float, end: float) -> dict:
    """What the decoding thread did between `start` and `end` (one request's life): its steps, those that
    took sentences in (their encoder passes included) and the plain ones. `starts`: when each outcome's step
    began; a step counts if it began inside, so a request's own steps all count (it is answered after them)."""
    life = [o for t, o in zip(starts, outcomes) if start <= t < end and o.running and not o.failed]
    plain = [o.seconds for o in life if not o.joined]
    joins = [o.seconds for o in life if o.joined]
    return {"steps": len(life), "steps_s": round(sum(o.seconds for o in life), 3),
            "join_steps": len(joins), "join_steps_s": round(sum(joins), 3),
            "plain_step_ms_p50": round(1000 * pct(plain, 0.5), 2) if plain else None,
            "mean_running": round(statistics.mean(o.running for o in life), 1) if life else 0}


class NaiveEngine:
    """bench/peers/naive.py's way (FastAPI sync routes, the model called once per request) without the HTTP:
    each request's sentence translated alone as it comes. One model thread: the backend serialises its
    calls under a lock anyway (the tokenizer's source language is state)."""

    def __init__(self, backend):
        self.backend = backend
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="naive-model")

    async def close(self) -> None:
        self._pool.shutdown()

    async def translate(self, text: str) -> str:
        out = await asyncio.get_running_loop().run_in_executor(self._pool, self.backend.translate, [text], SOURCE,
                                                               TARGET)
        return out[0]


def _load_for_mlpool(model_dir: str, device: str):
    """MLPool's loader, run in its worker process: the same backend as every other engine's. The worker's
    logger says nothing below WARNING (at DEBUG it logs every job with its result)."""
    import logging

    from bench.gpu.continuous import make_backend

    logging.getLogger("ml_worker").setLevel(logging.WARNING)
    return make_backend(model_dir, device)


def _translate_for_mlpool(backend, text: str, tokens: int) -> str:
    """MLPool's job: one sentence at its drawn length (the worker's backend has no draws of its own)."""
    backend.lengths = {text: tokens}
    return backend.translate([text], SOURCE, TARGET)[0]


class MLPoolEngine:
    """MLPool 0.1.0 as bench/peers/mlpool_peer.py serves it, without the HTTP: one job per request (it does not
    batch across requests) on its worker processes, the library's default count (CPU count - 1: 1 on a 2-core box,
    15 on the 16-CPU GPU machines), each with the same backend (1 thread), each job given its sentence's drawn
    length."""

    def __init__(self, backend, model_dir: str, device: str):
        from functools import partial

        from ml_pool import MLPool
        from ml_pool.config import Config

        logging.getLogger("ml_pool").setLevel(logging.WARNING)  # (its module's logger: INFO per job)
        self.backend = backend
        self.pool = MLPool(models_to_load={"model": partial(_load_for_mlpool, model_dir, device)},
                           nb_workers=Config.WORKERS_COUNT)
        self.pool.__enter__()

    async def close(self) -> None:
        self.pool.__exit__(None, None, None)

    async def translate(self, text: str) -> str:
        job = await self.pool.create_job_async(score_model_function=_translate_for_mlpool, model_name="model",
                                               args=(text, self.backend.lengths[text]))
        return await self.pool.get_result_async(job)


class BentoMLEngine:
    """BentoML 1.4 over HTTP, in its own venv (make bench's .bench-venvs/bentoml): bench/peers/bentoml_service.py's
    LengthMix, its adaptive batching with the cap `batch` in front of the same backend (its own copy, 1 thread),
    a batch decoding its rows' largest draw. One request per sentence, `{"texts": [text]}` as its README shows;
    the HTTP round trip on loopback (~ms) is BentoML's own cost, as it is for its users."""

    READY_TIMEOUT_S = 240.0

    def __init__(self, backend, model_dir: str, batch: int, workdir: Path, device: str = "cpu"):
        from bench.compare.procs import Server
        from bench.gpu.serving import free_port
        from bench.peers.models import BENTOML_VENV, ROOT

        launcher = Path(os.environ.get("BENCH_BENTOML") or BENTOML_VENV / "bin" / "bentoml")  # scripts/gpu-peers'
        if not launcher.exists():
            raise RuntimeError(f"no BentoML at {launcher}: make .bench-venvs/bentoml/bin/bentoml")
        lengths = workdir / "bentoml-lengths.json"
        lengths.write_text(json.dumps(backend.lengths))
        port = free_port()
        env = {**os.environ, "BENCH_WORKLOAD": "translation", "BENCH_MAX_BATCH": str(batch),
               "BENCH_MODEL_DIR": model_dir, "BENCH_DEVICE": device, "BENCH_LENGTHS": str(lengths),
               "BENTOML_DO_NOT_TRACK": "True",
               "BENTOML_HOME": str(ROOT / ".bench-venvs" / "bentoml-home")}
        argv = [str(launcher), "serve", "bench.peers.bentoml_service:LengthMix",
                "--host", "127.0.0.1", "--port", str(port), "--working-dir", str(ROOT)]
        self.server = Server(argv, env, workdir / "bentoml.log", ROOT)
        try:
            self.ready_s = round(self.server.wait_ready(f"http://127.0.0.1:{port}/readyz", self.READY_TIMEOUT_S), 1)
        except BaseException:
            self.server.stop()
            raise
        self.url = f"http://127.0.0.1:{port}/translation"
        self._client = None

    async def close(self) -> None:
        if self._client is not None:
            await self._client.aclose()
        self.server.stop()

    async def translate(self, text: str) -> str:
        import httpx

        if self._client is None:  # made in the bench's event loop
            self._client = httpx.AsyncClient(timeout=600, limits=httpx.Limits(max_connections=None))
        response = await self._client.post(self.url, json={"texts": [text]})
        response.raise_for_status()
        return response.json()[0]


__all__ = ["BentoMLEngine", "ContinuousEngine", "MLPoolEngine", "NaiveEngine", "StaticEngine", "StreamerEngine"]
