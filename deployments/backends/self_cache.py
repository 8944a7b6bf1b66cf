"""The CPU continuous decoder's self-attention cache: each step's column written in place.

transformers' `DynamicLayer` appends a step's keys and values with `torch.cat`, so every decoding step copied
every layer's whole self-attention cache into a fresh allocation. On the Marian-sized model (one thread, 12
rows) that copy grew with the outputs' length until it was most of the step: at 250 columns the 12 copies
took 33 ms of a 60 ms step (torch.profiler: `aten::cat` 55 % of the step's CPU time). The same 12
concatenations timed alone took 4.7 ms: in the step the decoder still held the previous step's caches while
the new ones were made, so each step's copies went to fresh memory, page by page. `generate` frees each old
tensor as its layer's copy is made, and gained 3-6 % from in-place appends at 12 rows x 200 tokens (not
applied there).

`GrowingLayer` keeps spare columns after the used ones and writes each step's column into them; a full buffer
is copied once into one `SPARE_COLUMNS` wider. Joins and leaves still build new tensors (`hold`), once per
join or leave rather than once per step. The slot engine (slot_decoder.py) has fixed buffers of its own.
"""

from __future__ import annotations

import torch
from transformers.cache_utils import DynamicLayer

#: the columns a buffer gains when it is full: one copy of the cache per this many steps
SPARE_COLUMNS = 32


class GrowingLayer(DynamicLayer):
    """A self-attention cache layer (keys and values of shape (rows, heads, columns, head_dim)) appended in
    place; `keys` / `values` are views of the used columns."""

    def __init__(self) -> None:
        super().__init__()
        self.columns = 0
        self._key_buffer = self._value_buffer = None

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.hold(key_states[:, :, :0], value_states[:, :, :0])

    def hold(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        """Take `keys` / `values` as the whole cache (after a join or leave), with no spare column yet."""
        self.keys, self.values, self._key_buffer, self._value_buffer = keys, values, keys, values
        self.columns = int(keys.shape[2])
        self.dtype, self.device, self.is_initialized = keys.dtype, keys.device, True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        end = self.columns + key_states.shape[2]
        if end > self._key_buffer.shape[2]:
            self._key_buffer = self._grown(self._key_buffer, end)
            self._value_buffer = self._grown(self._value_buffer, end)
        self._key_buffer[:, :, self.columns:end] = key_states
        self._value_buffer[:, :, self.columns:end] = value_states
        self.columns = end
        self.keys, self.values = self._key_buffer[:, :, :end], self._value_buffer[:, :, :end]
        return self.keys, self.values

    def _grown(self, buffer: torch.Tensor, columns: int) -> torch.Tensor:
        rows, heads, _, head_dim = buffer.shape
        grown = buffer.new_empty(rows, heads, columns + SPARE_COLUMNS, head_dim)
        grown[:, :, :self.columns] = buffer[:, :, :self.columns]
        return grown


__all__ = ["GrowingLayer", "SPARE_COLUMNS"]
