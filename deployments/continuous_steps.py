"""What the continuous decoding thread (continuous_batching.py) keeps per call and reports per step."""

from __future__ import annotations

from concurrent.futures import Future
from dataclasses import dataclass
from typing import Optional


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
