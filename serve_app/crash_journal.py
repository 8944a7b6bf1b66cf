"""Records that crash a model placed in the Ingress are refused, though the crash took the memory of it along.

A model placed in the Ingress (`placement: ingress`, `make run`) runs in the Ingress replica's own process, so an
input that crashes it (a segfault, the OOM killer, a custom model's os._exit) takes the replica down with every
request it held, and Serve starts another; a crash quarantine in memory (serve_app/crash_quarantine.py) dies with
it. So each Ingress replica journals the records its placed models are computing in a file that outlives it, in a
folder per node, Ray session and application: one fingerprint (crash_quarantine.py's, of model, method and
records) per call in flight. The file is mapped into memory, so holding a call is a 16-byte write, and the process
keeps an exclusive lock (flock) on it for its life. The OS drops the lock when the process dies, however it dies:
a live file whose lock another process can take is a dead process's. That one renames it `dead-<when>-...`, and
each fingerprint still in it counts one death, for every Ingress replica on the node (the other one, and the one
Serve starts in the dead one's place).

Records in `MAX_DEATHS` dead files of the last `ingress.crash_quarantine_s` get 500 `model_crashed` without
reaching the model. Records in fewer go alone (`Turns`): one call at a time with nothing else in flight in the
process, so a crash they cause again is counted against them only. The requests that rode along with a crashing
input the first time go alone too, are answered, and are forgotten: the process that answers records clears them
from every dead file. The callers that hold records are the Service's coalescers (each request's records, before
they share a call) and Ingress.call_placed (a job's call). Per node: on a cluster, each node's Ingress replicas
lose up to three before refusing.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import mmap
import os
import time
import uuid
from pathlib import Path
from typing import Callable, Optional

from .crash_quarantine import MAX_DEATHS, crashed, fingerprint
from .turns import Turns

logger = logging.getLogger("serve_app")

#: calls one process journals at once (the rest are computed unjournaled; logged once)
SLOTS = 1024
_SIZE = 16  # bytes in a fingerprint
_EMPTY = bytes(_SIZE)
_RACY_NS = 2_000_000_000


class CrashJournal:
    """This process's journal of its placed models' calls in flight, and what the dead processes' journals say."""

    def __init__(self, folder: Path, quarantine_s: float, *, slots: int = SLOTS,
                 clock: Callable[[], float] = time.time):
        self.folder, self.quarantine_s, self._clock = Path(folder), quarantine_s, clock
        self.folder.mkdir(parents=True, exist_ok=True)
        own = f"{os.getpid()}-{uuid.uuid4().hex[:12]}"
        fresh = self.folder / f"new-{own}"  # locked before it is named live-: nobody probes it unlocked
        self._fd = os.open(fresh, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.ftruncate(self._fd, slots * _SIZE)
        self._map = mmap.mmap(self._fd, slots * _SIZE)
        self._path = self.folder / f"live-{own}"
        os.rename(fresh, self._path)
        self._free = list(range(slots - 1, -1, -1))
        self._full_logged = False
        self._others: dict[str, int] = {}  # other processes' live files: name -> fd, probed on each check
        self._dead: dict[str, float] = {}  # dead files read: name -> when the death was found
        #: fingerprint -> [(dead file, offset)]: the deaths each suspect was in (voided ones dropped lazily)
        self._suspects: dict[bytes, list[tuple[str, int]]] = {}
        self._folder_seen: Optional[int] = None
        self._expiry_due = 0.0
        self._sync_failed = False
        self.turns = Turns()
        #: calls refused without reaching the model, and calls computed alone (tests and logs read them)
        self.refused = 0
        self.alone = 0
        self._sync()

    def model(self, name: str) -> "ModelJournal":
        """The journal as one placed model's callers hold it."""
        return ModelJournal(self, name)

    def deaths(self, name: str, key: bytes) -> int:
        """Processes that died computing these records within the quarantine; ModelCrashed once they are refused."""
        try:
            self._sync()
        except OSError as exc:  # (the folder gone or unreadable: the call is computed, never failed for it)
            if not self._sync_failed:
                logger.warning("the crash journal in %s cannot be read (%s); inputs that crash a model are not "
                               "refused while it cannot", self.folder, exc)
                self._sync_failed = True
        count = self._deaths(key) if key in self._suspects else 0
        if count >= MAX_DEATHS:
            self.refused += 1
            raise crashed(name, count, self.quarantine_s)
        return count

    def close(self) -> None:
        """A graceful end: the file goes first, so that nobody takes this process for dead."""
        if self._map.closed:
            return
        with contextlib.suppress(OSError):
            self._path.unlink()
        self._map.close()
        os.close(self._fd)
        for fd in self._others.values():
            os.close(fd)
        self._others.clear()

    # -- this process's file ------------------------------------------------------------------------------------
    def _hold(self, key: bytes) -> Optional[int]:
        if self._map.closed:  # (the replica is shutting down)
            return None
        if not self._free:
            if not self._full_logged:
                logger.warning("more than %d model calls in flight; the rest are not journaled", SLOTS)
                self._full_logged = True
            return None
        slot = self._free.pop()
        self._map[slot * _SIZE:(slot + 1) * _SIZE] = key
        return slot

    def _release(self, slot: Optional[int]) -> None:
        if slot is not None and not self._map.closed:  # (closed: the replica shut down while this computed)
            self._map[slot * _SIZE:(slot + 1) * _SIZE] = _EMPTY
            self._free.append(slot)

    # -- the others' files --------------------------------------------------------------------------------------
    def _sync(self) -> None:
        """Read the folder again if it changed (a file came, died or went), then probe each live file's lock."""
        seen = os.stat(self.folder).st_mtime_ns
        # A folder's mtime has the kernel's coarse clock (ms, or 1 s on some file systems): changes within one tick
        # of the last listing keep it. So the folder is listed again while its mtime is that recent ("racy git").
        if seen != self._folder_seen or time.time_ns() - seen < _RACY_NS:
            self._folder_seen = seen  # (before listing: a change while listing is seen next time)
            self._rescan()
        if self._dead:
            self._expire()
        for name, fd in list(self._others.items()):
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue  # alive
            del self._others[name]
            try:  # its owner is dead (or ended gracefully and unlinked it: then the rename fails)
                dead = f"dead-{int(self._clock() * 1e9)}-{name[len('live-'):]}"
                os.rename(self.folder / name, self.folder / dead)
            except FileNotFoundError:
                pass
            else:
                logger.error("a process died computing model calls (journal %s in %s)", name, self.folder)
                self._read_dead(dead)  # counted now, not at the next rescan
            finally:
                os.close(fd)

    def _rescan(self) -> None:
        names = set(os.listdir(self.folder))
        for name in list(self._others):
            if name not in names:
                os.close(self._others.pop(name))
        for name in sorted(names):
            if name.startswith("live-") and name != self._path.name and name not in self._others:
                with contextlib.suppress(FileNotFoundError):
                    self._others[name] = os.open(self.folder / name, os.O_RDONLY)
            elif name.startswith("dead-") and name not in self._dead:
                self._read_dead(name)
        self._drop([name for name in self._dead if name not in names])

    def _drop(self, gone: list[str]) -> None:
        """Dead files deleted (by whoever found them past the quarantine): their deaths are forgotten here too."""
        if not gone:
            return
        for name in gone:
            del self._dead[name]
        entries = ((key, [e for e in deaths if e[0] in self._dead]) for key, deaths in self._suspects.items())
        self._suspects = {key: deaths for key, deaths in entries if deaths}

    def _expire(self) -> None:
        """Delete the dead files past the quarantine (looked at once a minute at most)."""
        now = self._clock()
        if now < self._expiry_due:
            return
        self._expiry_due = now + 60
        old = [name for name, died_at in self._dead.items() if now - died_at >= self.quarantine_s]
        for name in old:
            with contextlib.suppress(FileNotFoundError):
                (self.folder / name).unlink()
        self._drop(old)

    def _read_dead(self, name: str) -> None:
        died_at = int(name.split("-")[1]) / 1e9
        if self._clock() - died_at >= self.quarantine_s:
            with contextlib.suppress(FileNotFoundError):
                (self.folder / name).unlink()  # forgotten (whoever reads it first deletes it)
            return
        try:
            data = (self.folder / name).read_bytes()
        except FileNotFoundError:
            return
        self._dead[name] = died_at
        for offset in range(0, len(data) - _SIZE + 1, _SIZE):
            key = data[offset:offset + _SIZE]
            if key != _EMPTY:
                self._suspects.setdefault(key, []).append((name, offset))

    def _deaths(self, key: bytes) -> int:
        """Dead files within the quarantine that still hold `key` (another process may have voided it)."""
        now, live = self._clock(), []
        for name, offset in self._suspects[key]:
            died_at = self._dead.get(name)
            if died_at is None or now - died_at >= self.quarantine_s:
                continue
            with contextlib.suppress(OSError), open(self.folder / name, "rb") as dead:
                dead.seek(offset)
                if dead.read(_SIZE) == key:
                    live.append((name, offset))
        if live:
            self._suspects[key] = live
        else:
            del self._suspects[key]
        return len(live)

    def _forget(self, key: bytes) -> None:
        """`key` was answered: clear it from every dead file (every process then counts it no more)."""
        for name, offset in self._suspects.pop(key, ()):
            with contextlib.suppress(OSError), open(self.folder / name, "r+b") as dead:
                dead.seek(offset)
                if dead.read(_SIZE) == key:
                    dead.seek(offset)
                    dead.write(_EMPTY)


class ModelJournal:
    """One placed model's view of the process's journal: what its callers hold (LocalClient.journal)."""

    def __init__(self, journal: CrashJournal, name: str):
        self.journal, self.name = journal, name

    def holding(self, method: str, args: tuple) -> "_Held":
        """`async with` it around computing these records: refused (ModelCrashed) if they crashed `MAX_DEATHS`
        processes here; computed alone if they crashed fewer; held in the journal meanwhile; forgotten once answered."""
        return _Held(self.journal, self.name, fingerprint(f"{self.name}.{method}", args))


class _Held:
    def __init__(self, journal: CrashJournal, name: str, key: bytes):
        self._journal, self._name, self._key, self._slot, self._alone = journal, name, key, None, False

    async def __aenter__(self) -> None:
        journal = self._journal
        self._alone = journal.deaths(self._name, self._key) > 0
        if self._alone:
            await journal.turns.alone()
            try:
                journal.deaths(self._name, self._key)  # (more processes may have died meanwhile)
            except BaseException:
                journal.turns.done_alone()
                raise
            journal.alone += 1
        else:
            await journal.turns.together()
        self._slot = journal._hold(self._key)

    async def __aexit__(self, kind, error, traceback) -> None:
        self._journal._release(self._slot)
        (self._journal.turns.done_alone if self._alone else self._journal.turns.done_together)()
        if kind is None and self._key in self._journal._suspects:
            self._journal._forget(self._key)


def journal_folder() -> Optional[Path]:
    """This node's journal folder of this replica's application, in the Ray session's folder; None outside a Serve
    replica (unit tests)."""
    import ray
    from ray import serve

    if not ray.is_initialized():
        return None
    try:
        app = serve.get_replica_context().app_name
    except Exception:  # (RayServeException: not in a replica)
        return None
    context = ray.get_runtime_context()
    return Path(context.get_temp_dir()) / context.get_session_name() / "serve-app" / "crash-journal" / app


__all__ = ["SLOTS", "CrashJournal", "ModelJournal", "journal_folder"]
