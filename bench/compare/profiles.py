"""What one `make bench` measures: the default profile (~40 min on 2 cores) and the full grid."""

from __future__ import annotations

from dataclasses import dataclass, field

WORKLOAD_ORDER = ("embeddings", "translation-embedded", "translation-transformers")


@dataclass(frozen=True)
class Profile:
    name: str
    workloads: tuple[str, ...]
    records: tuple[int, ...]  # texts per request
    concurrencies: tuple[int, ...]  # closed-loop clients
    cell_s: dict  # workload -> seconds of one closed-loop cell
    open_s: dict  # workload -> seconds of the open-loop (50% load) cell
    warmup_s: float  # closed-loop warm-up per contender and workload, not recorded
    offline_s: float  # seconds per batch size in the offline sweep
    load_fraction: float = 0.5
    #: (workload, records) -> concurrencies, where the default list would only measure backlog
    concurrency_overrides: dict = field(default_factory=dict)
    #: a client storm after the cells (1 record per request, clients ignoring Retry-After); 0: none
    storm_clients: int = 0
    storm_s: float = 15

    def concurrencies_for(self, workload: str, records: int) -> tuple[int, ...]:
        return self.concurrency_overrides.get((workload, records), self.concurrencies)


PROFILES = {
    # The default (~40 min): every contender, workload and request size; 3 of the 5 concurrencies
    # (1: no batching possible; 8: light; 64: the embeddings target's point); short cells.
    "default": Profile(
        "default", WORKLOAD_ORDER, (1, 16), (1, 8, 64),
        # The Marian-sized model's latencies reach 3-8 s at saturation: a cell must hold several.
        cell_s={"embeddings": 5, "translation-embedded": 5, "translation-transformers": 20},
        open_s={"embeddings": 5, "translation-embedded": 5, "translation-transformers": 20},
        warmup_s=2, offline_s=2,
        # The Marian-sized model does ~10-20 records/s here: 64 clients x 16 records is a minute of
        # queue, which an 8 s cell cannot measure; 8 x 16 = 128 records in flight already saturate.
        concurrency_overrides={("translation-transformers", 16): (1, 8)}),
    "full": Profile(
        "full", WORKLOAD_ORDER, (1, 16), (1, 8, 32, 64, 128),
        cell_s={"embeddings": 15, "translation-embedded": 15, "translation-transformers": 30},
        open_s={"embeddings": 20, "translation-embedded": 20, "translation-transformers": 40},
        warmup_s=5, offline_s=5,
        # As in the default: 32 x 16 records of the Marian-sized model is half a minute of queue and
        # 128 x 16 two minutes, past service_streamer's 20 s request timeout; its timed-out work stays
        # queued, so every later cell measured that backlog (0 rec/s down to 1 client; first full run).
        concurrency_overrides={("translation-transformers", 16): (1, 8)}),
    # Issue 24's embeddings cells only: 1, 8, 32 and 64 clients x 1 text and 32 clients x 16 texts,
    # then 200 clients that ignore Retry-After for 15 s (~3.5 min per serve-app mode, ~2 min per peer).
    "peers": Profile(
        "peers", ("embeddings",), (1, 16), (1, 8, 32, 64),
        cell_s={"embeddings": 8}, open_s={"embeddings": 5}, warmup_s=2, offline_s=2,
        concurrency_overrides={("embeddings", 16): (32,)}, storm_clients=200),
    # A minute-long check that every contender starts and answers (not for figures).
    "smoke": Profile(
        "smoke", WORKLOAD_ORDER, (1, 16), (8,),
        cell_s={"embeddings": 2, "translation-embedded": 2, "translation-transformers": 3},
        open_s={"embeddings": 2, "translation-embedded": 2, "translation-transformers": 3},
        warmup_s=1, offline_s=0.5),
}
