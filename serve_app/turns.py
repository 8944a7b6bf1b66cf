"""Turns: calls that may share the process, and calls that must go alone (a reader-writer lock for asyncio, the
writers first). serve_app/crash_journal.py sends records some process died computing alone."""

from __future__ import annotations

import asyncio


class Turns:
    """Calls that go together (any number at once) and calls that go alone (one at a time, none going together
    meanwhile). A call waiting to go alone holds back new ones that would go together."""

    def __init__(self):
        self.together_now = 0
        self._alone_now = 0  # waiting to go alone, or going
        self._alone_lock = asyncio.Lock()
        self._no_alone = asyncio.Event()
        self._no_alone.set()
        self._drained = asyncio.Event()
        self._drained.set()

    async def together(self) -> None:
        while self._alone_now:
            await self._no_alone.wait()
        self.together_now += 1

    def done_together(self) -> None:
        self.together_now -= 1
        if not self.together_now:
            self._drained.set()

    async def alone(self) -> None:
        self._alone_now += 1
        self._no_alone.clear()
        try:
            await self._alone_lock.acquire()
            try:
                while self.together_now:
                    self._drained.clear()
                    await self._drained.wait()
            except BaseException:
                self._alone_lock.release()
                raise
        except BaseException:
            self._left()
            raise

    def done_alone(self) -> None:
        self._alone_lock.release()
        self._left()

    def _left(self) -> None:
        self._alone_now -= 1
        if not self._alone_now:
            self._no_alone.set()


__all__ = ["Turns"]
