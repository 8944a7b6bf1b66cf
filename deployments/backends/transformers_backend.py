"""Hugging Face transformers seq2seq translation backend.

Works with any ``AutoModelForSeq2SeqLM`` checkpoint (M2M100, NLLB, Marian, or any seq2seq model
with ``language_pair``): how each family names its languages is languages.py; where the model
comes from and runs (device, dtype, weights) is hf_loading.py; this module tokenizes, generates
(length-sorted, padded, greedy or beam) and decodes.
"""

from __future__ import annotations

import logging
import threading
from contextlib import nullcontext
from typing import Sequence

import torch

from .base import BackendError, LanguagePair, TranslationBackend
from .cpu_linears import weight_layout
from .heap import DECODING_TRIM_AFTER_TOKENS, trim_after_batch
from .hf_loading import (load_seq2seq, load_tokenizer, max_input_length, max_new_tokens_limit, model_source,
                         resolve_device, resolve_dtype)
from .languages import Languages, detect_family, parse_language_pair, source_language_code
from .screened_head import screened_generate
from .segments import cut_short, mark_cut

logger = logging.getLogger(__name__)


class TransformersBackend(TranslationBackend):
    """Translation with a Hugging Face ``AutoModelForSeq2SeqLM``.

    Args:
        model: local folder or hub id (``facebook/m2m100_418M``,
            ``facebook/nllb-200-distilled-600M``, ``Helsinki-NLP/opus-mt-en-de``, ...).
        device: ``"auto"`` (CUDA if available, else CPU), ``"cpu"``, ``"cuda"``, ``"cuda:N"``.
        dtype: ``"auto"`` (float16 on CUDA, float32 on CPU), ``"float32"``,
            ``"float16"``, ``"bfloat16"``.
        num_beams: beam width; 1 = greedy (the default).
        max_new_tokens: generation limit per text.
        min_new_tokens: if set, EOS is suppressed until this many tokens were
            generated (``min_new_tokens == max_new_tokens`` fixes the output length).
        language_pair: ``"src-tgt"``. Required for models that carry no language
            information (generic seq2seq); for Marian it overrides the pair read
            from the ``opus-mt-{src}-{tgt}`` name. Ignored for the multilingual
            families (M2M100, NLLB): it restricts nothing there.
        num_threads: if given, ``torch.set_num_threads(num_threads)``.
        local_files_only: never contact the hub.
        cpu_weight_layout: ``"blocked"`` or ``"plain"``: the layout of a float32
            CPU model's linear weights (cpu_linears.py).

    Raises:
        ModelLoadError: folder missing, weights/config unreadable, or no way to
            know the language pair.
    """

    name = "transformers"

    def __init__(
        self,
        model: str,
        *,
        device: str = "auto",
        dtype: str = "auto",
        num_beams: int = 1,
        max_new_tokens: int = 256,
        min_new_tokens: int | None = None,
        language_pair: str | None = None,
        num_threads: int | None = None,
        local_files_only: bool = False,
        cpu_weight_layout: str = "blocked",
    ) -> None:
        if num_beams < 1:
            raise ValueError(f"num_beams must be >= 1, got {num_beams}")
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        if min_new_tokens is not None and not 0 <= min_new_tokens <= max_new_tokens:
            raise ValueError(f"min_new_tokens must be in [0, max_new_tokens], got {min_new_tokens}")
        if num_threads is not None:
            if num_threads < 1:
                raise ValueError(f"num_threads must be >= 1, got {num_threads}")
            torch.set_num_threads(num_threads)

        self._model_id = str(model)
        self.device = resolve_device(device)
        self.dtype = resolve_dtype(dtype, self.device)
        self.num_beams = int(num_beams)
        self.max_new_tokens = int(max_new_tokens)
        self.min_new_tokens = None if min_new_tokens is None else int(min_new_tokens)
        self._explicit_pair = parse_language_pair(language_pair) if language_pair else None
        self._lock = threading.Lock()  # the tokenizer's src_lang is shared state
        self.cpu_weight_layout = cpu_weight_layout

        self.tokenizer, self.model = self._load(self._model_id, local_files_only)
        self.model_type: str = getattr(self.model.config, "model_type", "unknown")
        self.family = detect_family(self.tokenizer, self.model_type)
        languages = Languages.of(self.family, self.tokenizer, self._model_id, self.model_type, self._explicit_pair)
        self._lang_token_ids = languages.token_ids  # multilingual families: ISO code -> forced BOS / source token id
        self._languages = list(languages.token_ids)  # multilingual families: ISO codes offered
        self._pair = languages.pair  # single-pair families
        self._lang_id_set = frozenset(self._lang_token_ids.values())
        self.max_input_length = max_input_length(self.tokenizer, self.model.config)
        if (limit := max_new_tokens_limit(self.model)) is not None and self.max_new_tokens > limit:
            raise ValueError(f"max_new_tokens={self.max_new_tokens}: {self._model_id!r} decodes at most {limit} tokens")
        # Every call passes max_new_tokens; a checkpoint's max_length would only warn "both set" at each generate.
        self.model.generation_config.max_length = None

    def _load(self, model: str, local_files_only: bool):
        """(tokenizer, model): the hook CTranslate2Backend overrides."""
        source = model_source(model)
        return load_tokenizer(source, local_files_only), load_seq2seq(model, source, self.dtype, self.device,
                                                                     local_files_only, self.cpu_weight_layout)

    # ------------------------------------------------------------------ interface

    @property
    def model_id(self) -> str:
        return self._model_id

    def supported_pairs(self) -> list[LanguagePair]:
        if self._pair is not None:
            return [self._pair]
        return [LanguagePair(s, t) for s in self._languages for t in self._languages if self.supports(s, t)]

    def supports(self, source: str, target: str) -> bool:
        if self._pair is not None:
            return LanguagePair(source, target) == self._pair
        ids = self._lang_token_ids  # (two codes of one language token, nb and no: not a pair)
        return source in ids and target in ids and ids[source] != ids[target]

    def describe(self) -> dict:
        return {
            "device": self.device,
            "dtype": str(self.dtype).replace("torch.", ""),
            "num_beams": self.num_beams, "max_new_tokens": self.max_new_tokens, "min_new_tokens": self.min_new_tokens,
            "model_type": self.model_type, "family": self.family,
            "cpu_weight_layout": weight_layout(self.model),
        }

    def token_lengths(self, texts: Sequence[str], source: str) -> list[int]:
        """Input tokens per text, as `generate_ids` will see them (truncated to max_input_length)."""
        return [len(ids) for ids in self.encode_texts(texts, source)]

    def encode_texts(self, texts: Sequence[str], source: str) -> list[list[int]]:
        """Source token ids per text, as `generate_ids` feeds them (truncated to max_input_length)."""
        with self._lock:
            self._set_source_language(source)
            return self.tokenizer(list(texts), truncation=True, max_length=self.max_input_length)["input_ids"]

    def forced_bos_token_id(self, target: str) -> int | None:
        """The token forced after the decoder start (M2M100/NLLB: the target language), else None."""
        return self._lang_token_ids[target] if self.family in ("m2m100", "nllb") else None

    def continuous_decoder(self, slots: int | None = None, cuda_graphs: bool = True):
        """The continuous scheduler's engine over this model (greedy only). On CUDA, given `slots` (the
        most sequences running) and `cuda_graphs`: a `SlotDecoder`, each step one CUDA graph replay (a GPU
        step costs kernel launches). Else a `ContinuousDecoder`, its tensors cut to the running rows (a
        CPU step costs arithmetic, which grows with the rows)."""
        from .continuous_decoder import ContinuousDecoder
        from .slot_decoder import SlotDecoder

        if self.num_beams != 1:
            raise ValueError(f"continuous scheduling decodes greedily: num_beams must be 1, got {self.num_beams}")
        if slots is not None and cuda_graphs and self.device.startswith("cuda"):
            return SlotDecoder(self.model, self._pad, slots=slots, graphs=True)
        return ContinuousDecoder(self.model, self._pad)

    def translate(self, texts: Sequence[str], source: str, target: str) -> list[str]:
        """Translations in order; one the model cut short (segments.py `cut_short`) is a `CutText`."""
        encoded, rows = self._encode_generate(texts, source, target)
        return mark_cut(self.decode_rows(rows), [self.is_cut(len(ids), row, self.max_new_tokens, self.min_new_tokens)
                                                 for ids, row in zip(encoded, rows)])

    def is_cut(self, source_tokens: int, row: Sequence[int], max_new_tokens: int, min_new_tokens: int | None) -> bool:
        return cut_short(source_tokens, row, max_input_length=self.max_input_length,
                         max_new_tokens=max_new_tokens, min_new_tokens=min_new_tokens)

    def decode_rows(self, sequences: Sequence[Sequence[int]]) -> list[str]:
        """Texts of generated rows (see `generate_ids`)."""
        # transformers 5's M2M100Tokenizer does not treat its __xx__ language tokens
        # as special, so skip_special_tokens keeps them: drop them by id.
        drop = self._lang_id_set
        return [
            self.tokenizer.decode(
                [t for t in seq if t not in drop], skip_special_tokens=True, clean_up_tokenization_spaces=False
            ).strip()
            for seq in sequences
        ]

    def warm_up(self) -> None:
        """One short generate per direction (at most two), a few tokens each."""
        saved = self.max_new_tokens, self.min_new_tokens
        self.max_new_tokens, self.min_new_tokens = 4, None
        try:
            for pair in self.supported_pairs()[:2]:
                self.generate_ids(["Hello."], pair.source, pair.target)
        finally:
            self.max_new_tokens, self.min_new_tokens = saved

    # ------------------------------------------------------------------ generation

    def generate_ids(self, texts: Sequence[str], source: str, target: str) -> list[list[int]]:
        """Generated token ids per text, in input order.

        Each row starts with the decoder start token (and, for M2M100/NLLB, the
        forced target-language token next) and is cut after the first EOS, so it
        does not depend on how the batch was padded.
        """
        return self._encode_generate(texts, source, target)[1]

    def _encode_generate(self, texts: Sequence[str], source: str, target: str) -> tuple[list, list[list[int]]]:
        """(source token ids, generated rows) per text, in input order."""
        if isinstance(texts, str):
            raise TypeError("texts must be a sequence of strings, not a string")
        if not self.supports(source, target):
            raise ValueError(
                f"{self.name} model {self._model_id!r} does not translate {source}->{target}"
                + (f" (only {self._pair})" if self._pair is not None else "")
            )
        if not (texts := list(texts)):
            return [], []
        with self._lock:
            self._set_source_language(source)
            encoded = self.tokenizer(texts, truncation=True, max_length=self.max_input_length)["input_ids"]
            return encoded, self._generate_encoded(encoded, target)

    def _generate_encoded(self, encoded: list[list[int]], target: str) -> list[list[int]]:
        """Generated rows (see :meth:`generate_ids`) for tokenized inputs, in input order."""
        # Length-aware: sort by length, pad into one batch.
        order = sorted(range(len(encoded)), key=lambda i: len(encoded[i]), reverse=True)
        input_ids, attention_mask = self._pad([encoded[i] for i in order])
        gen_kwargs = {
            "num_beams": self.num_beams,
            "do_sample": False,
            "max_new_tokens": self.max_new_tokens,
        }
        if self.min_new_tokens is not None:
            gen_kwargs["min_new_tokens"] = self.min_new_tokens
        if self.family in ("m2m100", "nllb"):
            gen_kwargs["forced_bos_token_id"] = self._lang_token_ids[target]
        try:
            # greedy on the CPU: each token from the screened output projection, exact (screened_head.py)
            with torch.inference_mode(), screened_generate(self.model) if self.num_beams == 1 else nullcontext():
                out = self.model.generate(
                    input_ids=input_ids.to(self.device),
                    attention_mask=attention_mask.to(self.device),
                    **gen_kwargs,
                )
        except Exception as exc:  # noqa: BLE001
            raise BackendError(f"generation failed for {self._model_id!r}: {type(exc).__name__}: {exc}") from exc

        rows = [self._trim(row) for row in out.tolist()]
        slots = out.numel() + input_ids.numel()
        del out  # the batch's caches are freed; glibc keeps their pages unless asked (heap.py)
        trim_after_batch(slots, DECODING_TRIM_AFTER_TOKENS, self.device)
        result: list[list[int]] = [[] for _ in encoded]
        for pos, idx in enumerate(order):
            result[idx] = rows[pos]
        return result

    def _pad(self, rows: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        """Pad token id lists into (input_ids, attention_mask) on the tokenizer's padding side."""
        pad_id = self.tokenizer.pad_token_id
        if pad_id is None:
            pad_id = self.model.config.pad_token_id if self.model.config.pad_token_id is not None else 0
        width = max(len(r) for r in rows)
        ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        left = getattr(self.tokenizer, "padding_side", "right") == "left"
        for i, r in enumerate(rows):
            if not r:
                continue
            sl = slice(width - len(r), width) if left else slice(0, len(r))
            ids[i, sl] = torch.tensor(r, dtype=torch.long)
            mask[i, sl] = 1
        return ids, mask

    def _set_source_language(self, source: str) -> None:
        code = source_language_code(self.family, source)
        if code is not None:
            self.tokenizer.src_lang = code

    def _eos_ids(self) -> set[int]:
        eos = self.model.generation_config.eos_token_id
        if eos is None:
            eos = self.model.config.eos_token_id
        return set(eos) if isinstance(eos, (list, tuple)) else {eos}

    def _trim(self, row: list[int]) -> list[int]:
        """Cut a generated row after its first EOS (position 0 is the decoder start)."""
        eos_ids = self._eos_ids()
        for i in range(1, len(row)):
            if row[i] in eos_ids:
                return row[: i + 1]
        return row


__all__ = ["TransformersBackend"]
