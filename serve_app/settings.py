"""The application's settings: the `args:` of serve-app in a Serve config.

The HTTP side's sections (ingress, cache, jobs) are here; the models' sections (translation, embeddings, models)
are the model side's own (deployments/settings.py) and nest here. Each field can be set three ways, highest first:

1. the `args:` of the application in `serve_config.yaml` (or `key=value` after
   the import path on the `serve run` command line), nested by section;
2. an environment variable `SERVE_APP_<SECTION>_<FIELD>` in the shell that runs
   `serve run` / `serve deploy` (e.g. `SERVE_APP_TRANSLATION_BACKEND=transformers`);
3. the default below.

Batch sizes and wait times are *not* here: they are runtime knobs of each model deployment, set in its
`user_config` (see `deployments/batch_config.py`) so that `serve deploy` can change them without restarting replicas.

Unknown keys are errors: a typo in `serve_config.yaml` fails at start-up with the bad key quoted, not ignored.
"""

from __future__ import annotations

import re
from typing import Annotated, Optional

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator
from pydantic_settings import NoDecode, SettingsConfigDict

from deployments.model_module import deployment_name
from deployments.settings import (
    PLACEABLE_MODELS, CustomModelSpec, EmbeddingSettings, Section, TranslationSettings,
)

from .jobs.settings import JobSettings

DEFAULT_PORT = 9527
_ORIGIN = re.compile(r"[a-z][a-z0-9+.-]*://[^/\s?#,@*]+")


#: HTTP requests one ingress replica handles at once (its Serve default; a config may set its own, above
#: what its admission holds: config_check.py). The ingress holds many concurrent requests cheaply.
INGRESS_MAX_ONGOING_REQUESTS = 512


