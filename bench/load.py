"""Closed-loop HTTP load: N clients each sending one request after another.

    python -m bench.load --url http://127.0.0.1:9527 --workload translation --concurrency 32 --duration-s 20

Prints requests/s, records/s, latency percentiles and status counts (as JSON
with --json). Sentences come from a fixed pool of varied lengths.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections import Counter

import httpx
import numpy as np

POOL = [
    "Life is like a box of chocolates.",
    "How are you today?",
    "Good morning.",
    "Where is the train station?",
    "I would like a cup of coffee, please.",
    "The weather is nice today, so we are going to the beach.",
    "The children were playing happily in the garden while their parents prepared dinner.",
    "She has been reading the same book for three weeks because she enjoys every page.",
    "Our quarterly results exceeded expectations, driven by strong demand in the southern region.",
    "Please make sure that all the windows are closed before you leave the office tonight.",
    "The museum opens at nine and closes at six, except on public holidays.",
    "He forgot his umbrella at the restaurant.",
    "Can you recommend a good doctor near the city centre?",
    "After the storm, volunteers from the whole town helped clean the streets and repair the roofs.",
    "Thank you very much.",
    "The new software update fixes several bugs and improves battery life on older phones.",
]


#: sent with every request unless --use-cache: the pool above is small, and the ingress's
#: response cache would answer its repeats; these benchmarks measure the models
NO_CACHE = {"Cache-Control": "no-cache"}


def payload(workload: str, records: int, i: int) -> tuple[str, dict]:
    texts = [POOL[(i + k) % len(POOL)] for k in range(records)]
    if workload == "embeddings":
        return "/embeddings", {"input": texts if records > 1 else texts[0]}
    return "/translation", {"payload": {"fromLang": "en", "toLang": "pt",
                                        "records": [{"id": str(k), "text": t} for k, t in enumerate(texts)]}}


async def run(url: str, workload: str, concurrency: int, duration_s: float, records: int,
              use_cache: bool = False) -> dict:
    latencies: list[float] = []
    statuses: Counter = Counter()
    batch_sizes: list[int] = []
    stop_at = time.monotonic() + duration_s
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    headers = {} if use_cache else NO_CACHE
    async with httpx.AsyncClient(base_url=url, timeout=120, limits=limits, headers=headers) as client:
        async def worker(w: int) -> None:
            i = w
            while time.monotonic() < stop_at:
                path, body = payload(workload, records, i)
                start = time.perf_counter()
                try:
                    resp = await client.post(path, json=body)
                    statuses[resp.status_code] += 1
                    if resp.status_code == 200:
                        latencies.append(time.perf_counter() - start)
                        batch_sizes.append(int(resp.headers.get("X-Batch-Records", 0)))
                except httpx.HTTPError as exc:
                    statuses[type(exc).__name__] += 1
                i += concurrency

        began = time.monotonic()
        await asyncio.gather(*(worker(w) for w in range(concurrency)))
        elapsed = time.monotonic() - began
    lat = np.array(latencies) * 1000 if latencies else np.zeros(1)
    ok = len(latencies)
    return {
        "workload": workload, "concurrency": concurrency, "records_per_request": records,
        "duration_s": round(elapsed, 1), "ok": ok, "statuses": {str(k): v for k, v in statuses.items()},
        "requests_per_s": round(ok / elapsed, 1), "records_per_s": round(ok * records / elapsed, 1),
        "p50_ms": round(float(np.percentile(lat, 50)), 1), "p95_ms": round(float(np.percentile(lat, 95)), 1),
        "p99_ms": round(float(np.percentile(lat, 99)), 1),
        "mean_batch_records": round(float(np.mean(batch_sizes)), 1) if batch_sizes else 0,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--url", default="http://127.0.0.1:9527")
    p.add_argument("--workload", choices=["translation", "embeddings"], default="translation")
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--duration-s", type=float, default=20)
    p.add_argument("--records", type=int, default=1, help="records (texts) per request")
    p.add_argument("--use-cache", action="store_true",
                   help="let the response cache answer repeated texts (default: every text is computed)")
    p.add_argument("--json", action="store_true")
    a = p.parse_args()
    result = asyncio.run(run(a.url, a.workload, a.concurrency, a.duration_s, a.records, a.use_cache))
    print(json.dumps(result) if a.json else "\n".join(f"{k:>20}: {v}" for k, v in result.items()))


if __name__ == "__main__":
    main()
