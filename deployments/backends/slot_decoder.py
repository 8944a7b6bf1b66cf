"""Continuous greedy decoding in fixed slots, each step one CUDA graph replay (the GPU's engine).

On a GPU a step of a 400M-parameter model is ~3 ms of kernels behind 7-9 ms of Python launching them, and
`ContinuousDecoder` changes every shape at every step. `SlotDecoder` keeps its contract (join, step, drop, compact) on
tensors whose shapes change only in coarse buckets, so a step is one graph replay:

* **slots:** a sequence takes the lowest free row of buffers sized for `slots` sequences and keeps it until it finishes;
  a finished or dropped row is only marked free (nothing is copied). A step runs the first R rows, R the power of two
  over the highest row in use.
* **self-attention cache:** one buffer (layers, rows, heads, W, head_dim) per keys and values. Every step writes its new
  column at the same index `col` for all rows; a row that joined at column s attends to columns s..col, a per-row mask
  hides the rest. Attention weights do not depend on a key's column (these models add absolute positions to the inputs),
  so this is the left-padded layout of `ContinuousDecoder` without the copies. When `col` reaches W the columns no live
  row needs are shifted out if they are W/8 or more, else W doubles; a step attends to the first C columns (C: the
  power of two over col).
* **cross-attention:** keys/values of every layer in one buffer (2, layers, rows, heads, S, head_dim); a step reads the
  first power-of-two columns over the longest live source.
* **joins:** joiners are padded to a bucket (rows, and columns from 32: powers of two) in fixed buffers; their encoder
  pass, one projection (all layers' k/v weights concatenated) and the copy into their slots are one graph per bucket
  (padding rows write a scratch row no step reads). Eager, a step with joiners took 5x a plain one
  (docs/benchmarks/gpu-run-h100-graphs).
* **warm-up:** `warm_up()` (at replica start) sizes the buffers for the longest output and captures all.
* **the step:** embeddings, the model's own decoder layers (sdpa, boolean masks), its output projection and greedy
  `generate`'s logits processors as tensor ops: one graph per (rows, columns, source) bucket, captured on first use. The
  host reads the chosen ids, the step's one synchronisation.

Outputs equal single-input `generate` (tests/unit/test_continuous_decoder.py); eager without CUDA, as CI runs it."""

from __future__ import annotations

from typing import Optional, Sequence

import torch
from torch.nn import functional as F

from .continuous_decoder import ContinuousDecoder, DecodeRequest, UnsupportedModel, _Row
from .cpu_linears import dense_weight
from .generation_rules import greedy_choice
from .slot_step import SlotCache, StepGraphs, bucket, pad_joiners, sizes

#: per-slot state columns of `_state` (int64): the step reads them, the host writes them at joins
_START, _POS, _TOKEN, _BOS, _MAX_NEW, _MIN_NEW = range(6)


