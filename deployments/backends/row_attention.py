"""Attention for the CPU continuous decoder's steps: each row over its own columns, where padding would dominate.

The running batch's caches are padded: self-attention to the row that has fed the most tokens (left), cross-
attention to the longest source (right). A step's attention reads every padded column of every row, and on the
CPU that read is the cost: one query per row makes attention a pass over the keys and values, at a few GB/s
from memory (Marian-sized, 13 rows x 51 columns: ~0.5 ms per call, 12 calls a step). When a 200-token sentence
decodes among sentences of 20, most of what each call reads is padding.

`row_attention` (a transformers attention function, installed on the decoder's attention modules by
`use_row_attention`) computes each row's attention over its own columns only, one SDPA call per row, when the
step passes `row_spans` and the padding it saves outweighs the calls (`RowSpans.worth`). A row's call is then
the very computation a single-sentence decode makes (batch of one, its own columns, no mask). Otherwise, and for
every call that does not pass `row_spans` (the encoder, `generate`), it is transformers' SDPA attention unchanged.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward

#: the attention implementation's name in transformers' registry
ROW_ATTENTION = "serve_app_rows"
#: per-row calls pay for themselves where the padding they skip is at least this many columns per row
#: (one call costs about what reading 15 padded columns of a Marian-sized row does)
MIN_PADDING_PER_ROW = 16


@dataclass(frozen=True)
class RowSpans:
    """One decoding step's rows: `own[i]` self-attention columns (the last ones; this step's included) and
    `source[i]` cross-attention columns (the first ones); `cross` the cross-attention modules' ids."""

    own: tuple[int, ...]
    source: tuple[int, ...]
    cross: frozenset

    @staticmethod
    def worth(lengths: tuple[int, ...], width: int) -> bool:
        return len(lengths) * width - sum(lengths) >= MIN_PADDING_PER_ROW * len(lengths)


def row_attention(module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attention_mask, *args,
                  row_spans: RowSpans | None = None, scaling: float | None = None, **kwargs):
    if row_spans is not None and query.shape[2] == 1:
        cross, width = id(module) in row_spans.cross, key.shape[2]
        lengths = row_spans.source if cross else row_spans.own
        if len(lengths) == query.shape[0] and RowSpans.worth(lengths, width):
            spans = [(0, n) if cross else (width - n, width) for n in lengths]
            out = torch.cat([torch.nn.functional.scaled_dot_product_attention(
                query[i:i + 1], key[i:i + 1, :, a:b], value[i:i + 1, :, a:b], scale=scaling)
                for i, (a, b) in enumerate(spans)])
            return out.transpose(1, 2).contiguous(), None
    return sdpa_attention_forward(module, query, key, value, attention_mask, *args, scaling=scaling, **kwargs)


def use_row_attention(decoder) -> frozenset:
    """Route `decoder`'s attention modules (self and cross, of every layer) through `row_attention`, if they
    use SDPA; returns the cross-attention modules' ids (empty: not routed). Other modules are untouched."""
    layers = list(decoder.layers)
    modules = [m for layer in layers for m in (layer.self_attn, layer.encoder_attn)]
    if any(m.config._attn_implementation not in ("sdpa", ROW_ATTENTION) for m in modules):
        return frozenset()
    AttentionInterface.register(ROW_ATTENTION, row_attention)
    # a deep copy: the setter also sets the config's sub-configs, which a shallow copy would share with the model
    config = copy.deepcopy(modules[0].config)
    config._attn_implementation = ROW_ATTENTION
    for module in modules:
        module.config = config
    return frozenset(id(layer.encoder_attn) for layer in layers)


__all__ = ["MIN_PADDING_PER_ROW", "ROW_ATTENTION", "RowSpans", "row_attention", "use_row_attention"]
