"""Memory and start time of 1 -> N Translator replicas, each with its own weights vs shared weights.

    flock /tmp/serve-app-cpu.lock .venv/bin/python -m bench.shared_weights [--replicas 3] [--json out.json]

For each mode (``share_weights`` off, then on) a local Ray cluster is started and
replicas are added one at a time as Ray actors with a fractional ``num_cpus``; each
builds its backend exactly as the Translator deployment does
(``load_translation_backend``) on the Marian-sized random model of
``bench.ctranslate2_compare`` (~74M parameters, ~296 MB in float32) and warms up.

Per replica: start time (actor created -> ready, and the backend's load alone) and
PSS from ``/proc/<pid>/smaps_rollup``. PSS charges each shared page to the
processes that map it in equal parts, so the sum over the replicas, the raylet
(which maps the object store) and the weights holder is the node's real memory
for the model; its growth per extra replica is the figure to compare. The
replicas' outputs are checked equal across modes.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import ray

from bench.ctranslate2_compare import _texts, build_marian_sized

#: per-replica CPU share, so that several replicas fit on a 2-core machine
REPLICA_NUM_CPUS = 0.5


def pss_mb(pid: int) -> float:
    """Proportional set size of ``pid`` in MB (shared pages split among the processes mapping them)."""
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            if line.startswith("Pss:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"no Pss line for pid {pid}")


@ray.remote(num_cpus=REPLICA_NUM_CPUS)
class Replica:
    def __init__(self, settings: dict):
        from deployments.backends import load_translation_backend
        from serve_app.settings import TranslationSettings

        start = time.perf_counter()
        self.backend = load_translation_backend(TranslationSettings(**settings), 1)
        self.backend.warm_up()
        self.load_s = time.perf_counter() - start

    def facts(self) -> dict:
        return {"pid": os.getpid(), "load_s": self.load_s}

    def translate(self, texts: list[str]) -> list[list[int]]:
        return self.backend.generate_ids(texts, "en", "de")


def _children(parent: int) -> list[tuple[int, bytes]]:
    """(pid, command line) of the processes whose parent is ``parent``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            status = (entry / "status").read_text()
            ppid = int(next(line.split()[1] for line in status.splitlines() if line.startswith("PPid:")))
            if ppid == parent:
                found.append((int(entry.name), (entry / "cmdline").read_bytes()))
        except (OSError, StopIteration, ValueError):
            continue
    return found


def _find_raylet() -> int:
    """The raylet that this driver's ``ray.init`` started (its child; it holds the object store)."""
    for pid, cmd in _children(os.getpid()):
        if cmd.split(b"\0")[0].endswith(b"/raylet"):
            return pid
    raise RuntimeError("the raylet of this cluster was not found")


def _holder_pids(raylet: int) -> list[int]:
    """Workers of our raylet that run a WeightsHolder actor."""
    return [pid for pid, cmd in _children(raylet) if cmd.startswith(b"ray::WeightsHolder")]


def run_mode(share: bool, model: str, replicas: int, tokens: int) -> dict:
    settings = dict(backend="transformers", model=model, device="cpu", share_weights=share,
                    max_new_tokens=tokens, min_new_tokens=tokens, local_files_only=True)
    ray.init(num_cpus=2, include_dashboard=False, object_store_memory=1 << 30, log_to_driver=False,
             namespace="bench-shared-weights")
    try:
        raylet = _find_raylet()
        base_raylet = pss_mb(raylet)
        actors, steps = [], []
        for n in range(1, replicas + 1):
            start = time.perf_counter()
            actor = Replica.remote(settings)
            facts = ray.get(actor.facts.remote())
            start_s = time.perf_counter() - start
            actors.append((actor, facts))
            replica_pss = [pss_mb(f["pid"]) for _, f in actors]
            holders = _holder_pids(raylet)
            holder_pss = sum(pss_mb(p) for p in holders)
            raylet_pss = pss_mb(raylet)
            steps.append({
                "replicas": n, "start_s": start_s, "load_s": facts["load_s"], "replica_pss_mb": replica_pss,
                "raylet_pss_growth_mb": raylet_pss - base_raylet, "holder_pss_mb": holder_pss,
                "total_mb": sum(replica_pss) + (raylet_pss - base_raylet) + holder_pss,
            })
            print(f"share_weights={share} replicas={n}: start {start_s:.1f} s, PSS {replica_pss}", file=sys.stderr)
        outputs = [ray.get(a.translate.remote(_texts()[:8])) for a, _ in actors]
        return {"steps": steps, "outputs": outputs}
    finally:
        ray.shutdown()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", help="model folder (default: build the Marian-sized random one)")
    parser.add_argument("--replicas", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=8, help="tokens decoded in the output check")
    parser.add_argument("--json", help="write the figures here too")
    args = parser.parse_args(argv)
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    model = args.model or str(build_marian_sized(Path(tempfile.mkdtemp(prefix="shared-weights-")) / "model"))

    modes = {"own copy": run_mode(False, model, args.replicas, args.tokens),
             "shared": run_mode(True, model, args.replicas, args.tokens)}
    same = all(o == modes["own copy"]["outputs"][0] for m in modes.values() for o in m["outputs"])
    lines = ["| weights | replicas | start s (actor -> ready) | backend load s | PSS per replica MB "
             "| object store (raylet PSS growth) MB | holder MB | node total MB | added by this replica MB |",
             "|---|---|---|---|---|---|---|---|---|"]
    for name, mode in modes.items():
        previous = 0.0
        for step in mode["steps"]:
            lines.append(
                f"| {name} | {step['replicas']} | {step['start_s']:.1f} | {step['load_s']:.1f} "
                f"| {' / '.join(f'{p:.0f}' for p in step['replica_pss_mb'])} | {step['raylet_pss_growth_mb']:.0f} "
                f"| {step['holder_pss_mb']:.0f} | {step['total_mb']:.0f} | {step['total_mb'] - previous:.0f} |")
            previous = step["total_mb"]
    own, shared = (modes[m]["steps"] for m in ("own copy", "shared"))
    n = len(own)
    if n > 1:
        per_extra_own = (own[-1]["total_mb"] - own[0]["total_mb"]) / (n - 1)
        per_extra_shared = (shared[-1]["total_mb"] - shared[0]["total_mb"]) / (n - 1)
        lines += ["", f"memory per extra replica: own copy {per_extra_own:.0f} MB, shared {per_extra_shared:.0f} MB "
                  f"({per_extra_shared / per_extra_own:.2f}x); mean start of extra replicas: own copy "
                  f"{sum(s['start_s'] for s in own[1:]) / (n - 1):.1f} s, shared "
                  f"{sum(s['start_s'] for s in shared[1:]) / (n - 1):.1f} s"]
    lines.append(f"outputs identical across modes and replicas: {same}")
    print("\n".join(lines))
    if args.json:
        for mode in modes.values():
            mode.pop("outputs")
        Path(args.json).write_text(json.dumps({"modes": modes, "outputs_identical": same}, indent=1))
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
