"""CTranslate2 vs transformers on a Marian-sized model: throughput, memory, output agreement.

    flock /tmp/serve-app-cpu.lock .venv/bin/python -m bench.ctranslate2_compare [--device cpu] [--json out.json]

The model is random (no hub access) but of opus-mt-en-de's size: vocabulary 58101,
d_model 512, 6+6 layers, 8 heads, FFN 2048 (~74M parameters), with the fixture's
SentencePiece tokenizer. Every backend decodes exactly ``--tokens`` tokens per
record (min = max new tokens), so all do the same work.

Each backend runs in its own subprocess (clean memory figures): it loads, reports
the RSS it added, translates ``--records`` records at batch 1, 8 and 32 (after a
warm-up batch), and returns the generated token ids of one pass over the texts
for the agreement check against the transformers backend (float32 on CPU,
float16 on CUDA): the share of records whose tokens are identical, the mean
share of tokens equal before the first difference, and identical texts.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

#: opus-mt-en-de's sizes
MARIAN_VOCAB = 58101
MARIAN_DIMS = dict(
    d_model=512, encoder_layers=6, decoder_layers=6, encoder_attention_heads=8,
    decoder_attention_heads=8, encoder_ffn_dim=2048, decoder_ffn_dim=2048,
)
BATCH_SIZES = (1, 8, 32)


def build_marian_sized(path: str | Path) -> Path:
    """A random Marian model of opus-mt-en-de's size under ``path`` (built once, reused)."""
    from tests.fixtures.tiny_models import build_tiny_marian

    out = Path(path) / "opus-mt-en-de"
    if (out / "config.json").exists():
        return out
    return build_tiny_marian(path, ("en", "de"), vocab_size=MARIAN_VOCAB, dims=MARIAN_DIMS)


def _texts() -> list[str]:
    from tests.fixtures.sentences import SENTENCES
    from tests.fixtures.tiny_models import CORPUS

    return list(SENTENCES) + [t for t in CORPUS if t.isascii()]


def _rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def _make_backend(spec: dict):
    from deployments.backends.ctranslate2_backend import CTranslate2Backend
    from deployments.backends.transformers_backend import TransformersBackend

    common = dict(device=spec["device"], max_new_tokens=spec["tokens"], min_new_tokens=spec["tokens"],
                  num_threads=spec["threads"], local_files_only=True)
    if spec["backend"] == "transformers":
        return TransformersBackend(spec["model"], dtype=spec["precision"], **common)
    return CTranslate2Backend(spec["model"], compute_type=spec["precision"], cache_dir=spec["cache_dir"], **common)


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        import torch

        torch.cuda.synchronize()


