"""A model placed in the Ingress dies with the replica an input crashes, and the crash quarantine in memory with it.
So each process journals the records in flight in a locked file per node (serve_app/crash_journal.py): the other
Ingress replica and the restarted one count a dead process's records, send those alone, refuse those that crashed
three, and forget those answered. A process "dies" here as a crash leaves it: its lock dropped, its file not removed
(one test kills a real child process)."""

import asyncio
import multiprocessing
import os

import pytest

from deployments.batching import Chunk
from serve_app.crash_journal import CrashJournal
from serve_app.crash_quarantine import MAX_DEATHS
from serve_app.errors import ModelCrashed
from serve_app.model_clients import LocalClient
from serve_app.placement import PlacedModels
from serve_app.schemas import TranslationPayload
from serve_app.service import Service
from serve_app.settings import load_settings
from tests.unit.fakes import FakeEmbedder

POISON = ("translate", (Chunk("en", "pt", ["poison"]),))
FINE = ("translate", (Chunk("en", "pt", ["fine"]),))
NOBODY = b"\0" * 16


class Clock:
    def __init__(self):
        self.now = 1_000_000_000.0

    def __call__(self):
        return self.now


def _crash(journal: CrashJournal) -> None:
    """What a crash leaves of a process: its lock gone (the OS drops it), its file and whatever it held still there."""
    journal._map.close()
    os.close(journal._fd)


def _crash_holding(folder, *calls, clock=None) -> None:
    journal = CrashJournal(folder, 600, **({"clock": clock} if clock else {}))
    for method, args in calls:
        journal._hold(journal.model("Translator").holding(method, args)._key)
    _crash(journal)


async def _compute(journal: CrashJournal, call=FINE, body=None):
    async with journal.model("Translator").holding(*call):
        if body is not None:
            await body()


def _deaths(journal: CrashJournal, call) -> int:
    return journal.deaths("Translator", journal.model("Translator").holding(*call)._key)


def test_records_in_flight_in_three_dead_processes_are_refused_and_others_are_not(tmp_path):
    survivor = CrashJournal(tmp_path, 600)
    for deaths in range(1, MAX_DEATHS):
        _crash_holding(tmp_path, POISON)
        asyncio.run(_compute(survivor))  # other records are not refused
        assert _deaths(survivor, POISON) == deaths
    _crash_holding(tmp_path, POISON)
    with pytest.raises(ModelCrashed, match="3 Translator replicas died"):
        asyncio.run(_compute(survivor, POISON, body=lambda: pytest.fail("refused records reached the model")))
    assert survivor.refused == 1
    restarted = CrashJournal(tmp_path, 600)  # Serve's replacement learns it from the files
    with pytest.raises(ModelCrashed):
        asyncio.run(_compute(restarted, POISON))
    asyncio.run(_compute(restarted, ("translate", (Chunk("en", "es", ["poison"]),))))  # other records: another pair
    assert len(list(tmp_path.glob("dead-*"))) == 3 and len(list(tmp_path.glob("live-*"))) == 2


def test_a_real_process_killed_holding_records_counts_one_death(tmp_path):
    survivor = CrashJournal(tmp_path, 600)
    context = multiprocessing.get_context("fork")
    ready = context.Event()

    def child():
        async def die_computing():
            ready.set()
            os._exit(1)  # as a segfault would end it: no clean-up
        asyncio.run(_compute(CrashJournal(tmp_path, 600), POISON, body=die_computing))

    process = context.Process(target=child)
    process.start()
    assert ready.wait(30)
    process.join(30)
    assert process.exitcode == 1
    assert _deaths(survivor, POISON) == 1 and _deaths(survivor, FINE) == 0


