"""Length-aware batching: the plan (sort by token length, cut under a padded-token budget) and
running a batch through it. Pure logic: no Ray, no model."""

import random
import threading
import types

import pytest

import numpy as np

from deployments.backends.embedding import EmbedderBase
from deployments.length_batching import padded_tokens, plan_token_batches, run_token_batched
from tests.unit.test_deployments import RecordingBackend


def test_padded_tokens_is_rows_times_longest():
    assert padded_tokens([3, 10, 4]) == 30
    assert padded_tokens([]) == 0


def test_plan_sorts_longest_first_and_respects_the_budget():
    lengths = [5, 40, 6, 38, 4, 7]
    groups = plan_token_batches(lengths, max_batch_tokens=80)
    assert groups == [[1, 3], [5, 2, 0, 4]]  # 2 x 40 = 80; then 4 x 7 = 28
    for group in groups:
        assert padded_tokens([lengths[i] for i in group]) <= 80


def test_plan_keeps_every_record_once_and_saves_padding_on_a_mixed_batch():
    rng = random.Random(7)
    lengths = [min(160, max(4, int(rng.lognormvariate(3.0, 0.8)))) for _ in range(64)]
    groups = plan_token_batches(lengths, max_batch_tokens=1024)
    assert sorted(i for g in groups for i in g) == list(range(64))
    assert all(padded_tokens([lengths[i] for i in g]) <= 1024 for g in groups if len(g) > 1)
    planned = sum(padded_tokens([lengths[i] for i in g]) for g in groups)
    assert planned < padded_tokens(lengths) / 2  # one padded call wastes more than half on padding here


def test_a_record_longer_than_the_budget_runs_alone():
    assert plan_token_batches([3, 500, 2], max_batch_tokens=100) == [[1], [0, 2]]


def test_a_large_budget_is_one_sorted_call_and_equal_lengths_keep_their_order():
    assert plan_token_batches([2, 9, 2, 5], max_batch_tokens=10_000) == [[1, 3, 0, 2]]
    assert plan_token_batches([], 10) == []


def test_bad_budget_is_rejected_quoting_it():
    with pytest.raises(ValueError, match="got 0"):
        plan_token_batches([1], 0)


def test_run_token_batched_scatters_outputs_back_in_input_order():
    calls = []

    def run(texts):
        calls.append(list(texts))
        return [t.upper() for t in texts]

    texts = ["a b", "c d e f g h", "i", "j k l m n o p"]
    lengths = [len(t.split()) for t in texts]
    assert run_token_batched(texts, lengths, 14, run) == [t.upper() for t in texts]
    assert calls == [["j k l m n o p", "c d e f g h"], ["a b", "i"]]


def test_run_token_batched_rejects_a_wrong_output_count_and_mismatched_lengths():
    with pytest.raises(RuntimeError, match="1 outputs for 2 inputs"):
        run_token_batched(["a", "b"], [1, 1], 10, lambda texts: ["x"])
    with pytest.raises(ValueError, match="1 lengths for 2 texts"):
        run_token_batched(["a", "b"], [1], 10, lambda texts: texts)


# --- in the Translator replica (its class driven directly, with its real batch queue) ---------

class WordBackend(RecordingBackend):
    """The recording backend of test_deployments; token length = words."""

    def token_lengths(self, texts, source):
        return [len(t.split()) for t in texts]

    def warm_up(self):
        pass

    @property
    def calls(self) -> list[list[str]]:
        return [texts for _, _, texts in self.batches]


@pytest.fixture
def word_translator(monkeypatch):
    from deployments.translator import Translator
    from deployments.settings import TranslationSettings

    backend = WordBackend()
    monkeypatch.setattr("deployments.translator.load_translation_backend", lambda settings, threads: backend)
    replica = Translator.func_or_class(TranslationSettings().model_dump())
    return replica, backend


def _translate_all(replica, loop, texts):
    import asyncio

    from deployments.batching import Chunk

    async def go():
        return await asyncio.gather(*(replica.translate(Chunk("en", "pt", [t])) for t in texts))

    return [out[0] for out, _ in loop.run_until_complete(go())]


TEXTS = ["one two three four five six seven eight", "a", "b c", "d e f g h i j k l m", "n o"]


def test_the_replica_cuts_a_batch_by_max_batch_tokens_and_answers_in_order(word_translator, loop):
    replica, backend = word_translator
    replica.reconfigure({"max_batch_size": 8, "batch_wait_timeout_s": 0.05, "max_batch_tokens": 20})
    assert _translate_all(replica, loop, TEXTS) == [f"pt:{t}" for t in TEXTS]
    # one batch of 5 records, sorted longest first, cut at 20 padded tokens
    assert backend.calls == [[TEXTS[3], TEXTS[0]], [TEXTS[2], TEXTS[4], TEXTS[1]]]
    assert replica.info()["batching"]["max_batch_tokens"] == 20


