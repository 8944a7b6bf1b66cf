"""Do jobs starve interactive requests? Interactive /translation latency alone, beside a large
job backlog (POST /jobs), and beside the same backlog sent as bulk /translation requests, in one
Serve run.

    flock /tmp/serve-app-cpu.lock .venv/bin/python -m bench.jobs_priority      # starts its own `serve run`
    .venv/bin/python -m bench.jobs_priority --url http://127.0.0.1:9527       # a running service

The interactive probe: `--clients` closed-loop clients, each sending a one-record translation and
then pausing `--think-s` (people at a UI, not a flood). Each phase runs `--seconds`:

1. `alone`: the probe only.
2. `job backlog`: `--jobs` jobs of `--job-records` records are submitted first; the probe runs
   while they compute (their records go to the replicas' background queues). Job progress during
   the phase gives the jobs' throughput; the jobs are cancelled at the end of the phase.
3. `bulk requests`: the same records sent as interactive /translation requests of
   `--bulk-records` records from `--bulk-clients` closed-loop clients: the backlog without the
   priority, for comparison.

Every text is unique and sent with `Cache-Control: no-cache, no-store`, so the response cache
answers nothing. Model replicas are pinned (no autoscaling) so the phases compare like for like.
Prints p50/p95/p99 of the probe per phase and the ratios to `alone`; `--json-out` writes them.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
import uuid
from pathlib import Path
from typing import Optional

import httpx

from bench.compare.stats import latency_summary

from .load import POOL
from .serve_run import pinned_serve_run

BYPASS = {"Cache-Control": "no-cache, no-store"}


def _records(n: int, tag: str) -> list[dict]:
    return [{"id": str(i), "text": f"{POOL[i % len(POOL)]} ({tag}-{i})"} for i in range(n)]


def _payload(n: int, tag: str) -> dict:
    return {"fromLang": "en", "toLang": "pt", "records": _records(n, tag)}


async def probe(client: httpx.AsyncClient, stop: asyncio.Event, clients: int, think_s: float) -> dict:
    latencies: list[float] = []
    errors: dict[str, int] = {}

    async def one(c: int) -> None:
        i = 0
        while not stop.is_set():
            body = {"payload": _payload(1, f"probe-{c}-{i}-{uuid.uuid4().hex[:8]}")}
            start = time.perf_counter()
            resp = await client.post("/translation", json=body, headers=BYPASS)
            if resp.status_code == 200:
                latencies.append(time.perf_counter() - start)
            else:
                errors[str(resp.status_code)] = errors.get(str(resp.status_code), 0) + 1
            i += 1
            await asyncio.sleep(think_s)

    await asyncio.gather(*(one(c) for c in range(clients)))
    return {**latency_summary(latencies), "requests": len(latencies), "errors": errors}


async def bulk(client: httpx.AsyncClient, stop: asyncio.Event, clients: int, records: int) -> dict:
    done = {"records": 0, "errors": 0}

    async def one(c: int) -> None:
        i = 0
        while not stop.is_set():
            resp = await client.post("/translation", json={"payload": _payload(records, f"bulk-{c}-{i}")},
                                     headers=BYPASS)
            if resp.status_code == 200:
                done["records"] += records
            else:
                done["errors"] += 1
            i += 1

    await asyncio.gather(*(one(c) for c in range(clients)))
    return done


async def phase(url: str, a: argparse.Namespace, kind: str) -> dict:
    limits = httpx.Limits(max_connections=a.clients + a.bulk_clients + 4)
    async with httpx.AsyncClient(base_url=url, timeout=300, limits=limits) as client:
        job_ids: list[str] = []
        if kind == "job backlog":
            for j in range(a.jobs):
                resp = await client.post("/jobs", json={"task": "translation",
                                                        "payload": _payload(a.job_records, f"job-{j}-{uuid.uuid4().hex[:8]}")})
                resp.raise_for_status()
                job_ids.append(resp.json()["job_id"])
        stop = asyncio.Event()
        started = time.perf_counter()
        tasks = [asyncio.create_task(probe(client, stop, a.clients, a.think_s))]
        if kind == "bulk requests":
            tasks.append(asyncio.create_task(bulk(client, stop, a.bulk_clients, a.bulk_records)))
        await asyncio.sleep(a.seconds)
        stop.set()
        results = await asyncio.gather(*tasks)
        elapsed = time.perf_counter() - started
        out = {"phase": kind, "probe": results[0], "seconds": round(elapsed, 1)}
        if kind == "bulk requests":
            out["backlog_records_per_s"] = round(results[1]["records"] / elapsed, 1)
            out["bulk_errors"] = results[1]["errors"]
        if job_ids:
            views = [(await client.get(f"/jobs/{j}")).json() for j in job_ids]
            done = sum(v["progress"]["records_done"] for v in views)
            out["backlog_records_per_s"] = round(done / elapsed, 1)
            out["jobs"] = {v["status"]: sum(1 for w in views if w["status"] == v["status"]) for v in views}
            for j in job_ids:
                await client.delete(f"/jobs/{j}")
        return out


async def measure(url: str, a: argparse.Namespace) -> list[dict]:
    phases = []
    for kind in ("alone", "job backlog", "bulk requests"):
        result = await phase(url, a, kind)
        p = result["probe"]
        print(f"{kind:>14}: probe p50 {p['p50_ms']:.0f} ms  p95 {p['p95_ms']:.0f} ms  p99 {p['p99_ms']:.0f} ms  "
              f"({p['requests']} requests, errors {p['errors']})"
              + (f"; backlog {result['backlog_records_per_s']} records/s" if "backlog_records_per_s" in result else ""),
              flush=True)
        phases.append(result)
    return phases


def main(argv: Optional[list[str]] = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--url", help="a running service; default: start `serve run serve_config.yaml` here")
    p.add_argument("--seconds", type=float, default=30.0, help="length of each phase")
    p.add_argument("--clients", type=int, default=4, help="interactive probe clients")
    p.add_argument("--think-s", type=float, default=0.25, help="pause of a probe client between requests")
    p.add_argument("--jobs", type=int, default=4)
    p.add_argument("--job-records", type=int, default=2000)
    p.add_argument("--bulk-clients", type=int, default=4,
                   help="bulk /translation clients in phase 3 (as many as jobs.max_running_jobs x "
                   "jobs.max_inflight_calls_per_job / calls per request gives a like-for-like backlog)")
    p.add_argument("--bulk-records", type=int, default=64)
    p.add_argument("--json-out", type=Path)
    a = p.parse_args(argv)

    with pinned_serve_run(a.url, "jobs-priority-") as url:
        phases = asyncio.run(measure(url, a))
    alone = phases[0]["probe"]
    ratios = {ph["phase"]: {q: round(ph["probe"][q] / alone[q], 2) for q in ("p50_ms", "p95_ms", "p99_ms")}
              for ph in phases[1:]}
    report = {"measured_at": time.strftime("%Y-%m-%d %H:%M:%S"), "settings": vars(a) | {"json_out": None},
              "phases": phases, "probe_latency_over_alone": ratios}
    print(json.dumps(ratios, indent=2))
    if a.json_out:
        a.json_out.parent.mkdir(parents=True, exist_ok=True)
        a.json_out.write_text(json.dumps(report, indent=2, default=str))


if __name__ == "__main__":
    main()
