"""The one load generator every contender gets: wrk for closed loop, asyncio for open loop.

Closed loop: `concurrency` connections, each sends its next request when the last one
is answered (wrk, C, so the generator costs little of the 2 cores). Open loop: requests
start on a fixed schedule (`rate` per second) whatever the server does, and each
latency is measured from its *scheduled* send time, so queueing is not hidden
(no coordinated omission).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import aiohttp

from bench.compare.stats import latency_summary

LUA = Path(__file__).with_name("closed.lua")
#: wrk's per-request timeout: long, because deep queues at 128 clients are part of what we measure.
REQUEST_TIMEOUT_S = 300


@dataclass(frozen=True)
class Target:
    """Where and what to send: base URL, route, body kind and records per request."""

    url: str
    path: str
    body_kind: str  # "embeddings" | "translation" | "texts"
    records: int
    texts: tuple[str, ...]

    def body(self, i: int) -> dict:
        picked = [self.texts[(i + k) % len(self.texts)] for k in range(self.records)]
        if self.body_kind == "texts":
            return {"texts": picked}
        if self.body_kind == "embeddings":
            return {"input": picked[0] if self.records == 1 else picked}
        return {"payload": {"fromLang": "en", "toLang": "pt",
                            "records": [{"id": str(k), "text": t} for k, t in enumerate(picked)]}}


def write_texts(texts: tuple[str, ...], path: Path) -> Path:
    path.write_text("".join(json.dumps(t) + "\n" for t in texts), encoding="utf-8")
    return path


def parse_wrk(output: str) -> dict:
    """The BENCH_JSON line closed.lua's done() prints, as a dict."""
    for line in output.splitlines():
        if line.startswith("BENCH_JSON "):
            return json.loads(line[len("BENCH_JSON "):])
    raise ValueError(f"wrk printed no BENCH_JSON line:\n{output[-2000:]}")


def closed_cell_figures(raw: dict, records: int, concurrency: Optional[int] = None) -> dict:
    """requests/s and records/s of answered-OK requests, latency percentiles in ms, error counts.

    The rate is Little's law, `concurrency` / mean latency (x the share answered OK), where closed.lua gives the mean
    and no socket error cost a client time outside it: answers counted in the window lose up to one round trip per
    client at its end, which at 32 clients x 16 texts (~1.2 s a request, ~7 answers per client in 8 s) cost a
    server answering a whole batch at once up to 15 % and one answering evenly ~1 % (a 12 % lead between two
    servers of equal capacity). `window_requests_per_s` keeps the count in the window."""
    seconds = raw["duration_us"] / 1e6
    socket_errors = raw["timeout"] + raw["read"] + raw["write"] + raw["connect"]
    ok = max(0, raw["requests"] - raw["status"])  # wrk's requests exclude socket errors already
    rate = ok / seconds
    if concurrency and raw.get("mean_us") and raw["requests"] and not socket_errors:
        rate = concurrency / (raw["mean_us"] / 1e6) * ok / raw["requests"]
    return {
        "duration_s": round(seconds, 2), "ok": ok, "errors": socket_errors + raw["status"],
        "requests_per_s": round(rate, 2), "records_per_s": round(rate * records, 2),
        "window_requests_per_s": round(ok / seconds, 2),
        "p50_ms": round(raw["p50_us"] / 1000, 2), "p95_ms": round(raw["p95_us"] / 1000, 2),
        "p99_ms": round(raw["p99_us"] / 1000, 2), "max_ms": round(raw["max_us"] / 1000, 2),
    }


def _run_wrk(script: Path, target: Target, texts_file: Path, connections: int, seconds: float,
             request_timeout_s: float) -> dict:
    """One wrk run of `script` (one thread, `connections` closed-loop clients): its BENCH_JSON line."""
    env = dict(os.environ, BENCH_TEXTS=str(texts_file), BENCH_PATH=target.path, BENCH_RECORDS=str(target.records),
               BENCH_BODY=target.body_kind, BENCH_LUA_DIR=str(script.parent))  # what bodies.lua reads
    cmd = ["wrk", "-t1", f"-c{connections}", f"-d{seconds:g}s", f"--timeout={request_timeout_s:g}s",
           "-s", str(script), target.url]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=seconds + request_timeout_s)
    return parse_wrk(done.stdout + done.stderr)


