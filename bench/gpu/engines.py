"""Static vs continuous batching, engine against engine, with no Ray in the process (issue 25).

    python -m bench.gpu.engines --out DIR                       # on a GPU: M2M100-418M-sized, float16
    python -m bench.gpu.engines --out DIR --device cpu --tiny   # the same flow on the tiny model

bench/gpu/continuous.py drives the Translator replica class and so needs Ray (its @serve.batch); a GPU machine
here has no Ray. This drives the engines directly, one worker each, on the same backend:

* ``static``: `@serve.batch`'s rule in a few lines (the first waiting request opens a batch, which takes up to
  `batch` requests or whatever arrives within `wait_s`; one batch at a time on one model thread), each batch
  decoding its rows' largest drawn length, as a real model's batch runs until its longest output ends;
* ``continuous``: deployments.continuous_batching.ContinuousScheduler, each sentence its own length (on CUDA
  its SlotDecoder: one CUDA graph per step and per join, captured at start; ``--eager`` adds
  ``continuous-eager``, without graphs; ``--eager-joins`` adds ``continuous-eager-joins``, graphed steps
  and eager joins).

Workloads: the length mix of bench/gpu/continuous.py (the same texts, draws and seeds) and a fixed one (make
bench's sentences, `--fixed-tokens` each). Cells: saturation (closed loop), Poisson arrivals at 0.25, 0.5 and
0.8 x each engine's own saturation (fixed: 0.5) and, for the others, at static's half rate; latency counts from
the arrival. `--streamer` adds service_streamer's ThreadedStreamer (issue 25's reference peer) in front of the
same backend. `p50_over_solo`: the median of each request's latency over its sentence's own solo decode
(`generate`); `p50_over_solo_continuous`: over the sentence decoded alone by the continuous engine.
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
from bench.gpu.report import plot_engines


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

        self.steps: list = []
        began = time.perf_counter()
        self.scheduler = ContinuousScheduler(backend, max_running_sequences=batch, max_cached_tokens=None,
                                             max_new_tokens=200, join_interval_steps=join_interval_steps,
                                             cuda_graphs=cuda_graphs, on_step=self.steps.append)
        self.scheduler.limits = lambda text, ids: (backend.lengths[text], backend.lengths[text])
        self.warm_up_s = round(time.perf_counter() - began, 2)  # the scheduler warms its decoder up
        self.warm_up_captures = getattr(self.scheduler.decoder, "captures", None)

    async def close(self) -> None:
        self.scheduler.shutdown()

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
    began, latencies, ratios, mismatches, engine_ratios = time.perf_counter(), [], [], [], []

    async def one(when: float, text: str):
        await asyncio.sleep(max(0.0, when - (time.perf_counter() - began)))
        out = await engine.translate(text)
        latency = time.perf_counter() - began - when
        latencies.append(latency)
        differs(text, out, solo, mismatches)
        if text in solo:
            ratios.append(latency / solo[text][0])
            if len(solo[text]) > 2:
                engine_ratios.append(latency / solo[text][2])
    await asyncio.gather(*(one(when, text) for when, text in zip(arrivals, texts)))
    cell = {"offered_per_s": round(rate, 2), "p50_s": round(pct(latencies, 0.5), 3),
            "p99_s": round(pct(latencies, 0.99), 3), "requests": len(texts), "differing_from_solo": sum(mismatches)}
    if ratios:
        cell["p50_over_solo"] = round(pct(ratios, 0.5), 2)
    if engine_ratios:
        cell["p50_over_solo_continuous"] = round(pct(engine_ratios, 0.5), 2)
    return cell


def workload(loop, engines: dict, texts: list[str], clients: int, saturation_requests: int, solo: dict,
             loads: tuple[float, ...], at_static_half: bool) -> dict:
    """Saturation of each engine, then Poisson arrivals at each of `loads` x its own saturation (at least
    64 requests or 6 s of arrivals) and, with `at_static_half`, at static's half rate."""
    cells: dict = {}
    sat_texts = (texts * (saturation_requests // len(texts) + 1))[:saturation_requests]
    for name, engine in engines.items():
        since = len(getattr(engine, "steps", []))
        loop.run_until_complete(closed_loop(engine, texts[:clients], clients, solo))  # warm: shapes, allocator
        cells[name] = {"saturation": loop.run_until_complete(closed_loop(engine, sat_texts, clients, solo))}
        if isinstance(engine, ContinuousEngine):
            cells[name]["saturation"]["steps"] = engine.step_figures(since)
        say(f"  {name} saturation {cells[name]['saturation']}")
    rates = {name: [(f"load_{load}", load * cell["saturation"]["records_per_s"]) for load in loads]
             for name, cell in cells.items()}
    if at_static_half and "static" in cells:
        for name in cells:
            if name != "static":
                rates[name].append(("at_static_half", cells["static"]["saturation"]["records_per_s"] / 2))
    for name, engine in engines.items():
        for label, rate in rates[name]:
            count = min(len(texts), max(64, round(6 * rate)))
            cells[name][label] = loop.run_until_complete(open_loop(engine, texts[:count], rate, SEED + 2, solo))
            say(f"  {name} {label} {cells[name][label]}")
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
    parser.add_argument("--join-interval-steps", type=int, default=1,
                        help="> 1: also a continuous engine joining every N steps")
    parser.add_argument("--streamer", action="store_true", help="also service_streamer (its package installed)")
    parser.add_argument("--eager", action="store_true", help="also continuous decoding without CUDA graphs")
    parser.add_argument("--eager-joins", action="store_true", help="also continuous with graphed steps only")
    parser.add_argument("--plot", type=Path, help="only draw DIR/engines.png from this engines.json")
    args = parser.parse_args()
    if args.plot:
        args.out.mkdir(parents=True, exist_ok=True)
        plot_engines(json.loads(args.plot.read_text()), args.out / "engines.png")
        return
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
    engines = {"static": StaticEngine(backend, args.batch, args.wait_s)}
    if args.streamer:
        engines["service_streamer"] = StreamerEngine(backend, args.batch, args.wait_s)
    engines["continuous"] = ContinuousEngine(backend, args.batch)
    if args.eager:
        engines["continuous-eager"] = ContinuousEngine(backend, args.batch, cuda_graphs=False)
    if args.join_interval_steps > 1:
        engines[f"continuous-join{args.join_interval_steps}"] = ContinuousEngine(backend, args.batch,
                                                                                args.join_interval_steps)
    if args.eager_joins:  # the step graphs only: joins encode eagerly, as before their graphs
        engines["continuous-eager-joins"] = ContinuousEngine(backend, args.batch)
        if joins := getattr(engines["continuous-eager-joins"].scheduler.decoder, "_join_graphs", None):
            joins.enabled = False  # (the CPU's engine has none)
    loop = asyncio.new_event_loop()
    for text in solo:  # each sentence alone through the continuous engine: its own solo time
        start = time.perf_counter()
        loop.run_until_complete(engines["continuous"].translate(text))
        solo[text] += (time.perf_counter() - start,)
    import torch
    draws = [backend.lengths[t] for t in texts]
    report = {"device": torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu",
              "torch": torch.__version__, "model": "tiny M2M100" if args.tiny else "M2M100-418M-sized random",
              "dtype": str(backend.dtype), "batch": args.batch, "wait_s": args.wait_s, "clients": args.batch,
              "cudnn_sdp": torch.backends.cuda.cudnn_sdp_enabled(),
              "length_mix": {"records": len(texts), "output_tokens_p50": pct(draws, 0.5),
                             "output_tokens_max": max(draws)},
              "solo_s_p50": round(statistics.median(t[0] for t in solo.values()), 3),
              "solo_continuous_s_p50": round(statistics.median(t[2] for t in solo.values()), 3),
              "warm_up": {name: {"captured": e.warm_up_captures, "seconds": e.warm_up_s}
                          for name, e in engines.items() if isinstance(e, ContinuousEngine)}}
    args.out.mkdir(parents=True, exist_ok=True)
    say("length mix")
    report["length_mix"]["cells"] = workload(loop, engines, texts, args.batch, 3 * len(texts) // 2, solo,
                                             (0.25, 0.5, 0.8), True)
    (args.out / "engines.json").write_text(json.dumps(report, indent=1))
    say(f"fixed, {args.fixed_tokens} tokens")
    fixed = (list(POOL) * (args.records // len(POOL) + 1))[:args.records]
    report["fixed"] = {"tokens": args.fixed_tokens,
                       "cells": workload(loop, engines, fixed, args.batch, 2 * len(fixed), solo, (0.5,), False)}
    report["wall_s"] = round(time.perf_counter() - began, 1)
    (args.out / "engines.json").write_text(json.dumps(report, indent=1))
    plot_engines(report, args.out / "engines.png")
    for engine in engines.values():
        loop.run_until_complete(engine.close())
    say(f"done in {report['wall_s']} s")


if __name__ == "__main__":
    main()