class _WakesBetweenSubmissions(threading.Condition):
    """The model queue's condition, where every hand-over (a notify, then the lock let go) waits for the model
    thread to compute what it found: the thread woke between two submissions, as it can on a loaded machine."""

    def __init__(self, computed: threading.Event):
        super().__init__()
        self._submitter, self._computed, self._handed = threading.get_ident(), computed, False

    def notify(self, n=1):
        super().notify(n)
        self._handed = threading.get_ident() == self._submitter

    def __exit__(self, *exc):
        handed, self._handed = self._handed and threading.get_ident() == self._submitter, False
        super().__exit__(*exc)
        if handed:
            assert self._computed.wait(10)
            self._computed.clear()


def test_a_batch_of_calls_reaches_the_model_thread_whole(monkeypatch, loop):
    """`@serve.batch` hands its calls to the model queue at once; a thread that woke after the first of them
    had computed it alone and the rest as a second batch (CI: 2 and 3 of these 5 calls)."""
    from deployments import model_queue
    from deployments.translator import Translator
    from deployments.settings import TranslationSettings

    computed = threading.Event()

    class Backend(WordBackend):
        def translate(self, texts, source, target):
            try:
                return super().translate(texts, source, target)
            finally:
                computed.set()

    backend = Backend()
    monkeypatch.setattr("deployments.translator.load_translation_backend", lambda settings, threads: backend)
    monkeypatch.setattr(model_queue, "threading", types.SimpleNamespace(
        Condition=lambda: _WakesBetweenSubmissions(computed), Thread=threading.Thread))
    replica = Translator.func_or_class(TranslationSettings().model_dump())
    replica.reconfigure({"max_batch_size": 8, "batch_wait_timeout_s": 0.05})
    assert _translate_all(replica, loop, TEXTS) == [f"pt:{t}" for t in TEXTS]
    assert backend.calls == [TEXTS]


def test_without_max_batch_tokens_a_batch_is_one_model_call(word_translator, loop):
    replica, backend = word_translator
    replica.reconfigure({"max_batch_size": 8, "batch_wait_timeout_s": 0.05})
    assert _translate_all(replica, loop, TEXTS) == [f"pt:{t}" for t in TEXTS]
    assert backend.calls == [TEXTS]


class WordEmbedder(EmbedderBase):
    """An engine whose token is a word and whose vector is [text's row id, its length, the pass width]."""

    dimensions = 3

    def __init__(self):
        self.passes = []

    def _tokenize(self, texts):
        width = max(len(t.split()) for t in texts)
        mask = np.array([[1] * len(t.split()) + [0] * (width - len(t.split())) for t in texts], dtype=np.int64)
        ids = np.array([[i + 1] * width for i in range(len(texts))], dtype=np.int64) * mask
        return {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(mask)}

    def _vectors(self, inputs):
        rows, width = inputs["input_ids"].shape
        self.passes.append((rows, width))
        return np.stack([inputs["input_ids"][:, 0], inputs["attention_mask"].sum(axis=1),
                         np.full(rows, width)], axis=1).astype(np.float32)


def test_embedding_passes_are_padded_to_their_own_longest_text_and_answered_in_input_order():
    texts = ["w " * n for n in (3, 40, 2, 9, 38, 1, 10)]
    engine = WordEmbedder()
    vectors, tokens = engine.embed(texts, max_batch_tokens=80)
    assert tokens == [3, 40, 2, 9, 38, 1, 10]
    assert vectors[:, 0].tolist() == [1, 2, 3, 4, 5, 6, 7]  # each row its own text's
    assert vectors[:, 1].tolist() == tokens
    # longest first, cut at 80 padded tokens: [40, 38], [10, 9, 3, 2, 1]; each pass as wide as its longest
    assert engine.passes == [(2, 40), (5, 10)]
    assert vectors[:, 2].tolist() == [10, 40, 10, 10, 40, 10, 10]


def test_embedding_without_a_budget_runs_sorted_passes_of_max_texts():
    engine = WordEmbedder()
    engine.MAX_TEXTS_PER_PASS = 2
    vectors, tokens = engine.embed(["w " * n for n in (5, 1, 3)])
    assert engine.passes == [(2, 3), (1, 5)] and tokens == [5, 1, 3]
    assert vectors[:, 0].tolist() == [1, 2, 3]
    one = WordEmbedder()
    one.embed(["w " * n for n in (5, 1, 3)])  # up to MAX_TEXTS_PER_PASS: one pass, as tokenized
    assert one.passes == [(3, 5)]
