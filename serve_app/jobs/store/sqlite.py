"""The job store in one SQLite file (the standard library's sqlite3), the default on one machine.

WAL mode with `synchronous=NORMAL`: a committed write survives the JobManager's process being
killed (the WAL is in the OS's page cache); a power cut may lose the last transactions, never
corrupt the file. Every call runs on one worker thread (sqlite3 connections are not shared between
threads), off the replica's event loop. Several processes may open the file (WAL readers do not
block the writer); only the holder of a cluster's lock file (`<path>.lock`, `<path>.<cluster>.lock`: an
flock, freed by the OS when its process dies, SIGKILL included) runs that cluster's jobs.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, Optional

from ..job import FINISHED, STATES, UNBOUNDED, JobRecord, StoreLimits
from . import Chunk, JobStore, Lease
from .files import FileLease, lock_path, private

#: the project's root (this file is serve_app/jobs/store/sqlite.py in it): where `make run` runs and
#: creates `.data/`; a relative `jobs.store_path` is under it when this module runs from a checkout
ROOT = Path(__file__).resolve().parents[3]

SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    id TEXT PRIMARY KEY, owner TEXT NOT NULL, task TEXT NOT NULL, status TEXT NOT NULL,
    records_total INTEGER NOT NULL, records_done INTEGER NOT NULL DEFAULT 0, chunk_records INTEGER NOT NULL,
    created_at REAL NOT NULL, started_at REAL, finished_at REAL, expires_at REAL, error TEXT,
    key TEXT, body_hash TEXT NOT NULL, reserved_bytes INTEGER NOT NULL, used_bytes INTEGER NOT NULL DEFAULT 0,
    payload BLOB, cluster TEXT NOT NULL DEFAULT ''
);
CREATE UNIQUE INDEX IF NOT EXISTS jobs_by_key ON jobs (owner, key) WHERE key IS NOT NULL;
CREATE INDEX IF NOT EXISTS jobs_by_status ON jobs (status, created_at);
CREATE INDEX IF NOT EXISTS jobs_by_owner ON jobs (owner);
CREATE INDEX IF NOT EXISTS jobs_by_expiry ON jobs (expires_at) WHERE expires_at IS NOT NULL;
CREATE TABLE IF NOT EXISTS chunks (
    job_id TEXT NOT NULL, idx INTEGER NOT NULL, records INTEGER NOT NULL, meta TEXT NOT NULL, data BLOB NOT NULL,
    PRIMARY KEY (job_id, idx)
) WITHOUT ROWID;
"""

_COLUMNS = ("id", "owner", "task", "status", "records_total", "records_done", "chunk_records", "created_at",
            "started_at", "finished_at", "expires_at", "error", "key", "body_hash", "reserved_bytes", "used_bytes",
            "cluster")
_SELECT = f"SELECT {', '.join(_COLUMNS)} FROM jobs"
_UNFINISHED = "('queued', 'running')"
#: what the store holds (add a WHERE to count one owner's): unfinished jobs, jobs, result bytes reserved
_HELD = f"SELECT COALESCE(SUM(status IN {_UNFINISHED}), 0), COUNT(*), COALESCE(SUM(reserved_bytes), 0) FROM jobs"
#: the results the store holds, as counted against jobs.max_total_result_bytes (reserved, or stored where more)
_RESULT_BYTES = "SELECT COALESCE(SUM(reserved_bytes), 0) FROM jobs"


def _record(row: tuple) -> JobRecord:
    data = dict(zip(_COLUMNS, row))
    data["error"] = json.loads(data["error"]) if data["error"] else None
    return JobRecord.from_dict(data)


