"""What the continuous decoding thread (continuous_batching.py) keeps per call and reports per step."""

from __future__ import annotations

import logging
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Iterable, Optional

logger = logging.getLogger("ray.serve")


@dataclass(frozen=True)
class StepOutcome:
    """One scheduler iteration: what metrics and health need."""

    running: int  # sequences in the step
    joined: int  # sequences that joined before it
    finished: int  # sequences it finished
    finished_by_priority: dict
    seconds: float  # wall time of the join (encoder) and the step
    cpu_seconds: float
    cached_tokens: int  # token slots held by the caches after the step
    dropped: int = 0  # sequences of cancelled calls taken out of the batch or the queue
    failed: bool = False
    error: Optional[BaseException] = None
    fatal: bool = False  # the decoding thread stopped: this scheduler decodes nothing more
    failed_records: int = 0  # sequences never to be decoded, their calls answered with an error


class Call:
    """One submitted call: its sequences' outputs and the future its caller awaits."""

    __slots__ = ("future", "outputs", "requests", "left", "priority", "batch", "records")

    def __init__(self, records: int, priority: int):
        self.future: Future = Future()
        self.outputs: list = [None] * records
        self.requests: list = [None] * records  # each finished sequence's DecodeRequest: was it cut short?
        self.left = self.records = records
        self.priority = priority
        self.batch = 0  # largest running batch one of its sequences was decoded in


def claim_failing(requests: Iterable[Any], counted: frozenset = frozenset()) -> tuple[list[Call], int, int]:
    """Of the calls of `requests` (the DecodeRequests a failure takes out: running rows, joiners, waiting ones), those
    to answer with the error, claimed (set running: their callers can no longer cancel them); with the sequences that
    fail (each such call's unfinished ones, wherever they are: its others still queued are skipped uncounted), and
    those dropped (the taken-out sequences of calls their callers cancelled, less the `counted` tags: the queue counts
    the rest of such a call as it skips them)."""
    unique = list({id(request): request for request in requests}.values())
    calls = {id(request.tag[0]): request.tag[0] for request in unique}.values()
    failing = [call for call in calls if not call.future.done() and call.future.set_running_or_notify_cancel()]
    dropped = sum(r.tag[0].future.cancelled() and r.tag not in counted for r in unique)
    return failing, sum(call.left for call in failing), dropped


def drop_every_row(decoder: Any, raise_reset_error: bool = True) -> None:
    """Take every row out of a continuous decoder's batch (its calls failed); if that fails (e.g. no memory to
    reshuffle the caches), start again from empty caches. If that fails too (a sticky device error), it raises, or
    with `raise_reset_error=False` (the decoding thread stops anyway) logs."""
    try:
        decoder.drop({row.request.tag for row in decoder.rows})
    except Exception:  # noqa: BLE001
        logger.exception("continuous decoding: dropping the failed rows failed; the running batch is reset")
        try:
            decoder._reset()  # both engines' (continuous_decoder.py, slot_decoder.py): no rows, empty caches
        except Exception:  # noqa: BLE001
            if raise_reset_error:
                raise
            logger.exception("continuous decoding: resetting the running batch failed too, as the decoding stopped")