class SlotDecoder(ContinuousDecoder):
    """A running batch of greedy decodes in `slots` fixed rows (see the module docstring)."""

    #: self-attention columns and source columns allocated at first; both grow by doubling
    initial_columns, initial_source = 128, 64
    #: fewest rows a step runs (buckets of rows are powers of two from here: fewer graphs to capture)
    smallest_rows, cpu_step_paths = 8, False  # the step is its own: no screened head, no row attention

    def __init__(self, model, pad, slots: int, graphs: Optional[bool] = None):
        super().__init__(model, pad)
        if slots < 1:
            raise ValueError(f"slots must be >= 1, got {slots!r}")
        if getattr(self.config, "_attn_implementation", None) != "sdpa":
            raise UnsupportedModel(f"slot decoding needs sdpa attention, not {self.config._attn_implementation!r}")
        self.slots, self._widest_join = int(slots), getattr(self.config, "max_position_embeddings", 0) or 1 << 20
        graphs = self.device.type == "cuda" if graphs is None else bool(graphs)
        if graphs and self.device.type != "cuda":
            raise ValueError(f"CUDA graphs need a CUDA model, this one is on {self.device}")
        attn = [layer.encoder_attn for layer in self.decoder.layers]
        self._heads, self._head_dim = attn[0].num_heads, attn[0].head_dim
        # the joiners' cross keys/values of every layer in one projection (plain weights: cpu_linears.py)
        self._cross_w = torch.cat([dense_weight(a.k_proj) for a in attn] + [dense_weight(a.v_proj) for a in attn])
        bias = [a.k_proj.bias for a in attn] + [a.v_proj.bias for a in attn]
        self._cross_b = None if bias[0] is None else torch.cat(bias)
        self._rows_cap = bucket(self.slots, 1)
        long = dict(device=self.device, dtype=torch.long)
        self._state = torch.zeros(self._rows_cap, 6, **long)
        self._state[:, _BOS] = -1
        self._col_t = torch.zeros(1, **long)
        self._pad_id = int(pad([[0], []])[0][1, 0])  # what `pad` fills an empty row with
        #: the joiners' slots; rows past them point at the scratch row `_rows_cap`
        self._join_slots = torch.full((self._rows_cap,), self._rows_cap, **long)
        self._graphs = StepGraphs(self.device, graphs, "the decoding step")
        self._join_graphs = StepGraphs(self.device, graphs, "the joiners' encoder pass")  # refused on its own
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
        cross = torch.zeros(2, n, self._rows_cap + 1, *shape[1:], source, self._head_dim,  # + a scratch row
                            device=self.device, dtype=self.dtype)
        valid = torch.zeros(self._rows_cap, source, device=self.device, dtype=torch.bool)
        valid[:, 0] = True  # a free row attends somewhere: no row is ever all masked
        if old is not None:
            old_k, old_v, old_cross, old_valid = old
            c, s = min(columns, old_k.shape[3]), min(source, old_cross.shape[4])
            keys[..., :c, :], values[..., :c, :] = old_k[..., :c, :], old_v[..., :c, :]
            cross[..., :s, :], valid[:, :s] = old_cross[..., :s, :], old_valid[:, :s]
        self._self_k, self._self_v, self._cross, self._enc_valid = keys, values, cross, valid
        self._arange = torch.arange(columns, device=self.device)
        self._join_ids = torch.full((self._rows_cap, source), self._pad_id, device=self.device, dtype=torch.long)
        self._join_mask = torch.zeros(self._rows_cap, source, device=self.device, dtype=torch.bool)
        self._graphs.clear(), self._join_graphs.clear()

    @property
    def graphs(self) -> bool:
        """Whether steps replay CUDA graphs (false without CUDA, or after a capture the driver refused)."""
        return self._graphs.enabled

    @property
    def captures(self) -> int:
        """CUDA graphs captured so far, steps' and joins' (each costs a warm-up run and a capture)."""
        return self._graphs.captures + self._join_graphs.captures

    @torch.inference_mode()
    def warm_up(self, columns: int = 0, source: int = 0) -> int:
        """Size the buffers for outputs of `columns` - 1 tokens (a live row never spans more: no widening)
        and sources of `source`, then capture every bucket they allow (steps: rows x columns x source; joins:
        rows x source); returns how many. Only while nothing decodes (it writes free rows' column 0)."""
        if self.running or not (self._graphs.enabled or self._join_graphs.enabled):
            return 0
        # columns: 8/7 of the longest row's in whole 64s (a shift frees W/8: `_make_room`); sources: a power of two
        have, columns = (self._self_k.shape[3], self._cross.shape[4]), -(-8 * columns // 7)
        if (want := (max(-(-columns // 64) * 64, have[0]), max(bucket(source, 1), have[1]))) != have:
            self._alloc(*want)
        before, rows, source = self.captures, self._rows_cap, self._cross.shape[4]
        self._join_slots.fill_(rows), self._join_mask[:, 0].fill_(True)  # rows to the scratch row, unmasked
        for width in sizes(min(32, source), source):
            for n in sizes(1, rows):
                self._encode_joiners(n, min(width, self._widest_join))  # (the encoder's positions)
            for columns in sizes(min(64, self._self_k.shape[3]), self._self_k.shape[3]):
                for r in sizes(min(self.smallest_rows, rows), rows):
                    self._run_step((r, columns, width))
        self._reset()
        return self.captures - before

    # ------------------------------------------------------------------ the contract

    def _reset(self) -> None:
        super()._reset()
        if hasattr(self, "_slot_rows"):
            self._slot_rows, self._col = [None] * self._rows_cap, 0

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
        """As ContinuousDecoder counts them: live rows x (columns since the earliest live one joined + source)."""
        first = min((self._col + 1 - len(r.ids) for r in self.rows), default=self._col)
        return self.running * (self._col - first + self._longest_source())

    def _join_column(self, row: Optional[_Row] = None) -> int:
        """The rows share the column `_col`: a row's columns run from the one it joined at (for `projected_tokens`,
        counted from the earliest live row's)."""
        return self._col if row is None else self._col + 1 - len(row.ids)

    @torch.inference_mode()
    def join(self, requests: Sequence[DecodeRequest]) -> None:
        if not requests:
            return
        free = [i for i, row in enumerate(self._slot_rows) if row is None][:len(requests)]
        if len(free) < len(requests) or max(free) >= self.slots:
            raise ValueError(f"{len(requests)} sequences cannot join: {self.running} of {self.slots} slots are taken")
        if self._grow_positions(max(r.max_new_tokens for r in requests) + 1):  # a graph cannot grow it
            self._graphs.clear(), self._join_graphs.clear()
        ids, mask = self._pad([r.input_ids for r in requests])
        n, width = ids.shape
        if width > self._cross.shape[4]:
            self._alloc(self._self_k.shape[3], bucket(width, self.initial_source))
        columns = min(bucket(width, 32), self._cross.shape[4], self._widest_join)  # the encoder's positions
        rows = min(bucket(n, 1), self._rows_cap)
        staged = pad_joiners(ids, mask, free, rows, columns, self._cross.shape[4], self._pad_id, self._rows_cap)
        for buffer, host in zip((self._join_ids[:rows, :columns], self._join_mask[:rows], self._join_slots[:rows]),
                                staged):
            buffer.copy_(host)
        self._encode_joiners(rows, columns)
        self._enc_valid.index_copy_(0, slots := self._join_slots[:n], self._join_mask[:n])
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
        """Before a step writes column `col`: shift out the columns no live row attends if that frees an eighth of
        them or more, else widen (a shift copies the self caches: with rows as long as the buffer, one a step)."""
        width = self._self_k.shape[3]
        if self._col < width:
            return
        starts = self._state[:, _START].tolist()
        shift = min(starts[i] for i, row in enumerate(self._slot_rows) if row is not None)
        if 8 * shift >= width:
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
        key = (min(bucket(top + 1, self.smallest_rows), self._rows_cap),  # rows, self columns, source columns
               min(bucket(self._col + 1, 64), self._self_k.shape[3]),
               min(bucket(self._longest_source(), 32), self._cross.shape[4]))
        self._col_t.fill_(self._col)
        out = self._run_step(key)
        rows, chosen = key[0], out.tolist()
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

    def _run_step(self, key: tuple[int, int, int]) -> torch.Tensor:
        return self._graphs(key, lambda: self._forward(*key))

    def _encode_joiners(self, rows: int, columns: int) -> None:
        self._join_graphs((rows, columns), lambda: self._encode(rows, columns))

    def _encode(self, rows: int, columns: int) -> None:
        """The joiners' encoder pass on `rows` x `columns` of the join buffers, their cross keys/values
        written into their slots: no host sync (the model's mask code would check a 2-D mask on the host)."""
        ids, valid = self._join_ids[:rows, :columns], self._join_mask[:rows, :columns]
        states = self.encoder(input_ids=ids, attention_mask=valid[:, None, None, :]).last_hidden_state
        kv = F.linear(states, self._cross_w, self._cross_b)  # (rows, columns, 2 * layers * d_model)
        kv = kv.view(rows, columns, 2, len(self.decoder.layers), self._heads, self._head_dim)
        self._cross[:, :, self._join_slots[:rows], :, :columns] = kv.permute(2, 3, 0, 4, 1, 5)

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
