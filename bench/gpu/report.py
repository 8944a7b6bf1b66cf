"""results.md (tables of every phase) and results.png (three panels) from bench.gpu's results.json.

`python -m bench.gpu --plot DIR/results.json` redraws the PNG (and the Markdown) from the JSON alone, on
a machine with matplotlib, when the measuring one had none.
"""

from __future__ import annotations

import json
from pathlib import Path

from bench.gpu.common import say


def _row(*cells) -> str:
    return "| " + " | ".join(str(c) for c in cells) + " |"


def _offline(res: dict) -> list[str]:
    off = res.get("phases", {}).get("offline", {}).get("result") or {}
    if not off.get("rows"):
        return ["No offline figures (see the phase's status)."]
    lines = [f"TransformersBackend on {off.get('gpu', off.get('device'))}, {off.get('dtype')}, "
             f"{off.get('decode_tokens')} tokens per record (min = max), one model thread; "
             f"load + warm-up {off.get('load_s')} s.", "",
             _row("batch", "records/s", "ms per batch (p50)", "tokens/s", "repeats"), _row(*["---"] * 5)]
    for r in off["rows"]:
        lines.append(_row(r["batch"], r["records_per_s"], round(r["batch_s_p50"] * 1000, 1), r["tokens_per_s"],
                          r["repeats"]))
    limit = off.get("offline_limit") or {}
    lines += ["", f"Offline limit: **{limit.get('records_per_s')} records/s** (batch {limit.get('batch')})."]
    return lines


def _serve(res: dict, name: str) -> list[str]:
    phase = res.get("phases", {}).get(name, {})
    srv = phase.get("result") or {}
    if not srv:
        return [f"Not run ({phase.get('status', 'skipped')})."]
    card = srv.get("v1_models") or {}
    gpu = srv.get("gpu_processes") or {}
    procs = ", ".join(f"pid {p['pid']} {p['used_memory']}{' (ours)' if p.get('ours') else ''}"
                      for p in gpu.get("processes", [])) or "n/a"
    dep = srv.get("translator_deployment", {})
    scaling = dep.get("autoscaling_config", {})
    lines = [f"Ready (/readyz 200) after {srv.get('ready_s')} s; Translator replicas RUNNING: "
             f"**{srv.get('translator_running')}** (autoscaling {scaling.get('min_replicas')}-"
             f"{scaling.get('max_replicas')}, num_gpus "
             f"{dep.get('ray_actor_options', {}).get('num_gpus')}); Ray's GPUs: {srv.get('ray_gpus')}; "
             f"GPU compute processes (nvidia-smi): **{gpu.get('count', 'n/a')}** ({procs}); /v1/models: device "
             f"**{card.get('device')}**, dtype **{card.get('dtype')}**, scheduling {card.get('scheduling')}; "
             f"config problems: {srv.get('config_problems') or 'none'}; stopped in {srv.get('stop_s')} s, "
             f"{srv.get('left_running')} processes left.", ""]
    if srv.get("checks"):
        lines += ["Checks: " + ", ".join(f"{k} **{'yes' if v else 'NO' if v is False else 'n/a'}**"
                                        for k, v in srv["checks"].items()), ""]
    if srv.get("error"):
        lines += [f"Error: `{srv['error'][:800]}`", ""]
    cells = [c for c in srv.get("cells", []) if "records_per_s" in c]
    if cells:
        lines += [_row("clients x records", "records/s", "requests/s", "p50 ms", "p99 ms", "statuses",
                       "mean model batch", "GPU util %", "x offline limit"), _row(*["---"] * 9)]
        for c in cells:
            lines.append(_row(f"{c['clients']} x {c['records_per_request']}", c["records_per_s"], c["requests_per_s"],
                              c["p50_ms"], c["p99_ms"], ", ".join(f"{k}: {v}" for k, v in c["statuses"].items()),
                              c["mean_batch_records"], c.get("gpu_util_mean_pct", "n/a"),
                              c.get("of_offline_limit", "n/a")))
    return lines


