"""Giving freed heap memory back to the OS after a large batch.

glibc's allocator keeps the pages a process freed for reuse, so a replica stays as large as its largest batch
made it: one 32 x 256-token embedding batch left the torch engine 88 MiB larger for good, one 32-sentence
Marian-sized translation batch 107-136 MiB. `malloc_trim(0)` returns them (0.1-20 ms, more the larger the
heap), so the backends call `trim_after_batch` after every CPU batch and it trims past the batch kind's size
threshold only. Measured in docs/benchmarks/where-the-cores-go.
"""

from __future__ import annotations

from .libc import libc_function

#: Embeddings: a batch of more tokens than this (rows x padded length) is given back (ONNX Runtime also shrinks
#: its arena then: embedding_onnx.py). One batch of 64 256-token texts left a process 155-280 MiB larger
#: (torch) or 1.27 GiB larger (ONNX Runtime) for good; make bench's batches (64 x ~20 tokens) stay below.
EMBEDDING_TRIM_AFTER_TOKENS = 4096
#: Translation: a CPU batch of more token slots than this (rows x (padded source + generated columns); for
#: continuous decoding the most cache slots held before the running batch drained). One 32-sentence
#: Marian-sized batch (~25 source, 60 output tokens each) left a process 107-136 MiB larger (continuous
#: decoding: 199 MiB); the trim took 20 ms of its 6.5 s. A lone sentence stays below.
DECODING_TRIM_AFTER_TOKENS = 1024


def give_back_free_heap() -> bool:
    """glibc's `malloc_trim(0)`: the free pages of its heaps go back to the OS. False where the C library has
    none (musl, macOS)."""
    trim = libc_function("malloc_trim")
    if trim is None:
        return False
    trim(0)
    return True


def trim_after_batch(tokens: int, threshold: int, device: object = "cpu") -> bool:
    """After a batch of `tokens` on `device` (a name or a torch.device): give the free heap back if the batch
    passed `threshold` on the CPU (a GPU batch grows device memory, not this heap). True if it trimmed."""
    on_cpu = getattr(device, "type", device) == "cpu"
    return on_cpu and tokens > threshold and give_back_free_heap()
