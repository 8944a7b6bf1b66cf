"""Issue 24's targets (the `peers` profile): serve-app against the dedicated batching servers
(mosec, LitServe, Infinity), the offline limit and a client storm, each with its figure and
verdict. Pure arithmetic over results.json, like stats.py."""

from __future__ import annotations

from typing import Optional

from bench.compare import stats

WORKLOAD = "embeddings"
#: (records per request, clients) of the lead target; at LEAD_MARGIN_AT clients the lead must be >= 10 %
LEAD_CELLS = ((1, 1), (1, 8), (1, 32), (1, 64), (16, 32))
LEAD_MARGIN_AT = (32, 64)
LEAD_MARGIN = 1.10
VS_OFFLINE_AT_64 = 0.75
P50_VS_BATCH_OF_1 = 1.5
STORM_GOODPUT = 0.8
STORM_503_P99_MS = 50.0
READY_S = 15.0
#: results["offline"] key suffix of the sweep on ONNX Runtime (the engine `make run` serves embeddings on)
ONNX_SUFFIX = "@onnx"


def _row(target: str, figure: Optional[float], met: Optional[bool], detail: str = "", versus_peers: bool = False) -> dict:
    """One target: `versus_peers` marks a lead over every peer (judged only where every peer was measured)."""
    return {"target": target, "figure": figure, "met": met, "detail": detail, "versus_peers": versus_peers}


def _verdict(figure: Optional[float], ok) -> Optional[bool]:
    return None if figure is None else bool(ok(figure))


def _judged(numerator: Optional[float], denominator: Optional[float], ok) -> tuple[Optional[float], Optional[bool]]:
    """(the ratio for display, rounded; the verdict on the unrounded quotient: 0.7496 rounds to 0.75 and is not met)."""
    return stats.ratio(numerator, denominator), _verdict(stats.quotient(numerator, denominator), ok)


def capacity_rps(cells: list[dict], contender: str) -> Optional[float]:
    """A contender's capacity in the run: its best closed-loop requests/s at 1 record per request."""
    best = stats.saturation(cells, contender, WORKLOAD, 1)
    return best and best["requests_per_s"]


def storm_cell(cells: list[dict], contender: str) -> Optional[dict]:
    return next((c for c in cells if c.get("mode") == "storm" and c["contender"] == contender
                 and c["workload"] == WORKLOAD), None)


def served_engine(results: dict, contender: str) -> str:
    """The embedding engine `contender` served on: from its /v1/models where it has one, else onnx for the
    contenders named `*_onnx` (bench/compare/contenders.py), else torch."""
    if contender.endswith("_onnx"):
        return "onnx"
    info = results.get("contender_info", {}).get(f"{contender}/{WORKLOAD}") or {}
    for model in info.get("data", []) if isinstance(info, dict) else []:
        if model.get("task") == "embeddings":
            return (model.get("details") or {}).get("engine", "torch")
    return "torch"


def offline_for(results: dict, contender: str) -> dict:
    """The offline sweep of the engine `contender` serves on (ONNX Runtime's where it has one)."""
    engine = served_engine(results, contender)
    if engine == "onnx" and f"{WORKLOAD}{ONNX_SUFFIX}" in results["offline"]:
        return results["offline"][f"{WORKLOAD}{ONNX_SUFFIX}"]
    return results["offline"].get(WORKLOAD, {})