class SqliteJobStore(JobStore):
    def __init__(self, path: Path, *, clock: Callable[[], float] = time.time, cluster: str = ""):
        self.path, self.cluster = Path(path), cluster
        self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        self._clock = clock
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="job-store")
        self._db: Optional[sqlite3.Connection] = None
        self._lease = FileLease(lock_path(self.path, cluster))

    @staticmethod
    def resolve(path: str) -> Path:
        """A relative path is under the project's root; installed as a package (no checkout around this
        module, e.g. `pip install .` into site-packages), under the current directory instead."""
        p = Path(path).expanduser()
        return p if p.is_absolute() else (ROOT if (ROOT / "pyproject.toml").is_file() else Path.cwd()) / p

    def _connect(self) -> sqlite3.Connection:
        if self._db is None:
            private(self.path)
            db = sqlite3.connect(self.path, timeout=30, isolation_level=None, check_same_thread=False)
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=NORMAL")
            db.executescript(SCHEMA)
            if "cluster" not in {row[1] for row in db.execute("PRAGMA table_info(jobs)")}:  # a store from before
                try:
                    db.execute("ALTER TABLE jobs ADD COLUMN cluster TEXT NOT NULL DEFAULT ''")
                except sqlite3.OperationalError as exc:  # another process added it in between
                    if "duplicate column" not in str(exc):
                        raise
            self._db = db
        return self._db

    async def _run(self, fn: Callable[..., Any], *args: Any) -> Any:
        def call():
            db = self._connect()
            db.execute("BEGIN IMMEDIATE")
            try:
                result = fn(db, *args)
                db.execute("COMMIT")
            except BaseException:
                if db.in_transaction:  # also after a failed COMMIT (busy, I/O): else every later BEGIN fails
                    db.execute("ROLLBACK")
                raise
            return result

        return await asyncio.get_running_loop().run_in_executor(self._thread, call)

    def _live(self, record: Optional[JobRecord], now: Optional[float] = None) -> Optional[JobRecord]:
        now = self._clock() if now is None else now
        if record is None or (record.expires_at is not None and record.expires_at <= now):
            return None
        return record

    async def create(self, record: JobRecord, payload: bytes, limits: StoreLimits) -> JobRecord:
        def create(db: sqlite3.Connection) -> JobRecord:
            now = self._clock()
            if record.key is not None:
                row = db.execute(f"{_SELECT} WHERE owner = ? AND key = ?", (record.owner, record.key)).fetchone()
                if row is not None and self._live(_record(row), now) is not None:
                    return _record(row)
            # an expired holder of the key (at the same `now` as above), and expired results, make room
            self._purge(db, now)
            for where, args, prefix, bounds in (
                    ("", (), "", (limits.max_unfinished_jobs, limits.max_jobs, limits.max_total_result_bytes)),
                    (" WHERE owner = ?", (record.owner,), "owner_",
                     (limits.max_unfinished_per_owner, limits.max_jobs_per_owner, limits.max_bytes_per_owner))):
                unfinished, jobs, total = db.execute(_HELD + where, args).fetchone()
                for reason, past in (("unfinished", unfinished >= bounds[0]), ("jobs", jobs >= bounds[1]),
                                     ("bytes", total + record.reserved_bytes > bounds[2])):
                    if past:
                        raise limits.refusal(prefix + reason)
            values = {**record.to_dict(), "error": None, "payload": payload}
            names = (*_COLUMNS, "payload")
            db.execute(f"INSERT INTO jobs ({', '.join(names)}) VALUES ({', '.join('?' * len(names))})",
                       [values[n] for n in names])
            return record

        return await self._run(create)

    async def find(self, owner: str, key: str) -> Optional[JobRecord]:
        row = await self._run(lambda db: db.execute(f"{_SELECT} WHERE owner = ? AND key = ?", (owner, key)).fetchone())
        return self._live(_record(row)) if row else None

    async def get(self, job_id: str) -> Optional[JobRecord]:
        row = await self._run(lambda db: db.execute(f"{_SELECT} WHERE id = ?", (job_id,)).fetchone())
        return self._live(_record(row)) if row else None

    async def payload(self, job_id: str) -> Optional[bytes]:
        row = await self._run(lambda db: db.execute("SELECT payload FROM jobs WHERE id = ?", (job_id,)).fetchone())
        return row[0] if row else None

    async def start(self, job_id: str, now: float) -> None:
        await self._run(lambda db: db.execute(
            f"UPDATE jobs SET status = 'running', started_at = COALESCE(started_at, ?) "
            f"WHERE id = ? AND status IN {_UNFINISHED}", (now, job_id)))

    async def put_chunk(self, job_id: str, index: int, records: int, meta: dict, data: bytes,
                        limits: StoreLimits) -> bool:
        def put(db: sqlite3.Connection) -> bool:
            row = db.execute(f"SELECT used_bytes, reserved_bytes FROM jobs WHERE id = ? AND status IN {_UNFINISHED}",
                             (job_id,)).fetchone()
            if row is None:
                return False  # finished meanwhile (cancelled): nothing kept, nothing counted
            if db.execute("SELECT 1 FROM chunks WHERE job_id = ? AND idx = ?", (job_id, index)).fetchone():
                return True  # stored already (a resent write)
            used, grows = row[0] + len(data), max(0, row[0] + len(data) - row[1])
            if used > limits.max_job_result_bytes:
                raise limits.outgrown("job")
            if grows and db.execute(_RESULT_BYTES).fetchone()[0] + grows > limits.max_total_result_bytes:
                raise limits.outgrown("bytes")
            if grows and limits.max_bytes_per_owner < UNBOUNDED and db.execute(
                    _RESULT_BYTES + " WHERE owner = (SELECT owner FROM jobs WHERE id = ?)",
                    (job_id,)).fetchone()[0] + grows > limits.max_bytes_per_owner:
                raise limits.outgrown("owner_bytes")
            added = db.execute("INSERT OR IGNORE INTO chunks (job_id, idx, records, meta, data) VALUES (?, ?, ?, ?, ?)",
                               (job_id, index, records, json.dumps(meta), data)).rowcount
            if added:
                db.execute("UPDATE jobs SET records_done = records_done + ?, used_bytes = used_bytes + ?, "
                           "reserved_bytes = MAX(reserved_bytes, used_bytes + ?) WHERE id = ?",
                           (records, len(data), len(data), job_id))
            return True

        return await self._run(put)

    async def chunk_metas(self, job_id: str) -> dict[int, tuple[int, dict]]:
        rows = await self._run(lambda db: db.execute(
            "SELECT idx, records, meta FROM chunks WHERE job_id = ?", (job_id,)).fetchall())
        return {idx: (records, json.loads(meta)) for idx, records, meta in rows}

    async def chunks(self, job_id: str, indexes: list[int]) -> dict[int, Chunk]:
        def read(db: sqlite3.Connection) -> dict[int, Chunk]:
            marks = ", ".join("?" * len(indexes))
            rows = db.execute(f"SELECT idx, records, meta, data FROM chunks WHERE job_id = ? AND idx IN ({marks})",
                              (job_id, *indexes)).fetchall()
            return {idx: (records, json.loads(meta), bytes(data)) for idx, records, meta, data in rows}

        return await self._run(read) if indexes else {}

    async def finish(self, job_id: str, status: str, now: float, expires_at: float,
                     error: Optional[dict] = None) -> bool:
        assert status in FINISHED, status

        def finish(db: sqlite3.Connection) -> bool:
            done = db.execute(
                f"UPDATE jobs SET status = ?, finished_at = ?, expires_at = ?, error = ?, payload = NULL "
                f"WHERE id = ? AND status IN {_UNFINISHED}",
                (status, now, expires_at, json.dumps(error) if error else None, job_id)).rowcount
            if done and status != "succeeded":  # nobody reads a failed or cancelled job's chunks
                db.execute("DELETE FROM chunks WHERE job_id = ?", (job_id,))
                db.execute("UPDATE jobs SET reserved_bytes = 0, used_bytes = 0 WHERE id = ?", (job_id,))
            elif done:  # its results are whole: the reservation comes down to what they hold
                db.execute("UPDATE jobs SET reserved_bytes = used_bytes WHERE id = ?", (job_id,))
            return bool(done)

        return await self._run(finish)

    async def unfinished(self) -> list[JobRecord]:
        rows = await self._run(lambda db: db.execute(
            f"{_SELECT} WHERE status IN {_UNFINISHED} ORDER BY created_at").fetchall())
        return [_record(r) for r in rows]

    async def lease_free(self, cluster: str) -> bool:
        lease = FileLease(lock_path(self.path, cluster))
        free = await lease.acquire()
        await lease.release()
        return free

    async def adopt(self, cluster: str) -> int:
        lease = FileLease(lock_path(self.path, cluster))
        if not await lease.acquire():  # that cluster's JobManager lives
            return 0
        try:
            return await self._run(lambda db: db.execute(
                f"UPDATE jobs SET cluster = ? WHERE cluster = ? AND status IN {_UNFINISHED}",
                (self.cluster, cluster)).rowcount)
        finally:
            await lease.release()

    @staticmethod
    def _purge(db: sqlite3.Connection, now: float) -> int:
        ids = [r[0] for r in db.execute("SELECT id FROM jobs WHERE expires_at <= ?", (now,)).fetchall()]
        for job_id in ids:
            db.execute("DELETE FROM chunks WHERE job_id = ?", (job_id,))
            db.execute("DELETE FROM jobs WHERE id = ?", (job_id,))
        return len(ids)

    async def purge(self, now: float) -> int:
        return await self._run(self._purge, now)

    async def counts(self) -> dict[str, int]:
        def count(db: sqlite3.Connection) -> dict[str, int]:
            now = self._clock()
            counts = {state: 0 for state in STATES}
            counts.update(db.execute("SELECT status, COUNT(*) FROM jobs WHERE expires_at IS NULL OR expires_at > ? "
                                     "GROUP BY status", (now,)).fetchall())
            counts["result_bytes"] = db.execute(_RESULT_BYTES).fetchone()[0]
            return counts

        return await self._run(count)

    def lease(self) -> Lease:
        return self._lease

    async def close(self) -> None:
        await self._lease.release()

        def close() -> None:
            if self._db is not None:
                self._db.close()
                self._db = None

        await asyncio.get_running_loop().run_in_executor(self._thread, close)
        self._thread.shutdown(wait=False)
