"""Closed-loop HTTP load on a running serve-app: C clients, each sending its next request when the last
one is answered, for a fixed time per cell.

A request is the contract's body, `POST /translation` with {"payload": {"fromLang": "en", "toLang":
"pt", "records": [...]}}, with make bench's sentences (bench/load.py POOL) and `Cache-Control:
no-cache` (every record computed). A 503 (shed: ingress.max_inflight_requests) makes its client wait
its Retry-After (at most 2 s), as serve_app.client does. Per cell: records/s and requests/s of the
200s over the cell's wall time, p50/p99 latency of the 200s, every status (and exception) counted,
the mean model batch the records rode in (X-Batch-Records), and the GPU's utilisation (nvidia-smi,
sampled every second) where there is one.
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import threading
import time
from collections import Counter
from typing import Optional

from bench.gpu.common import SOURCE, TARGET, pct, say


def payload(records: int, i: int) -> dict:
    from bench.load import POOL

    return {"payload": {"fromLang": SOURCE, "toLang": TARGET, "records": [
        {"id": str(k), "text": POOL[(i + k) % len(POOL)]} for k in range(records)]}}


class GpuSampler:
    """nvidia-smi's GPU utilisation and memory, every `interval_s`, on a thread (nothing without nvidia-smi)."""

    def __init__(self, interval_s: float = 1.0):
        self.interval_s = interval_s
        self.samples: list[tuple[float, float]] = []
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    def __enter__(self) -> "GpuSampler":
        if shutil.which("nvidia-smi"):
            self._thread = threading.Thread(target=self._run, daemon=True)
            self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                out = subprocess.run(["nvidia-smi", "--query-gpu=utilization.gpu,memory.used",
                                      "--format=csv,noheader,nounits"], capture_output=True, text=True,
                                     timeout=5).stdout.split("\n")[0]
                util, mem = (float(x) for x in out.split(","))
                self.samples.append((util, mem))
            except (OSError, ValueError, subprocess.SubprocessError):
                pass

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def summary(self) -> dict:
        if not self.samples:
            return {}
        utils = [u for u, _ in self.samples]
        return {"gpu_util_mean_pct": round(sum(utils) / len(utils), 1), "gpu_util_max_pct": max(utils),
                "gpu_memory_used_mib_max": max(m for _, m in self.samples)}


async def _cell(url: str, clients: int, records: int, seconds: float) -> dict:
    import aiohttp

    statuses: Counter = Counter()
    latencies: list[float] = []
    batches: list[int] = []
    errors: list[str] = []
    connector = aiohttp.TCPConnector(limit=clients + 4)
    timeout = aiohttp.ClientTimeout(total=120)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout,
                                     headers={"Cache-Control": "no-cache"}) as session:
        stop_at = time.monotonic() + seconds

        async def client(w: int) -> None:
            i = w
            while time.monotonic() < stop_at:
                start = time.perf_counter()
                try:
                    async with session.post(f"{url}/translation", json=payload(records, i)) as resp:
                        body = await resp.read()
                        took = time.perf_counter() - start
                        if resp.status == 200 and body.count(b'"id"') != records:
                            statuses["200_bad_body"] += 1
                            continue
                        statuses[str(resp.status)] += 1
                        if resp.status == 200:
                            latencies.append(took)
                            batches.append(int(resp.headers.get("X-Batch-Records", 0) or 0))
                        else:
                            if len(errors) < 3:
                                errors.append(f"{resp.status}: {body[:300].decode(errors='replace')}")
                            if resp.status == 503:
                                await asyncio.sleep(min(float(resp.headers.get("Retry-After", 1) or 1), 2.0))
                except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
                    statuses[type(exc).__name__] += 1
                    if len(errors) < 3:
                        errors.append(repr(exc)[:300])
                    await asyncio.sleep(0.2)
                i += clients

        began = time.monotonic()
        await asyncio.gather(*(client(w) for w in range(clients)))
        wall = time.monotonic() - began
    ok = len(latencies)
    return {"clients": clients, "records_per_request": records, "wall_s": round(wall, 1), "ok": ok,
            "statuses": dict(statuses), "requests_per_s": round(ok / wall, 2),
            "records_per_s": round(ok * records / wall, 1),
            "p50_ms": round(pct(latencies, 0.5) * 1000, 1), "p99_ms": round(pct(latencies, 0.99) * 1000, 1),
            "mean_batch_records": round(sum(batches) / len(batches), 1) if batches else 0.0,
            "error_samples": errors}


def run_cell(url: str, clients: int, records: int, seconds: float) -> dict:
    with GpuSampler() as gpu:
        result = asyncio.run(_cell(url, clients, records, seconds))
    result.update(gpu.summary())
    return result


def run_cells(url: str, cells: list[tuple[int, int]], seconds: float, offline_limit: Optional[float],
              deadline, reserve_s: float, label: str) -> list[dict]:
    """Each cell for `seconds`, shortened so that the cells left end `reserve_s` before `deadline`;
    records/s over the offline limit."""
    results = []
    for index, (clients, records) in enumerate(cells):
        budget = (deadline.left() - reserve_s) / (len(cells) - index)
        if budget < 4:
            say(f"{label}: cell {clients}x{records} skipped (phase time budget)")
            results.append({"clients": clients, "records_per_request": records, "skipped": "time budget"})
            continue
        cell = run_cell(url, clients, records, min(seconds, budget - 2))
        if offline_limit:
            cell["of_offline_limit"] = round(cell["records_per_s"] / offline_limit, 3)
        results.append(cell)
        shown = {k: v for k, v in cell.items() if k not in ("error_samples", "statuses")}
        say(f"{label}: {clients} clients x {records} records: {cell['records_per_s']} records/s, p50 "
            f"{cell['p50_ms']} ms, p99 {cell['p99_ms']} ms, statuses {cell['statuses']} | {shown}")
        for sample in cell["error_samples"]:
            say(f"{label}:   e.g. {sample}")
    return results
