"""Autoscaling, shown working: a load ramp against a running service while sampling
Serve's own state (replicas per deployment, from the controller) and Ray's Prometheus
metrics (queued and ongoing requests), every second.

    python -m bench.autoscale_demo --url http://127.0.0.1:9527 --out docs/img/autoscaling

Writes <out>.csv, <out>.png (replicas, queue length, latency and throughput over time)
and <out>.json (summary: peak replicas, time to scale up, time back to min).
Needs the service's Ray cluster on this machine (`ray.init(address="auto")`).
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import json
import os
import re
import time
from collections import defaultdict

import httpx
import numpy as np

from .load import payload

#: (seconds, offered requests/s): quiet, a ramp past one replica's capacity, then silence
#: long enough for downscale_delay_s (30 s) + look_back_period_s (15 s) to pass.
DEFAULT_PHASES = [(15, 4), (20, 20), (20, 40), (40, 60), (75, 0)]


def scrape(metrics_url: str) -> dict[str, float]:
    """Sum of Serve gauges per deployment from Ray's Prometheus endpoint."""
    wanted = ("ray_serve_deployment_queued_queries", "ray_serve_num_ongoing_requests_at_replicas")
    totals: dict[str, float] = defaultdict(float)
    try:
        text = httpx.get(metrics_url, timeout=5).text
    except httpx.HTTPError:
        return {}
    for line in text.splitlines():
        for name in wanted:
            if line.startswith(name + "{"):
                dep = re.search(r'deployment="([^"]+)"', line)
                if dep:
                    totals[f"{name}:{dep.group(1)}"] += float(line.rsplit(" ", 1)[1])
    return totals


def replica_counts() -> dict[str, int]:
    from ray import serve

    status = serve.status()
    counts = {}
    for app in status.applications.values():
        for name, dep in app.deployments.items():
            counts[name] = int(dep.replica_states.get("RUNNING", 0))
    return counts


async def drive(url: str, phases, samples: list, metrics_url: str, workload: str) -> None:
    began = time.monotonic()
    done: list[tuple[float, float, int]] = []  # (finish time, latency, status)
    limits = httpx.Limits(max_connections=1000, max_keepalive_connections=200)
    async with httpx.AsyncClient(base_url=url, timeout=120, limits=limits) as client:
        async def one(i: int) -> None:
            path, body = payload(workload, 1, i)
            start = time.perf_counter()
            try:
                resp = await client.post(path, json=body)
                status = resp.status_code
            except httpx.HTTPError:
                status = 0
            done.append((time.monotonic() - began, time.perf_counter() - start, status))

        async def sampler() -> None:
            total = sum(d for d, _ in phases)
            while (t := time.monotonic() - began) < total:
                counts = await asyncio.to_thread(replica_counts)
                metrics = await asyncio.to_thread(scrape, metrics_url)
                recent = [(lat, st) for (ft, lat, st) in done if t - 5 <= ft <= t]
                ok = [lat for lat, st in recent if st == 200]
                samples.append({
                    "t_s": round(t, 1),
                    "offered_rps": current_rate(phases, t),
                    "translator_replicas": counts.get("Translator", 0),
                    "embedder_replicas": counts.get("Embedder", 0),
                    "translator_queued": metrics.get("ray_serve_deployment_queued_queries:Translator", 0.0),
                    "translator_ongoing": metrics.get("ray_serve_num_ongoing_requests_at_replicas:Translator", 0.0),
                    "ok_rps_5s": round(len(ok) / 5, 1),
                    "shed_rps_5s": round(sum(1 for _, st in recent if st == 503) / 5, 1),
                    "p50_ms_5s": round(float(np.percentile(ok, 50)) * 1000, 1) if ok else None,
                    "p95_ms_5s": round(float(np.percentile(ok, 95)) * 1000, 1) if ok else None,
                })
                await asyncio.sleep(max(0.0, 1 - ((time.monotonic() - began) - t)))

        tasks, i = [], 0
        sampling = asyncio.create_task(sampler())
        for duration, rate in phases:
            phase_start = time.monotonic()
            n = 0
            while time.monotonic() - phase_start < duration:
                if rate <= 0:
                    await asyncio.sleep(0.2)
                    continue
                target = phase_start + n / rate
                now = time.monotonic()
                if target > now:
                    await asyncio.sleep(target - now)
                tasks.append(asyncio.create_task(one(i)))
                i += 1
                n += 1
        await asyncio.gather(*tasks)
        await sampling


