"""Giving freed heap memory back to the OS after a large batch.

glibc's allocator keeps the pages a process freed for reuse, so a replica stays as large as its largest batch
made it: one 32 x 256-token embedding batch left the torch engine 88 MiB larger for good, one 32-sentence
Marian-sized translation batch 107-136 MiB. `malloc_trim(0)` returns them (0.1-20 ms, more the larger the
heap), so the backends call it after a batch past their size threshold only. Measured in
docs/benchmarks/where-the-cores-go.
"""

from __future__ import annotations

from .libc import libc_function


def give_back_free_heap() -> bool:
    """glibc's `malloc_trim(0)`: the free pages of its heaps go back to the OS. False where the C library has
    none (musl, macOS)."""
    trim = libc_function("malloc_trim")
    if trim is None:
        return False
    trim(0)
    return True
