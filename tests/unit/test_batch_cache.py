"""The CPU continuous decoder's caches write steps, joins and leaves in place
(deployments/backends/batch_cache.py)."""

from __future__ import annotations

import random

import torch

from deployments.backends.batch_cache import (SPARE_COLUMNS, SPARE_ROWS, BatchCaches, GrowingLayer, RowBuffer,
                                              leave_moves, length_groups)
from deployments.backends.continuous_decoder import ContinuousDecoder, DecodeRequest


def _column(rows: int = 3, heads: int = 2, head_dim: int = 4) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(rows, heads, 1, head_dim), torch.randn(rows, heads, 1, head_dim)


def test_columns_are_written_in_place_until_the_spare_ones_run_out():
    layer, written = GrowingLayer(), []
    for step in range(SPARE_COLUMNS + 3):
        keys, values = _column()
        written.append((keys, values))
        got_keys, got_values = layer.update(keys, values)
        if step == 0:
            buffer = layer.key_rows.buffer.data_ptr()
        # the views hold every column so far, as torch.cat would have
        assert torch.equal(got_keys, torch.cat([k for k, _ in written], dim=2))
        assert torch.equal(got_values, torch.cat([v for _, v in written], dim=2))
        assert layer.get_seq_length() == layer.columns == step + 1
        if step < SPARE_COLUMNS:  # the first buffer has SPARE_COLUMNS columns
            assert layer.key_rows.buffer.data_ptr() == buffer, f"copied at step {step}"
    assert layer.key_rows.buffer.data_ptr() != buffer  # grown once it was full
    assert layer.key_rows.buffer.shape[2] == SPARE_COLUMNS + 1 + SPARE_COLUMNS


class _Reference:
    """What the buffers must equal: the rows as separate tensors, right-padded (cross) or left-padded (self)."""

    def __init__(self, left: bool) -> None:
        self.left, self.rows = left, []

    def tensor(self, columns: int) -> torch.Tensor:
        pad = lambda r: torch.nn.functional.pad(r, (0, 0, columns - r.shape[1], 0) if self.left  # noqa: E731
                                                else (0, 0, 0, columns - r.shape[1]))
        return torch.stack([pad(r[:, -columns:] if self.left else r[:, :columns]) for r in self.rows])


def test_joins_and_leaves_equal_padding_and_selecting_the_rows():
    rng, heads, head_dim = random.Random(0), 2, 3
    cross, cross_ref = RowBuffer(), _Reference(left=False)
    own, own_ref = RowBuffer(SPARE_COLUMNS), _Reference(left=True)
    for round_ in range(40):
        joiners = [torch.randn(heads, rng.randint(1, 9), head_dim) for _ in range(rng.randint(1, 4))]
        width = max(r.shape[1] for r in joiners)
        cross.append_rows(torch.stack([torch.nn.functional.pad(r, (0, 0, 0, width - r.shape[1])) for r in joiners]))
        cross_ref.rows += joiners
        if own.buffer is None:
            own.append_rows(torch.zeros(len(joiners), heads, 0, head_dim))
        else:
            own.append_empty_rows(len(joiners))
        own_ref.rows += [torch.zeros(heads, 0, head_dim) for _ in joiners]
        for _ in range(rng.randint(0, 3)):  # steps: one column for every row
            column = torch.randn(len(own_ref.rows), heads, 1, head_dim)
            own.append_columns(column)
            own_ref.rows = [torch.cat([r, c], dim=1) for r, c in zip(own_ref.rows, column)]
        keep = sorted(rng.sample(range(len(cross_ref.rows)), rng.randint(1, len(cross_ref.rows))))
        rows = len(keep)
        holes, movers, order = leave_moves(keep)
        cross_ref.rows, own_ref.rows = [cross_ref.rows[i] for i in order], [own_ref.rows[i] for i in order]
        source = max(r.shape[1] for r in cross_ref.rows)
        columns = max((r.shape[1] for r in own_ref.rows), default=0)
        cross.keep(rows, holes, movers, source, left=False)
        own.keep(rows, holes, movers, columns, left=True)
        assert torch.equal(cross.tensor, cross_ref.tensor(source)), round_
        assert torch.equal(own.tensor, own_ref.tensor(columns)), round_
        assert cross.buffer.shape[0] <= 2 * (rows + SPARE_ROWS)  # repacked when the batch shrinks


def test_a_leave_moves_only_the_last_rows_into_the_holes():
    buffer = RowBuffer()
    buffer.append_rows(torch.arange(6.0).view(6, 1, 1, 1).expand(6, 1, 2, 1))
    before = buffer.buffer.data_ptr()
    buffer.keep(4, holes=[1, 2], movers=[4, 5], columns=2, left=False)  # rows 1 and 2 leave
    assert buffer.buffer.data_ptr() == before  # no new buffer
    assert buffer.tensor[:, 0, 0, 0].tolist() == [0.0, 4.0, 5.0, 3.0]
    assert leave_moves([0, 3, 4, 5]) == ([1, 2], [4, 5], [0, 4, 5, 3])  # the plan BatchCaches.keep follows


def test_the_decoder_steps_joins_and_leaves_without_copying_its_cache(marian_backend):
    decoder: ContinuousDecoder = marian_backend.continuous_decoder()
    decoder.join([DecodeRequest([5, 9, 17, 2], 20, 20), DecodeRequest([7, 3, 2], 20, 20)])
    decoder.step()
    cache: BatchCaches = decoder._cache
    buffers = [layer.key_rows.buffer.data_ptr() for layer in cache.self_layers] + [
        k.buffer.data_ptr() for k, _ in cache.cross]
    decoder.join([DecodeRequest([8, 2], 3, 3)])  # fits the spare rows and the widest source
    for _ in range(5):
        decoder.step()
    assert decoder.running == 2  # the joiner left after its 3 tokens
    assert [layer.key_rows.buffer.data_ptr() for layer in cache.self_layers] + [
        k.buffer.data_ptr() for k, _ in cache.cross] == buffers
    assert decoder._self_columns() == 6
    assert cache.source_lengths == cache.source_mask.sum(dim=1).tolist()  # the host's copy follows the rows


def test_joiners_are_encoded_in_groups_of_similar_length():
    lengths = [3, 40, 4, 38, 5, 3, 41, 120]
    requests = [DecodeRequest(list(range(n)), 5, tag=i) for i, n in enumerate(lengths)]
    groups = length_groups(requests, padding=0.25)
    assert sorted(r.tag for g in groups for r in g) == list(range(len(lengths)))  # each once
    for group in groups:
        tokens = [len(r.input_ids) for r in group]
        assert len(tokens) * max(tokens) <= 1.25 * sum(tokens)
    assert [[len(r.input_ids) for r in g] for g in groups] == [[3, 3, 4], [5], [38, 40, 41], [120]]
    assert len(length_groups(requests, padding=100.0)) == 1  # any padding allowed: one pass
