"""The C library's functions the replicas call through ctypes (glibc on Linux), each looked up once."""

from __future__ import annotations

import ctypes
import functools
from typing import Callable, Optional


@functools.lru_cache(maxsize=None)
def libc_function(name: str) -> Optional[Callable[..., int]]:
    """The process's own C library function `name` (the libc is already loaded: no search for its file), or
    None where it has none (`malloc_trim` on musl or macOS, `prctl` off Linux)."""
    try:
        return getattr(ctypes.CDLL(None, use_errno=True), name, None)
    except OSError:  # pragma: no cover - a platform without dlopen(NULL)
        return None


def name_native_thread(name: str) -> bool:
    """Give the calling thread `name` (its first 15 bytes) in the OS too, where Linux allows it, so
    that `top -H`, `ps -L` and /proc/<pid>/task/*/comm tell a replica's model threads from Serve's
    (Ray names every thread of a replica `ray::IDLE`); bench.placed_probe --cpu splits CPU by it.
    Returns whether the name was set."""
    prctl = libc_function("prctl")
    if prctl is None:  # not Linux: the Python name still holds
        return False
    return prctl(15, name.encode("utf-8", "replace")[:15], 0, 0, 0) == 0  # 15: PR_SET_NAME
