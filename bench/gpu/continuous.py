"""Static vs continuous batching on the GPU (issue 25), the Translator replica class driven in-process.

As the CPU measurement (docs/benchmarks/continuous-batching.md, bench/continuous_mix.py at e2b847d)
did, on the current code: each contender is `deployments.translator.Translator` as a plain object
(its real intake, model queue and model thread, or its continuous scheduler; no HTTP, no Ray), one
record per request, on the M2M100-418M-sized random model in float16:

* ``static``: `scheduling: static` (`@serve.batch` + the model queue + `generate`), max_batch_size and
  batch_wait_timeout_s of the GPU profile's Translator;
* ``continuous``: `scheduling: continuous`, max_running_sequences = that max_batch_size.

The length mix: log-normal sentence lengths (tests/fixtures/sentences.py), shortened so the fixture
tokenizer gives each as many tokens as a real tokenizer would (1.35 per word); each sentence's output
length drawn once, `max_new_tokens = min_new_tokens` = source tokens x U(1.0, 1.3), clipped to 5-200,
the same draws for both. A static batch decodes its rows' largest draw (a real model's batch runs
until its longest output ends); a continuous sentence stops at its own. Cells: saturation (closed
loop, the plan's clients), Poisson arrivals at half of each one's own saturation (latency from
arrival), continuous at static's half rate, and each sentence's solo time (`generate` alone, its own
length) for p50 latency / solo. The fixed-length workload (make bench's sentences, the plan's
decode_tokens each) checks for a regression: saturation and half load.
"""

from __future__ import annotations

import asyncio
import math
import random
import statistics
import time
from typing import Callable

from bench.gpu.common import SOURCE, TARGET, Deadline, Plan, pct, say

#: input tokens per English word of real M2M100 / Marian SentencePiece vocabularies
REAL_TOKENS_PER_WORD = 1.35
SEED = 5


def output_lengths(token_lengths: list[int], seed: int, low: float = 1.0, high: float = 1.3) -> list[int]:
    rng = random.Random(seed)
    return [min(200, max(5, round(n * rng.uniform(low, high)))) for n in token_lengths]


def mix_texts(backend, records: int, seed: int) -> list[str]:
    from tests.fixtures.sentences import make_texts, sample_lengths

    words = sample_lengths(records, seed)
    tokens = backend.token_lengths(make_texts(words, seed), SOURCE)
    scale = REAL_TOKENS_PER_WORD * sum(words) / sum(tokens)
    return make_texts([max(1, round(n * scale)) for n in words], seed)


def make_backend(model_dir: str, device: str):
    from deployments.backends.transformers_backend import TransformersBackend

    class PerCallLength(TransformersBackend):
        """Static path: a model call decodes its rows' largest drawn length."""

        lengths: dict[str, int] = {}

        def translate(self, texts, source, target):
            self.max_new_tokens = self.min_new_tokens = max(self.lengths[t] for t in texts)
            return super().translate(texts, source, target)

    dtype = "float16" if device.startswith("cuda") else "float32"
    return PerCallLength(model_dir, device=device, dtype=dtype, local_files_only=True, num_threads=1,
                         max_new_tokens=200)


def make_replica(backend, scheduling: str, batch: int, wait_s: float, join_interval_steps: int = 1):
    from ray.serve import batching

    import deployments.translator as translator_module
    from deployments.settings import TranslationSettings

    # Outside Serve there is no replica context for this warning to read (tests/unit/conftest.py).
    batching._BatchQueue._warn_if_max_batch_size_exceeds_max_ongoing_requests = lambda self: None
    translator_module.load_translation_backend = lambda settings, threads: backend
    settings = TranslationSettings(backend="transformers", model=backend.model_id, local_files_only=True,
                                   max_new_tokens=200, scheduling=scheduling, max_running_sequences=batch,
                                   join_interval_steps=join_interval_steps)
    replica = translator_module.Translator.func_or_class(settings.model_dump())
    replica.reconfigure({"max_batch_size": batch, "batch_wait_timeout_s": wait_s})
    if scheduling == "continuous":
        lengths = backend.lengths
        scheduler = replica._continuous.scheduler
        scheduler.limits = lambda text, ids: (lengths[text], lengths[text])
        replica.steps = []  # every StepOutcome, for the cells' step figures
        record = scheduler._on_step
        scheduler._on_step = lambda outcome: (replica.steps.append(outcome), record(outcome))
    return replica


def step_figures(outcomes: list) -> dict:
    """Where a continuous contender's time went: its steps with and without sentences joining."""
    ok = [o for o in outcomes if o.running and not o.failed]
    if not ok:
        return {}
    joined = [o.seconds for o in ok if o.joined]
    plain = [o.seconds for o in ok if not o.joined]
    return {"steps": len(ok), "mean_running": round(statistics.mean(o.running for o in ok), 1),
            "steps_with_joins": len(joined), "mean_joined": round(sum(o.joined for o in ok) / max(1, len(joined)), 1),
            "step_ms_p50_without_joins": round(1000 * pct(plain, 0.5), 2) if plain else None,
            "step_ms_p50_with_joins": round(1000 * pct(joined, 0.5), 2) if joined else None,
            "decoding_s": round(sum(o.seconds for o in ok), 2)}


