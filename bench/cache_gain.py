"""What the response cache gains: latency and throughput with the cache bypassed vs used, in
one Serve run, on the same request sequence, at a realistic repeat ratio.

    flock /tmp/serve-app-cpu.lock .venv/bin/python -m bench.cache_gain            # starts its own `serve run`
    .venv/bin/python -m bench.cache_gain --url http://127.0.0.1:9527              # a running service

The workload: texts drawn from a universe of `--universe` distinct texts with Zipf popularity
(the probability of the text of rank r is proportional to 1/r^s, `--zipf-s`), the usual shape of
real traffic in which a few texts (UI strings, greetings, common queries) are asked for again and
again and most are asked once. With s = 1.0, a universe of 10,000 texts and 600 texts per phase,
about 40 % of the texts repeat an earlier one. Each phase sends the SAME pre-drawn sequence from `--concurrency`
closed-loop clients, twice: first with `Cache-Control: no-cache, no-store` (every text computed,
nothing stored: the cache is bypassed), then without (a cold cache that fills as the sequence
runs). Each phase's texts carry their own tag, so no phase starts with another's entries.

Then, for one-text workloads, the same comparison in an open loop: Poisson arrivals at 70 % of
the cache-off throughput (`--open-loop-load`), identical for off and on, so the latencies compare
at equal load (a closed loop gives the faster mode more load).

Prints per workload: requests/s, p50 and p99 latency, the X-Cache mix (and each kind's p50) and
the ratios on/off, and writes them as JSON (`--json-out`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections import Counter
from pathlib import Path
from typing import Optional

import httpx
import numpy as np

from .load import POOL
from .serve_run import pinned_serve_run

BYPASS = {"Cache-Control": "no-cache, no-store"}


def zipf_sequence(universe: int, requests: int, s: float, seed: int) -> list[int]:
    """`requests` text ranks (0-based) drawn with P(rank r) proportional to 1/(r+1)^s."""
    weights = 1.0 / np.arange(1, universe + 1) ** s
    rng = np.random.default_rng(seed)
    return rng.choice(universe, size=requests, p=weights / weights.sum()).tolist()


def text(rank: int, tag: str) -> str:
    """The text of `rank`: a sentence of the pool (varied lengths) made distinct by its rank."""
    return f"{POOL[rank % len(POOL)]} Ticket {tag}-{rank}."


def request_body(workload: str, ranks: list[int], tag: str) -> tuple[str, dict]:
    texts = [text(r, tag) for r in ranks]
    if workload == "embeddings":
        return "/embeddings", {"input": texts if len(texts) > 1 else texts[0]}
    return "/translation", {"payload": {"fromLang": "en", "toLang": "pt",
                                        "records": [{"id": str(i), "text": t} for i, t in enumerate(texts)]}}


async def phase(url: str, bodies: list[tuple[str, dict]], concurrency: int, headers: dict) -> dict:
    """Send `bodies` in order from `concurrency` closed-loop clients; latency and throughput."""
    latencies: list[float] = []
    by_cache: dict[str, list[float]] = {}
    statuses: Counter = Counter()
    next_index = iter(range(len(bodies)))
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(base_url=url, timeout=120, limits=limits, headers=headers) as client:
        async def worker() -> None:
            for i in next_index:  # shared iterator: each body is sent once, in order of start
                path, body = bodies[i]
                start = time.perf_counter()
                resp = await client.post(path, json=body)
                statuses[resp.status_code] += 1
                if resp.status_code == 200:
                    took = time.perf_counter() - start
                    latencies.append(took)
                    by_cache.setdefault(resp.headers.get("X-Cache", "absent"), []).append(took)

        began = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        elapsed = time.perf_counter() - began
    lat = np.array(latencies) * 1000
    return {"requests": len(bodies), "ok": len(latencies), "statuses": {str(k): v for k, v in statuses.items()},
            "seconds": round(elapsed, 2), "requests_per_s": round(len(latencies) / elapsed, 1),
            "p50_ms": round(float(np.percentile(lat, 50)), 1), "p99_ms": round(float(np.percentile(lat, 99)), 1),
            "x_cache": {k: {"requests": len(v), "p50_ms": round(float(np.percentile(v, 50)) * 1000, 1)}
                        for k, v in sorted(by_cache.items())}}


async def open_phase(url: str, bodies: list[tuple[str, dict]], arrivals_s: list[float], headers: dict) -> dict:
    """Send body i at `arrivals_s[i]` whatever the answers do (open loop); latency at that load."""
    latencies: list[float] = []
    statuses: Counter = Counter()
    limits = httpx.Limits(max_connections=1000, max_keepalive_connections=200)
    async with httpx.AsyncClient(base_url=url, timeout=120, limits=limits, headers=headers) as client:
        async def one(path: str, body: dict) -> None:
            start = time.perf_counter()
            resp = await client.post(path, json=body)
            statuses[resp.status_code] += 1
            if resp.status_code == 200:
                latencies.append(time.perf_counter() - start)

        began = time.perf_counter()
        tasks = []
        for (path, body), at in zip(bodies, arrivals_s):
            await asyncio.sleep(max(0.0, began + at - time.perf_counter()))
            tasks.append(asyncio.create_task(one(path, body)))
        await asyncio.gather(*tasks)
    lat = np.array(latencies) * 1000
    return {"requests": len(bodies), "ok": len(latencies), "statuses": {str(k): v for k, v in statuses.items()},
            "p50_ms": round(float(np.percentile(lat, 50)), 1), "p99_ms": round(float(np.percentile(lat, 99)), 1)}


def repeat_ratio(sequence: list[list[int]]) -> float:
    """Share of the texts in the sequence that an earlier request already asked for."""
    seen: set[int] = set()
    repeats = total = 0
    for ranks in sequence:
        for r in ranks:
            total += 1
            repeats += r in seen
            seen.add(r)
    return repeats / total


async def measure(url: str, a: argparse.Namespace) -> dict:
    results = {}
    warm = [request_body("translation", [r], "warmup") for r in range(32)] + \
           [request_body("embeddings", [r], "warmup") for r in range(32)]
    await phase(url, warm, a.concurrency, BYPASS)  # models and connections warm, excluded
    for round_ in range(a.rounds):  # off, on per workload; rounds repeat it to show the spread
        for n, (workload, per_request) in enumerate(a.workloads):
            ranks = zipf_sequence(a.universe, a.texts, a.zipf_s, seed=a.seed + n)
            sequence = [ranks[i:i + per_request] for i in range(0, len(ranks), per_request)]
            name = f"{workload} x{per_request}"
            tag = f"{round_}.{n}"
            off = await phase(url, [request_body(workload, r, f"off{tag}") for r in sequence], a.concurrency, BYPASS)
            on = await phase(url, [request_body(workload, r, f"on{tag}") for r in sequence], a.concurrency, {})
            result = {
                "round": round_, "texts_per_request": per_request, "repeat_ratio": round(repeat_ratio(sequence), 3),
                "cache_off": off, "cache_on": on,
                "throughput_on_over_off": round(on["requests_per_s"] / off["requests_per_s"], 2),
                "p50_on_over_off": round(on["p50_ms"] / off["p50_ms"], 2),
                "p99_on_over_off": round(on["p99_ms"] / off["p99_ms"], 2),
                "other_serve_runs": other_serve_runs(),
            }
            results.setdefault(name, []).append(result)
            print(f"round {round_} {name}: repeats {result['repeat_ratio']:.0%} | off {off['requests_per_s']} req/s "
                  f"p50 {off['p50_ms']} p99 {off['p99_ms']} ms | on {on['requests_per_s']} req/s p50 {on['p50_ms']} "
                  f"p99 {on['p99_ms']} ms {on['x_cache']} | throughput x{result['throughput_on_over_off']}, "
                  f"p50 x{result['p50_on_over_off']}, p99 x{result['p99_on_over_off']} "
                  f"(other serve runs: {result['other_serve_runs']})", flush=True)
    for n, (workload, per_request) in enumerate(a.workloads):
        if per_request != 1 or a.open_loop_load <= 0:
            continue
        name = f"{workload} x{per_request}"
        rate = a.open_loop_load * float(np.median([r["cache_off"]["requests_per_s"] for r in results[name]]))
        ranks = zipf_sequence(a.universe, a.texts, a.zipf_s, seed=a.seed + n)
        arrivals = np.cumsum(np.random.default_rng(a.seed).exponential(1 / rate, size=len(ranks))).tolist()
        off = await open_phase(url, [request_body(workload, [r], f"open-off{n}") for r in ranks], arrivals, BYPASS)
        on = await open_phase(url, [request_body(workload, [r], f"open-on{n}") for r in ranks], arrivals, {})
        results[f"{name} open loop"] = [{
            "requests_per_s_offered": round(rate, 1), "repeat_ratio": round(repeat_ratio([[r] for r in ranks]), 3),
            "cache_off": off, "cache_on": on, "p50_on_over_off": round(on["p50_ms"] / off["p50_ms"], 2),
            "p99_on_over_off": round(on["p99_ms"] / off["p99_ms"], 2), "other_serve_runs": other_serve_runs(),
        }]
        print(f"open loop {name} at {rate:.1f} req/s (Poisson): off p50 {off['p50_ms']} p99 {off['p99_ms']} ms | "
              f"on p50 {on['p50_ms']} p99 {on['p99_ms']} ms", flush=True)
    return results


def other_serve_runs() -> int:
    """`serve run` processes on this machine besides ours (they compete for the CPU)."""
    import os
    import subprocess

    out = subprocess.run(["ps", "-eo", "pid=,args="], capture_output=True, text=True).stdout
    return sum(1 for line in out.splitlines()
               if "serve run" in line and "cache-gain-" not in line and int(line.split()[0]) != os.getpid())


def _workload(spec: str) -> tuple[str, int]:
    workload, _, per_request = spec.partition(":")
    if workload not in ("translation", "embeddings"):
        raise argparse.ArgumentTypeError(f"workload must be translation or embeddings, got {workload!r}")
    return workload, int(per_request or 1)


def main(argv: Optional[list[str]] = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--url", help="a running service; default: start `serve run serve_config.yaml` here")
    p.add_argument("--workloads", type=_workload, nargs="+",
                   default=[("translation", 1), ("embeddings", 1), ("translation", 8)],
                   help="WORKLOAD[:TEXTS_PER_REQUEST] ... (default: translation embeddings translation:8)")
    p.add_argument("--texts", type=int, default=600,
                   help="texts per phase (requests: texts / texts per request)")
    p.add_argument("--universe", type=int, default=10_000, help="distinct texts the requests draw from")
    p.add_argument("--zipf-s", type=float, default=1.0, help="Zipf exponent of text popularity")
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--rounds", type=int, default=2, help="times the off/on pair of each workload is measured")
    p.add_argument("--open-loop-load", type=float, default=0.7,
                   help="then, for one-text workloads: Poisson arrivals at this fraction of the cache-off "
                   "throughput, the same for off and on (latency at equal load); 0 skips it")
    p.add_argument("--replicas", type=int, default=1,
                   help="replicas of each model deployment, fixed (when this starts its own Serve)")
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--json-out", type=Path)
    a = p.parse_args(argv)

    with pinned_serve_run(a.url, "cache-gain-", replicas=a.replicas, args={"cache": {"enabled": True}}) as url:
        results = asyncio.run(measure(url, a))
    summary = {name: {key: float(np.median([r[key] for r in rounds])) for key in
                      ("repeat_ratio", "throughput_on_over_off", "p50_on_over_off", "p99_on_over_off")
                      if key in rounds[0]}
               for name, rounds in results.items()}
    report = {"measured_at": time.strftime("%Y-%m-%d %H:%M:%S"), "zipf_s": a.zipf_s, "universe": a.universe,
              "texts_per_phase": a.texts, "concurrency": a.concurrency, "rounds": a.rounds,
              "model_replicas": a.replicas if a.url is None else "as deployed",
              "median_over_rounds": summary, "results": results}
    if a.json_out:
        a.json_out.parent.mkdir(parents=True, exist_ok=True)
        a.json_out.write_text(json.dumps(report, indent=2))
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
