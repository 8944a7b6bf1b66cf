"""A continuous decoder and a backend without a model, for the continuous scheduler (deployments/continuous_batching.py)
and the Translator's continuous path: every sequence decodes one token a step until its max_new_tokens, and a test can
hold a step (`hold()`, `entered`, `release()`) or make the next one raise (`fail_next`). `continuous_translator` makes a
Translator replica (scheduling: continuous) on them, without Ray."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any, Optional


@dataclass
class FakeRow:
    request: Any
    ids: list = field(default_factory=list)


class FakeDecoder:
    """The part of ContinuousDecoder's interface the scheduler uses."""

    screen = None
    row_attention = False
    max_new_tokens_limit = None
    device = "cpu"

    def __init__(self) -> None:
        self.rows: list[FakeRow] = []
        self.entered = threading.Event()  # set by each step as it begins
        self._open = threading.Event()
        self._open.set()
        self.fail_next: Optional[BaseException] = None

    @property
    def running(self) -> int:
        return len(self.rows)

    def hold(self) -> None:
        """The next steps wait for `release()` (each sets `entered` first)."""
        self.entered.clear()
        self._open.clear()

    def release(self) -> None:
        self._open.set()

    def warm_up(self, columns: int = 0, source: int = 0) -> int:
        return 0

    def cached_tokens(self) -> int:
        return sum(len(row.request.input_ids) + len(row.ids) for row in self.rows)

    def join(self, requests) -> None:
        self.rows.extend(FakeRow(request) for request in requests)

    def drop(self, tags: set) -> None:
        self.rows = [row for row in self.rows if row.request.tag not in tags]

    def compact(self) -> None:
        pass

    def _reset(self) -> None:
        self.rows = []

    def step(self, compact: bool = True) -> list:
        self.entered.set()
        if not self._open.wait(timeout=60):  # a test that forgot to release: fail the step, not hang the thread
            raise RuntimeError("FakeDecoder: a held step was never released")
        if self.fail_next is not None:
            error, self.fail_next = self.fail_next, None
            raise error
        for row in self.rows:
            row.ids.append(len(row.ids) + 1)
        finished = [row for row in self.rows if len(row.ids) >= row.request.max_new_tokens]
        self.rows = [row for row in self.rows if row not in finished]
        return [(row.request, row.ids) for row in finished]


class FakeBackend:
    """A translation backend around a FakeDecoder: a sequence's translation is "<n> tokens"."""

    name = "fake"
    model_id = "fake-model"

    def __init__(self, decoder: Optional[FakeDecoder] = None) -> None:
        self.decoder = decoder or FakeDecoder()

    def continuous_decoder(self, slots: Optional[int] = None, cuda_graphs: bool = True) -> FakeDecoder:
        return self.decoder

    def warm_up(self) -> None:
        pass

    def supports(self, source: str, target: str) -> bool:
        return True

    def forced_bos_token_id(self, target: str) -> None:
        return None

    def encode_texts(self, texts, source: str) -> list[list[int]]:
        return [[ord(c) for c in text] for text in texts]

    def is_cut(self, source_tokens: int, ids, max_new_tokens: int, min_new_tokens) -> bool:
        return False

    def decode_rows(self, outputs) -> list[str]:
        return [f"{len(ids)} tokens" for ids in outputs]


def continuous_translator(monkeypatch: Any, max_running_sequences: int = 8) -> Any:
    """A Translator replica decoding continuously on a FakeBackend; a text of n characters decodes in n steps."""
    from deployments.settings import TranslationSettings
    from deployments.translator import Translator

    backend = FakeBackend()
    monkeypatch.setattr("deployments.translator.load_translation_backend", lambda settings, threads: backend)
    settings = TranslationSettings(backend="transformers", model="fake", scheduling="continuous",
                                   max_running_sequences=max_running_sequences)
    replica = Translator.func_or_class(settings.model_dump())
    replica._continuous.scheduler.limits = lambda text, ids: (len(text), None)
    return replica
