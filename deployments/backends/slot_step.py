"""The pieces of `SlotDecoder`'s step that a CUDA graph replays (slot_decoder.py): the caches as the
model's attention layers read them, and the graphs themselves, one per bucket of shapes, captured on first
use into one memory pool."""

from __future__ import annotations

import logging
from typing import Callable, Optional, Sequence

import torch
from transformers.cache_utils import EncoderDecoderCache

logger = logging.getLogger(__name__)


def bucket(n: int, smallest: int) -> int:
    """The power of two at or over `n`, at least `smallest`."""
    return max(smallest, 1 << max(0, n - 1).bit_length())


def sizes(smallest: int, largest: int) -> list[int]:
    """The buckets `bucket(n, smallest)` takes for n up to `largest`, capped at `largest`: the powers of
    two from `smallest` (one itself) below `largest`, then `largest`."""
    return [1 << k for k in range((smallest - 1).bit_length(), largest.bit_length()) if 1 << k < largest] + [largest]


def pad_joiners(ids: torch.Tensor, mask: torch.Tensor, slots: list[int], rows: int, columns: int, source: int,
                pad_id: int, scratch: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Joiners' (ids, mask) padded to a `rows` x `columns` bucket (the mask to `source` columns), and the
    slot each row writes: its own, or `scratch` for the padding rows (each attends to column 0: a row with
    nothing to attend to would be NaN)."""
    n, width = ids.shape
    padded, valid = torch.full((rows, columns), pad_id), torch.zeros(rows, source, dtype=torch.bool)
    padded[:n, :width], valid[:n, :width] = ids, mask.bool()
    valid[n:, 0] = True
    return padded, valid, torch.tensor(list(slots) + [scratch] * (rows - n))


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
    (they never run at once, and each one's output is read before the next replay). Disabled (no CUDA,
    or after a capture the driver refused: logged once), every call runs eagerly."""

    def __init__(self, device: torch.device, enabled: bool, what: str):
        self.device, self.enabled, self.what = device, bool(enabled), what
        self._graphs: dict[tuple, tuple[torch.cuda.CUDAGraph, object]] = {}
        self._pool = None
        self.captures = 0

    def clear(self) -> None:
        """Forget every graph (the buffers they read were replaced); the pool goes with them: a pool
        whose graphs are all gone cannot take a new capture."""
        self._graphs.clear()
        self._pool = None

    def __call__(self, key: tuple, forward: Callable[[], object]):
        """`forward()`'s result, through `key`'s graph (captured first if new) while enabled."""
        if not self.enabled:
            return forward()
        found: Optional[tuple] = self._graphs.get(key)
        if found is None:
            try:
                found = self._graphs[key] = self._capture(forward)
            except GraphCaptureError as exc:  # run on without graphs rather than fail every call
                logger.warning("capturing %s %s failed (%s); this replica runs it without CUDA graphs from now on",
                               self.what, key, exc)
                self.enabled = False
                self.clear()
                return forward()  # again: it writes the same buffers as the warm-up did (idempotent)
            self.captures += 1
        found[0].replay()  # (CUDAGraph.replay guards its capture stream's device itself)
        return found[1]

    def _capture(self, forward: Callable[[], object]) -> tuple:
        # On this device throughout: torch.cuda.graph's own capture stream is made on the current device (cuda:0)
        # and kept for the class, so on `cuda:N` the model's kernels went to another stream, uncaptured.
        with torch.cuda.device(self.device):
            if self._pool is None:
                self._pool = torch.cuda.graph_pool_handle()
            stream = torch.cuda.Stream(self.device)
            stream.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(stream):  # warm-up: the same call, writing the same buffers
                forward()
            torch.cuda.current_stream(self.device).wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            try:
                with torch.cuda.graph(graph, pool=self._pool, stream=stream, capture_error_mode="thread_local"):
                    out = forward()
            except RuntimeError as exc:
                raise GraphCaptureError(str(exc)) from exc
        return graph, out


__all__ = ["GraphCaptureError", "SlotCache", "StepGraphs", "bucket", "pad_joiners", "sizes"]
