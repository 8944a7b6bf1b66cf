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
    """Small first buffers: the caches widen when a row needs more (or when shifting out the columns no live row
    needs would free under an eighth of them: shifts are tested below), sources longer than the buffer widen it; the
    outputs stay single `generate`'s."""
    backend, source, target = case
    monkeypatch.setattr(SlotDecoder, "initial_columns", 4)
    monkeypatch.setattr(SlotDecoder, "initial_source", 2)
    rng = random.Random(seed)
    requests = make_requests(backend, source, target, TEXTS * 3, rng)
    decoder = SlotDecoder(backend.model, backend._pad, slots=6, graphs=False)
    outputs, _ = run_with_random_joins(decoder, requests, rng, max_running=6)
    assert outputs == {r.tag: solo(backend, r, target) for r in requests}
    assert decoder._self_k.shape[3] > 4 and decoder._cross.shape[4] > 2


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


class _Replayer:
    """A stand-in for a captured CUDA graph: replay runs the captured call again into the captured output
    tensor (as a graph writes its outputs' memory), so what the engine reads after a replay is what a
    graph would have left there."""

    def __init__(self, forward):
        self.forward, self.replays = forward, 0

    def capture(self):
        self.out = self.forward()
        return self, self.out

    def replay(self):
        self.replays += 1
        result = self.forward()
        if self.out is not None:
            self.out.copy_(result)


def _fake_graphs(decoder, refuse: str = "") -> list:
    """Turn on both graph sets of a CPU decoder with `_Replayer` captures; the set named `refuse` has its
    first capture refused (after the warm-up call, as a real refusal comes)."""
    from deployments.backends.slot_step import GraphCaptureError

    captured = []
    for name in ("_graphs", "_join_graphs"):
        graphs = getattr(decoder, name)
        graphs.enabled = True

        def capture(forward, name=name):
            forward()  # the warm-up run
            if name == refuse:
                raise GraphCaptureError("operation not permitted when stream is capturing")
            captured.append(_Replayer(forward))
            return captured[-1].capture()
        graphs._capture = capture
    return captured


@pytest.mark.parametrize("refuse", ["_graphs", "_join_graphs"])
def test_a_capture_the_driver_refuses_runs_on_without_those_graphs(make_backend, tiny_marian_dir, caplog, refuse):
    """A refused capture must not fail every call from then on: the decoder logs it once, drops that set
    of graphs (steps' or joins') and runs the call eagerly (the warm-up wrote the same buffers); the
    other set keeps its graphs."""
    backend = make_backend(tiny_marian_dir)
    decoder = SlotDecoder(backend.model, backend._pad, slots=4, graphs=False)
    _fake_graphs(decoder, refuse=refuse)
    requests = [DecodeRequest(list(ids), 6, 6, None, i) for i, ids in enumerate(backend.encode_texts(TEXTS[:3], "en"))]
    with caplog.at_level("WARNING"):
        decoder.join(requests)
        outputs = {}
        while decoder.running:
            outputs.update({r.tag: ids for r, ids in decoder.step()})
    assert outputs == {r.tag: solo(backend, r, "de") for r in requests}
    kept = "_join_graphs" if refuse == "_graphs" else "_graphs"
    assert not getattr(decoder, refuse).enabled and getattr(decoder, kept).enabled
    assert getattr(decoder, kept).captures == 1 and caplog.text.count("without CUDA graphs from now on") == 1


@pytest.mark.parametrize("seed", [21, 22])
def test_warmed_up_graphs_cover_the_first_buffers_and_replay_the_same_outputs(case, seed):
    """warm_up captures every bucket of the first buffers (steps: rows x columns x source, joins: rows x
    source); sentences that fit them then never wait on a capture, and replays (recomputing into the
    captured outputs) give single `generate`'s outputs, joins padded with scratch rows included."""
    backend, source, target = case
    decoder = SlotDecoder(backend.model, backend._pad, slots=6, graphs=False)
    captured = _fake_graphs(decoder)
    # slots=6: 8 rows; columns 64, 128; sources 32, 64; joins of 1, 2, 4 or 8 rows
    assert decoder.warm_up() == (2 * 2 * 1) + (2 * 4) == len(captured)
    assert decoder.warm_up() == 0 and decoder.running == 0
    rng = random.Random(seed)
    requests = make_requests(backend, source, target, TEXTS * 2, rng)
    outputs, _ = run_with_random_joins(decoder, requests, rng, max_running=6)
    assert outputs == {r.tag: solo(backend, r, target) for r in requests}
    assert decoder.captures == len(captured) == 12 and sum(g.replays for g in captured) > len(requests)


def test_warm_up_sizes_the_buffers_for_the_longest_output_so_they_never_widen(case):
    """Sized for outputs of 40 tokens and sources of 100 (columns 64, sources 128), every bucket is captured
    at once; sentences within those bounds then never widen a buffer nor wait on a capture, however long
    the batch runs (columns no live row needs are shifted out instead)."""
    backend, source, target = case
    decoder = SlotDecoder(backend.model, backend._pad, slots=6, graphs=False)
    decoder._alloc(4, 2)  # tiny buffers before the warm-up
    captured = _fake_graphs(decoder)
    # columns 64 (41 in whole 64s); sources 32, 64, 128; joins of 1, 2, 4, 8 rows; steps of 8 rows
    assert decoder.warm_up(columns=41, source=100) == 3 * 1 + 3 * 4 == len(captured)
    assert (decoder._self_k.shape[3], decoder._cross.shape[4]) == (64, 128)
    rng = random.Random(5)
    requests = make_requests(backend, source, target, TEXTS * 6, rng, max_tokens=40)
    outputs, _ = run_with_random_joins(decoder, requests, rng, max_running=6)
    assert outputs == {r.tag: solo(backend, r, target) for r in requests}
    assert decoder.captures == len(captured) and decoder._self_k.shape[3] == 64 and decoder.shifts > 0


