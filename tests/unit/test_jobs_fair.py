"""Running slots fair between API keys (serve_app/jobs/fair.py): one key's queued jobs do not run ahead of every
other key's; with one owner, first in, first out."""

from __future__ import annotations

import asyncio

from serve_app.jobs.fair import FairSlots

from .fakes import FakeTranslator
from .test_jobs import _runner, _translation


def test_a_freed_slot_goes_to_the_owner_holding_fewest_then_to_the_longest_waiting():
    async def scenario():
        slots, order, gates = FairSlots(1), [], {}

        async def job(name: str, owner: str):
            async with slots.slot(owner):
                order.append(name)
                gates[name] = asyncio.Event()
                await gates[name].wait()

        tasks = [asyncio.create_task(job(f"a{i}", "a")) for i in range(4)]
        await asyncio.sleep(0)
        tasks += [asyncio.create_task(job("b0", "b")), asyncio.create_task(job("c0", "c"))]
        for name in ("a0", "b0", "c0", "a1", "a2", "a3"):  # each freed slot, once its holder is done
            async with asyncio.timeout(5):
                while name not in gates:
                    await asyncio.sleep(0.001)
            gates[name].set()
        await asyncio.gather(*tasks)
        return order

    # All queued while a0 ran. As each ends, every owner holds 0: the owner served least recently goes first
    # (b and c, never served, then a), and among one owner's jobs the longest waiting.
    assert asyncio.run(scenario()) == ["a0", "b0", "c0", "a1", "a2", "a3"]


def test_a_waiter_cancelled_gives_its_turn_to_the_next_and_nothing_leaks():
    async def scenario():
        slots, release = FairSlots(1), asyncio.Event()

        async def hold():
            async with slots.slot("a"):
                await release.wait()

        async def take(owner: str):
            async with slots.slot(owner):
                return owner

        holder = asyncio.create_task(hold())
        await asyncio.sleep(0)
        gone, next_ = asyncio.create_task(take("b")), asyncio.create_task(take("c"))
        await asyncio.sleep(0)
        gone.cancel()
        release.set()
        assert await next_ == "c"
        await asyncio.gather(holder, gone, return_exceptions=True)
        assert not slots.held and not slots._waiting

    asyncio.run(scenario())


def test_another_key_s_job_runs_at_the_next_free_slot_not_after_the_first_key_s_backlog(tmp_path):
    class Recording(FakeTranslator):
        def __init__(self):
            super().__init__(delay_s=0.02)
            self.texts: list[str] = []

        async def call(self, method, *args, **kwargs):
            if method == "translate":
                self.texts.append(args[0].texts[0])
            return await super().call(method, *args, **kwargs)

    async def scenario():
        translator = Recording()
        runner, _, _ = await _runner(tmp_path, translator, start=False, max_running_jobs=1)
        payload = lambda tag: {**_translation(1), "records": [{"id": "0", "text": tag}]}  # noqa: E731
        for i in range(4):
            await runner.submit("translation", payload(f"a{i}"), owner="k-a")
        await runner.submit("translation", payload("b0"), owner="k-b")
        await runner.start()
        try:
            async with asyncio.timeout(20):
                while len(translator.texts) < 5:
                    await asyncio.sleep(0.01)
        finally:
            await runner.stop()
        return translator.texts

    texts = asyncio.run(scenario())
    assert texts.index("b0") <= 1, texts  # the first slot's job, then b0: not after a1, a2 and a3


def test_one_key_holds_at_most_its_share_of_the_slots_and_another_key_starts_at_once():
    """A job holds its slot until it ends (up to jobs.job_timeout_s): one key's two jobs held both default slots and
    another key's job waited for one of them to end. Without API keys (one owner) every slot is used."""
    async def hold(slots, owner, started, release):
        async with slots.slot(owner):
            started.append(owner)
            await release.wait()

    async def scenario():
        # rounded up as the store's shares are (job.StoreLimits): 3 slots at half give a key 2, not 1
        assert [FairSlots(n, share=0.5).per_owner for n in (1, 2, 3, 4)] == [1, 1, 2, 2]
        slots, started, release = FairSlots(2, share=0.5), [], asyncio.Event()
        tasks = [asyncio.ensure_future(hold(slots, "k-a", started, release)) for _ in range(3)]
        await asyncio.sleep(0.01)
        assert started == ["k-a"] and dict(slots.held) == {"k-a": 1}  # the second slot stays free
        tasks.append(asyncio.ensure_future(hold(slots, "k-b", started, release)))
        await asyncio.sleep(0.01)
        assert started == ["k-a", "k-b"]
        release.set()
        await asyncio.gather(*tasks)
        assert started == ["k-a", "k-b", "k-a", "k-a"] and not slots.held and not slots._waiting

        anonymous, release = FairSlots(2, share=0.5), asyncio.Event()
        started = []
        tasks = [asyncio.ensure_future(hold(anonymous, "anonymous", started, release)) for _ in range(3)]
        await asyncio.sleep(0.01)
        assert started == ["anonymous", "anonymous"]
        release.set()
        await asyncio.gather(*tasks)

    asyncio.run(scenario())


