"""A Translator replica's teardown (Serve runs its `__del__` at the end of a graceful shutdown) stops its continuous
decoding: the decoding loop ends after the step under way, the callers still waiting get ReplicaStopped instead of
waiting for a loop that would never answer them, and the ingress tries another replica for them
(serve_app/handle_client.py; tests/unit/test_reliability.py). On the fake decoder (fake_decoder.py)."""

from __future__ import annotations

import time

import pytest

from deployments.batching import Chunk
from deployments.errors import ReplicaStopped

from . import fake_decoder
from .test_continuous_records import _settled, _start_together, _tallies


@pytest.fixture
def translator(monkeypatch):
    replica = fake_decoder.continuous_translator(monkeypatch, max_running_sequences=2)
    yield replica
    replica._continuous.scheduler.decoder.release()
    replica._continuous.shutdown()


def test_the_teardown_stops_decoding_and_fails_the_callers_still_waiting(translator, loop):
    scheduler = translator._continuous.scheduler
    decoder = scheduler.decoder
    decoder.hold()
    # two sentences decode (the running batch holds 2), the third waits to join
    running, queued = _start_together(translator, loop, Chunk("en", "de", ["abcdef", "abcdefg"]),
                                      Chunk("en", "de", ["abcdefgh"]))
    assert decoder.entered.wait(30)
    began = time.monotonic()
    translator.__del__()  # as Serve does, on the replica's event loop: it must not wait for the step
    assert time.monotonic() - began < 5 and scheduler._thread.is_alive()
    decoder.release()
    for task in (running, queued):
        assert isinstance(_settled(loop, task, timeout_s=10), ReplicaStopped)
    scheduler._thread.join(10)
    assert not scheduler._thread.is_alive()
    with pytest.raises(ReplicaStopped):  # a call that still comes is refused
        loop.run_until_complete(translator.translate(Chunk("en", "de", ["late"])))
    assert _tallies(translator) == (3, 0, 0, 3)
    with pytest.raises(RuntimeError, match="finished its graceful shutdown"):
        translator.check_health()