def test_the_scheduler_warms_the_slots_up_before_its_first_request(make_backend, tiny_marian_dir, monkeypatch):
    """At start the scheduler sizes the slots for its max_new_tokens and for sources of up to 256 tokens and
    captures every bucket, joins no wider than the encoder's positions (here as if it had 100); its
    requests then decode on those graphs alone, answering what solo translation answers."""
    from deployments.continuous_batching import ContinuousScheduler

    backend = make_backend(tiny_marian_dir)
    made = []

    def slots(slots=None, cuda_graphs=True):
        decoder = SlotDecoder(backend.model, backend._pad, slots=slots, graphs=False)
        decoder._widest_join = 100
        made.append(_fake_graphs(decoder))  # filled as it captures
        return decoder
    monkeypatch.setattr(backend, "continuous_decoder", slots)
    scheduler = ContinuousScheduler(backend, max_running_sequences=4, max_cached_tokens=None,
                                    max_new_tokens=backend.max_new_tokens)
    try:
        decoder = scheduler.decoder
        assert (decoder._self_k.shape[3], decoder._cross.shape[4]) == (128, 256)
        # joins: 1, 2, 4 rows x 32, 64, 100 columns; steps: 4 rows x 64, 128 columns x 32-256 sources
        assert decoder.captures == len(made[0]) == 3 * 3 + 2 * 4
        assert max(columns for _, columns in decoder._join_graphs._graphs) == 100
        replays = sum(g.replays for g in made[0])
        texts, _ = scheduler.submit(TEXTS[:3], "en", "de").result(timeout=60)
        assert texts == [backend.translate([text], "en", "de")[0] for text in TEXTS[:3]]
        assert decoder.captures == len(made[0]) and sum(g.replays for g in made[0]) > replays
    finally:
        scheduler.shutdown()


def test_slots_count_cached_tokens_from_the_earliest_live_row_as_the_tensors_do(make_backend, tiny_marian_dir):
    """The slots' shared column kept counting from a row long gone: after a long sentence left, one short row counted
    102 token slots where the tensor engine (and max_cached_tokens' formula) counts 22, and a joiner that fits was
    projected at 286 and refused."""
    backend = make_backend(tiny_marian_dir)
    ids = backend.encode_texts(["first", "a", "b"], "en")
    figures = {}
    for name, decoder in (("slots", SlotDecoder(backend.model, backend._pad, slots=8, graphs=False)),
                          ("tensors", ContinuousDecoder(backend.model, backend._pad))):
        decoder.join([DecodeRequest(ids[0], 100, 100, None, tag="long")])
        for _ in range(80):
            decoder.step()
        decoder.join([DecodeRequest(ids[1], 40, 40, None, tag="short")])
        while any(r.request.tag == "long" for r in decoder.rows):
            decoder.step()
        figures[name] = (decoder.running, decoder.cached_tokens(),
                         decoder.projected_tokens([DecodeRequest(ids[2], 40, 40, None, tag="other")]))
    assert figures["slots"][:2] == figures["tensors"][:2] == (1, 22)
    # the joiner starts ~20 columns after the short row on the slots' shared column: 2 x (20 + 41 + 2)
    assert figures["slots"][2] <= 2 * (21 + 41 + 2)


def test_rows_as_long_as_the_buffer_do_not_shift_it_at_every_step(make_backend, tiny_marian_dir, monkeypatch):
    """With max_new_tokens 255 the warm-up sized the columns at 256, a live row's whole span: once full, the earliest
    live row had started a few columns in, and the self caches were copied to free those few, nearly every step. Now a
    shift frees an eighth of the columns or more, else the buffer widens, and the warm-up leaves that eighth free."""
    backend = make_backend(tiny_marian_dir)
    monkeypatch.setattr(SlotDecoder, "initial_columns", 64)
    decoder = SlotDecoder(backend.model, backend._pad, slots=8, graphs=False)
    ids = backend.encode_texts(TEXTS, "de")
    requests = [DecodeRequest(list(ids[i % len(ids)]), 63, 63, None, i) for i in range(40)]  # 64 columns each
    outputs, steps = {}, 0
    while requests or decoder.running:
        if requests and steps % 2 == 0 and decoder.running < 8:  # a row joins every 2 steps: staggered starts
            decoder.join([requests.pop(0)])
        outputs.update({r.tag: out for r, out in decoder.step()})
        steps += 1
    # shifting 2-4 columns would have been under 64 / 8: the buffer widened to 128, and each shift freed 64 or more
    assert decoder._self_k.shape[3] == 128 and steps > 300 and 0 < decoder.shifts <= steps // 64 + 1
    assert len(outputs) == 40 and all(len(out) == 64 for out in outputs.values())
    for tag in range(len(ids)):  # the shifted caches decode as single `generate` does
        assert outputs[tag] == solo(backend, DecodeRequest(list(ids[tag]), 63, 63, None, tag), "en")
    sized = SlotDecoder(backend.model, backend._pad, slots=2, graphs=False)
    _fake_graphs(sized)
    sized.warm_up(columns=256)
    assert sized._self_k.shape[3] == 320  # 8/7 of 256 in whole 64s: a shift frees 64 columns or more
