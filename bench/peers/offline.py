"""Offline limit: the workload's model called in one process on batches, no server: the ceiling.

    python -m bench.peers.offline --workload embeddings --seconds 3 [--json]

Sweeps the workload's batch sizes (each for about --seconds, at least 2 calls, after
one warm-up call) over the same text pool the load generator sends, and reports
records/s and seconds per batch for each; the best is the limit.
"""

from __future__ import annotations

import argparse
import json
import time

from bench.compare.stats import best_batch
from bench.load import POOL
from bench.peers.models import WORKLOADS, load_model

MIN_CALLS = 2


def sweep(workload: str, seconds: float, sizes: tuple[int, ...] | None = None) -> dict:
    run = load_model(workload)
    batches: dict[int, dict] = {}
    offset = 0
    for size in sizes or WORKLOADS[workload].offline_batches:
        def texts() -> list[str]:
            nonlocal offset
            offset += size
            return [POOL[(offset + k) % len(POOL)] for k in range(size)]

        run(texts())  # warm-up at this shape
        calls, began = 0, time.perf_counter()
        while calls < MIN_CALLS or time.perf_counter() - began < seconds:
            run(texts())
            calls += 1
        elapsed = time.perf_counter() - began
        batches[size] = {"records_per_s": round(calls * size / elapsed, 2), "batch_s": round(elapsed / calls, 5)}
    best = best_batch(batches)
    return {"workload": workload, "batches": batches, "best_batch": best,
            "records_per_s": batches[best]["records_per_s"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument("--workload", choices=sorted(WORKLOADS), required=True)
    parser.add_argument("--seconds", type=float, default=3.0, help="measuring time per batch size")
    parser.add_argument("--sizes", type=lambda s: tuple(int(x) for x in s.split(",")), default=None)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    result = sweep(args.workload, args.seconds, args.sizes)
    print(json.dumps(result) if args.json else json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