class IngressSettings(Section):
    """Request limits and how requests are cut into model calls."""

    model_config = SettingsConfigDict(env_prefix="SERVE_APP_INGRESS_", extra="forbid")

    max_records_per_request: int = Field(
        1024, ge=1,
        description="Most records one /translation request may carry; more is 413. "
        "Raise it for bulk clients: the ingress cuts any request into calls of `records_per_call`.",
    )
    max_text_chars: int = Field(
        5000, ge=1,
        description="Longest text (in characters) of one record or embedding input; longer is 413. "
        "Models truncate far shorter inputs anyway (MiniLM: 256 tokens).",
    )
    max_embedding_inputs: int = Field(
        2048, ge=1,
        description="Most inputs one /embeddings request may carry (OpenAI's own limit is 2048).",
    )
    max_body_bytes: int = Field(
        4 * 1024 * 1024, ge=1024,
        description="Largest request body accepted, in bytes; larger is 413 before it is parsed.",
    )
    body_timeout_s: float = Field(
        30.0, gt=0, description="Longest an admitted request's body may take to arrive; then 408 `body_timeout`.",
    )
    records_per_call: int = Field(
        8, ge=1,
        description="Records sent to a model replica in one call. Smaller cuts a long request into "
        "more calls that interleave with other requests; larger spends less on Serve's per-call overhead.",
    )
    inputs_per_embedding_call: int = Field(
        32, ge=1,
        description="Embedding inputs sent to a replica in one call; the embedding model is cheaper per "
        "text than translation, so calls carry more.",
    )
    max_predict_inputs: int = Field(
        1024, ge=1,
        description="Most inputs one `POST /models/<name>/predict` request may carry; more is 413.",
    )
    inputs_per_predict_call: int = Field(
        32, ge=1,
        description="Inputs of a custom model (`models:`) sent to its replica in one call; the replica's "
        "`@serve.batch` then joins calls from many requests into one `predict`.",
    )
    max_inflight_calls_per_request: int = Field(
        4, ge=1,
        description="Calls of one request in flight at once. Bounds how much of the model queue a "
        "single large request can hold, so it neither blocks small requests nor starves itself.",
    )
    max_inflight_calls_per_model: int = Field(
        32, ge=1,
        description="Calls this ingress keeps in flight to one model (translate, embed, each custom model). "
        "Below it a call goes out at once; at it, the records of new calls wait and share one call per "
        "language pair (up to records_per_call / inputs_per_*_call records), sent when a call returns. "
        "Fewer, fuller calls save Serve's per-call CPU (most of its cost per one-record request). Serve's "
        "autoscaler only sees the calls in flight, so keep it (x Ingress replicas) >= each model's "
        "max_replicas x target_ongoing_requests (config_check enforces it); lower shares sooner, a very "
        "large value turns sharing off.",
    )
    max_inflight_requests: int = Field(
        64, ge=1,
        description="Model requests one ingress replica admits at once; more wait in its waiting room "
        "(max_waiting_requests) or are answered 503 + Retry-After immediately. Size it as (requests/s the "
        "models sustain) x (queueing delay you accept): at ~30 req/s, 64 bounds queueing to ~2 s. Keep the "
        "Ingress deployment's max_ongoing_requests above it.",
    )
    max_waiting_requests: int = Field(
        0, ge=0,
        description="Model requests that wait for a slot, oldest first, while max_inflight_requests are in flight, "
        "instead of a 503 at once (with API keys, each key within its fair share of them); past it, 503 + "
        "Retry-After at once. "
        "Clients that ignore Retry-After then wait for capacity rather than spend it on refusals. 0: none wait.",
    )
    max_wait_s: float = Field(
        2.0, gt=0,
        description="Longest a request in the waiting room (max_waiting_requests) waits for a slot; then 503 "
        "+ Retry-After. Behind HAProxy, requests past what the replicas hold (max_inflight_requests + "
        "max_waiting_requests each) first wait up to this long in HAProxy's queue (serve_app/proxy_shedding.py).",
    )
    readiness_timeout_s: float = Field(
        2.0, gt=0,
        description="How long /readyz waits for each model deployment to answer; then Serve's status says busy or not.",
    )
    model_timeout_s: float = Field(
        60.0, gt=0,
        description="Longest a request waits for its model calls before it fails with 504.",
    )
    retry_after_s: int = Field(
        2, ge=1,
        description="Seconds sent in Retry-After with 503 answers when the service is overloaded.",
    )
    replica_retry_timeout_s: float = Field(
        8.0, gt=0, description="Longest a model call waits for a replica, then the request gets 503 + Retry-After: "
        "for one to take the call while Serve's router knows no running replica of the model, after a replica of the "
        "model failed, and for the one retry of a call whose replica died. Keep it under the client's patience "
        "(every caller answered within ~10 s of a replica crash).",
    )
    crash_quarantine_s: float = Field(
        600.0, gt=0, description="Records whose model calls lost 3 replicas within this long (they likely crash "
        "the model) are refused with 500 `model_crashed` for this long, not sent; a job holding them fails.",
    )
    # API keys (serve_app/auth.py): from the environment or a mounted file only, never from `args:`
    # (refused there); `exclude`: never dumped, so never passed through Ray to the replicas, which
    # read their own environment.
    api_keys: Optional[SecretStr] = Field(
        None, exclude=True,
        description="Comma-separated API keys, from the environment only (never `args:`), each at least 32 "
        "characters. With keys, model routes and /v1/models need `Authorization: Bearer <key>` or "
        "`X-API-Key: <key>` (401 without one, 403 with a wrong one); /healthz, /readyz and /docs stay open. "
        "Without keys the service starts only on a loopback host or with `auth_disabled`.",
    )
    api_keys_file: Optional[str] = Field(
        None,
        description="A file of API keys (comma- or newline-separated; a mounted Kubernetes Secret), read "
        "again when it changes: rotate keys without a redeploy. Used with `api_keys` if both are set.",
    )
    auth_disabled: bool = Field(
        False,
        description="Serve without API keys on a non-loopback host (something in front authenticates every "
        "request). Without keys and without this, a service listening beyond 127.0.0.1 refuses to start.",
    )
    cors_origins: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="Origins allowed to call the API from a browser (CORS), comma-separated or a list; "
        "`*` allows any. Empty (the default): no CORS headers, browsers refuse cross-origin calls.",
    )
    access_log: bool = Field(
        True,
        description="One JSON log line per HTTP request at the ingress (request id, route, status, records, "
        "latency_ms, error_type). Off saves a little CPU per request; metrics count requests either way.",
    )

    @field_validator("cors_origins", mode="before")
    @classmethod
    def _split_origins(cls, value):
        if isinstance(value, str):
            value = value.split(",")
        if not isinstance(value, list):
            return value  # (pydantic says what it must be)
        # a browser's Origin is exactly scheme://host[:port], in lower case and without the scheme's default port
        # (or `null`), matched as a string: anything else never matches
        origins = [re.sub(r"^(https://.*):443$|^(http://.*):80$", r"\1\2", o.strip().lower()) if isinstance(o, str)
                   else o for o in value]
        for origin in origins:
            if isinstance(origin, str) and origin not in ("", "*", "null") and not _ORIGIN.fullmatch(origin):
                raise ValueError(f"{origin!r} is not an origin: scheme://host[:port] (no path, no trailing slash, no "
                                 "wildcard in the host), `null` or `*`; several: comma-separated or a list")
        return [o for o in origins if o != ""]

    def api_key_list(self) -> list[str]:
        """The configured API keys (empty: authentication off)."""
        if self.api_keys is None:
            return []
        return [k.strip() for k in self.api_keys.get_secret_value().split(",") if k.strip()]


