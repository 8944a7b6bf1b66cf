"""The CPU continuous decoder's self-attention cache appends each step's column in place
(deployments/backends/self_cache.py)."""

from __future__ import annotations

import torch

from deployments.backends.continuous_decoder import ContinuousDecoder, DecodeRequest
from deployments.backends.self_cache import SPARE_COLUMNS, GrowingLayer


def _column(rows: int = 3, heads: int = 2, head_dim: int = 4) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(rows, heads, 1, head_dim), torch.randn(rows, heads, 1, head_dim)


def test_columns_are_written_in_place_until_the_spare_ones_run_out():
    layer, written = GrowingLayer(), []
    for step in range(SPARE_COLUMNS + 3):
        keys, values = _column()
        written.append((keys, values))
        got_keys, got_values = layer.update(keys, values)
        if step == 0:
            buffer = layer._key_buffer.data_ptr()
        # the views hold every column so far, as torch.cat would have
        assert torch.equal(got_keys, torch.cat([k for k, _ in written], dim=2))
        assert torch.equal(got_values, torch.cat([v for _, v in written], dim=2))
        assert layer.get_seq_length() == layer.columns == step + 1
        if step < SPARE_COLUMNS + 1:  # the first buffer has 1 + SPARE_COLUMNS columns
            assert layer._key_buffer.data_ptr() == buffer, f"copied at step {step}"
    assert layer._key_buffer.data_ptr() != buffer  # grown once it was full
    assert layer._key_buffer.shape[2] == SPARE_COLUMNS + 2 + SPARE_COLUMNS


def test_a_held_cache_grows_from_where_it_was_cut():
    layer = GrowingLayer()
    keys, values = torch.randn(2, 2, 5, 4), torch.randn(2, 2, 5, 4)
    layer.hold(keys, values)  # a join or leave hands the layer new tensors, no spare column
    new_keys, new_values = _column(rows=2)
    got_keys, got_values = layer.update(new_keys, new_values)
    assert torch.equal(got_keys, torch.cat([keys, new_keys], dim=2))
    assert torch.equal(got_values, torch.cat([values, new_values], dim=2))
    assert layer.columns == 6 and layer._key_buffer.shape[2] == 6 + SPARE_COLUMNS


def test_the_decoder_steps_without_copying_its_cache(marian_backend):
    decoder: ContinuousDecoder = marian_backend.continuous_decoder()
    decoder.join([DecodeRequest([5, 9, 17, 2], 20, 20), DecodeRequest([7, 3, 2], 20, 20)])
    decoder.step()
    buffers = [layer._key_buffer.data_ptr() for layer in decoder._self]
    for _ in range(5):
        decoder.step()
    assert [layer._key_buffer.data_ptr() for layer in decoder._self] == buffers
    assert decoder._self_columns() == 6
