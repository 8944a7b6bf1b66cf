"""The pieces of `SlotDecoder`'s step that a CUDA graph replays (slot_decoder.py): the caches as the
model's attention layers read them, and the graphs themselves, one per bucket of shapes, captured on first
use into one memory pool."""

from __future__ import annotations

from typing import Callable, Optional, Sequence

import torch
from transformers.cache_utils import EncoderDecoderCache


class _KV:
    def __init__(self, keys: torch.Tensor, values: torch.Tensor):
        self.keys, self.values = keys, values


class _Layers:
    """What a cross-attention layer reads from a cache: `.layers[i].keys/.values`."""

    def __init__(self, keys: Sequence[torch.Tensor], values: Sequence[torch.Tensor]):
        self.layers = [_KV(k, v) for k, v in zip(keys, values)]


class _SelfSlots:
    """The self-attention cache as the layers call it: `update` writes the step's column in place and
    returns the first `columns` columns."""

    def __init__(self, keys, values, col: torch.Tensor, columns: int):
        self.keys, self.values, self.col, self.columns = keys, values, col, columns

    def update(self, key_states, value_states, layer_idx, *_args, **_kwargs):
        keys, values = self.keys[layer_idx], self.values[layer_idx]
        keys.index_copy_(2, self.col, key_states)
        values.index_copy_(2, self.col, value_states)
        return keys[:, :, :self.columns], values[:, :, :self.columns]


class SlotCache(EncoderDecoderCache):
    """An EncoderDecoderCache (the attention layers check the type) over slot buffers: self keys/values
    (layers, rows, heads, W, head_dim) written at column `col`, cross keys/values (layers, rows, heads,
    S, head_dim) read as they are."""

    def __init__(self, self_k, self_v, col: torch.Tensor, columns: int, cross_k, cross_v):  # noqa: D107
        # no parent __init__: it would build DynamicCaches the layers must not see
        self.self_attention_cache = _SelfSlots(self_k, self_v, col, columns)
        self.cross_attention_cache = _Layers(cross_k, cross_v)
        self.is_updated = {i: True for i in range(len(self.cross_attention_cache.layers))}


class GraphCaptureError(RuntimeError):
    """A step could not be captured (an operation this driver or torch cannot record); the step itself ran
    (the warm-up), so decoding can go on without graphs."""


class StepGraphs:
    """One CUDA graph per key (a bucket of shapes), captured on first use; all share one memory pool
    (they never run at once, and each one's output is read before the next replay)."""

    def __init__(self, device: torch.device):
        self.device = device
        self._graphs: dict[tuple, tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self._pool = torch.cuda.graph_pool_handle()
        self.captures = 0

    def clear(self) -> None:
        """Forget every graph (the buffers they read were replaced); the pool goes with them: a pool
        whose graphs are all gone cannot take a new capture."""
        self._graphs.clear()
        self._pool = torch.cuda.graph_pool_handle()

    def run(self, key: tuple, forward: Callable[[], torch.Tensor]) -> torch.Tensor:
        """Replay `key`'s graph (capturing `forward` first if new); returns its output tensor."""
        found: Optional[tuple] = self._graphs.get(key)
        if found is None:
            stream = torch.cuda.Stream(self.device)
            stream.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(stream):  # warm-up: the same step, writing the same cache column
                forward()
            torch.cuda.current_stream(self.device).wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            try:
                with torch.cuda.graph(graph, pool=self._pool, capture_error_mode="thread_local"):
                    out = forward()
            except RuntimeError as exc:
                raise GraphCaptureError(f"capturing the decoding step {key} failed: {exc}") from exc
            found = self._graphs[key] = (graph, out)
            self.captures += 1
        found[0].replay()
        return found[1]


__all__ = ["GraphCaptureError", "SlotCache", "StepGraphs"]