def _continuous(res: dict) -> list[str]:
    cont = res.get("phases", {}).get("continuous", {}).get("result") or {}
    if "length_mix" not in cont:
        return ["No continuous-batching figures (see the phase's status)."]
    lines = [f"{cont.get('model')} on {cont.get('device')} ({cont.get('dtype')}), {cont.get('through')}; batch "
             f"{cont.get('batch')} (max_batch_size = max_running_sequences), {cont.get('clients')} clients at "
             f"saturation. Length mix: {cont.get('length_mix_shape')}.", ""]
    for key, title in (("length_mix", "length mix"), ("fixed", "fixed length")):
        cells = cont.get(key, {}).get("contenders", {})
        labels = [label for label in cells if label != "static"] or ["continuous"]
        s, others = cells.get("static", {}), [cells.get(label, {}) for label in labels]
        lines += [_row(title, "static", *labels), _row(*["---"] * (2 + len(labels)))]

        def sat(e):
            x = e.get("saturation")
            return f"{x['records_per_s']} (p50 {x['p50_s']} s, p99 {x['p99_s']} s)" if x else "-"

        def half(e, k="half"):
            x = e.get(k)
            if not x:
                return "-"
            solo = f", p50/solo {x['p50_latency_over_solo']}" if "p50_latency_over_solo" in x else ""
            return f"{x['offered_per_s']} req/s: p50 {x['p50_s']} s, p99 {x['p99_s']} s{solo}"
        lines += [_row("saturation, records/s", sat(s), *map(sat, others)),
                  _row("at its own half saturation", half(s), *map(half, others)),
                  _row("at static's half rate", half(s), *(half(c, "at_static_half") for c in others)), ""]
    lines += [f"Continuous / static: `{json.dumps(cont.get('summary', {}))}`"]
    return lines


def markdown(res: dict) -> str:
    m = res.get("machine", {})
    lines = ["# serve-app on one GPU: Serve vs offline, static vs continuous batching", "",
             f"Run {res.get('started')} on {m.get('gpu') or m.get('device')} ({m.get('cpus')} CPUs), torch "
             f"{m.get('torch')}, transformers {m.get('transformers')}, ray {m.get('ray')}, Python {m.get('python')}; "
             f"mode {res.get('mode')}; wall {res.get('wall_s')} s. Written by `python -m bench.gpu` (bench/gpu/).", "",
             _row("phase", "status", "seconds"), _row("---", "---", "---")]
    for name, phase in res.get("phases", {}).items():
        lines.append(_row(name, phase.get("status"), phase.get("seconds")))
    lines += ["", "## Offline limit", "", *_offline(res), "",
              "## Serve, GPU profile, static batching (2 Translator replicas x num_gpus 0.5)", "",
              *_serve(res, "serve-static"), "",
              "## Static vs continuous batching, in-process", "", *_continuous(res), "",
              "## Serve, GPU profile, `scheduling: continuous`", "", *_serve(res, "serve-continuous"), ""]
    errors = [(n, p["error"]) for n, p in res.get("phases", {}).items() if p.get("error")]
    if errors:
        lines += ["## Errors", ""] + [f"* {n}: `{e[-600:]}`" for n, e in errors] + [""]
    return "\n".join(lines)


def _legend(ax) -> None:
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7)


