"""Iteration-level ("continuous") greedy decoding for encoder-decoder translation models.

`ContinuousDecoder` owns a running batch of sequences. Each `step()` feeds every running
sequence its last token and appends the next one; sequences join between steps (`join`:
their sources are encoded together, their cross-attention keys/values computed once) and
leave as soon as they are finished (end-of-sentence, or their own `max_new_tokens`).
`step(compact=False)` keeps a finished row in the tensors, masked and no longer advancing,
until the next `compact()` or `join()`: its output is returned at once, but the caches are
reshuffled once for many leavers (on a GPU a step costs kernel launches, not arithmetic).

How sequences of different ages share one batch (the outputs must equal single-input
`model.generate`, token for token):

* self-attention cache: one tensor per layer of shape (rows, heads, L, head_dim), rows
  *left-padded*: a row that has fed n tokens holds them in the last n of the L columns; a
  per-row attention mask hides the padding. A joining row starts with L zero (masked)
  columns. When the longest row leaves, columns no row needs are cut off.
* cross-attention: keys/values of each row's encoder states, right-padded to the longest
  source in the batch, with the rows' encoder attention masks.
* both are views of buffers with spare rows and columns (batch_cache.py): a step writes its
  column in place, joiners take spare rows, and leavers' rows are filled by the last rows. On
  the CPU, where padding dominates a step's attention, each row attends to its own columns
  only (row_attention.py).
* positions: every row gets its own position (tokens it has fed), so the decoder's
  position embeddings are computed here, per row (the model's own decoder forward uses one
  offset for the whole batch); the layers themselves are the model's, called as the
  model's decoder calls them, with the model's attention implementation and masks.
* logits: the processors greedy `generate` applies for these models (bad words,
  min_length, min_new_tokens, forced BOS, forced EOS at the last step), per row, in
  `generate`'s order; anything else in the generation config is refused at construction. On the CPU
  the best token comes from the output projection screened in bfloat16, exact (screened_head.py).

Supported: Marian (``marian``) and M2M100/NLLB (``m2m_100``). Pure torch, no threads.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence

import torch
from torch.nn import functional as F

from .batch_cache import BatchCaches, length_groups
from .cache_projection import CacheProjection
from .generation_rules import UnsupportedModel, ban_, forced_choice, generation_rules, greedy_choice
from .hf_loading import max_new_tokens_limit
from .row_attention import RowSpans, use_row_attention
from .screened_head import ScreenedHead

SUPPORTED_MODEL_TYPES = ("marian", "m2m_100")


@dataclass
class DecodeRequest:
    """One sequence to decode: its source token ids, its limits, and an opaque tag for the caller."""

    input_ids: list[int]
    max_new_tokens: int
    min_new_tokens: Optional[int] = None
    forced_bos_token_id: Optional[int] = None
    tag: Any = None


@dataclass
class _Row:
    request: DecodeRequest
    ids: list[int] = field(default_factory=list)  # decoder tokens: start token, then generated ones
    done: bool = False  # finished, still in the tensors until the next compaction


class ContinuousDecoder:
    """A running batch of greedy decodes over one seq2seq model (see the module docstring)."""

    #: whether a step on a CPU uses the screened output projection and the row attention (a subclass with a
    #: step of its own, SlotDecoder, sets False: it would hold the bfloat16 head's copy and reroute attention unused)
    cpu_step_paths = True

    def __init__(self, model, pad: Callable[[list[list[int]]], tuple[torch.Tensor, torch.Tensor]]):
        """`pad(rows)`: token id lists -> (input_ids, attention_mask), padded as the tokenizer pads."""
        model_type = getattr(model.config, "model_type", None)
        if model_type not in SUPPORTED_MODEL_TYPES:
            raise UnsupportedModel(f"continuous decoding supports model types {SUPPORTED_MODEL_TYPES}, "
                                   f"not {model_type!r}")
        self.model, self.model_type = model, model_type
        self.config = model.config
        self.encoder, self.decoder = model.get_encoder(), model.get_decoder()
        self._pad = pad
        rules = generation_rules(model)
        self.eos_ids, self.start_id, self.min_length = rules["eos"], rules["start"], rules["min_length"]
        self.forced_eos, self.bad_ids = rules["forced_eos"], rules["bad"]
        #: longest output the decoder's position table allows (Marian's is fixed; M2M100's grows)
        self.max_new_tokens_limit: Optional[int] = max_new_tokens_limit(model)
        self.device = next(model.parameters()).device
        self.dtype = next(model.parameters()).dtype
        long = dict(device=self.device, dtype=torch.long)
        #: what greedy_choice applies, as tensors on the model's device
        self._rules = {"eos_t": torch.tensor(self.eos_ids, **long), "min_length": self.min_length,
                       "bad_t": torch.tensor(self.bad_ids, **long) if self.bad_ids else None,
                       "forced_eos": self.forced_eos}
        #: the output projection screened in bfloat16 (CPU, float32, blocked weights; screened_head.py) or None
        on_cpu = self.device.type == "cpu" and self.cpu_step_paths
        self.screen = ScreenedHead.for_model(model) if on_cpu else None
        self._head = model.get_output_embeddings()  # the full layer, whatever greedy `generate` swaps in meanwhile
        #: the cross-attention modules' ids where a step's attention may go row by row (CPU; row_attention.py)
        self._cross_modules = use_row_attention(self.decoder) if on_cpu else frozenset()
        self._reset()

    # ------------------------------------------------------------------ state

    def _reset(self) -> None:
        self._rows: list[_Row] = []  # every row of the tensors, finished ones not yet compacted included
        self._cache = BatchCaches(len(self.decoder.layers))  # written in place (batch_cache.py)

    @property
    def rows(self) -> list[_Row]:
        """The rows still decoding."""
        return [row for row in self._rows if not row.done]

    @property
    def running(self) -> int:
        return sum(not row.done for row in self._rows)

    @property
    def row_attention(self) -> bool:
        """Whether steps may compute attention row by row (row_attention.py)."""
        return bool(self._cross_modules)

    def _self_columns(self) -> int:
        return self._cache.self_columns

    def cached_tokens(self) -> int:
        """Token slots the caches hold now (padding included): rows x (self columns + source columns)."""
        return len(self._rows) * (self._self_columns() + self._cache.source_columns)

    def projected_tokens(self, joining: Sequence[DecodeRequest] = ()) -> int:
        """Most token slots the caches can reach (padding included) if `joining` joins now and none leaves."""
        return self.projection(joining=joining).tokens

    def projection(self, keep: Callable[[DecodeRequest], bool] = lambda request: True, joining=()) -> CacheProjection:
        """`projected_tokens`' bound over the running rows `keep` keeps, for joiners to be added one at a time."""
        return CacheProjection.over([(self._join_column(r), r.request) for r in self.rows if keep(r.request)],
                                    self._join_column(), joining)

    def _join_column(self, row: Optional[_Row] = None) -> int:
        """The column `row` started at in `cached_tokens`' layout (None: one joining now); 0: left-padded rows."""
        return 0

    # ------------------------------------------------------------------ joining and leaving

    @torch.inference_mode()
    def join(self, requests: Sequence[DecodeRequest]) -> None:
        """Encode `requests` and add them to the running batch; they take their first step with the others
        at the next `step()`. Sources of similar length are encoded together (`length_groups`)."""
        if not requests:
            return
        self.compact()
        for group in length_groups(requests):
            ids, mask = (t.to(self.device) for t in self._pad([r.input_ids for r in group]))
            states = self.encoder(input_ids=ids, attention_mask=mask).last_hidden_state
            cross = []
            for layer in self.decoder.layers:
                attn = layer.encoder_attn
                shape = (states.shape[0], states.shape[1], -1, attn.head_dim)
                cross.append((attn.k_proj(states).view(shape).transpose(1, 2),
                              attn.v_proj(states).view(shape).transpose(1, 2)))
            self._cache.join(cross, mask)
            self._rows += [_Row(r, [self.start_id]) for r in group]

    def drop(self, tags: set) -> list[DecodeRequest]:
        """Remove the rows whose request tag is in `tags` (cancelled); returns their requests."""
        keep = [i for i, row in enumerate(self._rows) if row.request.tag not in tags]
        dropped = [row.request for row in self._rows if row.request.tag in tags and not row.done]
        if len(keep) < len(self._rows):
            self._keep(keep)
        return dropped

    def warm_up(self, columns: int = 0, source: int = 0) -> int:
        """Before the first request: ready for `columns` - 1 output tokens (SlotDecoder's graphs); graphs captured."""
        return 0

    def compact(self) -> None:
        """Take the finished rows out of the tensors (and the self-attention columns no row needs)."""
        if any(row.done for row in self._rows):
            self._keep([i for i, row in enumerate(self._rows) if not row.done])

    @torch.inference_mode()
    def _keep(self, keep: list[int]) -> None:
        if not keep:
            self._reset()
            return
        columns = max(len(self._rows[i].ids) - 1 for i in keep)  # tokens fed: cached self columns
        self._rows = [self._rows[i] for i in self._cache.keep(keep, columns)]

    # ------------------------------------------------------------------ one step

    @torch.inference_mode()
    def step(self, compact: bool = True) -> list[tuple[DecodeRequest, list[int]]]:
        """One decoder step for every running row; returns the rows it finished: (request, decoder
        ids: start token, generated tokens, end-of-sentence if emitted). They leave the tensors now
        with `compact` (or when no row is left running), else at the next `compact()` / `join()`."""
        if not self.running:
            self._reset()
            return []
        from transformers.cache_utils import DynamicCache, DynamicLayer, EncoderDecoderCache
        from transformers.masking_utils import create_bidirectional_mask, create_causal_mask

        rows, dev = self._rows, self.device
        fed = torch.tensor([len(r.ids) - 1 for r in rows], device=dev)  # each row's position
        tokens = torch.tensor([[r.ids[-1]] for r in rows], device=dev)
        self._grow_positions(max(len(r.ids) for r in rows))
        hidden = self._embed(tokens, fed)
        columns = self._self_columns()
        self_mask = (torch.arange(columns + 1, device=dev)[None, :] >= (columns - fed)[:, None]).long()

        def layers(kvs) -> list:
            made = []
            for keys, values in kvs:
                layer = DynamicLayer()
                layer.lazy_initialization(keys, values)
                layer.keys, layer.values = keys, values
                made.append(layer)
            return made
        self_cache, cross_cache = DynamicCache(), DynamicCache()
        self_cache.layers, cross_cache.layers = self._cache.self_layers, layers(self._cache.cross_kv())
        cache = EncoderDecoderCache(self_cache, cross_cache)
        cache.is_updated = {i: True for i in range(len(self._cache.cross))}
        # The layers read cross keys/values from the cache; the states only have to have their shape.
        enc_states = hidden.new_zeros(()).expand(len(rows), self._cache.source_columns, hidden.shape[-1])
        causal = create_causal_mask(config=self.config, inputs_embeds=hidden, attention_mask=self_mask,
                                    past_key_values=self_cache)
        cross_mask = create_bidirectional_mask(config=self.config, inputs_embeds=hidden,
                                               attention_mask=self._cache.source_mask, encoder_hidden_states=enc_states)
        spans = {"row_spans": RowSpans(tuple(len(r.ids) for r in rows), tuple(self._cache.source_lengths),
                                       self._cross_modules)} if self._cross_modules else {}
        for layer in self.decoder.layers:
            hidden = layer(hidden, causal, enc_states, encoder_attention_mask=cross_mask,
                           past_key_values=cache, use_cache=True, **spans)
        if self.model_type == "m2m_100":
            hidden = self.decoder.layer_norm(hidden)
        next_ids = self._choose(hidden).tolist()

        finished = []
        for row, token in zip(rows, next_ids):
            if row.done:  # masked passenger until the next compaction: it keeps its position
                continue
            row.ids.append(token)
            if token in self.eos_ids or len(row.ids) - 1 >= row.request.max_new_tokens:
                row.done = True
                finished.append((row.request, row.ids))
        if finished and (compact or not self.running):
            self.compact()
        return finished

    def _position_table_size(self) -> int:
        """Positions the decoder's position table holds now."""
        table = self.decoder.embed_positions
        if self.model_type == "marian":
            return int(table.weight.shape[0])
        return int(table.weights.shape[0]) - table.padding_idx - 1

    def _grow_positions(self, positions: int) -> bool:
        """M2M100's sinusoidal table grows on demand inside its own forward; the decoders embed positions
        themselves, so they grow it first, doubling (few regrowths). True if it grew (its tensor changed)."""
        if self.model_type == "marian" or positions <= self._position_table_size():
            return False  # Marian's is fixed: the scheduler refuses outputs longer than it
        table = self.decoder.embed_positions
        positions = max(positions, 2 * self._position_table_size())
        table.make_weights(positions + table.padding_idx + 1 + table.offset, table.embedding_dim, table.padding_idx)
        return True

    def _embed(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Token + position embeddings of one token per row, each at its own position (as the
        model's decoder computes them for a batch whose rows all sit at that position). Positions past
        the table (rows nothing decodes any more) are clamped: no host synchronisation, so a CUDA graph
        can replay it; `_grow_positions` first for the rows that decode."""
        dec = self.decoder
        if self.model_type == "marian":
            table = dec.embed_positions.weight
            where = positions.clamp(max=table.shape[0] - 1)[:, None]
            return dec.embed_tokens(tokens) * dec.embed_scale + F.embedding(where, table)
        table = dec.embed_positions
        index = (positions + table.padding_idx + 1).clamp(max=table.weights.shape[0] - 1)
        position = table.weights.index_select(0, index).view(len(tokens), 1, -1).to(tokens.device)
        return dec.embed_tokens(tokens) + position

    def _choose(self, hidden: torch.Tensor) -> torch.Tensor:
        """`generate`'s greedy choice per row (greedy_choice); from the screened output projection where it decides."""
        pos, bos, max_new, min_new = torch.tensor(
            [[len(r.ids) - 1, -1 if r.request.forced_bos_token_id is None else r.request.forced_bos_token_id,
              r.request.max_new_tokens, r.request.min_new_tokens or 0] for r in self._rows], device=hidden.device).unbind(1)
        ban = lambda scores: ban_(scores, pos, min_new, self._rules)  # noqa: E731
        best = None if self.screen is None else self.screen.argmax(hidden[:, -1], ban)
        if best is None:
            bias = self.model.final_logits_bias[0] if self.model_type == "marian" else 0
            best = ban((self._head(hidden)[:, -1, :] + bias).to(dtype=torch.float32)).argmax(dim=-1)
        return forced_choice(best, pos, bos, max_new, self._rules)


__all__ = ["ContinuousDecoder", "DecodeRequest", "SUPPORTED_MODEL_TYPES", "UnsupportedModel", "greedy_choice"]
