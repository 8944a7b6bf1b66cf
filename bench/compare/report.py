"""Turn the results into the markdown table, the target verdicts and the PNG plots."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from bench.compare import peer_targets, stats

TARGET_CONCURRENCY = 64  # the embeddings target compares throughput at 64 clients
TRANSLATION_VS_OFFLINE = 0.8
TRANSLATION_VS_NAIVE = 5.0
P99_VS_BATCH_TIME = 2.0
#: how a target's `met` (True / False / None: no figure) reads in the report
VERDICTS = {True: "met", False: "**not met**", None: "not measured"}


def _fmt(value: Optional[float], digits: int = 1) -> str:
    return "n/a" if value is None else f"{value:,.{digits}f}"


def summary_rows(results: dict) -> list[dict]:
    """One row per (workload, records, contender): saturation, ratio to offline, open-loop latency."""
    rows = []
    cells = results["cells"]
    for workload in results["workloads"]:
        for records in results["records"]:
            for contender in results["contenders"]:
                offline = (peer_targets.offline_for(results, contender) if workload == peer_targets.WORKLOAD
                           else results["offline"].get(workload, {})).get("records_per_s")
                sat = stats.saturation(cells, contender, workload, records)
                at64 = stats.cell_at(cells, contender, workload, records, TARGET_CONCURRENCY)
                opened = stats.open_cell(cells, contender, workload, records)
                rows.append({
                    "workload": workload, "records": records, "contender": contender,
                    "saturation_records_per_s": sat and sat["records_per_s"],
                    "saturation_concurrency": sat and sat["concurrency"],
                    "records_per_s_at_64": at64 and at64["records_per_s"],
                    "ratio_to_offline": stats.ratio(sat and sat["records_per_s"], offline),
                    "open_rps": opened and opened["offered_rps"],
                    "open_p50_ms": opened and opened["p50_ms"], "open_p99_ms": opened and opened["p99_ms"],
                })
    return rows


#: serve-app's contenders (its modes), judged against the peers, never against each other
PROJECT = ("serve_app", "serve_app_python_proxy", "serve_app_placed", "serve_app_placed_waits", "serve_app_placed_one_pass",
           "serve_app_placed_onnx", "serve_app_placed_user_thread")


def targets(results: dict, project: str = "serve_app", naive: str = "naive") -> list[dict]:
    """The issue's targets for `project` (one of serve-app's modes), each with its figures and
    met / not met / not measured."""
    out = []
    cells, offline = results["cells"], results["offline"]
    wl = "translation-transformers"
    for records in results["records"]:
        sat = stats.saturation(cells, project, wl, records)
        nsat = stats.saturation(cells, naive, wl, records)
        served = sat and sat["records_per_s"]
        vs_off = stats.ratio(served, offline.get(wl, {}).get("records_per_s"))
        vs_naive = stats.ratio(served, nsat and nsat["records_per_s"])
        out.append({"target": f"{wl}, {records} rec/req: served >= {TRANSLATION_VS_OFFLINE} x offline",
                    "figure": vs_off, "met": None if vs_off is None else vs_off >= TRANSLATION_VS_OFFLINE})
        out.append({"target": f"{wl}, {records} rec/req: served >= {TRANSLATION_VS_NAIVE:g} x naive",
                    "figure": vs_naive, "met": None if vs_naive is None else vs_naive >= TRANSLATION_VS_NAIVE})
    wl = "embeddings"
    batch_s = offline.get(wl, {}).get("full_batch_s")
    for records in results["records"]:
        mine = stats.cell_at(cells, project, wl, records, TARGET_CONCURRENCY)
        peers = [stats.cell_at(cells, c, wl, records, TARGET_CONCURRENCY) for c in results["contenders"]
                 if c not in PROJECT]
        best_peer = max((p["records_per_s"] for p in peers if p), default=None)
        lead = stats.ratio(mine and mine["records_per_s"], best_peer)
        out.append({"target": f"{wl}, {records} rec/req: ahead of every peer at {TARGET_CONCURRENCY} clients "
                              "(ratio to the best peer)",
                    "figure": lead, "met": None if lead is None else lead > 1.0})
        opened = stats.open_cell(cells, project, wl, records)
        p99 = opened and opened["p99_ms"]
        limit = None if batch_s is None else P99_VS_BATCH_TIME * batch_s * 1000
        ratio = stats.ratio(p99, batch_s and batch_s * 1000)
        out.append({"target": f"{wl}, {records} rec/req: p99 at 50% load <= {P99_VS_BATCH_TIME:g} x one full "
                              f"batch's model time ({_fmt(limit)} ms)",
                    "figure": ratio, "met": None if ratio is None else ratio <= P99_VS_BATCH_TIME})
    return out


def markdown(results: dict) -> str:
    labels = results["labels"]
    lines = [f"# Benchmark results ({results['profile']} profile)", "",
             f"Run {results['started_at']} on {results['machine']}.", "",
             f"Source: {results.get('revision', 'unknown')}. Method and caveats: "
             f"[README.md]({'../' if results.get('round') else ''}README.md).", "",
             "## Targets", ""]
    for project in [p for p in PROJECT if p in results["contenders"]] or ["serve_app"]:
        lines += [f"{labels.get(project, project)}:", "", "| target | figure | verdict |", "|---|---|---|"]
        for t in targets(results, project):
            verdict = VERDICTS[t["met"]]
            lines.append(f"| {t['target']} | {_fmt(t['figure'], 2)} | {verdict} |")
        lines.append("")
    lines.pop()
    if results["profile"] == "peers":
        lines += peer_target_lines(results)
    lines += ["", "## Offline limit (the model alone, best batch)", "",
              "| workload | best batch | records/s | one full batch (s) |", "|---|---|---|---|"]
    for workload, off in results["offline"].items():
        lines.append(f"| {workload} | {off.get('best_batch', 'n/a')} | {_fmt(off.get('records_per_s'))} | "
                     f"{_fmt(off.get('full_batch_s'), 3)} |")
    lines += ["", "## Saturation, ratio to offline, latency at 50% load", "",
              "| workload | rec/req | contender | saturation rec/s (at clients) | rec/s at 64 clients | "
              "x offline | 50% load req/s | p50 ms | p99 ms |", "|---|---|---|---|---|---|---|---|---|"]
    for r in summary_rows(results):
        lines.append(
            f"| {r['workload']} | {r['records']} | {labels.get(r['contender'], r['contender'])} | "
            f"{_fmt(r['saturation_records_per_s'])} ({r['saturation_concurrency'] or 'n/a'}) | "
            f"{_fmt(r['records_per_s_at_64'])} | {_fmt(r['ratio_to_offline'], 2)} | {_fmt(r['open_rps'])} | "
            f"{_fmt(r['open_p50_ms'])} | {_fmt(r['open_p99_ms'])} |")
    lines += startup_memory_lines(results)
    lines += memory_by_kind_lines(results)
    lines += peer_targets.storm_lines(results)
    lines += ["", "## Every closed-loop cell", "",
              "| workload | rec/req | contender | clients | rec/s | req/s | p50 ms | p99 ms | errors |",
              "|---|---|---|---|---|---|---|---|---|"]
    for c in results["cells"]:
        if c["mode"] == "closed":
            lines.append(f"| {c['workload']} | {c['records']} | {labels.get(c['contender'], c['contender'])} | "
                         f"{c['concurrency']} | {_fmt(c['records_per_s'])} | {_fmt(c['requests_per_s'])} | "
                         f"{_fmt(c['p50_ms'])} | {_fmt(c['p99_ms'])} | {c['errors']} |")
    if results.get("failures"):
        lines += ["", "## Contenders that did not run (exact errors)", ""]
        for f in results["failures"]:
            lines.append(f"- **{f['contender']}** / {f['workload']}: `{f['error']}`")
    return "\n".join(lines) + "\n"


def peer_target_lines(results: dict) -> list[str]:
    """Issue 24's targets (bench/compare/peer_targets.py) for each serve-app mode in the run."""
    labels, lines = results["labels"], []
    peers = [c for c in results["contenders"] if c not in PROJECT]
    for project in [p for p in PROJECT if p in results["contenders"]]:
        lines += ["", f"### Issue 24's targets: {labels.get(project, project)} against {', '.join(peers) or 'no peer'}",
                  "", "| target | figure | verdict | detail |", "|---|---|---|---|"]
        for t in peer_targets.targets(results, project, peers):
            verdict = VERDICTS[t["met"]]
            lines.append(f"| {t['target']} | {_fmt(t['figure'], 2)} | {verdict} | {t['detail']} |")
    return lines


