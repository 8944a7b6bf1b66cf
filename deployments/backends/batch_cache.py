"""The CPU continuous decoder's caches, kept in buffers with spare rows and columns so that steps, joins and
leaves write in place instead of copying the running batch's caches.

Each cache tensor (rows, heads, columns, head_dim) is a view of a larger zeroed buffer (`RowBuffer`):

* **a step** writes its self-attention column into the next spare column (`GrowingLayer`). transformers'
  `DynamicLayer` appends with `torch.cat`, so every step copied every layer's whole cache: on the Marian-sized
  model (one thread, 12 rows, 250 columns) those copies were 33 ms of a 60 ms step;
* **a join** writes the joiners' cross-attention keys / values into spare rows, and their self-attention rows
  are zeroed (masked) columns of spare rows; the running rows are not copied;
* **a leave** moves the last running rows into the rows that left (a copy of the movers only) and cuts the
  self-attention columns no row needs by moving the view's start (no copy).

Before these buffers, a join padded and concatenated every cache and a leave `index_select`ed them: with one
join or leave per step at saturation (Marian-sized, length mix), `copy_`, `index_select` and `cat` were 20 % of
the decoding thread's time. A buffer is copied when it runs out of rows or columns: into one with
`SPARE_ROWS` / `SPARE_COLUMNS` more than needed, which also gives back what a shrunken batch no longer uses.

Masked positions may hold stale (finite) values of earlier rows: attention gives them weight exactly 0.
"""

from __future__ import annotations

from typing import Optional, Sequence

import torch
from torch.nn import functional as F
from transformers.cache_utils import DynamicLayer

#: the self-attention columns a buffer gains when it is full: one copy of the cache per this many steps
SPARE_COLUMNS = 32
#: the rows a buffer gains when joiners do not fit: one copy per this many joiners at least
SPARE_ROWS = 8
#: joiners are encoded in groups padded to at most this fraction over their own tokens
ENCODER_PADDING = 0.25


class RowBuffer:
    """A (rows, heads, columns, head_dim) tensor (`tensor`), rows 0.. and columns start.. of a buffer."""

    def __init__(self, spare_columns: int = 0) -> None:
        self.spare_columns = spare_columns
        self.buffer: Optional[torch.Tensor] = None
        self.rows = self.start = self.columns = 0

    @property
    def tensor(self) -> torch.Tensor:
        return self.buffer[:self.rows, :, self.start:self.start + self.columns]

    def _reserve(self, like: torch.Tensor, rows: int, columns: int, repack: bool = False) -> None:
        """Room for `rows` rows and `columns` columns from `start`; else (or if `repack`) a new buffer with
        spare ones, the used part copied."""
        buffer = self.buffer
        if not repack and buffer is not None and rows <= buffer.shape[0] and self.start + columns <= buffer.shape[2]:
            return
        grown = like.new_zeros(rows + SPARE_ROWS, like.shape[1], columns + self.spare_columns, like.shape[3])
        if buffer is not None:
            used = min(self.rows, rows)
            grown[:used, :, :self.columns] = self.tensor[:used]
        self.buffer, self.start = grown, 0

    def append_rows(self, rows: torch.Tensor) -> None:
        """Add `rows` (joiners, right-padded with zeros to the wider of theirs and the buffer's columns)."""
        width, added = max(self.columns, rows.shape[2]), rows.shape[0]
        self._reserve(rows, self.rows + added, width)
        left, right = self.start, self.start + width
        self.buffer[:self.rows, :, self.start + self.columns:right] = 0  # the running rows' new (masked) columns
        new = self.buffer[self.rows:self.rows + added, :, left:right]
        new[:, :, :rows.shape[2]] = rows
        new[:, :, rows.shape[2]:] = 0
        self.rows, self.columns = self.rows + added, width

    def append_empty_rows(self, count: int) -> None:
        """Add `count` rows of zeros (joiners' masked self-attention columns)."""
        self.append_rows(self.buffer[:1, :, :0].expand(count, -1, -1, -1))

    def append_columns(self, columns: torch.Tensor) -> None:
        """Write `columns` (rows, heads, n, head_dim) after the used ones."""
        self._reserve(columns, self.rows, self.columns + columns.shape[2])
        end = self.start + self.columns
        self.buffer[:self.rows, :, end:end + columns.shape[2]] = columns
        self.columns += columns.shape[2]

    def keep(self, rows: int, holes: Sequence[int], movers: Sequence[int], columns: int, left: bool) -> None:
        """Keep `rows` rows, row movers[i] moved into holes[i]; keep `columns` columns, the last ones if `left`.
        A buffer left with over twice the rows it needs is repacked (memory back after a busy spell)."""
        if left:
            self.start += self.columns - columns
        self.columns = columns
        if movers:
            index = lambda rows: torch.tensor(rows, device=self.buffer.device)  # noqa: E731
            span = slice(self.start, self.start + self.columns)
            self.buffer[index(holes), :, span] = self.buffer[index(movers), :, span]
        if self.buffer.shape[0] > 2 * (rows + SPARE_ROWS):
            self._reserve(self.buffer, rows, columns, repack=True)
        self.rows = rows


