"""Open-loop overload: requests arrive at a fixed rate whatever the service does.

    python -m bench.overload --url http://127.0.0.1:9527 --rate 100 --duration-s 60

Counts every status (anything but 200 and 503 is a failure of the service), checks that
each 503 carries Retry-After and the JSON error body, reports latency of the 200s, how
many requests never got an answer (hangs), and the RSS of Ray's processes before/after.
Exits 1 if any answer was neither 200 nor a well-formed 503, or any request hung.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import time
from collections import Counter

import httpx
import numpy as np

from .load import NO_CACHE, payload


def ray_rss_mb() -> float:
    """Total RSS of Ray / Serve processes (ps), in MB."""
    out = subprocess.run(["ps", "-eo", "rss,args"], capture_output=True, text=True).stdout
    return round(sum(int(line.split(None, 1)[0]) for line in out.splitlines()[1:]
                     if any(k in line for k in ("ray::", "raylet", "gcs_server", "serve run", "serve_app.run", "ServeReplica"))) / 1024, 1)


async def flood(url: str, workload: str, rate: float, duration_s: float, records: int, timeout_s: float) -> dict:
    statuses: Counter = Counter()
    latencies, shed_latencies = [], []
    bad_503 = 0
    hung = 0
    limits = httpx.Limits(max_connections=2000, max_keepalive_connections=500)
    async with httpx.AsyncClient(base_url=url, timeout=timeout_s, limits=limits, headers=NO_CACHE) as client:
        async def one(i: int) -> None:
            nonlocal bad_503, hung
            path, body = payload(workload, records, i)
            start = time.perf_counter()
            try:
                resp = await client.post(path, json=body)
            except httpx.TimeoutException:
                hung += 1
                statuses["timeout"] += 1
                return
            except httpx.HTTPError as exc:
                statuses[type(exc).__name__] += 1
                return
            took = time.perf_counter() - start
            statuses[resp.status_code] += 1
            if resp.status_code == 200:
                latencies.append(took)
            elif resp.status_code == 503:
                shed_latencies.append(took)
                ok = "Retry-After" in resp.headers
                try:
                    ok = ok and resp.json().get("error_type") in ("overloaded", "model_unavailable")
                except ValueError:
                    ok = False
                bad_503 += 0 if ok else 1

        tasks = []
        began = time.monotonic()
        i = 0
        while (now := time.monotonic()) - began < duration_s:
            target = began + i / rate
            if target > now:
                await asyncio.sleep(target - now)
            tasks.append(asyncio.create_task(one(i)))
            i += 1
        await asyncio.gather(*tasks)
        elapsed = time.monotonic() - began
    lat = np.array(latencies or [0.0]) * 1000
    shed = np.array(shed_latencies or [0.0]) * 1000
    return {
        "workload": workload, "offered_rate_per_s": rate, "duration_s": duration_s, "sent": i,
        "elapsed_s": round(elapsed, 1), "statuses": {str(k): v for k, v in sorted(statuses.items(), key=str)},
        "ok_per_s": round(len(latencies) / elapsed, 1),
        "p50_ms_200": round(float(np.percentile(lat, 50)), 1), "p99_ms_200": round(float(np.percentile(lat, 99)), 1),
        "p50_ms_503": round(float(np.percentile(shed, 50)), 1),
        "malformed_503": bad_503, "hung": hung,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--url", default="http://127.0.0.1:9527")
    p.add_argument("--workload", choices=["translation", "embeddings"], default="translation")
    p.add_argument("--rate", type=float, required=True, help="requests per second offered")
    p.add_argument("--duration-s", type=float, default=60)
    p.add_argument("--records", type=int, default=1)
    p.add_argument("--timeout-s", type=float, default=90, help="a request unanswered after this counts as hung")
    a = p.parse_args()
    before = ray_rss_mb()
    result = asyncio.run(flood(a.url, a.workload, a.rate, a.duration_s, a.records, a.timeout_s))
    result["ray_rss_mb_before"], result["ray_rss_mb_after"] = before, ray_rss_mb()
    print(json.dumps(result))
    others = {k: v for k, v in result["statuses"].items() if k not in ("200", "503")}
    raise SystemExit(1 if others or result["malformed_503"] or result["hung"] else 0)


if __name__ == "__main__":
    main()