def startup_memory_lines(results: dict) -> list[str]:
    """Start-up (ready route, first answered request) and memory (PSS and RSS of the server's whole
    process tree, after its first answer and after its last cell) per contender and workload."""
    labels, first = results["labels"], results.get("first_answer_s", {})
    if not first:
        return []
    lines = ["", "## Start-up and memory", "",
             "From the launch: seconds until the readiness route answers 200 and until the first request is "
             "answered. Memory: the sum over the server's process tree (and the processes it detached) of PSS "
             "(shared pages divided among the processes that map them) and of RSS (which counts them once per "
             "process), after the first answer and after the last cell.", "",
             "| workload | contender | ready s | first answer s | PSS MiB (first answer) | PSS MiB (after load) | "
             "RSS MiB (after load) | processes |", "|---|---|---|---|---|---|---|---|"]
    for key, seconds in first.items():
        name, workload = key.split("/", 1)
        mem = results.get("memory", {}).get(key, {})
        idle, loaded = mem.get("after_first_answer", {}), mem.get("after_load", {})
        lines.append(f"| {workload} | {labels.get(name, name)} | {_fmt(results['startup_s'].get(key))} | "
                     f"{_fmt(seconds)} | {_fmt(idle.get('pss_mib'), 0)} | {_fmt(loaded.get('pss_mib'), 0)} | "
                     f"{_fmt(loaded.get('rss_mib'), 0)} | {loaded.get('processes', idle.get('processes', 'n/a'))} |")
    return lines


