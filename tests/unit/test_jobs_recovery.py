"""Jobs without Ray when the job store misbehaves: a submit cancelled while its job is written, the
store failing for a while (a Redis restart, a locked disk) around a running job, and a cancel whose
state change races a chunk being written. Every job ends once the store answers again, and a
cancelled job keeps no chunk and computes nothing more."""

import asyncio
import threading

import pytest

from serve_app.jobs import retry, runner as runner_mod
from serve_app.jobs.job import FINISHED
from serve_app.jobs.runner import JobRunner
from serve_app.jobs.store.sqlite import SqliteJobStore
from serve_app.settings import load_settings
from tests.support import until as _until
from tests.unit.fakes import FakeEmbedder, FakeTranslator
from tests.unit.test_jobs import Clock, _translation


class TroubledStore(SqliteJobStore):
    """SQLite that fails the next N calls of chosen methods (`failures`), and holds chosen writes in
    the store's thread (`hold`: a busy disk) until released; the write commits either way."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.failures: dict[str, int] = {}
        self._held: dict[str, tuple[threading.Event, threading.Event]] = {}

    def hold(self, name: str) -> tuple[threading.Event, threading.Event]:
        """(entered, release) of the store's next writes named `name` (`create`, `finish`)."""
        self._held[name] = (threading.Event(), threading.Event())
        return self._held[name]

    async def _run(self, fn, *args):
        if (held := self._held.get(getattr(fn, "__name__", ""))) is None:
            return await super()._run(fn, *args)
        entered, release = held

        def holding(db, *a):
            entered.set()
            release.wait(10)
            return fn(db, *a)

        return await super()._run(holding, *args)

    def _fail(self, name: str) -> None:
        if self.failures.get(name, 0) > 0:
            self.failures[name] -= 1
            raise ConnectionError(f"job store down ({name})")

    async def unfinished(self):
        self._fail("unfinished")
        return await super().unfinished()

    async def payload(self, job_id):
        self._fail("payload")
        return await super().payload(job_id)

    async def finish(self, *args, **kwargs):
        self._fail("finish")
        return await super().finish(*args, **kwargs)


class GatedTranslator(FakeTranslator):
    """Each translation waits for `gate` (a chunk computing while something else happens)."""

    def __init__(self):
        super().__init__()
        self.gate = asyncio.Event()
        self.waiting = 0

    async def call(self, method, *args, background=False):
        if method == "translate":
            self.waiting += 1
            await self.gate.wait()
        return await super().call(method, *args, background=background)


@pytest.fixture
def fast_maintenance(monkeypatch):
    """Maintenance ticks every 10 ms (not 2 s); a store call is retried for 0.2 s (not 120 s)."""
    monkeypatch.setattr(runner_mod, "MAINTENANCE_INTERVAL_S", 0.01)
    monkeypatch.setattr(retry, "STORE_RETRY_S", 0.2)


def _runner(tmp_path, translator=None) -> tuple[JobRunner, TroubledStore]:
    settings = load_settings({"jobs": {"max_records_per_job": 50, "chunk_records": 8}})
    clock = Clock()
    store = TroubledStore(tmp_path / "jobs.sqlite3", clock=clock)
    runner = JobRunner(settings, {"translation": translator or FakeTranslator(), "embeddings": FakeEmbedder()},
                       store=store, clock=clock)
    return runner, store


async def _finished(runner: JobRunner, job_id: str, timeout_s: float = 5.0) -> dict:
    """The job's view once it finished (TimeoutError if it never does)."""
    async with asyncio.timeout(timeout_s):
        while (view := await runner.get(job_id))["status"] not in FINISHED:
            await asyncio.sleep(0.005)
    return view


def test_a_submit_cancelled_while_its_job_is_written_still_runs(tmp_path, fast_maintenance):
    """The client gave up (Serve cancelled the call) while the create was committing: the job exists,
    and the maintenance sweep runs it; the client's retry with its key gets that job, which ends."""
    async def scenario():
        runner, store = _runner(tmp_path)
        await runner.start()
        entered, release = store.hold("create")
        submit = asyncio.create_task(runner.submit("translation", _translation(3), idempotency_key="k1"))
        await _until(entered.is_set)
        submit.cancel()
        await asyncio.gather(submit, return_exceptions=True)
        release.set()  # the create commits; `submit` never reaches its launch
        again = await runner.submit("translation", _translation(3), idempotency_key="k1")
        view = await _finished(runner, again["job_id"])
        stats = await runner.stats()
        await runner.stop()
        return submit, view, stats

    submit, view, stats = asyncio.run(scenario())
    assert submit.cancelled() and view["status"] == "succeeded"
    assert stats["queued"] == stats["running"] == 0 and stats["succeeded"] == 1  # no orphan holds a slot


