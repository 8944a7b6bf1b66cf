"""The model queue's wait for a fuller batch (deployments/model_queue.py) follows only a batch of the same priority."""

from __future__ import annotations

import time
from collections import deque

from deployments.model_queue import ModelQueue, _Entry
from deployments.priority import Priority


def _run(items):
    return items


def test_an_interactive_call_does_not_wait_for_company_after_a_job_s_batch():
    """The wait is a fraction of the last batch's model time: after a long job batch, the interactive call that had
    waited through it then idled fill_wait_fraction x that batch again (0.2 s after a 1 s job batch at 0.2)."""
    queue = ModelQueue("test", fill_wait_fraction=1.0)
    with queue._ready:
        queue._last_batch_s, queue._last_batch_end = 10.0, time.perf_counter()  # a 10 s batch just ended
        queue._waiting[Priority.INTERACTIVE] = deque([_Entry("x", 1, _run, cap=4)])
        queue._last_priority = Priority.BACKGROUND  # it was a job's
        assert queue._fill_deadline() is None
        queue._last_priority = Priority.INTERACTIVE  # an interactive one: 1 of 4 records, worth waiting
        assert queue._fill_deadline() is not None
        queue._waiting.clear()
    queue.shutdown()