#: trees of more processes than this get a per-process breakdown (a peer's front and worker need none)
BREAKDOWN_ABOVE_PROCESSES = 6
#: kinds below this PSS (at both readings) are summed into one "others" row
BREAKDOWN_MIN_MIB = 20.0


def memory_by_kind_lines(results: dict) -> list[str]:
    """Where a server of many processes (Ray's) keeps its memory: PSS per kind of process (procs.process_kind)
    after the first answer and after the last cell, largest first; a kind that appears only under load (an
    autoscaled replica) shows there."""
    lines = []
    for key, mem in results.get("memory", {}).items():
        idle, loaded = mem.get("after_first_answer", {}), mem.get("after_load", {})
        if max(idle.get("processes", 0), loaded.get("processes", 0)) <= BREAKDOWN_ABOVE_PROCESSES:
            continue
        if not lines:
            lines = ["", "## Memory by process", "",
                     "PSS MiB per kind of process (a Ray worker by its title), after the first answer and after the "
                     f"last cell, for the servers of more than {BREAKDOWN_ABOVE_PROCESSES} processes; kinds under "
                     f"{BREAKDOWN_MIN_MIB:g} MiB are summed as \"others\".", "",
                     "| workload | contender | process | count (first answer / after load) | PSS MiB (first answer) | "
                     "PSS MiB (after load) |", "|---|---|---|---|---|---|"]
        name, workload = key.split("/", 1)
        label = results["labels"].get(name, name)
        kinds = {"first": idle.get("by_kind", {}), "loaded": loaded.get("by_kind", {})}
        rows, others = [], {"first": [0, 0.0], "loaded": [0, 0.0]}
        for kind in dict.fromkeys([*kinds["loaded"], *kinds["first"]]):
            got = {when: kinds[when].get(kind, {"processes": 0, "pss_mib": 0.0}) for when in kinds}
            if max(g["pss_mib"] for g in got.values()) < BREAKDOWN_MIN_MIB:
                for when, g in got.items():
                    others[when] = [others[when][0] + g["processes"], others[when][1] + g["pss_mib"]]
                continue
            rows.append((kind, [(g["processes"], g["pss_mib"]) for g in got.values()]))
        if others["first"][0] or others["loaded"][0]:
            rows.append(("others", [tuple(others["first"]), tuple(others["loaded"])]))
        for kind, ((n_first, first), (n_loaded, after)) in rows:
            lines.append(f"| {workload} | {label} | {kind} | {n_first} / {n_loaded} | {_fmt(first, 0)} | "
                         f"{_fmt(after, 0)} |")
    return lines