async def closed_loop(replica, texts: list[str], clients: int) -> dict:
    from deployments.batching import Chunk

    latencies: list[float] = []
    order = iter(texts)

    async def client():
        for text in order:
            start = time.perf_counter()
            await replica.translate(Chunk(SOURCE, TARGET, [text]))
            latencies.append(time.perf_counter() - start)
    began = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(clients)))
    wall = time.perf_counter() - began
    return {"records_per_s": round(len(texts) / wall, 2), "p50_s": round(pct(latencies, 0.5), 3),
            "p99_s": round(pct(latencies, 0.99), 3), "requests": len(texts), "wall_s": round(wall, 1)}


async def open_loop(replica, texts: list[str], rate: float, seed: int) -> dict:
    """Poisson arrivals at `rate` requests/s; a request's latency counts from its arrival time."""
    from deployments.batching import Chunk

    rng = random.Random(seed)
    latencies: dict[int, float] = {}
    began = time.perf_counter()

    async def one(i: int, at: float, text: str):
        await asyncio.sleep(max(0.0, at - (time.perf_counter() - began)))
        await replica.translate(Chunk(SOURCE, TARGET, [text]))
        latencies[i] = time.perf_counter() - began - at
    at, tasks = 0.0, []
    for i, text in enumerate(texts):
        at += rng.expovariate(rate)
        tasks.append(one(i, at, text))
    await asyncio.gather(*tasks)
    values = [latencies[i] for i in range(len(texts))]
    return {"offered_per_s": round(rate, 2), "p50_s": round(pct(values, 0.5), 3), "p99_s": round(pct(values, 0.99), 3),
            "requests": len(texts), "wall_s": round(time.perf_counter() - began, 1),
            "latencies": [round(v, 4) for v in values]}


def _shown(cell: dict) -> dict:
    return {k: v for k, v in cell.items() if k != "latencies"}


def run_workload(name: str, texts: list[str], contenders: dict, plan: Plan, loop, deadline: Deadline,
                 saturation_requests: int, with_static_half: bool, save: Callable[[], None]) -> dict:
    """Saturation, then half load, per contender; continuous also at static's half rate."""
    result: dict = {"workload": name, "contenders": {label: {} for label in contenders}}
    sat_texts = (texts * math.ceil(saturation_requests / len(texts)))[:saturation_requests]
    for label, replica in contenders.items():
        if not deadline.allows(20):
            say(f"{name} {label}: saturation skipped (phase time budget)")
            continue
        loop.run_until_complete(closed_loop(replica, texts[:8], 8))  # warm
        seen = len(getattr(replica, "steps", []))
        cell = loop.run_until_complete(closed_loop(replica, sat_texts, plan.mix_clients))
        if hasattr(replica, "steps"):
            cell["steps"] = step_figures(replica.steps[seen:])
        result["contenders"][label]["saturation"] = cell
        say(f"{name} {label} saturation ({plan.mix_clients} clients): {cell}")
        save()
    half_texts = texts[:plan.half_requests]
    for label, replica in contenders.items():
        sat = result["contenders"][label].get("saturation", {}).get("records_per_s")
        if not sat or not deadline.allows(1.3 * len(half_texts) / (0.5 * sat) + 5):
            continue
        cell = loop.run_until_complete(open_loop(replica, half_texts, 0.5 * sat, SEED + 7))
        result["contenders"][label]["half"] = cell
        say(f"{name} {label} at 0.5 x its saturation: {_shown(cell)}")
        save()
    static_sat = result["contenders"].get("static", {}).get("saturation", {}).get("records_per_s")
    for label in (label for label in contenders if label.startswith("continuous")):
        if not (with_static_half and static_sat and deadline.allows(1.3 * len(half_texts) / (0.5 * static_sat) + 5)):
            break
        cell = loop.run_until_complete(open_loop(contenders[label], half_texts, 0.5 * static_sat, SEED + 7))
        result["contenders"][label]["at_static_half"] = cell
        say(f"{name} {label} at static's half rate: {_shown(cell)}")
        save()
    return result


def add_solo_ratios(result: dict, texts: list[str], solo: dict[str, float]) -> None:
    for entry in result["contenders"].values():
        for key in ("half", "at_static_half"):
            cell = entry.get(key)
            if not cell:
                continue
            pairs = [(lat, solo[t]) for lat, t in zip(cell["latencies"], texts) if t in solo]
            if pairs:
                cell["p50_latency_over_solo"] = round(statistics.median(lat / s for lat, s in pairs), 2)
                cell["p50_solo_s"] = round(statistics.median(s for _, s in pairs), 3)


