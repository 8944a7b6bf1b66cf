"""Continuous decoding (deployments/backends/continuous_decoder.py) gives, token for token, what
single-input greedy `generate` gives, whatever the sequences around it and whenever it joined.

The fixture models are random (tests/fixtures/tiny_models.py); the Marian fixture's EOS bias
makes some sequences stop early and others run to their limit, so rows leave at different
steps. The Marian-sized model (opus-mt's shape, random weights: the benchmarks' model from
bench/peers/models.py, built once into .bench-models/) takes 45-70 CPU seconds (more the first
time, to build it): it runs when SERVE_APP_SLOW_TESTS=1.
"""

from __future__ import annotations

import os
import random

import pytest

from deployments.backends import row_attention
from deployments.backends.continuous_decoder import ContinuousDecoder, DecodeRequest, UnsupportedModel
from deployments.backends.slot_decoder import SlotDecoder

from .test_transformers_backend import TEXTS

FAMILIES = {"marian": ("tiny_marian_dir", "en", "de"), "m2m100": ("tiny_m2m100_dir", "en", "pt"),
            "nllb": ("tiny_nllb_dir", "en", "pt")}


#: the engines: tensors cut to the running rows (the CPU's), the same with every step's attention row by row
#: (row_attention.py; on its own it goes row by row only where padding dominates), fixed slots (the GPU's, here
#: without graphs)
ENGINES = {"tensors": lambda backend: backend.continuous_decoder(),
           "rows": lambda backend: backend.continuous_decoder(),
           "slots": lambda backend: SlotDecoder(backend.model, backend._pad, slots=64, graphs=False)}


def _rows_always(engine_name: str, monkeypatch) -> None:
    if engine_name == "rows":
        monkeypatch.setattr(row_attention, "MIN_PADDING_PER_ROW", -10**9)


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def case(request, make_backend):
    fixture, source, target = FAMILIES[request.param]
    return make_backend(request.getfixturevalue(fixture)), source, target


@pytest.fixture(params=sorted(ENGINES))
def engine(request, monkeypatch):
    """Builds a decoder of one engine over a backend."""
    _rows_always(request.param, monkeypatch)
    return ENGINES[request.param]


def solo(backend, request: DecodeRequest, target: str) -> list[int]:
    """What single-input `generate` gives for one request, with its own limits."""
    saved = backend.max_new_tokens, backend.min_new_tokens
    backend.max_new_tokens, backend.min_new_tokens = request.max_new_tokens, request.min_new_tokens
    try:
        return backend._generate_encoded([request.input_ids], target)[0]
    finally:
        backend.max_new_tokens, backend.min_new_tokens = saved


def make_requests(backend, source, target, texts, rng: random.Random, max_tokens: int = 30) -> list[DecodeRequest]:
    requests = []
    for index, ids in enumerate(backend.encode_texts(texts, source)):
        max_new = rng.randint(1, max_tokens)
        min_new = rng.choice([None, 0, rng.randint(0, max_new), max_new])
        requests.append(DecodeRequest(list(ids), max_new, min_new, backend.forced_bos_token_id(target), index))
    return requests


def run_with_random_joins(decoder: ContinuousDecoder, requests, rng: random.Random, drop_rate: float = 0.0,
                          lazy: bool = False, max_running: int = 1000):
    """Join the requests in random groups at random steps (possibly several steps apart, possibly
    into an empty batch); optionally drop running rows at random; `lazy`: finished rows stay in the
    tensors until a random later step compacts them (or a join does). Returns {tag: ids} and the tags dropped."""
    pending, outputs, dropped = list(requests), {}, set()
    while pending or decoder.running:
        if pending and rng.random() < 0.6 and decoder.running < max_running:
            count = min(rng.randint(1, 4), max_running - decoder.running)
            decoder.join(pending[:count])
            pending = pending[count:]
        if drop_rate and decoder.rows and rng.random() < drop_rate:
            tag = rng.choice(decoder.rows).request.tag
            decoder.drop({tag})
            dropped.add(tag)
        for request, ids in decoder.step(compact=not lazy or rng.random() < 0.15):
            assert request.tag not in outputs
            outputs[request.tag] = ids
    return outputs, dropped


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_equals_single_generate_with_random_joins(case, engine, seed):
    backend, source, target = case
    rng = random.Random(seed)
    texts = TEXTS * 3
    rng.shuffle(texts)
    requests = make_requests(backend, source, target, texts, rng)
    expected = {r.tag: solo(backend, r, target) for r in requests}
    outputs, _ = run_with_random_joins(engine(backend), requests, rng)
    assert outputs == expected


