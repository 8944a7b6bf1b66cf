"""Static vs continuous batching, engine against engine, with no Ray in the process (issue 25).

    python -m bench.gpu.engines --out DIR                       # on a GPU: M2M100-418M-sized, float16
    python -m bench.gpu.engines --out DIR --device cpu --tiny   # the same flow on the tiny model

bench/gpu/continuous.py drives the Translator replica class and so needs Ray (its @serve.batch); a GPU
machine here has no Ray. This drives the two engines directly, one worker each, on the same backend:

* ``static``: `@serve.batch`'s rule in a few lines (the first waiting request opens a batch, which
  takes up to `batch` requests or whatever arrives within `wait_s`; one batch at a time on one model
  thread), each batch decoding its rows' largest drawn length, as a real model's batch runs until its
  longest output ends;
* ``continuous``: deployments.continuous_batching.ContinuousScheduler, each sentence its own length.

Workloads: the length mix of bench/gpu/continuous.py (the same texts, draws and seeds) and a fixed one
(make bench's sentences, `--fixed-tokens` each). Cells: saturation (closed loop), Poisson arrivals at
half of each engine's own saturation and (continuous) at static's half rate; latency counts from the
arrival. `p50_over_solo`: the median of each request's latency over its sentence's own solo decode.
DIR/engines.json holds every cell.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from bench.gpu.common import SOURCE, TARGET, pct, say
from bench.gpu.continuous import SEED, make_backend, mix_texts, output_lengths


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


class ContinuousEngine:
    """ContinuousScheduler with each sentence's drawn length."""

    def __init__(self, backend, batch: int, join_interval_steps: int = 1):
        from deployments.continuous_batching import ContinuousScheduler

        self.steps: list = []
        self.scheduler = ContinuousScheduler(backend, max_running_sequences=batch, max_cached_tokens=None,
                                             max_new_tokens=200, join_interval_steps=join_interval_steps,
                                             on_step=self.steps.append)
        self.scheduler.limits = lambda text, ids: (backend.lengths[text], backend.lengths[text])

    async def close(self) -> None:
        self.scheduler.shutdown()

    async def translate(self, text: str) -> str:
        (out, _batch) = await asyncio.wrap_future(self.scheduler.submit([text], SOURCE, TARGET))
        return out[0]

    def step_figures(self, since: int) -> dict:
        ok = [o for o in self.steps[since:] if o.running and not o.failed]
        if not ok:
            return {}
        plain = [o.seconds for o in ok if not o.joined]
        joined = [o.seconds for o in ok if o.joined]
        return {"steps": len(ok), "mean_running": round(statistics.mean(o.running for o in ok), 1),
                "steps_with_joins": len(joined),
                "step_ms_p50_without_joins": round(1000 * pct(plain, 0.5), 2) if plain else None,
                "step_ms_p50_with_joins": round(1000 * pct(joined, 0.5), 2) if joined else None}


def differs(text: str, out: str, solo: dict, mismatches: list) -> None:
    """Count an answer that differs from the sentence's solo translation (`generate` on it alone)."""
    if text in solo:
        mismatches.append(out != solo[text][1])


async def closed_loop(engine, texts: list[str], clients: int, solo: dict) -> dict:
    order, latencies, mismatches = iter(texts), [], []

    async def client():
        for text in order:
            began = time.perf_counter()
            differs(text, await engine.translate(text), solo, mismatches)
            latencies.append(time.perf_counter() - began)
    began = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(clients)))
    wall = time.perf_counter() - began
    return {"records_per_s": round(len(texts) / wall, 2), "p50_s": round(pct(latencies, 0.5), 3),
            "p99_s": round(pct(latencies, 0.99), 3), "requests": len(texts), "wall_s": round(wall, 1),
            "compared_with_solo": len(mismatches), "differing_from_solo": sum(mismatches)}


async def open_loop(engine, texts: list[str], rate: float, seed: int, solo: dict) -> dict:
    rng, at, arrivals = random.Random(seed), 0.0, []
    for _ in texts:
        at += rng.expovariate(rate)
        arrivals.append(at)
    began, latencies, ratios, mismatches = time.perf_counter(), [], [], []

    async def one(when: float, text: str):
        await asyncio.sleep(max(0.0, when - (time.perf_counter() - began)))
        out = await engine.translate(text)
        latency = time.perf_counter() - began - when
        latencies.append(latency)
        differs(text, out, solo, mismatches)
        if text in solo:
            ratios.append(latency / solo[text][0])
    await asyncio.gather(*(one(when, text) for when, text in zip(arrivals, texts)))
    cell = {"offered_per_s": round(rate, 2), "p50_s": round(pct(latencies, 0.5), 3),
            "p99_s": round(pct(latencies, 0.99), 3), "requests": len(texts), "differing_from_solo": sum(mismatches)}
    if ratios:
        cell["p50_over_solo"] = round(pct(ratios, 0.5), 2)
    return cell