def test_result_pages_are_built_a_few_at_once_and_fair_between_keys(tmp_path):
    """A result page is up to jobs.max_page_bytes of JSON, about 3 x that as Python objects, built in the JobManager
    that runs every key's jobs: one key polling from hundreds of connections could run it out of memory. Pages are built
    PAGE_READS_AT_ONCE at a time, at most half of them for one key, so another key's read is not queued behind."""
    from serve_app.jobs.reads import PAGE_READS_AT_ONCE
    from .test_jobs import _finished
    from tests.support import until

    async def scenario():
        runner, _, _ = await _runner(tmp_path)
        try:
            a = (await runner.submit("translation", _translation(3), owner="k-a"))["job_id"]
            b = (await runner.submit("translation", _translation(3), owner="k-b"))["job_id"]
            for job_id, owner in ((a, "k-a"), (b, "k-b")):
                assert (await _finished(runner, job_id, owner))["status"] == "succeeded"
            chunks, gate, building, most = runner.store.chunks, asyncio.Event(), [], [0]

            async def held_chunks(job_id, indexes):  # a page being built: held until the gate opens
                building.append(job_id)
                most[0] = max(most[0], len(building))
                await gate.wait()
                building.remove(job_id)
                return await chunks(job_id, indexes)

            runner.store.chunks = held_chunks
            flood = [asyncio.ensure_future(runner.get(a, "k-a")) for _ in range(20)]
            half = PAGE_READS_AT_ONCE // 2
            slots = runner._page_reads
            await until(lambda: building.count(a) == half and len(slots._waiting) == 20 - half)
            other = asyncio.ensure_future(runner.get(b, "k-b"))
            await until(lambda: b in building)
            assert building.count(b) == 1 and building.count(a) == half, building
            gate.set()
            views = await asyncio.gather(*flood, other)
            assert all(v["status"] == "succeeded" and len(v["result"]["result"]) == 3 for v in views)
            assert most[0] <= PAGE_READS_AT_ONCE
        finally:
            await runner.stop()

    asyncio.run(scenario())


def test_jobs_already_running_are_resumed_past_their_key_s_share(tmp_path):
    """A restart (or an adoption) resumes a key's running jobs; their time limits count from when they started. Held
    back by the key's share of the slots, the second one waited `running` behind the first and could fail `timeout`
    without computing: jobs that were running are resumed at once (queued ones still take turns)."""
    from .test_jobs import _finished

    async def scenario():
        gate = asyncio.Event()

        class Held(FakeTranslator):
            async def call(self, method, *args, **kwargs):
                if method == "translate":
                    await gate.wait()
                return await super().call(method, *args, **kwargs)

        held = Held()
        first, _, _ = await _runner(tmp_path, held, max_share_per_key=1.0)
        jobs = [(await first.submit("translation", _translation(1), owner="k-a"))["job_id"] for _ in range(2)]
        async with asyncio.timeout(5):
            while [(await first.get(j, "k-a"))["status"] for j in jobs] != ["running", "running"]:
                await asyncio.sleep(0.005)
        await first.stop()  # both `running` in the store

        translator = FakeTranslator(delay_s=0.1)
        second, _, _ = await _runner(tmp_path, translator)  # max_share_per_key 0.5: one slot of 2 per key
        try:
            for job_id in jobs:
                assert (await _finished(second, job_id, "k-a"))["status"] == "succeeded"
            assert translator.max_in_flight == 2  # both resumed at once
        finally:
            gate.set()
            await second.stop()

    asyncio.run(scenario())