@pytest.mark.parametrize("seed", [5, 6])
def test_finished_rows_riding_along_until_compaction_change_nothing(case, engine, seed):
    """`step(compact=False)` (join_interval_steps > 1): finished rows stay in the batch, masked, until
    a join or a compaction; the others' outputs are still single `generate`'s, drops included."""
    backend, source, target = case
    rng = random.Random(seed)
    requests = make_requests(backend, source, target, TEXTS * 3, rng)
    decoder = engine(backend)
    outputs, dropped = run_with_random_joins(decoder, requests, rng, drop_rate=0.1, lazy=True)
    assert not dropped & outputs.keys()
    assert outputs == {r.tag: solo(backend, r, target) for r in requests if r.tag not in dropped}
    assert decoder.running == 0 and decoder.cached_tokens() == 0  # the last finisher empties the tensors


def test_finished_rows_leave_the_caches_at_compaction(make_backend, tiny_marian_dir):
    backend = make_backend(tiny_marian_dir)
    decoder = backend.continuous_decoder()
    short, long_ = backend.encode_texts([TEXTS[3], TEXTS[1]], "en")
    decoder.join([DecodeRequest(short, 2, 2, None, "short"), DecodeRequest(long_, 6, 6, None, "long")])
    finished = [r.tag for _ in range(2) for r, _ids in decoder.step(compact=False)]
    assert finished == ["short"] and decoder.running == 1 and [r.request.tag for r in decoder.rows] == ["long"]
    held = decoder.cached_tokens()
    assert held == 2 * (2 + max(len(short), len(long_)))  # the finished row is still in the tensors
    decoder.step(compact=False)
    decoder.compact()
    assert decoder.cached_tokens() == 1 * (3 + len(long_))
    assert not decoder.drop({"short"})  # already answered: nothing to drop


def test_rows_leave_at_different_steps(case, engine):
    """The comparison above is only meaningful if rows finish at different steps: some by EOS,
    some at their own limit (checked on the fixture's data)."""
    backend, source, target = case
    rng = random.Random(7)
    requests = make_requests(backend, source, target, TEXTS * 2, rng)
    for request in requests:
        request.min_new_tokens = None
        request.max_new_tokens = 20
    decoder = engine(backend)
    decoder.join(requests)
    finished_at = []
    step = 0
    while decoder.running:
        step += 1
        finished_at += [step for _ in decoder.step()]
    assert len(finished_at) == len(requests)
    if backend.family == "marian":  # the fixture's EOS bias: some stop before their limit
        assert min(finished_at) < 20 <= max(finished_at)


def test_fixed_length_when_min_equals_max(case, engine):
    backend, source, target = case
    decoder = engine(backend)
    requests = [DecodeRequest(list(ids), n, n, backend.forced_bos_token_id(target), n)
                for n, ids in zip((3, 9, 17), backend.encode_texts(TEXTS[:3], source))]
    decoder.join(requests)
    outputs = {}
    while decoder.running:
        outputs.update({r.tag: ids for r, ids in decoder.step()})
    assert {tag: len(ids) - 1 for tag, ids in outputs.items()} == {3: 3, 9: 9, 17: 17}
    assert outputs == {r.tag: solo(backend, r, target) for r in requests}


@pytest.mark.parametrize("seed", [3, 4])
def test_dropped_rows_do_not_change_the_others(case, engine, seed):
    backend, source, target = case
    rng = random.Random(seed)
    requests = make_requests(backend, source, target, TEXTS * 3, rng)
    outputs, dropped = run_with_random_joins(engine(backend), requests, rng, drop_rate=0.2)
    assert dropped and not dropped & outputs.keys()
    assert outputs == {r.tag: solo(backend, r, target) for r in requests if r.tag not in dropped}


def test_caches_shrink_when_rows_leave(make_backend, tiny_marian_dir):
    backend = make_backend(tiny_marian_dir)
    decoder = backend.continuous_decoder()
    long_text, short_text = TEXTS[1], TEXTS[3]
    (long_ids,), (short_ids,) = backend.encode_texts([long_text], "en"), backend.encode_texts([short_text], "en")
    decoder.join([DecodeRequest(long_ids, 3, 3, None, "long")])
    decoder.step()
    decoder.join([DecodeRequest(short_ids, 10, 10, None, "short")])
    assert decoder.cached_tokens() == 2 * (1 + len(long_ids))
    assert decoder.projected_tokens() == 2 * (11 + len(long_ids))
    while decoder.running == 2:
        decoder.step()
    # the long source and the long row's history are cut away with it
    assert decoder.cached_tokens() == 1 * (decoder._self_columns() + len(short_ids))
    assert decoder._self_columns() == 2  # the short row has fed 2 tokens (the long one left after 3)
    while decoder.running:
        decoder.step()
    assert decoder.cached_tokens() == 0 and decoder.projected_tokens() == 0