def test_jobs_of_a_previous_runner_are_resumed_after_a_failed_read(tmp_path, fast_maintenance):
    """The new runner takes the lease, but its read of the unfinished jobs fails once: it reads again."""
    async def scenario():
        first, _ = _runner(tmp_path)  # never started: stores the job and runs nothing (a crashed replica)
        job = await first.submit("translation", _translation(3))
        await first.stop()
        second, store = _runner(tmp_path)
        store.failures["unfinished"] = 1
        await second.start()
        holding_after_failed_read = second.holding
        view = await _finished(second, job["job_id"])
        await second.stop()
        return holding_after_failed_read, view

    holding_after_failed_read, view = asyncio.run(scenario())
    assert not holding_after_failed_read
    assert view["status"] == "succeeded"


def test_a_transient_error_reading_the_payload_is_retried(tmp_path):
    async def scenario():
        runner, store = _runner(tmp_path)
        await runner.start()
        store.failures["payload"] = 1
        job = await runner.submit("translation", _translation(3))
        await asyncio.gather(runner._tasks[job["job_id"]], return_exceptions=True)
        view = await runner.get(job["job_id"])
        await runner.stop()
        return view

    view = asyncio.run(scenario())
    assert view["status"] == "succeeded", view["error"]


@pytest.mark.parametrize("failures", [2, 4], ids=["one-retry-period", "two-retry-periods"])
def test_a_store_outage_at_the_final_write_leaves_the_job_to_resume_not_failed(tmp_path, fast_maintenance, failures):
    """Every chunk is stored, then the final write fails past retry.STORE_RETRY_S (2 attempts each
    0.2 s period here): the job is neither failed (its chunks deleted) nor left running without a
    task; the sweep runs it again, which finds every chunk stored and records it succeeded."""
    async def scenario():
        translator = FakeTranslator()
        runner, store = _runner(tmp_path, translator)
        await runner.start()
        store.failures["finish"] = failures
        job = await runner.submit("translation", _translation(20))
        view = await _finished(runner, job["job_id"])
        await runner.stop()
        return view, translator, store.failures["finish"]

    view, translator, failures_left = asyncio.run(scenario())
    assert failures_left == 0
    assert view["status"] == "succeeded", view["error"]
    assert view["result"]["result"] == [{"id": str(i), "text": f"[pt] t{i}"} for i in range(20)]
    assert len(translator.calls) == 3  # its 3 chunks computed once, not again when resumed


def test_a_cancel_whose_caller_gave_up_mid_write_stops_the_job_at_its_next_chunk(tmp_path):
    """DELETE's state change commits while a chunk computes, but the caller was cancelled before it
    could cancel the job's task: the chunk's write is refused, nothing more is computed or counted."""
    async def scenario():
        translator = GatedTranslator()
        runner, store = _runner(tmp_path, translator)
        await runner.start()
        job = await runner.submit("translation", _translation(48))  # 6 chunks of 8 records
        await _until(lambda: translator.waiting == 1)  # the first chunk computes
        task = runner._tasks[job["job_id"]]
        entered, release = store.hold("finish")
        cancel = asyncio.create_task(runner.cancel(job["job_id"]))
        await _until(entered.is_set)
        cancel.cancel()
        await asyncio.gather(cancel, return_exceptions=True)
        release.set()
        translator.gate.set()  # the first chunk's answer: its write queues behind the cancel's
        await asyncio.wait_for(asyncio.gather(task, return_exceptions=True), 5)
        record, chunks, counts = await store.get(job["job_id"]), await store.chunk_metas(job["job_id"]), \
            await store.counts()
        await runner.stop()
        return record, chunks, counts, translator

    record, chunks, counts, translator = asyncio.run(scenario())
    assert record.status == "cancelled" and chunks == {}
    assert record.reserved_bytes == record.used_bytes == 0 and counts["result_bytes"] == 0
    assert len(translator.calls) == 1  # the chunk computing when it was cancelled; no other
