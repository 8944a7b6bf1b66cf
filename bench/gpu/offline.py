"""The offline limit: the project's own TransformersBackend called in a loop, no serving at all.

On the GPU in float16 (float32 on CPU), the decode length fixed (min_new_tokens == max_new_tokens, the
plan's decode_tokens, as the Serve cells), make bench's sentences (bench/load.py POOL) in batches of
1 to 128. Per batch size: the batch's time (median of the repeats) and records/s; the best batch is
the offline limit that the Serve cells are compared with. One model thread (torch threads 1), as a
Translator replica with num_cpus 1 has.
"""

from __future__ import annotations

import statistics
import time

from bench.gpu.common import SOURCE, TARGET, Deadline, Plan, say


def device_info(device: str) -> dict:
    import torch

    info = {"device": device, "torch": torch.__version__}
    if device.startswith("cuda"):
        props = torch.cuda.get_device_properties(0)
        info.update(gpu=props.name, gpu_memory_gib=round(props.total_memory / 2**30, 1),
                    cuda=torch.version.cuda)
    return info


def run(model_dir: str, device: str, plan: Plan, deadline: Deadline) -> dict:
    import torch

    from bench.load import POOL
    from deployments.backends.transformers_backend import TransformersBackend

    began = time.perf_counter()
    dtype = "float16" if device.startswith("cuda") else "float32"
    backend = TransformersBackend(model_dir, device=device, dtype=dtype, max_new_tokens=plan.decode_tokens,
                                  min_new_tokens=plan.decode_tokens, num_threads=1, local_files_only=True)
    backend.warm_up()
    loaded_s = time.perf_counter() - began
    say(f"offline: {backend.describe()} loaded and warmed in {loaded_s:.1f} s")
    rows = []
    for batch in plan.offline_batches:
        if not deadline.allows(3 * plan.offline_seconds):
            say(f"offline: batch {batch} skipped (phase time budget)")
            break
        texts = [POOL[i % len(POOL)] for i in range(batch)]
        backend.translate(texts, SOURCE, TARGET)  # this shape's first call (allocator, kernels)
        times: list[float] = []
        stop_at = time.perf_counter() + plan.offline_seconds
        while len(times) < 3 or (time.perf_counter() < stop_at and len(times) < 200):
            start = time.perf_counter()
            out = backend.translate(texts, SOURCE, TARGET)
            times.append(time.perf_counter() - start)
            assert len(out) == batch
        median = statistics.median(times)
        row = {"batch": batch, "repeats": len(times), "batch_s_p50": round(median, 4),
               "batch_s_min": round(min(times), 4), "records_per_s": round(batch / median, 1),
               "tokens_per_s": round(batch * plan.decode_tokens / median, 1)}
        rows.append(row)
        say(f"offline: batch {batch:>3}: {row['records_per_s']:>8.1f} records/s, {median * 1000:.1f} ms per batch "
            f"({len(times)} repeats)")
    best = max(rows, key=lambda r: r["records_per_s"]) if rows else None
    result = {**device_info(device), "dtype": dtype, "decode_tokens": plan.decode_tokens, "load_s": round(loaded_s, 1),
              "describe": backend.describe(), "rows": rows,
              "offline_limit": {"batch": best["batch"], "records_per_s": best["records_per_s"]} if best else None}
    if device.startswith("cuda"):
        result["max_memory_allocated_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
    if best:
        say(f"offline limit: {best['records_per_s']} records/s at batch {best['batch']}")
    return result