def plots(results: dict, out_dir: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels, cells = results["labels"], results["cells"]
    panels = [(w, r) for w in results["workloads"] for r in results["records"]]
    written = []

    fig, axes = plt.subplots(len(results["workloads"]), len(results["records"]), squeeze=False,
                             figsize=(6 * len(results["records"]), 4 * len(results["workloads"])))
    for ax, (workload, records) in zip(axes.flat, panels):
        for contender in results["contenders"]:
            pts = sorted((c["concurrency"], c["records_per_s"])
                         for c in stats.closed_cells(cells, contender, workload, records))
            if pts:
                ax.plot(*zip(*pts), marker="o", label=labels.get(contender, contender))
        off = results["offline"].get(workload, {}).get("records_per_s")
        if off:
            ax.axhline(off, color="black", linestyle="--", label="offline limit")
        ax.set_xscale("log", base=2)
        ax.set_title(f"{workload}, {records} rec/request")
        ax.set_xlabel("concurrent clients (closed loop)")
        ax.set_ylabel("records/s")
        ax.legend(fontsize=7)
    fig.tight_layout()
    written.append(out_dir / "throughput_vs_concurrency.png")
    fig.savefig(written[-1], dpi=110)
    plt.close(fig)

    for name, key, ylabel in (("latency_at_half_load.png", ("p50_ms", "p95_ms", "p99_ms"), "latency (ms, log)"),
                              ("ratio_to_offline.png", None, "saturation / offline limit")):
        fig, axes = plt.subplots(1, len(panels), squeeze=False, figsize=(3.2 * len(panels), 4))
        for ax, (workload, records) in zip(axes.flat, panels):
            names = [labels.get(c, c) for c in results["contenders"]]
            xs = range(len(names))
            if key:
                for j, q in enumerate(key):
                    vals = [(stats.open_cell(cells, c, workload, records) or {}).get(q) or 0
                            for c in results["contenders"]]
                    ax.bar([x + (j - 1) * 0.27 for x in xs], vals, width=0.27, label=q.split("_")[0])
                ax.set_yscale("log")
            else:
                off = results["offline"].get(workload, {}).get("records_per_s")
                vals = [stats.ratio((stats.saturation(cells, c, workload, records) or {}).get("records_per_s"),
                                    off) or 0 for c in results["contenders"]]
                ax.bar(list(xs), vals)
                ax.axhline(1.0, color="black", linestyle="--")
            ax.set_xticks(list(xs), names, rotation=60, ha="right", fontsize=7)
            ax.set_title(f"{workload}\n{records} rec/req", fontsize=8)
        axes.flat[0].set_ylabel(ylabel)
        if key:
            axes.flat[0].legend(fontsize=7)
        fig.tight_layout()
        written.append(out_dir / name)
        fig.savefig(written[-1], dpi=110)
        plt.close(fig)
    return written
