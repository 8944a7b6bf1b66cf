"""The SQLite store's files (serve_app/jobs/store/sqlite.py): the lock files that are its clusters' leases,
and the database file's mode."""

from __future__ import annotations

import fcntl
import logging
import os
import re
import stat
from pathlib import Path
from typing import Optional

from . import Lease

logger = logging.getLogger("ray.serve")


def lock_path(store: Path, cluster: str) -> Path:
    """The lock file of `cluster`'s lease: `<store>.lock` for the unnamed cluster, else `<store>.<cluster>.lock`
    (characters other than letters, digits, `.`, `_` and `-` as `_`)."""
    return store.with_name(f"{store.name}.{re.sub(r'[^A-Za-z0-9._-]', '_', cluster)}.lock" if cluster
                           else f"{store.name}.lock")


class FileLease(Lease):
    """An exclusive flock on `<store>.lock`: held while this process lives, freed by the OS when it
    dies (a killed JobManager's successor takes it at once)."""

    def __init__(self, path: Path):
        self.path = path
        self._fd: Optional[int] = None

    async def acquire(self) -> bool:
        if self._fd is not None:
            return True
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        self._fd = fd
        return True

    async def renew(self) -> bool:
        return self._fd is not None

    async def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the descriptor drops the flock
            self._fd = None


def private(path: Path) -> None:
    """The store's file (created if missing) readable by its user alone: it holds every API key's payloads and
    results. SQLite gives the -wal and -shm files it creates the database file's mode; older ones are tightened."""
    os.close(os.open(path, os.O_RDWR | os.O_CREAT, 0o600))
    for file in (path, path.with_name(path.name + "-wal"), path.with_name(path.name + "-shm")):
        try:
            if stat.S_IMODE(file.stat().st_mode) & 0o077:
                file.chmod(0o600)
        except FileNotFoundError:
            pass
        except OSError as exc:  # not this user's file: say so, and serve on
            logger.warning("job store file %s stays readable by others: %s", file, exc)