def workload(loop, engines: dict, texts: list[str], clients: int, saturation_requests: int, solo: dict,
             at_static_half: bool) -> dict:
    cells: dict = {}
    sat_texts = (texts * (saturation_requests // len(texts) + 1))[:saturation_requests]
    for name, engine in engines.items():
        since = len(getattr(engine, "steps", []))
        loop.run_until_complete(closed_loop(engine, texts[:clients], clients, solo))  # warm: shapes, allocator
        cells[name] = {"saturation": loop.run_until_complete(closed_loop(engine, sat_texts, clients, solo))}
        if isinstance(engine, ContinuousEngine):
            cells[name]["saturation"]["steps"] = engine.step_figures(since)
        say(f"  {name} saturation {cells[name]['saturation']}")
    for name, engine in engines.items():
        rate = cells[name]["saturation"]["records_per_s"] / 2
        cells[name]["half"] = loop.run_until_complete(open_loop(engine, texts, rate, SEED + 2, solo))
        say(f"  {name} at half its saturation {cells[name]['half']}")
        if at_static_half and name != "static" and "static" in cells:
            static_rate = cells["static"]["saturation"]["records_per_s"] / 2
            cells[name]["at_static_half"] = loop.run_until_complete(
                open_loop(engine, texts, static_rate, SEED + 2, solo))
            say(f"  {name} at static's half rate {cells[name]['at_static_half']}")
    return cells


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--tiny", action="store_true")
    parser.add_argument("--records", type=int, default=192, help="length-mix sentences")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--wait-s", type=float, default=0.02)
    parser.add_argument("--fixed-tokens", type=int, default=32)
    parser.add_argument("--solo", type=int, default=48, help="sentences whose solo decode is timed")
    parser.add_argument("--join-interval-steps", type=int, default=1)
    args = parser.parse_args()
    from bench.gpu.models import build_m2m100_sized, build_tiny_m2m100
    from bench.load import POOL

    began = time.perf_counter()
    model_dir = str(build_tiny_m2m100() if args.tiny else build_m2m100_sized(args.device, "float16"))
    backend = make_backend(model_dir, args.device)
    texts = mix_texts(backend, args.records, SEED)
    backend.lengths = dict(zip(texts, output_lengths(backend.token_lengths(texts, SOURCE), SEED + 1)))
    backend.lengths.update({t: args.fixed_tokens for t in POOL})
    backend.translate(texts[:4], SOURCE, TARGET)  # warm-up
    solo = {}
    for text in list(dict.fromkeys(texts))[:args.solo] + list(POOL)[:4]:
        start = time.perf_counter()
        out = backend.translate([text], SOURCE, TARGET)[0]
        solo[text] = (time.perf_counter() - start, out)
    engines = {"static": StaticEngine(backend, args.batch, args.wait_s),
               "continuous": ContinuousEngine(backend, args.batch)}
    if args.join_interval_steps > 1:
        engines[f"continuous-join{args.join_interval_steps}"] = ContinuousEngine(backend, args.batch,
                                                                                args.join_interval_steps)
    import torch
    draws = [backend.lengths[t] for t in texts]
    report = {"device": torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu",
              "torch": torch.__version__, "model": "tiny M2M100" if args.tiny else "M2M100-418M-sized random",
              "dtype": str(backend.dtype), "batch": args.batch, "wait_s": args.wait_s, "clients": args.batch,
              "cudnn_sdp": torch.backends.cuda.cudnn_sdp_enabled(),
              "length_mix": {"records": len(texts), "output_tokens_p50": pct(draws, 0.5),
                             "output_tokens_max": max(draws)},
              "solo_s_p50": round(statistics.median(t for t, _ in solo.values()), 3)}
    loop = asyncio.new_event_loop()
    args.out.mkdir(parents=True, exist_ok=True)
    say("length mix")
    report["length_mix"]["cells"] = workload(loop, engines, texts, args.batch, 3 * len(texts) // 2, solo, True)
    (args.out / "engines.json").write_text(json.dumps(report, indent=1))
    say(f"fixed, {args.fixed_tokens} tokens")
    fixed = (list(POOL) * (args.records // len(POOL) + 1))[:args.records]
    report["fixed"] = {"tokens": args.fixed_tokens,
                       "cells": workload(loop, engines, fixed, args.batch, 2 * len(fixed), solo, False)}
    report["wall_s"] = round(time.perf_counter() - began, 1)
    (args.out / "engines.json").write_text(json.dumps(report, indent=1))
    for engine in engines.values():
        loop.run_until_complete(engine.close())
    say(f"done in {report['wall_s']} s")


if __name__ == "__main__":
    main()