def test_a_live_process_is_never_taken_for_dead_and_a_graceful_end_costs_nothing(tmp_path):
    survivor, busy = CrashJournal(tmp_path, 600), CrashJournal(tmp_path, 600)
    slot = busy._hold(NOBODY.replace(b"\0", b"\1"))
    for _ in range(MAX_DEATHS + 1):
        survivor.deaths("Translator", NOBODY)
    assert not survivor._suspects and not list(tmp_path.glob("dead-*"))
    busy._release(slot)
    busy.close()  # scaled down: its file goes before its lock
    busy.close()  # (twice is harmless)
    survivor.deaths("Translator", NOBODY)
    assert not survivor._suspects and not list(tmp_path.glob("dead-*")) and not survivor._others


def test_records_that_rode_along_go_alone_once_are_answered_and_forgotten_by_every_process(tmp_path):
    """Requests in flight in the replica a crashing input took down come again: they go alone, are answered, and
    their deaths are cleared from the files, so no process (not even one started later) refuses them."""
    survivor, other = CrashJournal(tmp_path, 600), CrashJournal(tmp_path, 600)
    _crash_holding(tmp_path, POISON, FINE)
    assert _deaths(other, FINE) == 1
    asyncio.run(_compute(survivor, FINE))
    assert survivor.alone == 1 and len(survivor._suspects) == 1  # POISON's
    for journal in (other, CrashJournal(tmp_path, 600)):
        assert _deaths(journal, FINE) == 0 and _deaths(journal, POISON) == 1


def test_a_suspect_goes_alone_so_its_second_crash_counts_against_it_only():
    """The ones that rode along wait outside while it computes (and are not held); new calls wait behind it."""
    async def scenario(folder):
        journal = CrashJournal(folder, 600)
        _crash_holding(folder, POISON)
        order, gate = [], asyncio.Event()

        async def held(name):
            order.append((name, bytes(journal._map).strip(b"\0") != b""))
            await gate.wait()

        first = asyncio.ensure_future(_compute(journal, FINE, body=lambda: held("fine, together")))
        await asyncio.sleep(0)
        suspect = asyncio.ensure_future(_compute(journal, POISON, body=lambda: held("poison, alone")))
        later = asyncio.ensure_future(_compute(journal, ("embed", (["later"],)), body=lambda: held("later")))
        await asyncio.sleep(0.01)
        assert order == [("fine, together", True)]  # the suspect waits for the call in flight; the later one for it
        gate.set()
        await asyncio.gather(first, suspect, later)
        return order, journal

    import tempfile
    with tempfile.TemporaryDirectory() as folder:
        order, journal = asyncio.run(scenario(folder))
    assert [name for name, _ in order] == ["fine, together", "poison, alone", "later"]
    assert journal.alone == 1 and journal.turns.together_now == 0


def test_a_call_that_fails_is_released_but_not_forgotten(tmp_path):
    journal = CrashJournal(tmp_path, 600)
    _crash_holding(tmp_path, FINE)

    async def refuse():
        raise ValueError("the model refused it")
    with pytest.raises(ValueError):
        asyncio.run(_compute(journal, FINE, body=refuse))
    assert bytes(journal._map) == bytes(len(journal._map)) and journal.turns.together_now == 0
    assert _deaths(journal, FINE) == 1
    _crash(journal)  # its own death holds nothing
    assert _deaths(CrashJournal(tmp_path, 600), FINE) == 1


def test_deaths_older_than_the_quarantine_are_not_counted_and_their_files_go(tmp_path):
    clock = Clock()
    survivor = CrashJournal(tmp_path, 600, clock=clock)
    for _ in range(MAX_DEATHS - 1):
        _crash_holding(tmp_path, POISON, clock=clock)
    assert _deaths(survivor, POISON) == MAX_DEATHS - 1
    clock.now += 601
    _crash_holding(tmp_path, POISON, clock=clock)
    assert _deaths(survivor, POISON) == 1  # the old two no longer count
    assert _deaths(CrashJournal(tmp_path, 600, clock=clock), POISON) == 1
    assert len(list(tmp_path.glob("dead-*"))) == 1  # ... and were deleted by the process that read them late