def worker(spec: dict) -> dict:
    """Runs in a subprocess: load one backend, time it, return figures and token ids."""
    import torch  # noqa: F401 - imports are not the model's memory
    import transformers  # noqa: F401

    if spec["backend"] == "ctranslate2":
        import ctranslate2  # noqa: F401
    texts = _texts()
    rss0 = _rss_mb()
    t0 = time.perf_counter()
    backend = _make_backend(spec)
    load_s = time.perf_counter() - t0
    load_rss = _rss_mb() - rss0
    backend.warm_up()
    ids = backend.generate_ids(texts, "en", "de")
    out_texts = backend.translate(texts, "en", "de")
    throughput = {}
    for batch in BATCH_SIZES:
        records = [texts[i % len(texts)] for i in range(max(batch, spec["records"] // batch * batch))]
        backend.generate_ids(records[:batch], "en", "de")  # warm this shape
        _sync(spec["device"])
        start = time.perf_counter()
        for i in range(0, len(records), batch):
            backend.generate_ids(records[i:i + batch], "en", "de")
        _sync(spec["device"])
        throughput[str(batch)] = len(records) / (time.perf_counter() - start)
    facts = backend.describe()
    next_token = None
    if spec.get("reference_ids"):
        next_token = next_token_agreement(backend, texts, spec["reference_ids"])
    gpu_mb = None
    if spec["device"].startswith("cuda") and spec["backend"] == "transformers":
        import torch

        gpu_mb = torch.cuda.max_memory_allocated() / 2**20
    return {"load_s": load_s, "load_rss_mb": load_rss, "steady_rss_mb": _rss_mb() - rss0, "gpu_mb": gpu_mb,
            "throughput": throughput, "next_token_agreement": next_token, "ids": ids, "texts": out_texts, "describe": facts}


def next_token_agreement(backend, texts: list[str], reference: list[list[int]]) -> float:
    """Share of positions where ``backend`` picks the reference's next token given the reference's prefix.

    Teacher forcing isolates the precision's effect on each step from the divergence that
    one flipped token causes in free-running greedy decoding (random weights amplify it).
    The reference rows have one length (fixed decode length); the forced final EOS is skipped.
    """
    width = len(reference[0])
    assert all(len(r) == width for r in reference), "needs a fixed decode length"
    if backend.name == "ctranslate2":
        vocab = backend._id_to_token
        sources = [[vocab[i] for i in ids] for ids in backend.tokenizer(texts)["input_ids"]]
        hits = total = 0
        for k in range(0, width - 2):  # predict reference[k + 1] from reference[1:k + 1]
            prefixes = [[vocab[i] for i in r[1:k + 1]] for r in reference]
            results = backend.translator.translate_batch(
                sources, target_prefix=prefixes, beam_size=1, max_decoding_length=k + 1,
                min_decoding_length=k + 1, return_end_token=True)
            for r, res in zip(reference, results):
                hits += backend._token_to_id[res.hypotheses[0][k]] == r[k + 1]
                total += 1
        return hits / total
    import torch

    enc = backend.tokenizer(texts, padding=True, return_tensors="pt").to(backend.device)
    decoder = torch.tensor([r[:-1] for r in reference], device=backend.device)
    # as in the fixed-length run: EOS is suppressed, and so are the checkpoint's bad words (Marian's <pad>)
    banned = set(backend._eos_ids()) | {
        seq[0] for seq in (backend.model.generation_config.bad_words_ids or []) if len(seq) == 1}
    with torch.inference_mode():
        logits = backend.model(**enc, decoder_input_ids=decoder).logits
        logits[..., sorted(banned)] = float("-inf")
    predicted = logits.argmax(-1)[:, : width - 2].cpu()
    return (predicted == torch.tensor([r[1:-1] for r in reference])).float().mean().item()


def _run(spec: dict) -> dict:
    proc = subprocess.run([sys.executable, "-m", "bench.ctranslate2_compare", "--worker", json.dumps(spec)],
                          capture_output=True, text=True, cwd=Path(__file__).resolve().parent.parent)
    if proc.returncode != 0:
        return {"error": (proc.stderr or proc.stdout).strip().splitlines()[-1:]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def agreement(ref: dict, other: dict) -> dict:
    """Exact-match rates of ``other``'s outputs against ``ref``'s."""
    pairs = list(zip(ref["ids"], other["ids"]))
    prefix = []
    for a, b in pairs:
        same = 0
        for x, y in zip(a, b):
            if x != y:
                break
            same += 1
        prefix.append(same / max(len(a), len(b)))
    return {
        "rows_equal": sum(a == b for a, b in pairs) / len(pairs),
        "tokens_equal_before_first_difference": sum(prefix) / len(prefix),
        "texts_equal": sum(a == b for a, b in zip(ref["texts"], other["texts"])) / len(pairs),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--model", help="Marian-family model folder (default: build the Marian-sized random one)")
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--tokens", type=int, default=32, help="tokens decoded per record (min = max)")
    parser.add_argument("--records", type=int, default=64, help="records per batch size")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="CPU threads per backend")
    parser.add_argument("--variants", default="", help="comma-separated backend:precision (default: per device)")
    parser.add_argument("--json", help="write the figures here too")
    args = parser.parse_args(argv)
    if args.worker:
        print(json.dumps(worker(json.loads(args.worker))))
        return 0

    work = Path(tempfile.mkdtemp(prefix="ct2-bench-"))
    model = args.model or str(build_marian_sized(work / "model"))
    gpu = args.device.startswith("cuda")
    default = ("transformers:float32,transformers:float16,ctranslate2:float16,ctranslate2:int8_float16,"
               "ctranslate2:float32" if gpu else "transformers:float32,ctranslate2:int8,ctranslate2:float32")
    variants = [v.split(":") for v in (args.variants or default).split(",")]
    results = {}
    convert_s = {}
    for backend, precision in variants:
        if backend == "ctranslate2":  # convert up front: workers time the load from the cache
            from deployments.backends.ctranslate2_backend import convert_once

            start = time.perf_counter()
            convert_once(model, precision, work / "ct2-cache")
            convert_s[precision] = time.perf_counter() - start
    reference_ids = None
    for backend, precision in variants:
        spec = dict(backend=backend, precision=precision, model=model, device=args.device, tokens=args.tokens,
                    records=args.records, threads=args.threads, cache_dir=str(work / "ct2-cache"),
                    reference_ids=reference_ids)
        results[f"{backend}:{precision}"] = _run(spec)
        if reference_ids is None:  # the first variant is the reference
            reference_ids = results[f"{backend}:{precision}"].get("ids")
        results[f"{backend}:{precision}"]["convert_s"] = convert_s.get(precision) if backend == "ctranslate2" else None
        print(f"{backend}:{precision} done", file=sys.stderr, flush=True)
    reference = results[f"transformers:{variants[0][1]}"]

    head = (f"device {args.device}, {args.threads} threads, {args.tokens} tokens/record, "
            f"{args.records} records per batch size; agreement vs transformers:{variants[0][1]}")
    lines = [head, "",
             "| backend | convert s (once) | load s | RSS after load MB | RSS after runs MB | " + " | ".join(f"rec/s b{b}" for b in BATCH_SIZES)
             + " | vs ref b1/b8/b32 | rows equal | tokens equal before 1st difference | texts equal "
             "| next token equal (teacher-forced) |",
             "|---|---|---|---|---|" + "---|" * len(BATCH_SIZES) + "---|---|---|---|---|"]
    for name, r in results.items():
        if "error" in r:
            lines.append(f"| {name} | failed: {' '.join(r['error'])} |")
            continue
        tput = [r["throughput"][str(b)] for b in BATCH_SIZES]
        ref_t = [reference["throughput"][str(b)] for b in BATCH_SIZES]
        ratio = "/".join(f"{t / rt:.2f}x" for t, rt in zip(tput, ref_t))
        agree = agreement(reference, r)
        r["agreement"] = agree
        lines.append(
            f"| {name} | {'-' if r['convert_s'] is None else format(r['convert_s'], '.1f')} | {r['load_s']:.1f} "
            f"| {r['load_rss_mb']:.0f} | {r['steady_rss_mb']:.0f} | " + " | ".join(f"{t:.1f}" for t in tput)
            + f" | {ratio} | {agree['rows_equal']:.0%} | {agree['tokens_equal_before_first_difference']:.0%} "
            f"| {agree['texts_equal']:.0%} | "
            + ("-" if r.get("next_token_agreement") is None else f"{r['next_token_agreement']:.1%}") + " |")
    print("\n".join(lines))
    if args.json:
        for r in results.values():
            r.pop("ids", None)
            r.pop("texts", None)
        Path(args.json).write_text(json.dumps({"setup": head, "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
