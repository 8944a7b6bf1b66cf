"""Continuous greedy decoding in fixed slots, each step one CUDA graph replay (the GPU's engine).

On a GPU a decoding step of a 400M-parameter translation model is ~3 ms of kernels behind 7-9 ms
of Python launching them (docs/benchmarks/continuous-batching.md), and `ContinuousDecoder` changes
every tensor's shape at every step, so its steps cannot be replayed. `SlotDecoder` keeps the same
contract (join, step, drop, compact: the scheduler cannot tell them apart) on tensors whose shapes
only change in coarse buckets, so a step is one `CUDAGraph.replay()`:

* **slots:** a sequence takes the lowest free row of buffers sized for `slots` sequences and keeps
  it until it finishes; a finished or dropped row is only marked free (nothing is copied). A step
  runs the first R rows, R the power of two over the highest row in use.
* **self-attention cache:** one buffer (layers, rows, heads, W, head_dim) per keys and values. Every
  step writes its new column at the same index `col` for all rows; a row that joined at column s
  attends to columns s..col, a per-row mask hides the rest. Attention weights do not depend on a
  key's column (these models add absolute positions to the inputs), so this is the left-padded
  layout of `ContinuousDecoder` without the copies. When `col` reaches W the columns no live row
  needs are shifted out (or W doubles); a step attends to the first C columns, C the power of two
  over col.
* **cross-attention:** keys/values of every layer in one buffer (2, layers, rows, heads, S, head_dim),
  written for the joiners in one projection (the layers' k/v weights concatenated) and one indexed
  copy; a step reads the first power-of-two columns over the longest live source.
* **the step:** token and position embeddings, the model's own decoder layers (its attention
  implementation, sdpa, with boolean masks), its output projection, and greedy `generate`'s logits
  processors as tensor ops (bans, min_length/min_new_tokens, forced BOS, forced EOS): one graph per
  (rows, columns, source) bucket, captured on first use into one shared memory pool. The host
  reads the chosen ids (the step's one synchronisation) and advances tokens and positions.

Outputs equal single-input `generate`, as `ContinuousDecoder`'s do (tests/unit/test_continuous_decoder.py
runs both). Without CUDA (`graphs=False`) the same step runs eagerly: that is how CI checks it.
"""

from __future__ import annotations

import logging
from typing import Optional, Sequence

import torch
from torch.nn import functional as F

from .continuous_decoder import ContinuousDecoder, DecodeRequest, UnsupportedModel, _Row
from .generation_rules import greedy_choice
from .slot_step import GraphCaptureError, SlotCache, StepGraphs

logger = logging.getLogger(__name__)

#: per-slot state columns of `_state` (int64): the step reads them, the host writes them at joins
_START, _POS, _TOKEN, _BOS, _MAX_NEW, _MIN_NEW = range(6)


def _bucket(n: int, smallest: int) -> int:
    return max(smallest, 1 << max(0, n - 1).bit_length())