def test_unsupported_generation_settings_are_refused(make_backend, tiny_marian_dir):
    backend = make_backend(tiny_marian_dir)
    backend.model.generation_config.no_repeat_ngram_size = 3
    with pytest.raises(UnsupportedModel, match=r"no_repeat_ngram_size=3"):
        backend.continuous_decoder()
    backend.model.generation_config.no_repeat_ngram_size = None
    backend.model.generation_config.bad_words_ids = [[5, 6]]
    with pytest.raises(UnsupportedModel, match="single-token bad_words_ids"):
        backend.continuous_decoder()


def test_beam_search_is_refused(make_backend, tiny_m2m100_dir):
    with pytest.raises(ValueError, match="num_beams must be 1, got 4"):
        make_backend(tiny_m2m100_dir, num_beams=4).continuous_decoder()


def test_unsupported_model_type_is_refused(make_backend, tiny_m2m100_dir):
    backend = make_backend(tiny_m2m100_dir)
    backend.model.config.model_type = "bart"
    with pytest.raises(UnsupportedModel, match="not 'bart'"):
        ContinuousDecoder(backend.model, backend._pad)


@pytest.mark.skipif(os.environ.get("SERVE_APP_SLOW_TESTS") != "1", reason="slow: set SERVE_APP_SLOW_TESTS=1")
@pytest.mark.parametrize("lazy", [False, True])
@pytest.mark.parametrize("engine_name", sorted(ENGINES))
def test_marian_sized_model_equals_single_generate(lazy, engine_name, monkeypatch):
    """opus-mt's shape (6+6 layers, d_model 512, vocabulary 58,101) with random weights, as bench/ builds it:
    joins at random steps, per-sentence lengths as in the benchmark (min_new_tokens == max_new_tokens)."""
    from bench.peers.models import build_marian_sized
    from deployments.backends.transformers_backend import TransformersBackend
    from tests.fixtures.sentences import make_texts, sample_lengths

    _rows_always(engine_name, monkeypatch)
    folder = build_marian_sized()  # .bench-models/, built once
    backend = TransformersBackend(str(folder), device="cpu", local_files_only=True, max_new_tokens=64)
    rng = random.Random(11)
    texts = make_texts([max(1, n // 3) for n in sample_lengths(24, 11)], 11)
    requests = make_requests(backend, "en", "pt", texts, rng, max_tokens=40)
    for request in requests[::2]:
        request.min_new_tokens = request.max_new_tokens
    expected = {r.tag: solo(backend, r, "pt") for r in requests}
    outputs, _ = run_with_random_joins(ENGINES[engine_name](backend), requests, rng, lazy=lazy)
    assert outputs == expected


@pytest.mark.parametrize("fixture, target", [("tiny_marian_dir", "de"), ("tiny_m2m100_dir", "pt")])
def test_half_precision_runs_in_the_model_dtype(request, make_backend, engine, fixture, target):
    """The dtype path CUDA float16 takes (caches, padding and masks in the model's dtype, logits
    compared in float32), exercised on CPU with bfloat16. Float32 answers equal solo `generate`'s
    exactly (the tests above); in 8 mantissa bits, padding and batch shapes change roundings, and a
    near-tie can flip: over 12 seeds of this case M2M100 differed in 3 of 168 (tensor engine) and
    4 of 168 (slots, joins padded to buckets), Marian in none. A broken dtype path differs in most."""
    import torch

    backend = make_backend(request.getfixturevalue(fixture), dtype="bfloat16")
    rng = random.Random(9)
    requests = make_requests(backend, "en", target, TEXTS * 2, rng, max_tokens=12)
    decoder = engine(backend)
    assert decoder.dtype == torch.bfloat16
    outputs, _ = run_with_random_joins(decoder, requests, rng)
    expected = {r.tag: solo(backend, r, target) for r in requests}
    differing = sum(outputs[t] != expected[t] for t in expected)
    assert differing <= 1, f"{differing} of {len(expected)} differ from solo generate in bfloat16"
