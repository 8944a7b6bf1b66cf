"""Static vs continuous batching, engine against engine, with no Ray in the process (issue 25).

    python -m bench.gpu.engines --out DIR                       # on a GPU: M2M100-418M-sized, float16
    python -m bench.gpu.engines --out DIR --device cpu --tiny   # the same flow on the tiny model
    python -m bench.gpu.engines --out DIR --device cpu --marian --naive --batch 32   # the CPU's comparison

bench/gpu/continuous.py drives the Translator replica class and so needs Ray (its @serve.batch); a GPU machine
here has no Ray. This drives the engines directly, one worker each, on the same backend:

* ``static``: `@serve.batch`'s rule in a few lines (the first waiting request opens a batch, which takes up to
  `batch` requests or whatever arrives within `wait_s`; one batch at a time on one model thread), each batch
  decoding its rows' largest drawn length, as a real model's batch runs until its longest output ends;
* ``continuous``: deployments.continuous_batching.ContinuousScheduler, each sentence its own length (on CUDA
  its SlotDecoder: one CUDA graph per step and per join, captured at start; ``--eager`` adds
  ``continuous-eager``, without graphs; ``--eager-joins`` adds ``continuous-eager-joins``, graphed steps
  and eager joins);
* ``naive`` (``--naive``): each request's sentence translated alone as it comes, as bench/peers/naive.py's
  FastAPI route calls the model (bench/gpu/contenders.py has them all).

Workloads: the length mix of bench/gpu/continuous.py (the same texts, draws and seeds) and a fixed one (make
bench's sentences, `--fixed-tokens` each). Cells: saturation (closed loop), Poisson arrivals at `--loads` (0.25,
0.5 and 0.8) x each engine's own saturation (fixed: 0.5) and, for the others, at static's half rate; latency counts from
the arrival. `--streamer` adds service_streamer's ThreadedStreamer (issue 25's reference peer) in front of the
same backend, `--mlpool` MLPool's worker processes (its default count, cpu_count() - 1; one job per request),
each on its own copy of it, `--bentoml` BentoML's server over HTTP (its adaptive batching, batch cap `--batch`)
on another copy, on `--device`. A peer that cannot start is named in engines.json (`failed_to_start`) and the
run goes on; `--fixed-engines` limits the fixed workload to some engines. engines.json is rewritten after each
cell.
`p50_over_solo`: the median of each request's latency over its sentence's own solo decode (`generate`);
`p50_over_solo_continuous`: over the sentence decoded alone by the continuous engine. A continuous open-loop cell
also gives `decoding_busy_fraction` (the decoding thread's share of the cell in steps) and `slowest`: the slowest
request's life (the steps that began within it, those that took other sentences in, the plain steps' p50, the
mean rows). DIR/engines.json holds every cell.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import statistics
import time
from pathlib import Path

from bench.gpu.common import SOURCE, TARGET, pct, say
from bench.gpu.contenders import (BentoMLEngine, ContinuousEngine, MLPoolEngine, NaiveEngine, StaticEngine,
                                  StreamerEngine, life_of)
from bench.gpu.continuous import SEED, make_backend, mix_texts, output_lengths
from bench.gpu.report import plot_engines


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
    began, ratios, mismatches, engine_ratios = time.perf_counter(), [], [], []
    lives: list[tuple[float, float, str]] = []  # (latency, arrival, text)

    async def one(when: float, text: str):
        await asyncio.sleep(max(0.0, when - (time.perf_counter() - began)))
        out = await engine.translate(text)
        latency = time.perf_counter() - began - when
        lives.append((latency, began + when, text))
        differs(text, out, solo, mismatches)
        if text in solo:
            ratios.append(latency / solo[text][0])
            if len(solo[text]) > 2:
                engine_ratios.append(latency / solo[text][2])
    await asyncio.gather(*(one(when, text) for when, text in zip(arrivals, texts)))
    ended, latencies = time.perf_counter(), [latency for latency, _, _ in lives]
    cell = {"offered_per_s": round(rate, 2), "p50_s": round(pct(latencies, 0.5), 3),
            "p99_s": round(pct(latencies, 0.99), 3), "requests": len(texts), "differing_from_solo": sum(mismatches)}
    if ratios:
        cell["p50_over_solo"] = round(pct(ratios, 0.5), 2)
    if engine_ratios:
        cell["p50_over_solo_continuous"] = round(pct(engine_ratios, 0.5), 2)
    if isinstance(engine, ContinuousEngine):  # where the slowest request's time went: its steps, others' joins
        await engine.recorded()
        whole = life_of(engine.starts, engine.steps, began, ended)
        cell["decoding_busy_fraction"] = round(whole["steps_s"] / (ended - began), 2)
        latency, arrival, text = max(lives)
        alone = solo.get(text, ())
        cell["slowest"] = {"latency_s": round(latency, 3), "output_tokens": engine.backend.lengths.get(text),
                           "solo_continuous_s": round(alone[2], 3) if len(alone) > 2 else None,
                           **life_of(engine.starts, engine.steps, arrival, arrival + latency)}
    return cell


def workload(loop, engines: dict, texts: list[str], clients: int, saturation_requests: int, solo: dict,
             loads: tuple[float, ...], at_static_half: bool, cells: dict, flush=lambda: None) -> dict:
    """Saturation of each engine, then Poisson arrivals at each of `loads` x its own saturation (at least
    64 requests or 6 s of arrivals) and, with `at_static_half`, at static's half rate. Each cell goes into
    `cells` as it ends, and `flush` writes them (a run cut short keeps what it measured)."""
    sat_texts = (texts * (saturation_requests // len(texts) + 1))[:saturation_requests]
    for name, engine in engines.items():
        since = len(getattr(engine, "steps", []))
        loop.run_until_complete(closed_loop(engine, texts[:clients], clients, solo))  # warm: shapes, allocator
        cells[name] = {"saturation": loop.run_until_complete(closed_loop(engine, sat_texts, clients, solo))}
        if isinstance(engine, ContinuousEngine):
            cells[name]["saturation"]["steps"] = engine.step_figures(since)
        say(f"  {name} saturation {cells[name]['saturation']}")
        flush()
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
            flush()
    return cells


def start_peer(engines: dict, failed: dict, name: str, make) -> None:
    """Add a peer; one that cannot start (a package or server missing where the bench runs) is reported in
    `failed` and the run goes on without it."""
    try:
        engines[name] = make()
    except Exception as exc:  # noqa: BLE001 - reported in engines.json
        failed[name] = f"{type(exc).__name__}: {exc}"[:500]
        say(f"  {name} did not start: {failed[name]}")


def _stop(*_) -> None:
    """SIGTERM (a time limit's) runs main's finally too: BentoML's servers and MLPool's workers are stopped."""
    raise SystemExit(143)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--tiny", action="store_true")
    parser.add_argument("--marian", action="store_true", help="the Marian-sized model (make bench's), for a CPU")
    parser.add_argument("--naive", action="store_true", help="also naive: each request alone, as it comes")
    parser.add_argument("--loads", default="0.25,0.5,0.8", help="length mix: x each engine's own saturation")
    parser.add_argument("--records", type=int, default=192, help="length-mix sentences")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--wait-s", type=float, default=0.02)
    parser.add_argument("--fixed-tokens", type=int, default=32)
    parser.add_argument("--solo", type=int, default=48, help="sentences whose solo decode is timed")
    parser.add_argument("--join-interval-steps", type=int, default=1,
                        help="> 1: also a continuous engine joining every N steps")
    parser.add_argument("--streamer", action="store_true", help="also service_streamer (its package installed)")
    parser.add_argument("--mlpool", action="store_true", help="also MLPool (its package installed): one job per request")
    parser.add_argument("--bentoml", action="store_true",
                        help="also BentoML over HTTP (make bench's venv, or scripts/gpu-peers' on a GPU)")
    parser.add_argument("--eager", action="store_true", help="also continuous decoding without CUDA graphs")
    parser.add_argument("--eager-joins", action="store_true", help="also continuous with graphed steps only")
    parser.add_argument("--fixed-engines", help="the fixed workload for these engines only (comma-separated; "
                        "default every engine)")
    parser.add_argument("--plot", type=Path, help="only draw DIR/engines.png from this engines.json")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, _stop)
    if args.plot:
        args.out.mkdir(parents=True, exist_ok=True)
        plot_engines(json.loads(args.plot.read_text()), args.out / "engines.png")
        return
    from bench.gpu.models import build_m2m100_sized, build_tiny_m2m100
    from bench.load import POOL
    from bench.peers.models import build_marian_sized

    began = time.perf_counter()
    if args.tiny:
        model = ("tiny M2M100", build_tiny_m2m100)
    elif args.marian:
        model = ("Marian-sized random", build_marian_sized)
    else:
        model = ("M2M100-418M-sized random", lambda: build_m2m100_sized(args.device, "float16"))
    model_dir = str(model[1]())
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
    engines: dict = {}
    failed: dict = {}  # peers that did not start
    loop = asyncio.new_event_loop()
    try:
        engines["static"] = StaticEngine(backend, args.batch, args.wait_s)
        if args.streamer:
            start_peer(engines, failed, "service_streamer", lambda: StreamerEngine(backend, args.batch, args.wait_s))
        if args.mlpool:
            start_peer(engines, failed, "mlpool", lambda: MLPoolEngine(backend, model_dir, args.device))
        args.out.mkdir(parents=True, exist_ok=True)
        if args.bentoml:
            start_peer(engines, failed, "bentoml",
                       lambda: BentoMLEngine(backend, model_dir, args.batch, args.out, args.device))
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
        if args.naive:  # last: the slowest to measure (a run cut short has the others' cells)
            engines["naive"] = NaiveEngine(backend)
        for text in solo:  # each sentence alone through the continuous engine: its own solo time
            start = time.perf_counter()
            loop.run_until_complete(engines["continuous"].translate(text))
            solo[text] += (time.perf_counter() - start,)
        import torch
        draws = [backend.lengths[t] for t in texts]
        report = {"device": torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu",
                  "torch": torch.__version__, "model": model[0],
                  "dtype": str(backend.dtype), "batch": args.batch, "wait_s": args.wait_s, "clients": args.batch,
                  "cudnn_sdp": torch.backends.cuda.cudnn_sdp_enabled(),
                  "length_mix": {"records": len(texts), "output_tokens_p50": pct(draws, 0.5),
                                 "output_tokens_max": max(draws)},
                  "solo_s_p50": round(statistics.median(t[0] for t in solo.values()), 3),
                  "solo_continuous_s_p50": round(statistics.median(t[2] for t in solo.values()), 3),
                  "warm_up": {name: {"captured": e.warm_up_captures, "seconds": e.warm_up_s}
                              for name, e in engines.items() if isinstance(e, ContinuousEngine)}}
        names = args.fixed_engines.split(",") if args.fixed_engines else list(engines)
        if unknown := [name for name in names if name not in engines and name not in failed]:
            raise SystemExit(f"--fixed-engines: no engine named {', '.join(unknown)} (engines: {', '.join(engines)})")
        if "bentoml" in engines:
            report["bentoml_ready_s"] = engines["bentoml"].ready_s
        if failed:
            report["failed_to_start"] = failed

        def flush() -> None:  # whole or not at all: a run killed mid-write keeps the last cell's file
            report["wall_s"] = round(time.perf_counter() - began, 1)
            (args.out / "engines.json.part").write_text(json.dumps(report, indent=1))
            os.replace(args.out / "engines.json.part", args.out / "engines.json")
        say("length mix")
        report["length_mix"]["cells"] = {}
        workload(loop, engines, texts, args.batch, 3 * len(texts) // 2, solo,
                 tuple(float(x) for x in args.loads.split(",")), True, report["length_mix"]["cells"], flush)
        say(f"fixed, {args.fixed_tokens} tokens")
        fixed = (list(POOL) * (args.records // len(POOL) + 1))[:args.records]
        report["fixed"] = {"tokens": args.fixed_tokens, "cells": {}}
        workload(loop, {name: e for name, e in engines.items() if name in names}, fixed, args.batch, 2 * len(fixed),
                 solo, (0.5,), False, report["fixed"]["cells"], flush)
        flush()
        plot_engines(report, args.out / "engines.png")
    finally:  # every server and pool stopped, also when a cell fails (BentoML is a process tree)
        for engine in engines.values():
            loop.run_until_complete(engine.close())
    say(f"done in {report['wall_s']} s")


if __name__ == "__main__":
    main()
