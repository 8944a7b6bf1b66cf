"""Where a decoding step's time goes: the continuous decoder's step and static `generate`'s step on batches
shaped like the length mix against batches of one shape (issue 25's open question: ~50 ms steps on the
length mix against ~8 ms on the fixed workload, on an H100).

    python -m bench.gpu.step_probe --out DIR                 # on a GPU: the M2M100-418M-sized model, float16
    python -m bench.gpu.step_probe --out DIR --device cpu --tiny   # the same flow on the tiny model

Each scenario builds a running batch (no row finishes while it is timed), takes a few warm-up steps, then
times steps with the device synchronised around them and once more under torch.profiler: wall ms per
step, the device's kernel time per step, and the top operators by device and by CPU time. Scenarios
separate what differs between the two workloads: source padding (cross-attention mask), different ages
(self-attention padding), length alone. DIR/step_probe.json holds every figure; stdout the tables.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from pathlib import Path

import torch

from bench.gpu.common import TARGET, say

SCENARIOS = {  # name: (rows, source tokens (None: the length mix), age spread in steps)
    "fixed-64": (64, 16, 0),
    "long-uniform-32": (32, 100, 0),
    "mixed-sources-32": (32, None, 0),
    "staggered-ages-32": (32, 16, 60),
    "length-mix-32": (32, None, 60),
}


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def source_lengths(rows: int, fixed, seed: int) -> list[int]:
    if fixed is not None:
        return [fixed] * rows
    from tests.fixtures.sentences import sample_lengths
    return [min(145, max(3, round(1.6 * n))) for n in sample_lengths(rows, seed)]  # ~the mix's token counts


def build_batch(backend, rows: int, fixed, spread: int, seed: int):
    """A decoder holding `rows` rows, joined in 8 groups `spread` / 8 steps apart (their ages differ)."""
    decoder = backend.continuous_decoder()
    rng = random.Random(seed)
    bos = backend.forced_bos_token_id(TARGET)
    from deployments.backends.continuous_decoder import DecodeRequest

    lengths = source_lengths(rows, fixed, seed)
    top = min(20000, backend.model.config.vocab_size - 8)
    requests = [DecodeRequest([rng.randint(4, top) for _ in range(n - 1)] + [2], 1000, 1000, bos)
                for n in lengths]
    groups = 8 if spread else 1
    for g in range(groups):
        decoder.join(requests[g::groups])
        for _ in range(spread // groups):
            decoder.step()
    return decoder


def profile(fn, steps: int, device: str) -> dict:
    from torch.profiler import ProfilerActivity, profile as torch_profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.startswith("cuda") else [])
    with torch_profile(activities=activities) as prof:
        for _ in range(steps):
            fn()
        sync(device)
    events = prof.key_averages()
    dev_attr = "self_device_time_total" if hasattr(events[0], "self_device_time_total") else "self_cuda_time_total"
    device_us = sum(getattr(e, dev_attr, 0) for e in events)
    top = lambda key: [{"op": e.key, "calls": e.count, "ms_per_step": round(getattr(e, key) / 1e3 / steps, 3)}  # noqa: E731
                       for e in sorted(events, key=lambda e: getattr(e, key), reverse=True)[:12]]
    return {"device_ms_per_step": round(device_us / 1e3 / steps, 3), "top_device": top(dev_attr),
            "top_cpu": top("self_cpu_time_total")}


def timed(fn, steps: int, device: str) -> dict:
    for _ in range(3):
        fn()
    sync(device)
    times = []
    for _ in range(steps):
        began = time.perf_counter()
        fn()
        sync(device)
        times.append((time.perf_counter() - began) * 1e3)
    return {"wall_ms_p50": round(statistics.median(times), 3), "wall_ms_min": round(min(times), 3)}


def continuous_cell(backend, name: str, steps: int, device: str, seed: int) -> dict:
    rows, fixed, spread = SCENARIOS[name]
    decoder = build_batch(backend, rows, fixed, spread, seed)
    step = lambda: decoder.step(compact=False)  # noqa: E731 - nobody finishes: max_new_tokens 1000
    cell = timed(step, steps, device)
    cell.update(rows=decoder.running, self_columns=decoder._self_columns(),
                source_columns=int(decoder._enc_mask.shape[1]))
    cell.update(profile(step, max(3, steps // 4), device))
    return cell


def static_cell(backend, fixed, rows: int, new_tokens: int, device: str, seed: int) -> dict:
    """generate on one padded batch: ms per decoded token (encoder included, it is one pass)."""
    rng = random.Random(seed)
    top = min(20000, backend.model.config.vocab_size - 8)
    rows_ids = [[rng.randint(4, top) for _ in range(n - 1)] + [2] for n in source_lengths(rows, fixed, seed)]
    ids, mask = (t.to(device) for t in backend._pad(rows_ids))
    kwargs = {"max_new_tokens": new_tokens, "min_new_tokens": new_tokens, "do_sample": False, "num_beams": 1,
              "forced_bos_token_id": backend.forced_bos_token_id(TARGET)}

    def run():
        with torch.inference_mode():
            backend.model.generate(input_ids=ids, attention_mask=mask, **kwargs)
    cell = timed(run, 3, device)
    cell = {"rows": rows, "source_columns": int(ids.shape[1]),
            "ms_per_token": round(cell["wall_ms_p50"] / new_tokens, 3), **cell}
    cell.update({k: v for k, v in profile(run, 1, device).items()})
    cell["device_ms_per_token"] = round(cell.pop("device_ms_per_step") / new_tokens, 3)
    return cell


def run_probe(model_dir: str, device: str, steps: int, out: Path, attn: tuple[str, ...]) -> dict:
    from bench.gpu.continuous import make_backend

    backend = make_backend(model_dir, device)
    backend.model.generation_config.max_length = None
    result: dict = {"device": torch.cuda.get_device_name() if device.startswith("cuda") else "cpu",
                    "torch": torch.__version__, "model": model_dir, "cells": {}}
    import transformers
    result["transformers"] = transformers.__version__
    for implementation in attn:
        try:
            backend.model.set_attn_implementation(implementation)
        except Exception as exc:  # noqa: BLE001 - reported
            result["cells"][implementation] = {"error": f"{type(exc).__name__}: {exc}"}
            continue
        cells: dict = {}
        for name in SCENARIOS:
            began = time.perf_counter()
            cells[f"continuous/{name}"] = continuous_cell(backend, name, steps, device, seed=7)
            say(f"[{implementation}] continuous {name}: {json.dumps({k: v for k, v in cells[f'continuous/{name}'].items() if not k.startswith('top')})} "
                f"({time.perf_counter() - began:.1f} s)")
        for label, fixed in (("fixed", 16), ("length-mix", None)):
            cells[f"static/{label}-64"] = static_cell(backend, fixed, 64, 32, device, seed=7)
            say(f"[{implementation}] static {label}: {json.dumps({k: v for k, v in cells[f'static/{label}-64'].items() if not k.startswith('top')})}")
        result["cells"][implementation] = cells
        out.mkdir(parents=True, exist_ok=True)
        (out / "step_probe.json").write_text(json.dumps(result, indent=1))
    return result


def print_tops(result: dict) -> None:
    for implementation, cells in result["cells"].items():
        for name, cell in cells.items():
            if "top_device" not in cell:
                continue
            print(f"\n== {implementation} {name}: top device ops (ms/step)")
            for row in cell["top_device"][:8]:
                print(f"   {row['ms_per_step']:8.3f}  x{row['calls']:<5} {row['op'][:90]}")
            print(f"== {implementation} {name}: top CPU ops (ms/step)")
            for row in cell["top_cpu"][:8]:
                print(f"   {row['ms_per_step']:8.3f}  x{row['calls']:<5} {row['op'][:90]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--tiny", action="store_true")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--attn", default="sdpa,eager", help="attention implementations to compare")
    args = parser.parse_args()
    from bench.gpu.models import build_m2m100_sized, build_tiny_m2m100

    model_dir = str(build_tiny_m2m100() if args.tiny else build_m2m100_sized(args.device, "float16"))
    result = run_probe(model_dir, args.device, args.steps, args.out, tuple(args.attn.split(",")))
    print_tops(result)


if __name__ == "__main__":
    main()
