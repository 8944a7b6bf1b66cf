"""Freed heap memory given back to the OS after a large batch (deployments/backends/heap.py), and the
translation backend asking for it only after one. The embedding engines' memory tests are with their engines."""

from __future__ import annotations

from deployments.backends import heap
from tests.support import wait_for


def test_giving_back_the_heap_is_skipped_where_the_c_library_has_no_malloc_trim(monkeypatch):
    assert heap.give_back_free_heap() is True  # glibc: this machine's
    monkeypatch.setattr(heap, "libc_function", lambda name: None)
    assert heap.give_back_free_heap() is False
    assert heap.trim_after_batch(10**6, heap.DECODING_TRIM_AFTER_TOKENS) is False


def test_a_batch_is_trimmed_after_only_past_its_threshold_and_on_the_cpu(monkeypatch):
    import torch

    calls = []
    monkeypatch.setattr(heap, "give_back_free_heap", lambda: calls.append(1) or True)
    limit = heap.EMBEDDING_TRIM_AFTER_TOKENS
    assert heap.trim_after_batch(limit, limit) is False  # at the threshold: kept
    assert heap.trim_after_batch(limit + 1, limit, "cuda:0") is False  # device memory, not this heap
    assert heap.trim_after_batch(limit + 1, limit, torch.device("cuda", 0)) is False
    assert calls == []
    assert heap.trim_after_batch(limit + 1, limit) is True
    assert heap.trim_after_batch(limit + 1, limit, torch.device("cpu")) is True
    assert calls == [1, 1]


def test_translation_gives_the_heap_back_after_a_large_batch_only(monkeypatch, make_backend, tiny_marian_dir):
    """A 32-sentence Marian-sized batch left 107-136 MiB in glibc's heaps for good; past
    DECODING_TRIM_AFTER_TOKENS token slots the backend trims them, and a lone sentence does not pay for it."""
    calls = []
    monkeypatch.setattr(heap, "give_back_free_heap", lambda: calls.append(1) or True)
    backend = make_backend(tiny_marian_dir, max_new_tokens=40, min_new_tokens=40)
    backend.translate(["Hello there."], "en", "de")
    assert calls == []  # 1 x (source + 41 columns): far below
    rows = heap.DECODING_TRIM_AFTER_TOKENS // 40 + 1
    out = backend.translate([f"Sentence number {i} of a large batch." for i in range(rows)], "en", "de")
    assert len(out) == rows and calls == [1]


def test_continuous_decoding_gives_the_heap_back_when_a_large_batch_drains(monkeypatch, make_backend,
                                                                           tiny_marian_dir):
    """The running batch's caches grow and shrink with it; once a batch that held more than
    DECODING_TRIM_AFTER_TOKENS cache slots has drained (its callers answered), the heap goes back, once."""
    from deployments import continuous_batching

    calls = []
    monkeypatch.setattr(heap, "give_back_free_heap", lambda: calls.append(1) or True)
    scheduler = continuous_batching.ContinuousScheduler(make_backend(tiny_marian_dir), max_running_sequences=64,
                                                        max_cached_tokens=None, max_new_tokens=40, min_new_tokens=40)
    try:
        assert len(scheduler.submit(["Hello there."], "en", "de").result(timeout=60)[0]) == 1
        assert calls == []  # one sentence: ~50 slots
        texts = [f"Sentence number {i} of a large batch." for i in range(32)]  # 32 x (41 + ~12) slots
        assert len(scheduler.submit(texts, "en", "de").result(timeout=60)[0]) == 32
        wait_for(lambda: calls, 10, "the heap given back after the batch")  # right after the answers
        assert calls == [1]
    finally:
        scheduler.shutdown()
