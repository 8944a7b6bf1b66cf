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
