"""CTranslate2 translation backend: the transformers model, converted once, run by CTranslate2.

The Hugging Face checkpoint (hub id or folder) is converted with
``ctranslate2.converters.TransformersConverter`` into a cache folder keyed on
the model (path, size and mtime of its files), the quantization and the
CTranslate2 version; later replicas, restarts and other processes on the node
reuse it. Conversion writes to a temporary folder renamed into place, so
replicas that start together never read a half-written model.

Language handling is the transformers backend's (it is a subclass): same family
detection, same pairs, same tokenizer, same decoding of the generated ids. Only
generation differs: M2M100/NLLB get their target language as the
``target_prefix`` token (the ``forced_bos_token_id`` of transformers), Marian
needs none.

``compute_type="auto"`` is int8 on CPU and float16 on CUDA.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any, Sequence

from .base import BackendError, ModelLoadError
from .checkpoint_files import weight_files
from .hf_loading import load_tokenizer, model_source
from .transformers_backend import TransformersBackend

logger = logging.getLogger(__name__)

#: what ``compute_type="auto"`` becomes on each device
AUTO_COMPUTE_TYPE = {"cpu": "int8", "cuda": "float16"}
COMPUTE_TYPES = (
    "auto", "int8", "int8_float32", "int8_float16", "int8_bfloat16", "int16", "float16", "bfloat16", "float32",
)
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


def _ctranslate2():
    try:
        import ctranslate2
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise ModelLoadError(
            "translation.backend 'ctranslate2' needs the ctranslate2 package: pip install 'serve-app[ctranslate2]'"
        ) from exc
    return ctranslate2


def resolve_compute_type(compute_type: str, device: str) -> str:
    """``auto`` -> int8 on CPU, float16 on CUDA; any other name must be one CTranslate2 runs on ``device``."""
    name = (compute_type or "auto").strip().lower()
    if name not in COMPUTE_TYPES:
        raise ValueError(f"ctranslate2 compute_type must be one of {', '.join(COMPUTE_TYPES)}; got {compute_type!r}")
    kind = "cuda" if device.startswith("cuda") else "cpu"
    if name == "auto":
        name = AUTO_COMPUTE_TYPE[kind]
    supported = _ctranslate2().get_supported_compute_types(kind)
    if name not in supported:
        raise ValueError(
            f"ctranslate2 compute_type {compute_type!r} is not supported on {kind} here "
            f"(supported: {', '.join(sorted(supported))})"
        )
    return name


def converted_model_dir(source: str, quantization: str, cache_dir: str | os.PathLike) -> Path:
    """Cache folder of ``source`` converted with ``quantization``: ``<cache>/<name>-<quant>-<key>``.

    The key hashes the model (hub id, or resolved folder plus the size and mtime of
    its weight/config files), the quantization and the CTranslate2 version.
    """
    parts = [str(source), quantization, _ctranslate2().__version__]
    folder = Path(source)
    if folder.is_dir():
        folder = folder.resolve()
        parts[0] = str(folder)
        for path in weight_files(folder):
            stat = path.stat()
            parts.append(f"{path.name}:{stat.st_size}:{stat.st_mtime_ns}")
    key = hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]
    name = _UNSAFE.sub("_", Path(str(source).rstrip("/")).name or "model")[:60]
    return Path(cache_dir).expanduser() / f"{name}-{quantization}-{key}"


def _converter_class():
    ctranslate2 = _ctranslate2()

    class _Converter(ctranslate2.converters.TransformersConverter):
        """Gives CTranslate2 the full vocabulary of M2M100 tokenizers.

        transformers 5's ``M2M100Tokenizer.get_vocab()`` leaves out the ``__xx__``
        language tokens (their ids follow the SentencePiece pieces), so the converter
        would build a vocabulary 100 tokens short of the model's embeddings.
        """

        def load_tokenizer(self, tokenizer_class, model_name_or_path, **kwargs):
            tokenizer = super().load_tokenizer(tokenizer_class, model_name_or_path, **kwargs)
            lang_ids = getattr(tokenizer, "lang_code_to_id", None)
            if lang_ids and hasattr(tokenizer, "get_lang_token"):
                vocab = tokenizer.get_vocab()
                missing = {tokenizer.get_lang_token(code): i for code, i in lang_ids.items()}
                if any(token not in vocab for token in missing):
                    full = {**vocab, **missing}
                    tokenizer.get_vocab = lambda: dict(full)
            return tokenizer

    return _Converter


def convert_once(source: str, quantization: str, cache_dir: str | os.PathLike, local_files_only: bool = False) -> Path:
    """The converted model's folder; converts ``source`` first unless the cache has it. With
    ``local_files_only``, a hub id is converted from its folder in the local hub cache: CTranslate2's
    converter would ask the hub otherwise (retrying for minutes on an air-gapped cluster)."""
    target = converted_model_dir(source, quantization, cache_dir)
    if (target / "model.bin").exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        logger.info("converting %s to CTranslate2 (%s) in %s", source, quantization, target)
        if local_files_only and not Path(source).is_dir():
            from huggingface_hub import snapshot_download

            source = snapshot_download(source, local_files_only=True)
        _converter_class()(source).convert(str(tmp), quantization=quantization, force=True)
        try:
            os.rename(tmp, target)
        except OSError:
            if not (target / "model.bin").exists():  # not a concurrent conversion that won the race
                raise
    except Exception as exc:  # noqa: BLE001 - any converter failure is a load error
        raise ModelLoadError(
            f"cannot convert {source!r} to CTranslate2 ({quantization}): {type(exc).__name__}: {exc}"
        ) from exc
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


class _ModelFacts:
    """What the transformers backend reads from ``self.model``: its config and generation config."""

    def __init__(self, config: Any, generation_config: Any):
        self.config = config
        self.generation_config = generation_config


class CTranslate2Backend(TransformersBackend):
    """Translation with a CTranslate2 ``Translator`` built from a transformers checkpoint.

    Args (besides those of :class:`TransformersBackend`, less ``dtype``):
        compute_type: ``auto`` (int8 on CPU, float16 on CUDA) or a CTranslate2
            compute type (``float32``, ``int8_float16``, ...). The model is converted
            with the same quantization, so loading it needs no further conversion.
        cache_dir: where converted models are kept.
    """

    name = "ctranslate2"

    def __init__(
        self,
        model: str,
        *,
        compute_type: str = "auto",
        cache_dir: str | os.PathLike = "~/.cache/serve-app/ctranslate2",
        **options: Any,
    ) -> None:
        """``options``: those of :class:`TransformersBackend` (device, decoding, threads, ...)."""
        if "dtype" in options:
            raise TypeError("CTranslate2Backend takes compute_type, not dtype")
        self._compute_type_setting = compute_type
        self._cache_dir = cache_dir
        self._threads = options.get("num_threads") or 0  # 0: CTranslate2 picks
        super().__init__(model, **options)
        generation = self.model.generation_config
        self._forced_eos = getattr(generation, "forced_eos_token_id", None)
        self._suppress = self._suppressed_sequences(getattr(generation, "bad_words_ids", None) or [])

    # ------------------------------------------------------------------ loading

    def _load(self, model: str, local_files_only: bool):
        from transformers import AutoConfig, GenerationConfig

        ctranslate2 = _ctranslate2()
        source = model_source(model)
        tokenizer = load_tokenizer(source, local_files_only)
        try:
            config = AutoConfig.from_pretrained(source, local_files_only=local_files_only)
        except Exception as exc:  # noqa: BLE001
            raise ModelLoadError(f"cannot load config from {model!r}: {type(exc).__name__}: {exc}") from exc
        if not getattr(config, "is_encoder_decoder", False):
            raise ModelLoadError(f"model {model!r} is not an encoder-decoder (seq2seq) model")
        try:
            generation = GenerationConfig.from_pretrained(source, local_files_only=local_files_only)
        except OSError:  # no generation_config.json: transformers derives it from the config
            generation = GenerationConfig.from_model_config(config)

        self.compute_type = resolve_compute_type(self._compute_type_setting, self.device)
        self.converted_path = convert_once(source, self.compute_type, self._cache_dir, local_files_only)
        kind, _, index = self.device.partition(":")
        try:
            self.translator = ctranslate2.Translator(
                str(self.converted_path),
                device=kind,
                device_index=int(index or 0),
                compute_type=self.compute_type,
                inter_threads=1,
                intra_threads=self._threads,
            )
        except Exception as exc:  # noqa: BLE001
            raise ModelLoadError(
                f"cannot load CTranslate2 model {str(self.converted_path)!r}: {type(exc).__name__}: {exc}"
            ) from exc
        vocabulary = self._vocabulary(self.converted_path)
        self._id_to_token = vocabulary
        self._token_to_id = {token: i for i, token in enumerate(vocabulary)}
        # ids the conversion dropped (Marian's <pad>, which the tokenizer gives for "<pad>" in a text)
        self._unk_token = tokenizer.unk_token if tokenizer.unk_token in self._token_to_id else "<unk>"
        return tokenizer, _ModelFacts(config, generation)

    @staticmethod
    def _vocabulary(path: Path) -> list[str]:
        import json

        for name in ("shared_vocabulary.json", "target_vocabulary.json"):
            if (path / name).exists():
                return json.loads((path / name).read_text(encoding="utf-8"))
        for name in ("shared_vocabulary.txt", "target_vocabulary.txt"):
            if (path / name).exists():
                return (path / name).read_text(encoding="utf-8").split("\n")
        raise ModelLoadError(f"converted model {str(path)!r} has no shared or target vocabulary file")

    def _suppressed_sequences(self, bad_words_ids: Sequence[Sequence[int]]) -> list[list[str]]:
        """transformers' ``bad_words_ids`` as CTranslate2 tokens (Marian's ``<pad>`` is not in its vocabulary)."""
        return [
            [self._id_to_token[i] for i in seq]
            for seq in bad_words_ids
            if all(0 <= i < len(self._id_to_token) for i in seq)
        ]

    # ------------------------------------------------------------------ interface

    def describe(self) -> dict:
        facts = super().describe()
        facts.pop("dtype", None)
        facts.pop("cpu_weight_layout", None)
        facts.update(compute_type=self.compute_type)
        return facts

    # ------------------------------------------------------------------ generation

    def _generate_encoded(self, encoded: list[list[int]], target: str) -> list[list[int]]:
        """Same rows as transformers' generate: decoder start token, forced language token, tokens, EOS."""
        # transformers counts the forced language token and EOS in max_new_tokens, so does
        # CTranslate2's max_decoding_length; a forced EOS takes the last step of the budget.
        max_length = self.max_new_tokens - (1 if self._forced_eos is not None else 0)
        options: dict[str, Any] = {
            "beam_size": self.num_beams,
            "max_decoding_length": max(1, max_length),
            "max_input_length": self.max_input_length,
            "return_end_token": True,
            # CTranslate2's default (1) forbids an immediate EOS, which transformers allows.
            "min_decoding_length": min(self.min_new_tokens or 0, max_length),
        }
        if self._suppress:
            options["suppress_sequences"] = self._suppress
        vocabulary, unk = self._id_to_token, self._unk_token
        try:
            sources = [[vocabulary[i] if 0 <= i < len(vocabulary) else unk for i in ids] for ids in encoded]
            prefix = None
            if self.family in ("m2m100", "nllb"):
                prefix = [[vocabulary[self._lang_token_ids[target]]]] * len(sources)
            results = self.translator.translate_batch(sources, target_prefix=prefix, **options)
        except Exception as exc:  # noqa: BLE001
            raise BackendError(f"generation failed for {self._model_id!r}: {type(exc).__name__}: {exc}") from exc

        start = self.model.config.decoder_start_token_id
        eos_ids = self._eos_ids()
        rows = []
        for result in results:
            row = [start] + [self._token_to_id[t] for t in result.hypotheses[0]]
            if self._forced_eos is not None and row[-1] not in eos_ids:
                row.append(self._forced_eos)
            rows.append(self._trim(row))
        return rows


__all__ = ["CTranslate2Backend", "convert_once", "converted_model_dir", "resolve_compute_type"]