def targets(results: dict, project: str, peers: list[str]) -> list[dict]:
    cells, offline = results["cells"], offline_for(results, project)
    engine = "onnx" if offline is results["offline"].get(f"{WORKLOAD}{ONNX_SUFFIX}") else "torch"
    out = []
    for records, clients in LEAD_CELLS:
        mine = stats.cell_at(cells, project, WORKLOAD, records, clients)
        theirs = {p: stats.cell_at(cells, p, WORKLOAD, records, clients) for p in peers}
        measured = {p: c["records_per_s"] for p, c in theirs.items() if c}
        best = max(measured, key=measured.get) if measured else None
        need = LEAD_MARGIN if clients in LEAD_MARGIN_AT else 1.0
        lead, met = _judged(mine and mine["records_per_s"], best and measured[best],
                            lambda x, need=need: x >= need if need > 1 else x > 1.0)
        out.append(_row(f"{clients} clients x {records} text: ahead of every peer"
                        + (f" by >= {LEAD_MARGIN - 1:.0%}" if need > 1 else "") + " (ratio to the best peer)",
                        lead, met,
                        f"best peer: {best}" if best else "no peer measured", versus_peers=True))
    at64 = stats.cell_at(cells, project, WORKLOAD, 1, 64)
    vs_off, met = _judged(at64 and at64["records_per_s"], offline.get("records_per_s"), lambda x: x >= VS_OFFLINE_AT_64)
    out.append(_row(f"64 clients x 1 text: served >= {VS_OFFLINE_AT_64} x the offline limit", vs_off, met,
                    f"offline ({engine}) {offline.get('records_per_s')} texts/s at batch {offline.get('best_batch')}"))
    one = stats.cell_at(cells, project, WORKLOAD, 1, 1)
    batch_1 = offline.get("batches", {}).get(1, offline.get("batches", {}).get("1", {})).get("batch_s")
    p50, met = _judged(one and one["p50_ms"], batch_1 and batch_1 * 1000, lambda x: x <= P50_VS_BATCH_OF_1)
    out.append(_row(f"1 client: p50 <= {P50_VS_BATCH_OF_1} x the offline batch-of-1 time", p50, met,
                    f"p50 {one and one['p50_ms']} ms, batch of 1 ({engine}) {batch_1 and round(batch_1 * 1000, 2)} ms"))
    storm, capacity = storm_cell(cells, project), capacity_rps(cells, project)
    goodput, met = _judged(storm and storm["goodput_rps"], capacity, lambda x: x >= STORM_GOODPUT)
    out.append(_row(f"storm: goodput >= {STORM_GOODPUT} x capacity", goodput, met,
                    f"{storm and storm['goodput_rps']} ok/s of {capacity} req/s" if storm else "no storm cell"))
    refused = (storm or {}).get("statuses", {}).get("503") or {}
    p99 = refused.get("p99_ms")
    out.append(_row(f"storm: 503s answered within {STORM_503_P99_MS:g} ms at p99", p99,
                    _verdict(p99, lambda x: x <= STORM_503_P99_MS),
                    f"{refused.get('count', 0)} 503s, {refused.get('timed', 0)} timed" if storm else "no storm cell"))
    ready = results.get("first_answer_s", {}).get(f"{project}/{WORKLOAD}")
    out.append(_row(f"ready (first answer) <= {READY_S:g} s after launch", ready, _verdict(ready, lambda x: x <= READY_S),
                    "from the launch of the server process"))
    return out


def storm_lines(results: dict) -> list[str]:
    """The storm cells: goodput against each contender's own capacity, answers by status."""
    cells, labels = results["cells"], results["labels"]
    rows = [c for c in cells if c.get("mode") == "storm"]
    if not rows:
        return []
    lines = ["", "## Client storm (clients ignoring Retry-After, 1 text per request)", "",
             "| contender | clients | ok/s | capacity req/s | x capacity | statuses (count: p50 / p99 ms) | socket errors |",
             "|---|---|---|---|---|---|---|"]
    for c in rows:
        capacity = capacity_rps(cells, c["contender"])
        statuses = "; ".join(f"{k}: {v['count']} ({v['p50_ms']} / {v['p99_ms']})" if v["timed"] else
                             f"{k}: {v['count']} (not timed: no X-Request-ID echo)" for k, v in c["statuses"].items())
        lines.append(f"| {labels.get(c['contender'], c['contender'])} | {c['concurrency']} | {c['goodput_rps']} | "
                     f"{capacity} | {stats.ratio(c['goodput_rps'], capacity)} | {statuses} | {c['socket_errors']} |")
    return lines
