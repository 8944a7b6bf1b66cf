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

    Codes are case-insensitive and `_` equals `-`; a regional code such as
    `pt-BR` falls back to its language (`pt`) when the model has no regional pair, one subtag at a
    time (`zh-Hant-TW`, `zh-Hant`), but never past a script: `sr-Latn` is refused where the model
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
#: a language's bare code in these models means this script: dropping it changes nothing (`zh-hans` -> `zh`)
_DEFAULT_SCRIPTS = {"zh": "hans"}


def _fallbacks(code: str) -> list[str]:
    """`code`, then shorter by one subtag at a time, stopping before a script subtag would be dropped
    (four letters, ISO 15924: `hant`, `latn`) unless the bare language means that script; a Chinese region
    implies its script (`zh-tw`: `zh-tw`, `zh-hant-tw`, `zh-hant`; never `zh`)."""
    parts, found = code.split("-"), [code]
    implied = _IMPLIED_SCRIPTS.get(parts[0], {}).get(parts[-1]) if len(parts) == 2 else None
    if implied is not None:
        parts = [parts[0], implied, parts[1]]
        found.append("-".join(parts))
    for n in range(len(parts) - 1, 0, -1):
        if len(parts[n]) == 4 and parts[n].isalpha() and _DEFAULT_SCRIPTS.get(parts[0]) != parts[n]:
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
