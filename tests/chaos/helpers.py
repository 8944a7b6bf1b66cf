"""Load generators and checks shared by the chaos tests."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Optional

import httpx

from tests.support import wait_for

SENTENCE = ("The children were playing happily in the garden while their parents prepared dinner "
            "and talked about the long journey they had made across the mountains, number {i}.")


def translation_body(n: int, offset: int = 0) -> dict:
    return {"payload": {"fromLang": "en", "toLang": "pt",
                        "records": [{"id": f"r{offset + i}", "text": SENTENCE.format(i=offset + i)}
                                    for i in range(n)]}}


@dataclass
class Outcome:
    started: float
    finished: float
    status: Optional[int]            # None: no HTTP answer (connection error)
    error: str = ""
    headers: dict = field(default_factory=dict)
    body: object = None

    @property
    def seconds(self) -> float:
        return self.finished - self.started


async def post(client: httpx.AsyncClient, path: str, body: dict, headers: Optional[dict] = None) -> Outcome:
    started = time.monotonic()
    try:
        r = await client.post(path, json=body, headers=headers or {})
    except httpx.HTTPError as exc:
        return Outcome(started, time.monotonic(), None, error=type(exc).__name__)
    try:
        parsed = r.json()
    except ValueError:
        parsed = r.text
    return Outcome(started, time.monotonic(), r.status_code, headers=dict(r.headers), body=parsed)


async def steady_load(url: str, stop: asyncio.Event, outcomes: list, workers: int = 4, records: int = 2,
                      path: str = "/translation") -> list[Outcome]:
    """`workers` clients each sending one request after another until `stop` is set; every
    outcome is appended to `outcomes` as it arrives (callers watch it live)."""

    async def worker(w: int):
        async with httpx.AsyncClient(base_url=url, timeout=60) as client:
            i = 0
            while not stop.is_set():
                outcomes.append(await post(client, path, translation_body(records, offset=w * 10_000 + i)))
                i += records

    await asyncio.gather(*(worker(w) for w in range(workers)))
    return outcomes


def cpu_ticks(pid: int) -> int:
    """utime + stime of a process, in clock ticks (to see a replica computing)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


async def wait_quiet(pid: int, timeout_s: float = 60, window_s: float = 0.5, max_ticks: int = 2) -> None:
    """Return once process `pid` burns at most `max_ticks` in a `window_s` window. A replica that
    has just started (or been replaced) still spends CPU on its own start-up for a few seconds,
    which would otherwise pass for a batch computing (seen in CI: 5 ticks, no record enqueued)."""
    deadline = time.monotonic() + timeout_s
    while True:
        before = cpu_ticks(pid)
        await asyncio.sleep(window_s)
        if cpu_ticks(pid) - before <= max_ticks:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"replica {pid} kept computing for {timeout_s} s with no load")


async def start_while_computing(client: httpx.AsyncClient, pid: int, requests: int,
                                records: int) -> list[asyncio.Task]:
    """Start `requests` translations of `records` records each, and return once replica `pid`
    has burnt 50 ms of CPU on them (5 ticks): a batch is computing, the rest are queued. The
    replica must be idle first, so that the ticks counted are our batch's."""
    await wait_quiet(pid)
    ticks = cpu_ticks(pid)
    tasks = [asyncio.create_task(post(client, "/translation", translation_body(records, i * records)))
             for i in range(requests)]
    while cpu_ticks(pid) - ticks < 5:
        await asyncio.sleep(0.01)
    return tasks


def is_clean_error(o: Outcome, status: int, error_type: Optional[str] = None) -> bool:
    """The project's error contract: JSON {"error", "error_type"} (+ Retry-After on 503)."""
    if o.status != status or not isinstance(o.body, dict):
        return False
    if not o.body.get("error") or not o.body.get("error_type"):
        return False
    if error_type and o.body["error_type"] != error_type:
        return False
    return status != 503 or "retry-after" in o.headers


def under_load(run, change, settled, workers: int = 4) -> tuple[list, float]:
    """Steady load on `run` (a ServeRun); `change()` once 10 answers came back; stop 20 answers after
    `settled()` (polled until true, 90 s at most)."""
    outcomes: list = []

    async def scenario():
        stop = asyncio.Event()
        load = asyncio.create_task(steady_load(run.url, stop, outcomes, workers=workers, records=2))
        while sum(o.status == 200 for o in outcomes) < 10:
            await asyncio.sleep(0.02)
        loop = asyncio.get_running_loop()
        took = await loop.run_in_executor(None, change)
        await loop.run_in_executor(None, lambda: wait_for(settled, 90, "the change to take effect", 0.2))
        mark = len(outcomes)
        while len(outcomes) < mark + 20 and not load.done():
            await asyncio.sleep(0.05)
        stop.set()
        await load
        return took

    took = asyncio.run(scenario())
    return outcomes, took


def retrying_post(client: httpx.Client, url: str, body: dict, attempts: int = 20) -> list[tuple[int, str, float]]:
    """POST `body` as a client that honours Retry-After: (status, error_type, seconds) per attempt, until an answer
    that is not a 503 (status 0 and the exception's name: no HTTP answer, tried again after 1 s)."""
    outcomes = []
    for _ in range(attempts):
        started = time.monotonic()
        try:
            answer = client.post(url, json=body)
        except httpx.TransportError as exc:
            outcomes.append((0, type(exc).__name__, time.monotonic() - started))
            time.sleep(1)
            continue
        error_type = "" if answer.status_code == 200 else answer.json().get("error_type", "")
        outcomes.append((answer.status_code, error_type, time.monotonic() - started))
        if answer.status_code != 503:
            break
        time.sleep(float(answer.headers["Retry-After"]))
    return outcomes