def current_rate(phases, t: float) -> float:
    elapsed = 0.0
    for duration, rate in phases:
        if t < elapsed + duration:
            return rate
        elapsed += duration
    return 0.0


def plot(samples: list[dict], path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t = [s["t_s"] for s in samples]
    fig, axes = plt.subplots(3, 1, figsize=(10, 9), sharex=True)
    axes[0].step(t, [s["translator_replicas"] for s in samples], where="post", label="Translator replicas", lw=2)
    axes[0].step(t, [s["embedder_replicas"] for s in samples], where="post", label="Embedder replicas", ls="--")
    axes[0].set_ylabel("running replicas")
    axes[0].legend(loc="upper left")
    ax0b = axes[0].twinx()
    ax0b.plot(t, [s["offered_rps"] for s in samples], color="grey", alpha=0.5, label="offered req/s")
    ax0b.set_ylabel("offered req/s", color="grey")
    axes[1].plot(t, [s["translator_ongoing"] for s in samples], label="ongoing at Translator replicas")
    axes[1].plot(t, [s["translator_queued"] for s in samples], label="queued for Translator")
    axes[1].set_ylabel("requests")
    axes[1].legend(loc="upper left")
    axes[2].plot(t, [s["p50_ms_5s"] for s in samples], label="p50 latency (5 s window)")
    axes[2].plot(t, [s["p95_ms_5s"] for s in samples], label="p95 latency (5 s window)")
    axes[2].set_ylabel("ms")
    axes[2].set_xlabel("seconds since the ramp started")
    ax2b = axes[2].twinx()
    ax2b.plot(t, [s["ok_rps_5s"] for s in samples], color="green", alpha=0.6, label="answered req/s")
    ax2b.set_ylabel("answered req/s", color="green")
    axes[2].legend(loc="upper left")
    fig.suptitle("serve-app: Translator autoscaling under a load ramp (2-core machine, cpu profile)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def summarise(samples: list[dict], phases) -> dict:
    peak = max(s["translator_replicas"] for s in samples)
    first_up = next((s["t_s"] for s in samples if s["translator_replicas"] > 1), None)
    load_end = sum(d for d, r in phases if r > 0)
    back_down = next((s["t_s"] for s in samples if s["t_s"] > load_end and s["translator_replicas"] == 1), None)
    return {"phases": phases, "peak_translator_replicas": peak, "first_upscale_at_s": first_up,
            "load_stopped_at_s": load_end, "back_to_one_replica_at_s": back_down,
            "downscale_took_s": None if back_down is None else round(back_down - load_end, 1)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--url", default="http://127.0.0.1:9527")
    p.add_argument("--out", default="docs/img/autoscaling")
    p.add_argument("--workload", default="translation", choices=["translation", "embeddings"])
    p.add_argument("--ray-address", default=os.environ.get("RAY_ADDRESS", "auto"),
                   help="GCS address of the service's Ray cluster (default: the latest one on this machine)")
    a = p.parse_args()
    # A local cluster started by `serve run` uses Ray 2.60's token auth (~/.ray/auth_token).
    os.environ.setdefault("RAY_AUTH_MODE", "token")
    import ray

    ray.init(address=a.ray_address, logging_level="ERROR", log_to_driver=False)
    node = ray.nodes()[0]
    metrics_url = f"http://{node['NodeManagerAddress']}:{node['MetricsExportPort']}/metrics"
    samples: list[dict] = []
    asyncio.run(drive(a.url, DEFAULT_PHASES, samples, metrics_url, a.workload))
    with open(a.out + ".csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(samples[0]))
        writer.writeheader()
        writer.writerows(samples)
    plot(samples, a.out + ".png")
    summary = summarise(samples, DEFAULT_PHASES)
    with open(a.out + ".json", "w") as f:
        json.dump(summary, f, indent=2)
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
