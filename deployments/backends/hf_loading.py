"""Where a Hugging Face seq2seq model comes from and where it runs: the device, the dtype, its
folder or hub id, its tokenizer and weights. Every load failure is a `ModelLoadError`."""

from __future__ import annotations

import re
from pathlib import Path

import torch

from .base import BackendError, ModelLoadError
from .cpu_linears import linears_on_onednn

_DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "float16": torch.float16,
    "fp16": torch.float16,
    "half": torch.float16,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
}

_DEVICE_RE = re.compile(r"^(cpu|cuda(:\d+)?)$")


def resolve_device(device: str = "auto") -> str:
    """``"auto"`` -> ``"cuda"`` when CUDA is available (and, inside a Ray worker, when Ray gave it a
    GPU), else ``"cpu"``.

    ``"cpu"``, ``"cuda"`` and ``"cuda:N"`` are returned as given; asking for
    CUDA on a machine without it raises :class:`BackendError`.
    """
    dev = (device or "auto").strip().lower()
    if dev == "auto":
        return "cuda" if torch.cuda.is_available() and _ray_gave_a_gpu() is not False else "cpu"
    if not _DEVICE_RE.match(dev):
        raise ValueError(f"device must be 'auto', 'cpu', 'cuda' or 'cuda:N', got {device!r}")
    if dev.startswith("cuda") and not torch.cuda.is_available():
        raise BackendError(f"device {device!r} requested but CUDA is not available")
    return dev


def _ray_gave_a_gpu() -> bool | None:
    """Whether Ray assigned this worker a GPU; None outside Ray. Ray 2.60 no longer hides the GPUs from
    a worker that asked for none (CUDA_VISIBLE_DEVICES is left alone), so CUDA alone would put a CPU
    replica on GPU 0, beside the replicas Ray gave it to."""
    try:
        import ray

        if not ray.is_initialized():
            return None
        return bool(ray.get_runtime_context().get_accelerator_ids().get("GPU"))
    except Exception:  # noqa: BLE001 - no Ray, or no runtime context: decide by CUDA alone
        return None


def max_new_tokens_limit(model) -> int | None:
    """The longest output the decoder's position table allows: Marian's is fixed (max_position_embeddings,
    position 0 the start token); M2M100's and NLLB's grow with the output (None)."""
    config = model.config
    return int(config.max_position_embeddings) - 1 if getattr(config, "model_type", None) == "marian" else None


def resolve_dtype(dtype: str = "auto", device: str = "cpu") -> torch.dtype:
    """``"auto"`` -> float16 on CUDA, float32 on CPU; else the named dtype.

    Accepts ``float32``/``float16``/``bfloat16`` (and ``fp32``/``fp16``/``bf16``).
    """
    name = (dtype or "auto").strip().lower()
    if name == "auto":
        return torch.float16 if str(device).startswith("cuda") else torch.float32
    try:
        return _DTYPES[name]
    except KeyError:
        raise ValueError(f"dtype must be 'auto', 'float32', 'float16' or 'bfloat16', got {dtype!r}") from None


def avoid_per_shape_attention_plans(device: str) -> None:
    """On CUDA, take cuDNN out of torch's scaled-dot-product attention backends (process-wide).

    torch picks cuDNN's attention first on Hopper GPUs, and cuDNN builds an execution plan for every
    new shape it meets. Decoding meets a new shape at almost every step (the cache grows by a column,
    rows join and leave, sources are padded to each batch's longest), so the plans were built again and
    again: bench/gpu/step_probe.py measured 80-97 ms of wall time per decoder step of the M2M100-418M-
    sized model on an H200 for 2.3-2.9 ms of kernel time, 78 ms of it in `_cudnn_attention_forward` on
    the CPU. Flash and memory-efficient attention have no per-shape plans. A no-op on the CPU.
    """
    if str(device).startswith("cuda"):
        torch.backends.cuda.enable_cudnn_sdp(False)


def ready_to_serve(model, device: str, cpu_weight_layout: str = "blocked"):
    """`model` on `device`, set up for serving only, as every torch backend here serves: eval mode, no
    parameter requiring grad (whatever the caller's grad mode), no cuDNN attention on CUDA, and on the CPU
    its float32 linear layers on oneDNN, their weights in `cpu_weight_layout` (cpu_linears.py: 1.3-2 x faster
    decoding steps). Returns `model`."""
    model.to(device)
    model.eval()
    model.requires_grad_(False)
    avoid_per_shape_attention_plans(device)
    linears_on_onednn(model, cpu_weight_layout)
    return model


def _looks_like_path(model: str) -> bool:
    return model.startswith(("/", ".", "~")) or Path(model).is_absolute()


def model_source(model: str) -> str:
    """The hub id as given, or the local folder expanded; a missing folder is a :class:`ModelLoadError`."""
    if not _looks_like_path(model):
        return model
    path = Path(model).expanduser()
    if not path.exists():
        raise ModelLoadError(f"model folder {model!r} does not exist")
    if not path.is_dir():
        raise ModelLoadError(f"model path {model!r} is not a folder")
    return str(path)


def load_tokenizer(source: str, local_files_only: bool):
    """``AutoTokenizer.from_pretrained``; any failure is a :class:`ModelLoadError` naming the source."""
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(source, local_files_only=local_files_only)
    except Exception as exc:  # noqa: BLE001 - any loader failure is a load error
        raise ModelLoadError(f"cannot load tokenizer from {source!r}: {type(exc).__name__}: {exc}") from exc


def load_seq2seq(model: str, source: str, dtype: torch.dtype, device: str, local_files_only: bool,
                 cpu_weight_layout: str = "blocked"):
    """`AutoModelForSeq2SeqLM.from_pretrained(source)` on `device`, ready to serve (`ready_to_serve`); an
    encoder-decoder only."""
    from transformers import AutoModelForSeq2SeqLM

    try:
        seq2seq = ready_to_serve(AutoModelForSeq2SeqLM.from_pretrained(source, dtype=dtype,
                                                                       local_files_only=local_files_only),
                                 device, cpu_weight_layout)
    except Exception as exc:  # noqa: BLE001
        raise ModelLoadError(f"cannot load model from {model!r}: {type(exc).__name__}: {exc}") from exc
    if not getattr(seq2seq.config, "is_encoder_decoder", False):
        raise ModelLoadError(f"model {model!r} is not an encoder-decoder (seq2seq) model")
    return seq2seq


def max_input_length(tokenizer, config) -> int:
    """The most source tokens a seq2seq model reads: its tokenizer's and its position table's limits."""
    limits = []
    tok_max = getattr(tokenizer, "model_max_length", None)
    if isinstance(tok_max, int) and 0 < tok_max < 1_000_000:
        limits.append(tok_max)
    pos_max = getattr(config, "max_position_embeddings", None)
    if isinstance(pos_max, int) and pos_max > 0:
        limits.append(pos_max)
    return min(limits) if limits else 512
