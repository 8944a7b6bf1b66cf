"""Continuous (iteration-level) scheduling of translation: sequences join and leave the decoding batch at every step.

`ContinuousScheduler` runs a `ContinuousDecoder` (deployments/backends/continuous_decoder.py) on its own thread. Callers
submit calls (a language pair and some texts); each text becomes one sequence. Before every decoding step the scheduler
admits waiting sequences, highest priority first (interactive before job records) and in arrival order, while the
running batch stays within `max_running_sequences` and its projected cache (`ContinuousDecoder.projection`: every
running sequence decoding to its max_new_tokens, padding included) within `max_cached_tokens`; the admitted ones are
encoded together and take their first step with the others. A sequence leaves the batch at the step that finishes it; a
call is answered as soon as its last sequence is done. With `join_interval_steps` N > 1, sequences join (and finished
ones are taken out of the caches) only every N steps, or sooner when nothing runs or half a batch or more can join at
once: one encoder pass and one cache reshuffle for many sequences, which is what a step costs on a GPU. A call cancelled
by its caller (deadline passed, client gone), or failed by a step, leaves at the next step, its sequences never computed
further. An error outside a step stops the thread: callers get a BackendError, new calls are refused, a `fatal`
StepOutcome is sent. No Ray here: the Translator deployment wires it in (continuous_translation.py)."""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from concurrent.futures import Future
from dataclasses import replace
from typing import Callable, Optional, Sequence

from .backends.base import BackendError
from .backends.cache_projection import CacheProjection
from .backends.continuous_decoder import DecodeRequest
from .backends.heap import DECODING_TRIM_AFTER_TOKENS, trim_after_batch
from .backends.segments import mark_cut
from .continuous_steps import Call, StepOutcome, claim_failing, drop_every_row
from .errors import ReplicaStopped, describe_exception, settle
from .priority import Priority

logger = logging.getLogger("ray.serve")

#: (text, its source token ids) -> (max_new_tokens, min_new_tokens) of its sequence
Limits = Callable[[str, list[int]], tuple[int, Optional[int]]]


