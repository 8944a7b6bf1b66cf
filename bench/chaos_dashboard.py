"""Render docs/img/grafana-dashboard.png: the panels of k8s/base/grafana-dashboard.json drawn with
matplotlib from Prometheus data scraped during a real run.

    python -m bench.chaos_dashboard [--seconds 75] [--out docs/img/grafana-dashboard.png]

Starts its own `serve run` (tests/chaos/harness.py), drives a mixed load (translations,
embeddings, a few invalid bodies), then a burst of requests with a 300 ms deadline (their
queued records are dropped), then SIGKILLs the Translator replica, scraping Ray's metrics
endpoint every 2 s. Each panel reproduces its PromQL over the scraped counters (rates and
histogram quantiles over a 10 s window). Keep it short: the machine is shared.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import httpx

from tests.chaos.harness import ROOT, ServeRun
from tests.chaos.helpers import SENTENCE, translation_body

WINDOW_S = 10.0


def scrape_series(run: ServeRun) -> dict:
    return {f"{name}|{json.dumps(dict(labels), sort_keys=True)}": v for (name, labels), v in run.scrape().items()
            if name.startswith("ray_serve_app_") or name in (
                "ray_serve_deployment_replica_healthy", "ray_serve_deployment_queued_queries")}


async def drive(run: ServeRun, seconds: float, events: list, scrapes: list) -> None:
    t0 = time.monotonic()
    stop = asyncio.Event()

    async def translator_worker(i: int):
        async with httpx.AsyncClient(base_url=run.url, timeout=30) as c:
            n = 0
            while not stop.is_set():
                await c.post("/translation", json=translation_body(1 + n % 4, offset=i * 100_000 + n))
                n += 1

    async def embedder_worker(i: int):
        async with httpx.AsyncClient(base_url=run.url, timeout=30) as c:
            n = 0
            while not stop.is_set():
                await c.post("/embeddings", json={"input": [SENTENCE.format(i=i * 1000 + n + k) for k in range(4)]})
                n += 1

    async def mischief():
        async with httpx.AsyncClient(base_url=run.url, timeout=30) as c:
            while not stop.is_set():
                await c.post("/translation", json={"payload": {}})   # 422 invalid_request
                await c.post("/translation", json=translation_body(1) | {"payload": {
                    "fromLang": "en", "toLang": "de", "records": [{"id": "1", "text": "x"}]}})  # 400
                await asyncio.sleep(1.0)

    async def scenario():
        await asyncio.sleep(seconds * 0.3)
        events.append((time.monotonic() - t0, "deadline burst (300 ms)"))
        async with httpx.AsyncClient(base_url=run.url, timeout=30) as c:
            await asyncio.gather(*(c.post("/translation", json=translation_body(64, i * 64),
                                          headers={"X-Request-Timeout-Ms": "300"}) for i in range(12)))
        await asyncio.sleep(seconds * 0.2)
        pid = run.replica_pids("Translator")[0]
        os.kill(pid, signal.SIGKILL)
        events.append((time.monotonic() - t0, "Translator replica SIGKILLed"))
        await asyncio.sleep(max(0.0, seconds - (time.monotonic() - t0)))
        stop.set()

    async def scraper():
        loop = asyncio.get_running_loop()
        while not stop.is_set():
            scrapes.append((time.monotonic() - t0, await loop.run_in_executor(None, scrape_series, run)))
            await asyncio.sleep(2.0)

    await asyncio.gather(scenario(), scraper(), mischief(),
                         *(translator_worker(i) for i in range(6)), *(embedder_worker(i) for i in range(2)))


# -- PromQL-like helpers over the scraped series ------------------------------------------------------

def _parse(key: str) -> tuple[str, dict]:
    name, labels = key.split("|", 1)
    return name, json.loads(labels)


def grouped(sample: dict, name: str, by: tuple[str, ...]) -> dict:
    out: dict = defaultdict(float)
    for key, value in sample.items():
        n, labels = _parse(key)
        if n == name:
            out[tuple(labels.get(b, "") for b in by)] += value
    return out


def rates(scrapes: list, name: str, by: tuple[str, ...]) -> dict:
    """{group: (times, per-second rates over WINDOW_S)}."""
    series: dict = defaultdict(lambda: ([], []))
    for i, (t, sample) in enumerate(scrapes):
        j = max((k for k in range(i) if t - scrapes[k][0] >= WINDOW_S), default=None)
        if j is None:
            continue
        t0, s0 = scrapes[j]
        now, before = grouped(sample, name, by), grouped(s0, name, by)
        for group in set(now) | set(before):
            series[group][0].append(t)
            series[group][1].append(max(0.0, now.get(group, 0) - before.get(group, 0)) / (t - t0))
    return series


def quantiles(scrapes: list, name: str, by: tuple[str, ...], q: float) -> dict:
    series: dict = defaultdict(lambda: ([], []))
    for i, (t, sample) in enumerate(scrapes):
        j = max((k for k in range(i) if t - scrapes[k][0] >= WINDOW_S), default=None)
        if j is None:
            continue
        now = grouped(sample, f"{name}_bucket", by + ("le",))
        before = grouped(scrapes[j][1], f"{name}_bucket", by + ("le",))
        per_group: dict = defaultdict(list)
        for key, value in now.items():
            per_group[key[:-1]].append((float(key[-1]), value - before.get(key, 0.0)))
        for group, buckets in per_group.items():
            buckets.sort()
            total = buckets[-1][1]
            if total <= 0:
                continue
            rank, prev_le, prev_count = q * total, 0.0, 0.0
            for le, count in buckets:
                if count >= rank:
                    value = prev_le if le == float("inf") else prev_le + (le - prev_le) * (
                        (rank - prev_count) / max(count - prev_count, 1e-9))
                    series[group][0].append(t)
                    series[group][1].append(value)
                    break
                prev_le, prev_count = le, count
    return series


def gauges(scrapes: list, name: str, by: tuple[str, ...]) -> dict:
    series: dict = defaultdict(lambda: ([], []))
    for t, sample in scrapes:
        for group, value in grouped(sample, name, by).items():
            series[group][0].append(t)
            series[group][1].append(value)
    return series


def render(scrapes: list, events: list, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    dashboard = json.loads((ROOT / "k8s" / "base" / "grafana-dashboard.json").read_text())
    titles = {p["id"]: p["title"] for p in dashboard["panels"]}
    p = "ray_serve_app_"
    panels = {
        1: [(rates(scrapes, p + "requests_total", ("route", "status")), "{0} {1}")],
        2: [(rates(scrapes, p + "errors_total", ("error_type",)), "{0}")],
        3: [(quantiles(scrapes, p + "request_seconds", ("route",), q), "{0} p" + str(int(q * 100)))
            for q in (0.5, 0.95, 0.99)],
        4: [(rates(scrapes, p + "records_total", ("deployment",)), "{0} computed"),
            (rates(scrapes, p + "records_cancelled_total", ("deployment",)), "{0} dropped")],
        5: [(_ratio(rates(scrapes, p + "batch_records_sum", ("deployment",)),
                    rates(scrapes, p + "batch_records_count", ("deployment",))), "{0}")],
        6: [(quantiles(scrapes, p + "queue_wait_seconds", ("deployment",), 0.95), "{0}")],
        7: [(quantiles(scrapes, p + "model_seconds", ("deployment",), 0.95), "{0}")],
        8: [(gauges(scrapes, "ray_serve_deployment_replica_healthy", ("deployment",)), "{0}")],
        9: [(rates(scrapes, p + "model_failures_total", ("deployment",)), "{0}")],
        10: [(gauges(scrapes, "ray_serve_deployment_queued_queries", ("deployment",)), "{0}")],
    }
    end = scrapes[-1][0] if scrapes else 1.0
    gauge_panels = {8, 10}
    plt.style.use("dark_background")
    fig, axes = plt.subplots(4, 3, figsize=(18, 16))
    for ax, (pid, lines) in zip(axes.flat, panels.items()):
        ax.set_title(titles[pid], fontsize=11, loc="left")
        for series, fmt in lines:
            for group, (xs, ys) in sorted(series.items()):
                if group and group[0] in ("/healthz", "/readyz", "/v1/models", "/docs", "/openapi.json"):
                    continue
                if pid in gauge_panels:
                    ax.step(xs, ys, where="post", linewidth=1.5, marker=".", label=fmt.format(*group))
                else:
                    ax.plot(xs, ys, linewidth=1.2, label=fmt.format(*group))
        ax.set_xlim(0, end)
        if not ax.get_lines():
            ax.set_ylim(0, 1)
            ax.text(end / 2, 0.5, "none during the run", ha="center", fontsize=10, alpha=0.7)
        for t, what in events:
            ax.axvline(t, color="#f2cc0c", linestyle="--", linewidth=0.8)
        ax.grid(alpha=0.2)
        ax.set_xlabel("seconds into the run", fontsize=8)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7, loc="upper left")
    for ax in axes.flat[len(panels):]:
        ax.axis("off")
    notes = "\n".join(f"{t:5.1f} s  {what}" for t, what in events)
    axes.flat[-1].text(0, 0.9, "Events (dashed lines):\n" + notes, fontsize=11, va="top", family="monospace")
    axes.flat[-1].text(0, 0.2, "Rendered by bench/chaos_dashboard.py from Ray's Prometheus\nendpoint, "
                       f"scraped every 2 s; rates over {WINDOW_S:g} s windows.", fontsize=9, va="top")
    fig.suptitle("serve-app (Grafana dashboard k8s/base/grafana-dashboard.json, reproduced from a real run)",
                 fontsize=14)
    fig.tight_layout(rect=(0, 0, 1, 0.97))
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=80)


def _ratio(num: dict, den: dict) -> dict:
    out: dict = {}
    for group, (xs, ys) in num.items():
        dxs, dys = den.get(group, ([], []))
        d = dict(zip(dxs, dys))
        pairs = [(x, y / d[x]) for x, y in zip(xs, ys) if d.get(x)]
        out[group] = ([x for x, _ in pairs], [y for _, y in pairs])
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=75)
    parser.add_argument("--out", default=str(ROOT / "docs" / "img" / "grafana-dashboard.png"))
    parser.add_argument("--data", default=str(ROOT / "reports" / "dashboard-scrapes.json"))
    parser.add_argument("--render-only", action="store_true", help="redraw from --data without a run")
    ns = parser.parse_args()
    if ns.render_only:
        data = json.loads(Path(ns.data).read_text())
        render(data["scrapes"], data["events"], Path(ns.out))
        return
    run = ServeRun(Path(tempfile.mkdtemp(prefix="dashboard-run-")))
    events: list = []
    scrapes: list = []
    try:
        run.start()
        asyncio.run(drive(run, ns.seconds, events, scrapes))
    finally:
        run.stop()
    Path(ns.data).parent.mkdir(parents=True, exist_ok=True)
    Path(ns.data).write_text(json.dumps({"events": events, "scrapes": scrapes}))
    render(scrapes, events, Path(ns.out))
    print(f"wrote {ns.out} ({len(scrapes)} scrapes) and {ns.data}")


if __name__ == "__main__":
    main()
