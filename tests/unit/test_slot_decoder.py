"""The GPU's continuous engine (deployments/backends/slot_decoder.py), run eagerly on CPU: what only the
slots have (buffers that shift and widen, a fixed number of slots, M2M100's position table grown ahead
of a replayed step) and the engine choice. The equality tests both engines share are in
test_continuous_decoder.py."""

from __future__ import annotations

import random

import pytest

from deployments.backends.continuous_decoder import ContinuousDecoder, DecodeRequest
from deployments.backends.slot_decoder import SlotDecoder

from .test_continuous_decoder import case, make_requests, run_with_random_joins, solo  # noqa: F401 - case: a fixture
from .test_transformers_backend import TEXTS


@pytest.mark.parametrize("seed", [12, 13])
def test_slots_shift_and_widen_their_caches_without_changing_outputs(case, monkeypatch, seed):
    """Small first buffers: columns no live row needs are shifted out, the caches widen when a row
    needs more, sources longer than the buffer widen it; the outputs stay single `generate`'s."""
    backend, source, target = case
    monkeypatch.setattr(SlotDecoder, "initial_columns", 4)
    monkeypatch.setattr(SlotDecoder, "initial_source", 2)
    rng = random.Random(seed)
    requests = make_requests(backend, source, target, TEXTS * 3, rng)
    decoder = SlotDecoder(backend.model, backend._pad, slots=6, graphs=False)
    outputs, _ = run_with_random_joins(decoder, requests, rng, max_running=6)
    assert outputs == {r.tag: solo(backend, r, target) for r in requests}
    assert decoder._self_k.shape[3] > 4 and decoder._cross.shape[4] > 2 and decoder.shifts > 0


def test_the_cpu_gets_the_tensor_engine_and_no_graphs(make_backend, tiny_marian_dir):
    """Slots and graphs are the GPU's engine: on a CPU a step's cost grows with its rows, so the
    scheduler's backend gives the engine whose tensors hold only the running rows."""
    backend = make_backend(tiny_marian_dir)
    assert type(backend.continuous_decoder(slots=8)) is ContinuousDecoder
    with pytest.raises(ValueError, match="CUDA graphs need a CUDA model, this one is on cpu"):
        SlotDecoder(backend.model, backend._pad, slots=8, graphs=True)


def test_slots_grow_m2m100_s_position_table_before_a_step_needs_it(make_backend, tiny_m2m100_dir):
    """M2M100's sinusoidal positions grow on demand inside its forward; a replayed step cannot grow them,
    so the slot engine grows the table when a sentence that needs it joins (here after a shrink to 12)."""
    backend = make_backend(tiny_m2m100_dir)
    decoder = SlotDecoder(backend.model, backend._pad, slots=4, graphs=False)
    table = backend.model.get_decoder().embed_positions
    table.make_weights(12 + table.padding_idx + 1 + table.offset, table.embedding_dim, table.padding_idx)
    assert decoder._position_table_size() == 12 + table.offset
    bos = backend.forced_bos_token_id("pt")
    requests = [DecodeRequest(list(ids), 30, 30, bos, i) for i, ids in enumerate(backend.encode_texts(TEXTS[:3], "en"))]
    decoder.join(requests)
    assert decoder._position_table_size() >= 31
    outputs = {}
    while decoder.running:
        outputs.update({r.tag: ids for r, ids in decoder.step()})
    assert outputs == {r.tag: solo(backend, r, "pt") for r in requests}


def test_slots_refuse_more_sequences_than_they_hold(make_backend, tiny_marian_dir):
    backend = make_backend(tiny_marian_dir)
    decoder = SlotDecoder(backend.model, backend._pad, slots=2, graphs=False)
    ids = backend.encode_texts(TEXTS[:3], "en")
    decoder.join([DecodeRequest(ids[0], 5, None, None, 0), DecodeRequest(ids[1], 5, None, None, 1)])
    with pytest.raises(ValueError, match="1 sequences cannot join: 2 of 2 slots are taken"):
        decoder.join([DecodeRequest(ids[2], 5, None, None, 2)])
    decoder.drop({0})
    decoder.join([DecodeRequest(ids[2], 5, None, None, 2)])  # the freed slot
    assert sorted(r.request.tag for r in decoder.rows) == [1, 2]


def test_a_step_that_cannot_be_captured_decodes_on_without_graphs(make_backend, tiny_marian_dir, caplog):
    """A capture the driver refuses must not fail every step from then on: the decoder logs it once, drops
    its graphs and runs the step eagerly (the warm-up already wrote the same cache column)."""
    from deployments.backends.slot_step import GraphCaptureError

    class Refusing:
        calls = 0

        def run(self, key, forward):
            Refusing.calls += 1
            forward()  # the warm-up ran; the capture then failed
            raise GraphCaptureError(f"capturing the decoding step {key} failed: operation not permitted")

    backend = make_backend(tiny_marian_dir)
    decoder = SlotDecoder(backend.model, backend._pad, slots=4, graphs=False)
    decoder._graphs = Refusing()
    requests = [DecodeRequest(list(ids), 6, 6, None, i) for i, ids in enumerate(backend.encode_texts(TEXTS[:3], "en"))]
    decoder.join(requests)
    outputs = {}
    with caplog.at_level("WARNING"):
        while decoder.running:
            outputs.update({r.tag: ids for r, ids in decoder.step()})
    assert outputs == {r.tag: solo(backend, r, "de") for r in requests}
    assert Refusing.calls == 1 and decoder._graphs is None
    assert "decodes without CUDA graphs from now on" in caplog.text
