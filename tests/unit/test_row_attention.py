"""The CPU continuous decoder's attention row by row where padding dominates (deployments/backends/row_attention.py)."""

from __future__ import annotations

import pytest
import torch
from torch.nn import functional as F

from deployments.backends import row_attention
from deployments.backends.continuous_decoder import DecodeRequest
from deployments.backends.row_attention import ROW_ATTENTION, RowSpans, row_attention as attend


class _Module:  # what the attention function reads of its module
    pass


def _padded(lengths: list[int], width: int, left: bool, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    query = torch.randn(len(lengths), 4, 1, 8, generator=generator)
    key, value = (torch.randn(len(lengths), 4, width, 8, generator=generator) for _ in range(2))
    mask = torch.zeros(len(lengths), 1, 1, width, dtype=torch.bool)
    for i, n in enumerate(lengths):
        mask[i, ..., width - n:] = True if left else False
        mask[i, ..., :n] = mask[i, ..., :n] if left else True
    return query, key, value, mask


@pytest.mark.parametrize("cross", [False, True])
def test_each_row_attends_to_its_own_columns_only(cross):
    lengths, width = [3, 40, 1, 17], 40
    query, key, value, mask = _padded(lengths, width, left=not cross)
    module = _Module()
    spans = RowSpans(own=tuple(lengths), source=tuple(lengths), cross=frozenset({id(module)} if cross else ()))
    out, _ = attend(module, query, key, value, mask, row_spans=spans, scaling=0.3)
    masked = F.scaled_dot_product_attention(query, key, value, attn_mask=mask, scale=0.3).transpose(1, 2)
    torch.testing.assert_close(out, masked, rtol=1e-6, atol=1e-6)
    for i, n in enumerate(lengths):  # row by row: bit for bit what a batch of one over its own columns gives
        own = slice(0, n) if cross else slice(width - n, width)
        alone = F.scaled_dot_product_attention(query[i:i + 1], key[i:i + 1, :, own], value[i:i + 1, :, own], scale=0.3)
        assert torch.equal(out[i], alone.transpose(1, 2)[0])


def test_batched_where_padding_is_small_or_spans_are_absent():
    lengths, width = [38, 40, 39, 37], 40  # 1.5 padded columns per row: not worth a call per row
    query, key, value, mask = _padded(lengths, width, left=True)
    module = _Module()
    assert not RowSpans.worth(tuple(lengths), width) and RowSpans.worth((1, 40), 40)
    spans = RowSpans(own=tuple(lengths), source=(), cross=frozenset())
    batched = F.scaled_dot_product_attention(query, key, value, attn_mask=mask, scale=0.3).transpose(1, 2)
    for given in (spans, None):
        out, _ = attend(module, query, key, value, mask, row_spans=given, scaling=0.3)
        assert torch.equal(out, batched)


def test_the_decoder_routes_only_its_own_attention(marian_backend, monkeypatch):
    model = marian_backend.model
    decoder = marian_backend.continuous_decoder()
    layers = model.get_decoder().layers
    assert all(m.config._attn_implementation == ROW_ATTENTION for layer in layers
               for m in (layer.self_attn, layer.encoder_attn))
    assert model.config._attn_implementation == "sdpa"  # the model, its encoder and generate's masks: unchanged
    assert all(layer.self_attn.config._attn_implementation == "sdpa" for layer in model.get_encoder().layers)
    calls = []
    sdpa = F.scaled_dot_product_attention
    monkeypatch.setattr(row_attention, "MIN_PADDING_PER_ROW", -10**9)  # row by row at every step
    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention",
                        lambda q, *args, **kwargs: calls.append(q.shape[0]) or sdpa(q, *args, **kwargs))
    decoder.join([DecodeRequest([5, 9, 17, 2], 8, 8), DecodeRequest([7, 3, 2], 8, 8)])
    assert calls == [2] * len(model.get_encoder().layers)  # the joiners' encoder pass: batched, as before
    calls.clear()
    decoder.step()
    assert calls and set(calls) == {1} and len(calls) == 2 * 2 * len(layers)  # rows x (self, cross) x layers


def test_the_model_and_its_sub_configs_keep_their_attention():
    """The decoder's modules get a config of their own: setting its attention also sets its sub-configs, and
    a shallow copy would share those with the model's config."""
    from types import SimpleNamespace

    from transformers import PretrainedConfig

    class WithSub(PretrainedConfig):
        sub_configs = {"extra": PretrainedConfig}

    config = WithSub()
    config.extra = PretrainedConfig()
    config._attn_implementation = "sdpa"
    layers = [SimpleNamespace(self_attn=SimpleNamespace(config=config), encoder_attn=SimpleNamespace(config=config))]
    cross = row_attention.use_row_attention(SimpleNamespace(layers=layers))
    assert cross == frozenset({id(layers[0].encoder_attn)})
    assert layers[0].self_attn.config._attn_implementation == ROW_ATTENTION
    assert config._attn_implementation == "sdpa" and config.extra._attn_implementation == "sdpa"


def test_slot_decoding_leaves_the_cpu_step_paths_alone(make_backend, tiny_marian_dir):
    from deployments.backends.slot_decoder import SlotDecoder

    backend = make_backend(tiny_marian_dir)
    decoder = SlotDecoder(backend.model, backend._pad, slots=4, graphs=False)
    assert decoder.screen is None and not decoder.row_attention
    assert all(m.config._attn_implementation == "sdpa" for layer in backend.model.get_decoder().layers
               for m in (layer.self_attn, layer.encoder_attn))