def run_closed(target: Target, texts_file: Path, concurrency: int, seconds: float) -> dict:
    raw = _run_wrk(LUA, target, texts_file, concurrency, seconds, REQUEST_TIMEOUT_S)
    return closed_cell_figures(raw, target.records, concurrency)


STORM_LUA = Path(__file__).with_name("storm.lua")
#: a storm's per-request timeout: a request held this long is what the storm measures going wrong
STORM_TIMEOUT_S = 30


def storm_figures(raw: dict, records: int) -> dict:
    """Goodput (200s per second), answers by status with their latencies (ms), socket errors."""
    seconds = raw["duration_us"] / 1e6
    statuses = {}
    for status, v in sorted(raw["statuses"].items()):
        summary = latency_summary([us / 1e6 for us in v["lat_us"]])
        statuses[str(status)] = {"count": v["count"], "timed": len(v["lat_us"]),
                                 "p50_ms": summary["p50_ms"], "p99_ms": summary["p99_ms"]}
    ok = statuses.get("200", {}).get("count", 0)
    return {"duration_s": round(seconds, 2), "goodput_rps": round(ok / seconds, 2),
            "records_per_s": round(ok * records / seconds, 2), "statuses": statuses,
            "socket_errors": raw["connect"] + raw["read"] + raw["write"] + raw["timeout"]}


def run_storm(target: Target, texts_file: Path, clients: int, seconds: float) -> dict:
    """`clients` closed-loop clients that ignore Retry-After (storm.lua): what a herd of impolite
    clients gets from a server at and past its capacity."""
    return storm_figures(_run_wrk(STORM_LUA, target, texts_file, clients, seconds, STORM_TIMEOUT_S), target.records)


async def _open_loop(target: Target, rate: float, seconds: float, grace_s: float) -> dict:
    latencies: list[float] = []
    errors = 0
    count = max(1, int(rate * seconds))
    timeout = aiohttp.ClientTimeout(total=seconds + grace_s)
    async with aiohttp.ClientSession(base_url=target.url, timeout=timeout,
                                     connector=aiohttp.TCPConnector(limit=0)) as session:
        async def one(i: int, scheduled: float) -> None:
            nonlocal errors
            try:
                async with session.post(target.path, json=target.body(i)) as resp:
                    await resp.read()
                    if resp.status == 200:
                        latencies.append(time.perf_counter() - scheduled)
                    else:
                        errors += 1
            except (aiohttp.ClientError, asyncio.TimeoutError):
                errors += 1

        began = time.perf_counter()
        tasks = []
        for i in range(count):
            scheduled = began + i / rate
            delay = scheduled - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one(i * target.records, scheduled)))
        await asyncio.gather(*tasks)
        elapsed = time.perf_counter() - began
    return {"offered_rps": round(rate, 2), "sent": count, "ok": len(latencies), "errors": errors,
            "duration_s": round(elapsed, 2), "requests_per_s": round(len(latencies) / elapsed, 2),
            "records_per_s": round(len(latencies) * target.records / elapsed, 2),
            **latency_summary(latencies)}


def run_open(target: Target, rate: float, seconds: float, grace_s: float = REQUEST_TIMEOUT_S) -> dict:
    return asyncio.run(_open_loop(target, rate, seconds, grace_s))


async def _probe(target: Target, timeout_s: float) -> bool:
    async with aiohttp.ClientSession(base_url=target.url,
                                     timeout=aiohttp.ClientTimeout(total=timeout_s)) as session:
        try:
            async with session.post(target.path, json=Target(
                    target.url, target.path, target.body_kind, 1, target.texts).body(0)) as resp:
                await resp.read()
                return resp.status == 200
        except (aiohttp.ClientError, asyncio.TimeoutError):
            return False


def drain(target: Target, timeout_s: float = REQUEST_TIMEOUT_S, retry_pause_s: float = 1.0) -> bool:
    """Probe until one request is answered 200, within `timeout_s` in all: returns once a backlog left by
    the last cell is worked off. One probe is not enough: a server with a request timeout of its own
    (service_streamer's 20 s) fails the probe while its backlog is still queued, and the next cell
    would measure that backlog."""
    deadline = time.monotonic() + timeout_s
    while (left := deadline - time.monotonic()) > 0:
        if asyncio.run(_probe(target, left)):
            return True
        time.sleep(min(retry_pause_s, max(0.0, deadline - time.monotonic())))
    return False
