"""A job read back for `GET /jobs/<id>`: its view, with its result once it succeeded, whole or one page."""

from __future__ import annotations

import contextlib
from typing import Optional

from .fair import FairSlots
from .job import JobNotFound, JobRecord, store_call
from .results import json_bytes_per_record, page_bounds, page_of, render
from .store import JobStore

#: result pages (up to jobs.max_page_bytes of JSON each, about 3 x that as Python objects) built at once: one key
#: polling a large result from hundreds of connections could run the JobManager (every key's jobs) out of memory
#: (an estimate, not measured)
PAGE_READS_AT_ONCE = 4


async def job_view(store: JobStore, record: JobRecord, max_page_bytes: int, offset: Optional[int],
                   limit: Optional[int], reads: Optional[FairSlots] = None) -> dict:
    """`record`'s view; once succeeded with its result, whole when it is small (no paging asked) or else
    records [offset, offset + limit) with a `page` object (`next`: the next page) of at most about
    `max_page_bytes` of JSON; built in one of `reads`' slots (fair between keys) when given."""
    if record.status != "succeeded":
        return record.view()
    async with reads.slot(record.owner) if reads is not None else contextlib.nullcontext():
        return await _result_view(store, record, max_page_bytes, offset, limit)


async def _result_view(store: JobStore, record: JobRecord, max_page_bytes: int, offset: Optional[int],
                       limit: Optional[int]) -> dict:
    total, per = record.records_total, record.chunk_records
    per_page = max(1, int(max_page_bytes // json_bytes_per_record(record.task, record.used_bytes, total)))
    whole, start, stop, limit = page_bounds(offset, limit, total, per_page)
    metas = await store_call(store.chunk_metas(record.id))
    indexes = list(range(start // per, (stop - 1) // per + 1)) if stop > start else []
    chunks = await store_call(store.chunks(record.id, indexes))
    if len(chunks) < len(indexes):  # expired and purged since its record was read
        raise JobNotFound(f"No job {record.id!r}: it never existed or its result expired.")
    tokens = sum(meta.get("tokens", 0) for _, meta in metas.values())
    result = render(record.task, [(i * per, chunks[i]) for i in indexes], start, stop, tokens)
    return record.view(result, None if whole else page_of(record.id, start, stop, limit, total))