def summarise(report: dict) -> dict:
    """Each continuous contender / static, per workload: `length_mix` for `continuous` (every step),
    `length_mix_join8` for `continuous-join8`, and so on."""
    summary = {}
    for key, label in ((key, label) for key in ("length_mix", "fixed")
                       for label in report.get(key, {}).get("contenders", {}) if label.startswith("continuous")):
        cells = report.get(key, {}).get("contenders", {})
        s, c = cells.get("static", {}), cells.get(label, {})
        row = {}
        if "saturation" in s and "saturation" in c:
            row["saturation_x"] = round(c["saturation"]["records_per_s"] / s["saturation"]["records_per_s"], 2)
        if "half" in s and "half" in c:
            row["p50_at_own_half_x"] = round(c["half"]["p50_s"] / s["half"]["p50_s"], 3)
            row["p99_at_own_half_x"] = round(c["half"]["p99_s"] / s["half"]["p99_s"], 3)
        if "half" in s and "at_static_half" in c:
            row["p50_at_static_half_x"] = round(c["at_static_half"]["p50_s"] / s["half"]["p50_s"], 3)
            row["p99_at_static_half_x"] = round(c["at_static_half"]["p99_s"] / s["half"]["p99_s"], 3)
        summary[key + label.removeprefix("continuous").replace("-", "_")] = row
    return summary


def run(model_dir: str, device: str, plan: Plan, deadline: Deadline, report: dict, save: Callable[[], None],
        join_interval_steps: int = 1) -> dict:
    """Fills `report` as it goes (`save()` writes it), so a phase cut short keeps its cells."""
    from bench.load import POOL
    from deploy.serve_profiles import serve_config

    began = time.perf_counter()
    backend = make_backend(model_dir, device)
    texts = mix_texts(backend, plan.mix_records, SEED)
    tokens = backend.token_lengths(texts, SOURCE)
    draws = output_lengths(tokens, SEED + 1)
    backend.lengths = dict(zip(texts, draws))
    gpu_user = next(d for d in serve_config("gpu", "local")["applications"][0]["deployments"]
                    if d["name"] == "Translator")["user_config"]
    wait_s = gpu_user["batch_wait_timeout_s"] if device != "cpu" else 0.01
    loop = asyncio.new_event_loop()  # @serve.batch binds its queue to the first loop: one for all runs
    contenders = {"static": make_replica(backend, "static", plan.mix_batch, wait_s),
                  "continuous": make_replica(backend, "continuous", plan.mix_batch, wait_s)}
    if join_interval_steps > 1:
        contenders[f"continuous-join{join_interval_steps}"] = make_replica(
            backend, "continuous", plan.mix_batch, wait_s, join_interval_steps)
    report.update({
        "model": "M2M100-418M-sized random" if device != "cpu" else "tiny M2M100 fixture", "device": device,
        "dtype": str(backend.dtype).replace("torch.", ""), "batch": plan.mix_batch, "batch_wait_timeout_s": wait_s,
        "clients": plan.mix_clients,
        "through": "Translator replica in-process (real intake/queue/model thread; no HTTP)",
        "length_mix_shape": {"records": len(texts), "source_tokens_p50": pct(tokens, 0.5),
                             "source_tokens_p90": pct(tokens, 0.9), "source_tokens_max": max(tokens),
                             "output_tokens_p50": pct(draws, 0.5), "output_tokens_p90": pct(draws, 0.9),
                             "output_tokens_max": max(draws), "output_tokens_mean": round(statistics.mean(draws), 1)}})
    say(f"continuous: model loaded in {time.perf_counter() - began:.1f} s; length mix {report['length_mix_shape']}")
    try:
        report["length_mix"] = run_workload("length-mix", texts, contenders, plan, loop, deadline,
                                            plan.saturation_requests, True, save)
        if deadline.allows(15):
            solo_texts = texts[:plan.solo_sentences]
            solo = {}
            for text in dict.fromkeys(solo_texts):
                start = time.perf_counter()
                backend.translate([text], SOURCE, TARGET)
                solo[text] = time.perf_counter() - start
            add_solo_ratios(report["length_mix"], texts, solo)
            say(f"continuous: solo time p50 {statistics.median(solo.values()):.3f} s over {len(solo)} sentences")
        report["summary"] = summarise(report)
        save()
        backend.lengths.update({t: plan.decode_tokens for t in POOL})
        fixed_texts = (POOL * math.ceil(plan.mix_records / len(POOL)))[:plan.mix_records]
        report["fixed"] = run_workload(f"fixed-{plan.decode_tokens}", fixed_texts, contenders, plan, loop, deadline,
                                       plan.fixed_saturation_requests, False, save)
        report["summary"] = summarise(report)
        say(f"continuous: summary {report['summary']}")
    finally:
        report["wall_s"] = round(time.perf_counter() - began, 1)
        save()
        for label, replica in contenders.items():
            if label.startswith("continuous"):
                replica._continuous.shutdown()
    return report