class ContinuousScheduler:
    """The decoding thread and the queue of sequences waiting to join its batch. `backend` is a TransformersBackend
    (its `continuous_decoder()`, `encode_texts`, `forced_bos_token_id`, `decode_rows`, `is_cut`). `on_step(outcome)`
    runs on the decoding thread."""

    def __init__(self, backend, *, max_running_sequences: int, max_cached_tokens: Optional[int],
                 max_new_tokens: int, min_new_tokens: Optional[int] = None, join_interval_steps: int = 1,
                 cuda_graphs: bool = True, on_step: Optional[Callable[[StepOutcome], None]] = None,
                 name: str = "continuous-decoder"):
        for knob, value in (("max_running_sequences", max_running_sequences), ("max_cached_tokens", max_cached_tokens),
                            ("join_interval_steps", join_interval_steps)):
            if value is not None and value < 1:
                raise ValueError(f"{knob} must be >= 1, got {value!r}")
        self.backend = backend
        self.decoder = backend.continuous_decoder(slots=int(max_running_sequences), cuda_graphs=cuda_graphs)
        # Before the first request, so none waits on a CUDA graph capture (a source past 256 tokens grows them).
        began, source = time.perf_counter(), min(getattr(backend, "max_input_length", 256), 256)
        if captured := self.decoder.warm_up(columns=max_new_tokens + 1, source=source):
            logger.info("continuous decoding: %d CUDA graphs captured in %.1f s", captured, time.perf_counter() - began)
        self._check_length(max_new_tokens, "max_new_tokens")
        self.max_running_sequences, self.max_cached_tokens = int(max_running_sequences), max_cached_tokens
        self.join_interval_steps = int(join_interval_steps)
        #: when the iteration under way began (its join's encoder pass, step, answers); None between: health checks
        self._steps_since_join, self.iteration_began, self._steps = 0, None, 0
        #: id -> (a waiting sequence the cache cap refused, the step it was first refused at): after max_new_tokens
        #: steps of that (others joining beside it, so the batch never emptied for it), it is starved (`_admissible`)
        self._refused: dict[int, tuple[DecodeRequest, int]] = {}
        self._starved_after_steps = max(int(max_new_tokens), 1)
        #: most job (background) sequences in the running batch; None: no cap of their own
        self.max_background_sequences: Optional[int] = None
        #: per-sequence decode limits; default: the same for every sequence (the backend's settings)
        self.limits: Limits = lambda text, ids: (max_new_tokens, min_new_tokens)
        self._on_step, self._cond = on_step, threading.Condition()
        self._waiting: dict[int, deque[DecodeRequest]] = {}
        self._closed, self._broken, self._joining = False, None, []  # _broken: the BackendError that stopped the thread
        self._dropped = 0  # sequences of cancelled calls skipped in the queue since the last step
        self._held_peak = 0  # most cache token slots held since the heap was last given back
        self._thread = threading.Thread(target=self._work, name=name, daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ callers (any thread)

    def submit(self, texts: Sequence[str], source: str, target: str, priority: int = 0) -> Future:
        """Queue one call's texts; the future resolves to (translations in order, largest running batch
        they were decoded in). Cancel the future to take its sequences out of the batch."""
        if not self.backend.supports(source, target):
            raise ValueError(f"model {self.backend.model_id!r} does not translate {source}->{target}")
        texts = list(texts)
        call = Call(len(texts), int(priority))
        if not texts:
            call.future.set_result(([], 0))
            return call.future
        bos = self.backend.forced_bos_token_id(target)
        requests = []
        for index, (text, ids) in enumerate(zip(texts, self.backend.encode_texts(texts, source))):
            max_new, min_new = self.limits(text, ids)
            self._check_length(max_new, "a sentence's max_new_tokens")
            requests.append(DecodeRequest(list(ids), int(max_new), min_new, bos, tag=(call, index)))
        with self._cond:
            if self._closed:
                raise BackendError(str(self._broken)) if self._broken else ReplicaStopped("decoding is shut down")
            self._waiting.setdefault(call.priority, deque()).extend(requests)
            self._cond.notify()
        return call.future

    def _check_length(self, max_new_tokens: int, what: str) -> None:
        """One sequence past the model's positions would fail the step of every running sequence."""
        limit = self.decoder.max_new_tokens_limit
        if limit is not None and max_new_tokens > limit:
            raise ValueError(f"{what}={max_new_tokens!r} exceeds the {limit} output tokens "
                             f"{self.backend.model_id!r} has positions for")

    def waiting(self) -> dict[int, int]:
        """Sequences waiting to join, by priority (those of cancelled or failed calls not counted)."""
        with self._cond:
            counts = {p: sum(not r.tag[0].future.done() for r in q) for p, q in self._waiting.items()}
        return {p: n for p, n in counts.items() if n}

    def shutdown(self, wait_s: float = 10.0) -> None:
        """Stop after the step under way: calls not answered fail, new ones are refused (ReplicaStopped); waits up to
        `wait_s` for the thread to end (0: not at all, as the replica's teardown does not block its event loop)."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join(timeout=wait_s)

    # ------------------------------------------------------------------ the decoding thread

    def _admissible(self) -> list[DecodeRequest]:
        """Under the lock: the waiting sequences that would join before the next step (priority order, then
        arrival order; stops at the first that does not fit, so long ones are not starved). Done calls' skipped.
        A sequence the cache cap has refused for max_new_tokens steps (others of a higher priority kept joining, so
        the batch never emptied for it) is starved: only its own queue, up to it, joins until it has joined."""
        # the rows of done calls (cancelled, failed) leave before the next join: they hold no room, nor cache
        live = [r.request.tag[0] for r in self.decoder.rows if not r.request.tag[0].future.done()]
        joining, room = [], self.max_running_sequences - len(live)
        projection = None  # the cache bound over the live rows, built at the first sequence weighed (if capped)
        cap = self.max_background_sequences
        background_room = None if cap is None else cap - sum(call.priority >= Priority.BACKGROUND for call in live)
        starved = self._starved()
        for priority in [starved.tag[0].priority] if starved is not None else sorted(self._waiting):
            for request in self._waiting[priority]:
                if request.tag[0].future.done():  # cancelled, or failed by a step another of its sequences ran
                    continue
                background = priority >= Priority.BACKGROUND and background_room is not None
                if room <= 0 or (background and background_room <= 0):
                    return joining
                if projection is None and self.max_cached_tokens is not None:
                    projection = self.decoder.projection(keep=lambda r: not r.tag[0].future.done())
                if projection is not None and not self._fits(projection, request):
                    self._refused.setdefault(id(request), (request, self._steps))
                    return joining
                if projection is not None:
                    projection.join(request)
                joining.append(request)
                room -= 1
                if background:
                    background_room -= 1
        return joining

    def _starved(self) -> Optional[DecodeRequest]:
        """The sequence refused longest, if that is max_new_tokens steps or more (refused ones whose call is done
        are forgotten)."""
        for key, (request, _) in list(self._refused.items()):
            if request.tag[0].future.done():  # cancelled, or failed
                del self._refused[key]
        request, since = min(self._refused.values(), key=lambda refused: refused[1], default=(None, self._steps))
        return request if self._steps - since >= self._starved_after_steps else None

    def _admit(self, admissible: list[DecodeRequest]) -> list[DecodeRequest]:
        """Under the lock: take `admissible` out of the queue, and the done calls' sequences before them."""
        joining = self._joining = admissible  # failed with the rest if an error stops the thread
        for request in joining:
            self._refused.pop(id(request), None)
        following = next(taken := iter(joining), None)
        for priority in sorted(self._waiting):
            queue = self._waiting[priority]
            while queue and (queue[0] is following or queue[0].tag[0].future.done()):
                if (request := queue.popleft()) is following:
                    following = next(taken, None)
                else:
                    self._dropped += request.tag[0].future.cancelled()
        return joining

    def _joining_now(self) -> Optional[list[DecodeRequest]]:
        """Under the lock: the sequences taken to join before the next step, or None: no rebuild of the batch before
        the join_interval_steps-th step unless nothing runs or half a batch would join (capped or done: not counted)."""
        if self._steps_since_join + 1 >= self.join_interval_steps or not self.decoder.running:
            return self._admit(self._admissible())
        half = self.max_running_sequences
        if 2 * (half - self.decoder.running) < half or 2 * len(admissible := self._admissible()) < half:
            return None
        return self._admit(admissible)

    def _fits(self, projection: CacheProjection, request: DecodeRequest) -> bool:
        """Whether `request` fits the cache cap beside the live rows and the joiners `projection` holds."""
        if not projection.rows:
            return True  # a sequence alone always runs, whatever its size
        # joining every N steps, finished rows stay until the next rebuild and every row's columns grow up to N - 1
        slack = (self.join_interval_steps - 1) * (projection.rows + 1)
        return projection.tokens_if_joined(request) + slack <= self.max_cached_tokens

    def _work(self) -> None:
        try:
            while True:
                with self._cond:
                    while not self._closed and not self.decoder.running and not any(self._waiting.values()):
                        self._cond.wait()
                    if self._closed:
                        break
                    joining = self._joining_now()
                rebuild = joining is not None
                self._steps_since_join, self._steps = 0 if rebuild else self._steps_since_join + 1, self._steps + 1
                self._iterate(joining or [], rebuild)
                self.iteration_began, self._joining = None, []  # (joined, or failed with the step: not to fail again)
        except BaseException as exc:  # noqa: BLE001 - outside a step's own handling: no call would ever be answered
            logger.error("continuous decoding stopped: this replica decodes nothing more: %s", describe_exception(exc))
            with self._cond:  # then `submit` refuses calls (the message withheld: it may quote a request)
                self._closed, self._broken = True, BackendError(
                    f"continuous decoding stopped for {self.backend.model_id!r}: {describe_exception(exc)}")
        self._fail_all(self._broken or ReplicaStopped("decoding is shut down"), self._joining)

    def _iterate(self, joining: list[DecodeRequest], rebuild: bool = True) -> None:
        start, cpu_start, self.iteration_began = time.perf_counter(), time.thread_time(), time.monotonic()
        gone = {r.request.tag for r in self.decoder.rows if r.request.tag[0].future.done()}  # cancelled or failed
        with self._cond:
            dropped, self._dropped = self._dropped + sum(tag[0].future.cancelled() for tag in gone), 0
        try:
            if gone:
                self.decoder.drop(gone)
            if rebuild:
                self.decoder.compact()
            self.decoder.join(joining)
            running, self._held_peak = self.decoder.running, max(self._held_peak, self.decoder.cached_tokens())
            for row in self.decoder.rows:
                call = row.request.tag[0]
                call.batch = max(call.batch, running)
            finished = self.decoder.step(compact=self.join_interval_steps == 1)
        except Exception as exc:  # noqa: BLE001 - every sequence in the batch gets the error
            logger.error("continuous decoding step failed: %s", describe_exception(exc))
            error = BackendError(f"generation failed for {self.backend.model_id!r}: {type(exc).__name__}: {exc}")
            took, cpu = time.perf_counter() - start, time.thread_time() - cpu_start
            self._fail_running(error, joining, StepOutcome(0, len(joining), 0, {}, took, cpu, 0, dropped, True, error),
                               counted=frozenset(gone))
            return
        by_priority: dict[int, int] = {}
        done = []
        for request, ids in finished:
            call, index = request.tag
            call.outputs[index], call.requests[index] = ids, request
            call.left -= 1
            by_priority[call.priority] = by_priority.get(call.priority, 0) + 1
            if call.left == 0:
                done.append(call)
        self._report(StepOutcome(running, len(joining), len(finished), by_priority, time.perf_counter() - start,
                                 time.thread_time() - cpu_start, self.decoder.cached_tokens(), dropped))
        for call in done:
            self._answer(call)
        if not self.decoder.running:  # the batch drained, its callers answered: glibc's kept pages go back
            held, self._held_peak = self._held_peak, 0
            trim_after_batch(held, DECODING_TRIM_AFTER_TOKENS, self.decoder.device)

    def _answer(self, call: Call) -> None:
        try:  # each output marked if the model cut it short (segments.py)
            cut = [self.backend.is_cut(len(r.input_ids), ids, r.max_new_tokens, r.min_new_tokens)
                   for r, ids in zip(call.requests, call.outputs)]
            result = (mark_cut(self.backend.decode_rows(call.outputs), cut), call.batch)
        except Exception as exc:  # noqa: BLE001
            result = exc
        settle(call.future, result)

    def _fail_running(self, error: BaseException, extra: Sequence, outcome: StepOutcome, counted=frozenset(),
                      stopping: bool = False) -> None:
        """The running (and `extra`) sequences' calls fail with `error`: rows dropped (`stopping`: if they cannot be,
        logged, not raised), `outcome` reported with the failed and cancelled ones (less `counted` tags), answered."""
        failing, failed, dropped = claim_failing([r.request for r in self.decoder.rows] + list(extra), counted)
        try:
            drop_every_row(self.decoder, raise_reset_error=not stopping)
            self._report(replace(outcome, failed_records=failed, dropped=outcome.dropped + dropped))
        finally:  # claimed (running): answered here or never, also when dropping the rows raised (a device error)
            for call in failing:
                settle(call.future, error)

    def _fail_all(self, error: BaseException, joining: Sequence[DecodeRequest] = ()) -> None:
        """The thread stops: every call it holds fails; `fatal` if an error stopped it (Serve replaces the replica)."""
        with self._cond:
            waiting = [r for q in self._waiting.values() for r in q]
            self._waiting.clear()
            dropped, self._dropped = self._dropped, 0
        fatal = self._broken is not None
        self._fail_running(error, waiting + list(joining),
                           StepOutcome(0, 0, 0, {}, 0.0, 0.0, 0, dropped, fatal, self._broken, fatal), stopping=True)

    def _report(self, outcome: Optional[StepOutcome]) -> None:
        try:
            if outcome is not None and self._on_step is not None:
                self._on_step(outcome)
        except Exception:  # pragma: no cover - bookkeeping must never stop decoding
            logger.exception("continuous decoding bookkeeping failed")