class GrowingLayer(DynamicLayer):
    """A self-attention cache layer: `keys` / `values` are views of `RowBuffer`s, each step's column written in place."""

    def __init__(self) -> None:
        super().__init__()
        self.key_rows, self.value_rows = RowBuffer(SPARE_COLUMNS), RowBuffer(SPARE_COLUMNS)

    @property
    def columns(self) -> int:
        return self.key_rows.columns

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        for buffer, states in ((self.key_rows, key_states), (self.value_rows, value_states)):
            buffer.append_rows(states[:, :, :0])
        self.dtype, self.device, self.is_initialized = key_states.dtype, key_states.device, True
        self.refresh()

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        self.key_rows.append_columns(key_states)
        self.value_rows.append_columns(value_states)
        self.refresh()
        return self.keys, self.values

    def refresh(self) -> None:
        """Point `keys` / `values` at the buffers' used rows and columns (after a join or leave)."""
        self.keys, self.values = self.key_rows.tensor, self.value_rows.tensor


class BatchCaches:
    """The running batch's caches: per decoder layer a self-attention `GrowingLayer` and cross-attention key and
    value `RowBuffer`s (right-padded), and the rows' encoder attention mask (rows, source columns) of 0/1."""

    def __init__(self, layers: int) -> None:
        self.self_layers = [GrowingLayer() for _ in range(layers)]
        self.cross = [(RowBuffer(), RowBuffer()) for _ in range(layers)]
        self.source_mask: Optional[torch.Tensor] = None
        self.source_lengths: list[int] = []  # each row's source tokens (its mask's ones), on the host

    @property
    def self_columns(self) -> int:
        return self.self_layers[0].columns

    @property
    def source_columns(self) -> int:
        return 0 if self.source_mask is None else int(self.source_mask.shape[1])

    def cross_kv(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        return [(keys.tensor, values.tensor) for keys, values in self.cross]

    def join(self, cross_kv: Sequence[tuple[torch.Tensor, torch.Tensor]], mask: torch.Tensor) -> None:
        """Add rows after the others: their cross-attention keys / values per layer (rows, heads, source,
        head_dim) and their encoder mask; their self-attention rows are zero (masked) columns."""
        for (keys, values), (new_keys, new_values) in zip(self.cross, cross_kv):
            keys.append_rows(new_keys)
            values.append_rows(new_values)
        width = max(self.source_columns, int(mask.shape[1]))
        pad = lambda m: m if m.shape[1] == width else F.pad(m, (0, width - m.shape[1]))  # noqa: E731
        self.source_mask = mask if self.source_mask is None else torch.cat([pad(self.source_mask), pad(mask)])
        self.source_lengths += mask.sum(dim=1).tolist()
        if self.self_layers[0].is_initialized:  # the layers are stepped together: all or none hold columns
            for layer in self.self_layers:
                layer.key_rows.append_empty_rows(len(mask))
                layer.value_rows.append_empty_rows(len(mask))
                layer.refresh()

    def keep(self, keep: Sequence[int], columns: int) -> list[int]:
        """Keep rows `keep` (ascending, not empty): the last kept rows move into the first rows that leave.
        Self-attention keeps its last `columns` columns; cross-attention the source columns a kept row uses.
        Returns each row's former index."""
        rows = len(keep)
        holes, movers, order = leave_moves(keep)
        self.source_lengths = [self.source_lengths[i] for i in order]
        mask = self.source_mask.index_select(0, torch.tensor(order, device=self.source_mask.device))
        used = mask.any(dim=0).nonzero()
        width = int(used.max()) + 1 if used.numel() else 0
        self.source_mask = mask[:, :width]
        for keys, values in self.cross:
            keys.keep(rows, holes, movers, width, left=False)
            values.keep(rows, holes, movers, width, left=False)
        if self.self_layers[0].is_initialized:
            for layer in self.self_layers:
                layer.key_rows.keep(rows, holes, movers, columns, left=True)
                layer.value_rows.keep(rows, holes, movers, columns, left=True)
                layer.refresh()
        return order


def leave_moves(keep: Sequence[int]) -> tuple[list[int], list[int], list[int]]:
    """For rows `keep` (ascending) staying: the rows below len(keep) that leave (holes), the kept rows at or above
    it that move into them (movers, in the same order), and each of the len(keep) rows' former index."""
    rows, kept = len(keep), set(keep)
    holes = [i for i in range(rows) if i not in kept]
    movers = [i for i in keep if i >= rows]
    order = list(range(rows))
    for hole, mover in zip(holes, movers):
        order[hole] = mover
    return holes, movers, order


def length_groups(requests: Sequence, padding: float = ENCODER_PADDING) -> list[list]:
    """`requests` by source length, cut into groups whose padded tokens are at most (1 + `padding`) x their
    tokens: one encoder pass per group. (One pass over 32 joiners of the length mix, padded to the longest
    of 145 tokens, computed 6.6 x their tokens.)"""
    groups: list[list] = []
    tokens = 0
    for request in sorted(requests, key=lambda r: len(r.input_ids)):
        length = len(request.input_ids)
        if groups and (len(groups[-1]) + 1) * length <= (1 + padding) * (tokens + length):
            groups[-1].append(request)
            tokens += length
        else:
            groups.append([request])
            tokens = length
    return groups


__all__ = ["BatchCaches", "ENCODER_PADDING", "GrowingLayer", "leave_moves", "length_groups", "RowBuffer", "SPARE_COLUMNS", "SPARE_ROWS"]
