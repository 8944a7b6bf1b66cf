"""The replicas-per-node plot of the ramp test (docs/deploy.md shows it)."""

from __future__ import annotations

import json
from pathlib import Path


def save_timeline(timeline: list[dict], nodes: list[str]) -> None:
    """The ramp's samples and their plot, beside reports/cluster/figures.json."""
    from .conftest import FIGURES

    FIGURES.parent.mkdir(parents=True, exist_ok=True)
    (FIGURES.parent / "scaling.json").write_text(json.dumps(timeline, indent=1))
    plot_replicas_per_node(timeline, nodes, FIGURES.parent / "scaling.png")


def plot_replicas_per_node(timeline: list[dict], nodes: list[str], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    deployments = sorted({d for sample in timeline for d in sample["replicas"]} - {"JobManager"})
    fig, axes = plt.subplots(len(deployments), 1, figsize=(8, 1.8 * len(deployments)), sharex=True)
    t = [s["t"] for s in timeline]
    for ax, name in zip(axes, deployments):
        ax.stackplot(t, *[[s["replicas"].get(name, {}).get(n, 0) for s in timeline] for n in nodes],
                     labels=nodes, step="post")
        ax.set_ylabel(name, rotation=0, ha="right")
        ax.yaxis.get_major_locator().set_params(integer=True)
    axes[0].legend(loc="upper left", fontsize="small", title="worker pod")
    ax2 = axes[-1].twinx()
    ax2.plot(t, [s["clients"] for s in timeline], color="black", linewidth=1)
    ax2.set_ylabel("clients")
    axes[-1].set_xlabel("seconds into the ramp")
    fig.suptitle("Replicas per worker pod under a ramp\n(local multi-node cluster from kuberay/rayservice-cpu.yaml)", fontsize="medium")
    fig.tight_layout()
    fig.savefig(out, dpi=90)
    plt.close(fig)