def test_a_long_lived_process_deletes_deaths_past_the_quarantine_and_forgets_them(tmp_path):
    clock = Clock()
    survivor = CrashJournal(tmp_path, 600, clock=clock)
    _crash_holding(tmp_path, POISON, FINE, clock=clock)
    assert _deaths(survivor, POISON) == 1 and len(survivor._suspects) == 2
    clock.now += 601
    survivor.deaths("Translator", NOBODY)
    assert not list(tmp_path.glob("dead-*")) and not survivor._dead and not survivor._suspects


def test_a_journal_that_cannot_be_read_or_made_never_fails_a_call(tmp_path, caplog):
    """A safety net must not become the failure: a folder removed under a live journal (or unreadable) leaves the
    calls computed, and one that cannot be made leaves the placed models served without a journal."""
    import shutil

    journal = CrashJournal(tmp_path / "gone", 600)
    _crash_holding(tmp_path / "gone", POISON)
    assert _deaths(journal, POISON) == 1
    shutil.rmtree(tmp_path / "gone")
    asyncio.run(_compute(journal, FINE))
    asyncio.run(_compute(journal, POISON))  # its deaths went with the files
    assert "cannot be read" in caplog.text
    (tmp_path / "a-file").write_text("")
    settings = load_settings({"embeddings": {"placement": "ingress"}})
    placed = PlacedModels(settings, journal_folder=lambda: tmp_path / "a-file" / "journal")
    try:
        assert placed.journal is None and placed.clients["Embedder"].journal is None
        assert "no crash journal" in caplog.text
    finally:
        placed.shut_down()


def test_calls_past_the_slots_are_computed_unjournaled(tmp_path):
    journal = CrashJournal(tmp_path, 600, slots=2)
    slots = [journal._hold(bytes([i + 1]) * 16) for i in range(3)]
    assert slots[2] is None
    for slot in slots:
        journal._release(slot)
    assert sorted(journal._free) == [0, 1]


def test_placed_models_journal_each_request_and_each_job_call_and_refuse_what_crashed(tmp_path):
    """Through the Service's coalescer (each caller's records) and Ingress.call_placed (a job's call): held while
    they compute, refused once they crashed three processes."""
    settings = load_settings({"translation": {"placement": "ingress"}, "embeddings": {"placement": "ingress"}})
    placed = PlacedModels(settings, journal_folder=lambda: tmp_path)
    translator = placed.clients["Translator"]
    assert isinstance(translator, LocalClient) and translator.journal is not None
    for _ in range(MAX_DEATHS):
        _crash_holding(tmp_path, POISON)
    seen: list[tuple[str, bool]] = []
    original = translator.call

    async def call(method, *args, **kwargs):  # whether the journal holds something while the model computes
        seen.append((method, bytes(placed.journal._map).strip(b"\0") != b""))
        return await original(method, *args, **kwargs)

    translator.call = call
    service = Service(settings, translator=translator, embedder=FakeEmbedder())

    async def scenario():
        def request(*texts):
            return service.translate(TranslationPayload(
                fromLang="en", toLang="pt", records=[{"id": str(i), "text": t} for i, t in enumerate(texts)]))
        answered = await request("Hello.")
        refused = await asyncio.gather(request("poison"), return_exceptions=True)
        job = await placed.call("Translator", "translate", Chunk("en", "pt", ["Good morning."]), background=True)
        with pytest.raises(ModelCrashed):
            await placed.call("Translator", "translate", *POISON[1], background=True)
        return answered, refused[0], job

    try:
        answered, refused, job = asyncio.run(scenario())
        assert answered[0].result[0].text and isinstance(refused, ModelCrashed) and job[0]
        assert [held for method, held in seen if method == "translate"] == [True, True]  # the refused never ran
    finally:
        placed.shut_down()
    assert not list(tmp_path.glob("live-*"))  # a graceful end