class CacheSettings(Section):
    """The ingress's response cache (per ingress replica, in its memory)."""

    model_config = SettingsConfigDict(env_prefix="SERVE_APP_CACHE_", extra="forbid")

    enabled: bool = Field(
        True,
        description="Answer repeated texts from an in-memory LRU cache in each ingress replica (keyed on model, "
        "languages and text; embeddings on model and text). Responses carry `X-Cache: hit|miss|partial`. "
        "A request with `Cache-Control: no-cache` is computed anyway; `no-store` is not stored.",
    )
    max_entries: int = Field(
        100_000, ge=1,
        description="Most entries (one per translated record or embedded text) one ingress replica keeps; "
        "past it the least recently used are evicted: an API key's own while it holds more than its share (this "
        "bound and max_bytes divided by the keys holding entries), else those of the key furthest over its share.",
    )
    max_bytes: int = Field(
        128 * 1024 * 1024, ge=4096,
        description="Most memory, in bytes, one ingress replica's cache holds (texts, translations and "
        "float32 vectors as estimated by the cache; an embedding entry is about 2 KB). Count it in the "
        "ingress's memory request.",
    )
    ttl_s: float = Field(
        3600.0, gt=0,
        description="Seconds an entry stays valid after it was computed; a hit does not extend it. "
        "Bounds how long an answer outlives a model replaced under the same name.",
    )


class AppSettings(BaseModel):
    """The `args:` of the application in serve_config.yaml."""

    model_config = ConfigDict(extra="forbid")

    ingress: IngressSettings = Field(default_factory=IngressSettings)
    translation: TranslationSettings = Field(default_factory=TranslationSettings)
    embeddings: EmbeddingSettings = Field(default_factory=EmbeddingSettings)
    cache: CacheSettings = Field(default_factory=CacheSettings)
    jobs: JobSettings = Field(default_factory=JobSettings)
    models: list[CustomModelSpec] = Field(
        default_factory=list,
        description="Your own models (see examples/iris_classifier.py), each with its own route, in its own "
        "deployment or (`placement: ingress`) in the Ingress.",
    )

    def placed_in_ingress(self) -> dict[str, str]:
        """Deployment name -> where its `placement` is set in `args:` (`translation`,
        `models[iris]`), for each model placed in the Ingress (`placement: ingress`): those have no
        deployment of their own."""
        placed = {name: section for name, section in PLACEABLE_MODELS.items()
                  if getattr(self, section).placement == "ingress"}
        placed.update({deployment_name(spec.name): f"models[{spec.name}]"
                       for spec in self.models if spec.placement == "ingress"})
        return placed

    @field_validator("models")
    @classmethod
    def _names_are_unique(cls, value: list[CustomModelSpec]) -> list[CustomModelSpec]:
        names = [spec.name for spec in value]
        repeated = sorted({n for n in names if names.count(n) > 1})
        if repeated:
            raise ValueError(f"model names must be unique; repeated: {', '.join(map(repr, repeated))}")
        return value

    @field_validator("ingress", "translation", "embeddings", "cache", "jobs", mode="before")
    @classmethod
    def _read_environment(cls, value, info):
        # Nested validation skips BaseSettings.__init__, which is what reads the
        # environment: construct each section explicitly so env vars apply.
        section = cls.model_fields[info.field_name].annotation
        if isinstance(value, section):
            return value
        if value is not None and not isinstance(value, dict):  # `jobs: false` read as {}: jobs on, defaults
            raise ValueError(f"must be a mapping of the section's settings (such as `{info.field_name}: "
                             f"{{enabled: false}}`), not {value!r}")
        return section(**(value or {}))


def load_settings(args: dict | None) -> AppSettings:
    """Build settings from builder args, environment and defaults.

    `serve run module:build_app translation.backend=transformers` passes flat
    dotted keys as strings; they are nested here.
    """
    nested: dict = {}
    for key, value in (args or {}).items():
        parts = key.split(".")
        target = nested
        for part in parts[:-1]:
            target = target.setdefault(part, {})
        if isinstance(value, dict) and isinstance(target.get(parts[-1]), dict):
            target[parts[-1]].update(value)
        else:
            target[parts[-1]] = value
    return AppSettings.model_validate(nested)


if __name__ == "__main__":  # python -m serve_app.settings  -> the table in docs/configuration.md
    from serve_app.settings_doc import settings_table

    print(settings_table())
