"""Ray's Prometheus endpoint as the tests read it: metrics parsed, summed, and the batches a model
computed between two readings (it served the batch-join probe too, bench/batch_join.py, now in git only).

The replicas' `serve_app_batch_records` / `serve_app_model_seconds` histograms (labelled by
`model`: the deployment, or the model placed in the Ingress) say how many batches ran, of how many
records, for how long. Ray's agent exports them with a delay (replicas report every few seconds),
so `batches_between` takes each of its two readings once the counts have stopped moving for longer
than that delay.
"""

from __future__ import annotations

import glob
import os
import time
import urllib.request
from pathlib import Path
from typing import Callable, Optional


def _started_at(pid: int) -> float:
    """When process `pid` started (epoch seconds), or 0.0 if it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        boot = next(int(line.split()[1]) for line in open("/proc/stat") if line.startswith("btime"))
    except (FileNotFoundError, ProcessLookupError):
        return 0.0
    return boot + int(fields[19]) / os.sysconf("SC_CLK_TCK")  # field 22, starttime, in ticks since boot


def session_folder(pid: int) -> Optional[Path]:
    """The Ray session folder of the cluster process `pid` started (Ray names it after that pid), or None
    yet. PIDs wrap (pid_max is 32768 here) and /tmp/ray keeps old sessions: a folder made before the
    process started is another's (a ci-local chaos run read a stale session's logs and metrics port)."""
    born = _started_at(pid) - 2  # btime is whole seconds
    found = [Path(p) for p in glob.glob(f"/tmp/ray/session_*_{pid}") if os.stat(p).st_ctime >= born]
    return max(found, key=lambda p: p.stat().st_ctime, default=None)


def metrics_url(launcher_pid: int, timeout_s: float = 30.0) -> Optional[str]:
    """Ray's metrics endpoint of the cluster the launcher `launcher_pid` started (its session folder is
    named after that pid), or None if it has none after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        folder = session_folder(launcher_pid)
        for port_file in glob.glob(str(folder / "metrics_export_port_*")) if folder else []:
            port = Path(port_file).read_text().strip()
            if port:
                return f"http://127.0.0.1:{port}/metrics"
        time.sleep(0.5)
    return None


def parse(text: str) -> dict[tuple[str, tuple], float]:
    """Prometheus text -> {(name, sorted labels): value}."""
    from prometheus_client.parser import text_string_to_metric_families

    samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return samples


def scrape(url: str) -> dict[tuple[str, tuple], float]:
    with urllib.request.urlopen(url, timeout=10) as resp:
        return parse(resp.read().decode())


def total(samples: dict, name: str, **labels: str) -> float:
    """Sum of a metric's samples whose labels include `labels` (Ray may prefix names with `ray_`)."""
    out = 0.0
    for (sample_name, sample_labels), value in samples.items():
        if sample_name in (name, f"ray_{name}") and all(dict(sample_labels).get(k) == v for k, v in labels.items()):
            out += value
    return out


def batch_figures(before: dict, after: dict, model: str) -> dict:
    """What `model` computed between two readings: batches, records per batch, model seconds per
    batch and records per model second (the model's own rate, waits and Serve excluded)."""
    def delta(name: str) -> float:
        return total(after, name, model=model) - total(before, name, model=model)

    # (exact counters: Ray exports a histogram's _sum from its bucket midpoints)
    batches = delta("serve_app_batch_records_count")
    records = delta("serve_app_records_batched_total")
    seconds = delta("serve_app_model_busy_seconds_total")
    if batches <= 0:
        return {"batches": 0}
    return {"batches": int(batches), "records": int(records),
            "records_per_batch": round(records / batches, 1),
            "model_s_per_batch": round(seconds / batches, 3),
            "model_records_per_s": round(records / seconds, 2) if seconds > 0 else None}


#: Ray's core workers report user metrics to the agent every 10 s (`metrics_report_interval_ms`):
#: a count unchanged for longer than that has caught up with the work done so far.
REPORT_INTERVAL_S = 10.0


def settled_reading(url: str, model: str, quiet_s: float = REPORT_INTERVAL_S + 2, timeout_s: float = 60.0) -> dict:
    """A reading taken once `model`'s computed-records counts have stopped moving for `quiet_s` (the work
    of earlier cells, warm-ups and bursts is all in it), or after `timeout_s`."""
    def counts(reading: dict) -> tuple[float, float]:
        return (total(reading, "serve_app_records_total", model=model),
                total(reading, "serve_app_records_batched_total", model=model))

    reading = scrape(url)
    count = counts(reading)
    still_since = began = time.monotonic()
    while time.monotonic() - still_since < quiet_s and time.monotonic() - began < timeout_s:
        time.sleep(1.0)
        reading = scrape(url)
        now = counts(reading)
        if now != count:
            count, still_since = now, time.monotonic()
    return reading


def batches_between(url: str, model: str, run: Callable[[], dict]) -> tuple[dict, dict]:
    """Run `run()` (a bench cell) between two settled readings of `url` (`settled_reading`: the work
    before the cell, then the cell's, all counted). Returns (the cell, `model`'s batch figures over
    it, the requests still in flight when the cell's load stopped included)."""
    before = settled_reading(url, model)
    cell = run()
    return cell, batch_figures(before, settled_reading(url, model), model)