def plot(res: dict, png: Path) -> bool:
    try:
        import matplotlib
    except ImportError:
        say("no matplotlib here: run `python -m bench.gpu --plot results.json` where it is installed")
        return False
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    phases = res.get("phases", {})
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.6))
    off = (phases.get("offline", {}).get("result") or {}).get("rows", [])
    ax = axes[0]
    if off:
        ax.plot([r["batch"] for r in off], [r["records_per_s"] for r in off], "o-", color="#4c72b0", label="offline")
    for name, color in (("serve-static", "#c44e52"), ("serve-continuous", "#55a868")):
        cells = [c for c in (phases.get(name, {}).get("result") or {}).get("cells", []) if "records_per_s" in c]
        if cells:
            best = max(cells, key=lambda c: c["records_per_s"])
            ax.axhline(best["records_per_s"], color=color, ls="--",
                       label=f"{name} best ({best['clients']}x{best['records_per_request']})")
    ax.set_xscale("log", base=2)
    ax.set(xlabel="offline batch size", ylabel="records/s", title="offline limit vs Serve (2 replicas, 1 GPU)")
    _legend(ax)
    ax = axes[1]
    width, labels = 0.4, []
    for i, (name, color) in enumerate((("serve-static", "#c44e52"), ("serve-continuous", "#55a868"))):
        cells = [c for c in (phases.get(name, {}).get("result") or {}).get("cells", []) if "records_per_s" in c]
        labels = labels or [f"{c['clients']}x{c['records_per_request']}" for c in cells]
        ax.bar([j + (i - 0.5) * width for j in range(len(cells))], [c["records_per_s"] for c in cells], width,
               color=color, label=name)
        for j, c in enumerate(cells):
            ax.annotate(f"p99 {c['p99_ms'] / 1000:.2f}s", (j + (i - 0.5) * width, c["records_per_s"]), fontsize=6,
                        ha="center", va="bottom")
    ax.set_xticks(range(len(labels)), labels)
    ax.set(xlabel="clients x records per request", ylabel="records/s", title="Serve over HTTP")
    _legend(ax)
    ax = axes[2]
    cont = (phases.get("continuous", {}).get("result") or {}).get("length_mix", {}).get("contenders", {})
    colors = ["#c44e52", "#4c72b0", "#55a868", "#8172b2"]
    for label, color in zip(cont, colors):
        entry = cont.get(label, {})
        points = [entry[k] for k in ("half", "at_static_half") if k in entry]
        points = sorted(points, key=lambda c: c["offered_per_s"])
        if points:
            ax.plot([c["offered_per_s"] for c in points], [c["p50_s"] for c in points], "o-", color=color,
                    label=f"{label} p50")
            ax.plot([c["offered_per_s"] for c in points], [c["p99_s"] for c in points], "s--", color=color,
                    alpha=0.6, label=f"{label} p99")
        if "saturation" in entry:
            ax.axvline(entry["saturation"]["records_per_s"], color=color, ls=":", lw=1)
    ax.set(xlabel="offered requests/s (dotted: saturation)", ylabel="latency, s",
           title="length mix, in-process: static vs continuous")
    _legend(ax)
    m = res.get("machine", {})
    model = "tiny M2M100 fixture, CPU" if res.get("mode") == "tiny" else "M2M100-418M-sized random model, fp16"
    fig.suptitle(f"serve-app, {model}, {m.get('gpu') or m.get('device')}", fontsize=10)
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)
    say(f"wrote {png}")
    return True


def write(out: Path, res: dict, with_plot: bool = False) -> None:
    from bench.gpu.common import write_json

    write_json(out / "results.json", res)
    (out / "results.md").write_text(markdown(res))
    if with_plot:
        plot(res, out / "results.png")


def plot_engines(report: dict, path: Path) -> None:
    """bench.gpu.engines' engines.png: p50 and p99 latency against offered load, one line per engine, the
    length mix."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), sharex=True)
    for name, cell in report["length_mix"]["cells"].items():
        points = sorted((c["offered_per_s"], c["p50_s"], c["p99_s"]) for k, c in cell.items() if k.startswith("load_"))
        for axis, index, label in ((axes[0], 1, "p50"), (axes[1], 2, "p99")):
            axis.plot([p[0] for p in points], [p[index] for p in points], marker="o", label=name)
            axis.set_title(f"{label} latency, length mix ({report['device']}, {report['model']})", fontsize=9)
    for axis in axes:
        axis.set_xlabel("offered requests/s (0.25, 0.5, 0.8 x each engine's saturation)")
        axis.set_ylabel("seconds")
        axis.set_yscale("log")
        axis.grid(alpha=0.3)
        axis.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