class SlotDecoder(ContinuousDecoder):
    """A running batch of greedy decodes in `slots` fixed rows (see the module docstring)."""

    #: self-attention columns and source columns allocated at first; both grow by doubling
    initial_columns, initial_source = 128, 64
    #: fewest rows a step runs (buckets of rows are powers of two from here: fewer graphs to capture)
    smallest_rows = 8

    def __init__(self, model, pad, slots: int, graphs: Optional[bool] = None):
        super().__init__(model, pad)
        if slots < 1:
            raise ValueError(f"slots must be >= 1, got {slots!r}")
        if getattr(self.config, "_attn_implementation", None) != "sdpa":
            raise UnsupportedModel(f"slot decoding needs sdpa attention, not {self.config._attn_implementation!r}")
        self.slots = int(slots)
        graphs = self.device.type == "cuda" if graphs is None else bool(graphs)
        if graphs and self.device.type != "cuda":
            raise ValueError(f"CUDA graphs need a CUDA model, this one is on {self.device}")
        layers = self.decoder.layers
        attn = layers[0].encoder_attn
        self._heads, self._head_dim = attn.num_heads, attn.head_dim
        # the joiners' cross keys/values of every layer in one projection
        self._cross_w = torch.cat([l.encoder_attn.k_proj.weight for l in layers] +
                                  [l.encoder_attn.v_proj.weight for l in layers])
        bias = [l.encoder_attn.k_proj.bias for l in layers] + [l.encoder_attn.v_proj.bias for l in layers]
        self._cross_b = None if bias[0] is None else torch.cat(bias)
        self._rows_cap = _bucket(self.slots, 1)
        long = dict(device=self.device, dtype=torch.long)
        self._state = torch.zeros(self._rows_cap, 6, **long)
        self._state[:, _BOS] = -1
        self._col_t = torch.zeros(1, **long)
        self._graphs = StepGraphs(self.device) if graphs else None
        self._alloc(columns=self.initial_columns, source=self.initial_source)
        self._slot_rows: list[Optional[_Row]] = [None] * self._rows_cap
        self._col = 0  # the column the next step writes
        self.shifts = 0  # column shifts made (each a copy of the self caches)

    # ------------------------------------------------------------------ buffers

    def _alloc(self, columns: int, source: int) -> None:
        """(Re)allocate the caches at `columns` x `source`, keeping what they hold; graphs are recaptured."""
        n, shape = len(self.decoder.layers), (self._rows_cap, self._heads)
        old = (self._self_k, self._self_v, self._cross, self._enc_valid) if hasattr(self, "_self_k") else None
        keys = torch.zeros(n, *shape, columns, self._head_dim, device=self.device, dtype=self.dtype)
        values = torch.zeros_like(keys)
        cross = torch.zeros(2, n, *shape, source, self._head_dim, device=self.device, dtype=self.dtype)
        valid = torch.zeros(self._rows_cap, source, device=self.device, dtype=torch.bool)
        valid[:, 0] = True  # a free row attends somewhere: no row is ever all masked
        if old is not None:
            old_k, old_v, old_cross, old_valid = old
            c, s = min(columns, old_k.shape[3]), min(source, old_cross.shape[4])
            keys[..., :c, :], values[..., :c, :] = old_k[..., :c, :], old_v[..., :c, :]
            cross[..., :s, :], valid[:, :s] = old_cross[..., :s, :], old_valid[:, :s]
        self._self_k, self._self_v, self._cross, self._enc_valid = keys, values, cross, valid
        self._arange = torch.arange(columns, device=self.device)
        self._drop_graphs()

    def _drop_graphs(self) -> None:
        if self._graphs is not None:
            self._graphs.clear()

    @property
    def graphs(self) -> bool:
        """Whether steps replay CUDA graphs (false without CUDA, or after a capture the driver refused)."""
        return self._graphs is not None

    @property
    def captures(self) -> int:
        """CUDA graphs captured so far (each costs a warm-up step and a capture)."""
        return 0 if self._graphs is None else self._graphs.captures

    # ------------------------------------------------------------------ the contract

    def _reset(self) -> None:
        super()._reset()
        if hasattr(self, "_slot_rows"):
            self._slot_rows = [None] * self._rows_cap
            self._col = 0

    @property
    def rows(self) -> list[_Row]:
        return [row for row in self._slot_rows if row is not None]

    @property
    def running(self) -> int:
        return sum(row is not None for row in self._slot_rows)

    def _self_columns(self) -> int:
        return self._col

    def _longest_source(self) -> int:
        return max((len(row.request.input_ids) for row in self.rows), default=0)

    def cached_tokens(self) -> int:
        live = self.running
        return live * (self._col + self._longest_source()) if live else 0

    @torch.inference_mode()
    def join(self, requests: Sequence[DecodeRequest]) -> None:
        if not requests:
            return
        free = [i for i, row in enumerate(self._slot_rows) if row is None][:len(requests)]
        if len(free) < len(requests) or max(free) >= self.slots:
            raise ValueError(f"{len(requests)} sequences cannot join: {self.running} of {self.slots} slots are taken")
        if self._grow_positions(max(r.max_new_tokens for r in requests) + 1):  # a graph cannot grow it
            self._drop_graphs()
        ids, mask = (t.to(self.device) for t in self._pad([r.input_ids for r in requests]))
        width = ids.shape[1]
        if width > self._cross.shape[4]:
            self._alloc(self._self_k.shape[3], _bucket(width, self.initial_source))
        states = self.encoder(input_ids=ids, attention_mask=mask).last_hidden_state
        n, layers = len(requests), len(self.decoder.layers)
        kv = F.linear(states, self._cross_w, self._cross_b)  # (n, width, 2 * layers * d_model)
        kv = kv.view(n, width, 2, layers, self._heads, self._head_dim).permute(2, 3, 0, 4, 1, 5)
        slots = torch.tensor(free, device=self.device)
        self._cross[:, :, slots, :, :width] = kv
        valid = torch.zeros(n, self._enc_valid.shape[1], device=self.device, dtype=torch.bool)
        valid[:, :width] = mask.bool()
        self._enc_valid.index_copy_(0, slots, valid)
        bos = [-1 if r.forced_bos_token_id is None else r.forced_bos_token_id for r in requests]
        state = torch.tensor([[self._col, 0, self.start_id, b, r.max_new_tokens, r.min_new_tokens or 0]
                              for r, b in zip(requests, bos)], device=self.device)
        self._state.index_copy_(0, slots, state)
        for slot, request in zip(free, requests):
            self._slot_rows[slot] = _Row(request, [self.start_id])

    def drop(self, tags: set) -> list[DecodeRequest]:
        dropped = []
        for slot, row in enumerate(self._slot_rows):
            if row is not None and row.request.tag in tags:
                dropped.append(row.request)
                self._free(slot)
        return dropped

    def compact(self) -> None:
        """Nothing to move: finished rows left their slots when they finished."""

    def _free(self, slot: int) -> None:
        self._slot_rows[slot] = None
        if not self.running:
            self._col = 0

    def _make_room(self) -> None:
        """Before a step writes column `col`: shift out the columns no live row attends, or widen."""
        width = self._self_k.shape[3]
        if self._col < width:
            return
        starts = self._state[:, _START].tolist()
        shift = min(starts[i] for i, row in enumerate(self._slot_rows) if row is not None)
        if shift > 0:
            keep = width - shift
            self._self_k[..., :keep, :] = self._self_k[..., shift:, :].clone()
            self._self_v[..., :keep, :] = self._self_v[..., shift:, :].clone()
            self._state[:, _START] -= shift
            self._col -= shift
            self.shifts += 1
        else:
            self._alloc(2 * width, self._cross.shape[4])

    # ------------------------------------------------------------------ one step

    @torch.inference_mode()
    def step(self, compact: bool = True) -> list[tuple[DecodeRequest, list[int]]]:
        if not self.running:
            self._reset()
            return []
        self._make_room()
        top = max(i for i, row in enumerate(self._slot_rows) if row is not None)
        key = (min(_bucket(top + 1, self.smallest_rows), self._rows_cap),  # rows, self columns, source columns
               min(_bucket(self._col + 1, 64), self._self_k.shape[3]),
               min(_bucket(self._longest_source(), 32), self._cross.shape[4]))
        self._col_t.fill_(self._col)
        out = None
        if self._graphs is not None:
            try:
                out = self._graphs.run(key, lambda: self._forward(*key))
            except GraphCaptureError as exc:  # decode on without graphs rather than fail every step
                logger.warning("%s; this replica decodes without CUDA graphs from now on", exc)
                self._graphs = None
        if out is None:
            out = self._forward(*key)  # the same step again (it writes the same cache column): idempotent
        rows = key[0]
        chosen = out.tolist()
        self._state[:rows, _TOKEN] = out
        self._state[:rows, _POS] += 1
        self._col += 1
        finished = []
        for slot, token in enumerate(chosen):
            row = self._slot_rows[slot]
            if row is None:
                continue
            row.ids.append(token)
            if token in self.eos_ids or len(row.ids) - 1 >= row.request.max_new_tokens:
                finished.append((row.request, row.ids))
                self._free(slot)
        return finished

    def _forward(self, rows: int, columns: int, source: int) -> torch.Tensor:
        """The step on the first `rows` slots, attending `columns` self and `source` cross columns:
        shapes and buffers fixed per bucket, no host synchronisation (it is what a graph captures)."""
        dec, state = self.decoder, self._state[:rows]
        hidden = self._embed(state[:, _TOKEN:_TOKEN + 1], state[:, _POS])  # free rows' positions are clamped
        span = self._arange[:columns]
        self_mask = ((span[None, :] >= state[:, _START, None]) & (span[None, :] <= self._col_t))[:, None, None, :]
        cross_mask = self._enc_valid[:rows, None, None, :source]
        cache = SlotCache(self._self_k[:, :rows], self._self_v[:, :rows], self._col_t, columns,
                          self._cross[0, :, :rows, :, :source], self._cross[1, :, :rows, :, :source])
        enc_states = hidden.new_zeros(()).expand(rows, source, hidden.shape[-1])  # the layers read only its shape
        for layer in dec.layers:
            hidden = layer(hidden, self_mask, enc_states, encoder_attention_mask=cross_mask,
                           past_key_values=cache, use_cache=True)
        if self.model_type == "m2m_100":
            hidden = dec.layer_norm(hidden)
        logits = self.model.lm_head(hidden)
        if self.model_type == "marian":
            logits = logits + self.model.final_logits_bias
        scores = logits[:, -1, :].to(dtype=torch.float32)
        return greedy_choice(scores, state[:, _POS], state[:, _BOS], state[:, _MAX_NEW], state[:, _MIN_NEW],
                             self._rules)


__all__ = ["SlotDecoder"]
