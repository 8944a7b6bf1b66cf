"""Hugging Face transformers seq2seq translation backend.

Works with any ``AutoModelForSeq2SeqLM`` checkpoint; knows how to drive the
language tokens of the three common translation families:

* ``m2m100``  - ``facebook/m2m100_418M`` & co. (M2M100Tokenizer, ``__xx__`` tokens)
* ``nllb``    - ``facebook/nllb-200-*`` (NllbTokenizer, FLORES-200 codes such as
  ``eng_Latn``; the API speaks ISO 639-1 and maps through :data:`ISO_TO_FLORES`)
* ``marian``  - ``Helsinki-NLP/opus-mt-{src}-{tgt}`` (one pair per model)
* ``seq2seq`` - anything else; the pair must be given with ``language_pair`` and
  the texts are fed to the model unchanged.
"""

from __future__ import annotations

import logging
import re
import threading
from pathlib import Path
from typing import Sequence

import torch

from .base import BackendError, LanguagePair, ModelLoadError, TranslationBackend

logger = logging.getLogger(__name__)

#: ISO 639-1 code -> FLORES-200 code, as used by NLLB tokenizers.
ISO_TO_FLORES: dict[str, str] = {
    "af": "afr_Latn",
    "am": "amh_Ethi",
    "ar": "arb_Arab",
    "az": "azj_Latn",
    "be": "bel_Cyrl",
    "bg": "bul_Cyrl",
    "bn": "ben_Beng",
    "bs": "bos_Latn",
    "ca": "cat_Latn",
    "cs": "ces_Latn",
    "cy": "cym_Latn",
    "da": "dan_Latn",
    "de": "deu_Latn",
    "el": "ell_Grek",
    "en": "eng_Latn",
    "eo": "epo_Latn",
    "es": "spa_Latn",
    "et": "est_Latn",
    "eu": "eus_Latn",
    "fa": "pes_Arab",
    "fi": "fin_Latn",
    "fr": "fra_Latn",
    "ga": "gle_Latn",
    "gl": "glg_Latn",
    "gu": "guj_Gujr",
    "ha": "hau_Latn",
    "he": "heb_Hebr",
    "hi": "hin_Deva",
    "hr": "hrv_Latn",
    "hu": "hun_Latn",
    "hy": "hye_Armn",
    "id": "ind_Latn",
    "ig": "ibo_Latn",
    "is": "isl_Latn",
    "it": "ita_Latn",
    "ja": "jpn_Jpan",
    "jv": "jav_Latn",
    "ka": "kat_Geor",
    "kk": "kaz_Cyrl",
    "km": "khm_Khmr",
    "kn": "kan_Knda",
    "ko": "kor_Hang",
    "ky": "kir_Cyrl",
    "lo": "lao_Laoo",
    "lt": "lit_Latn",
    "lv": "lvs_Latn",
    "mk": "mkd_Cyrl",
    "ml": "mal_Mlym",
    "mn": "khk_Cyrl",
    "mr": "mar_Deva",
    "ms": "zsm_Latn",
    "mt": "mlt_Latn",
    "my": "mya_Mymr",
    "ne": "npi_Deva",
    "nl": "nld_Latn",
    "nb": "nob_Latn",
    "nn": "nno_Latn",
    "no": "nob_Latn",
    "pa": "pan_Guru",
    "pl": "pol_Latn",
    "ps": "pbt_Arab",
    "pt": "por_Latn",
    "ro": "ron_Latn",
    "ru": "rus_Cyrl",
    "si": "sin_Sinh",
    "sk": "slk_Latn",
    "sl": "slv_Latn",
    "so": "som_Latn",
    "sq": "als_Latn",
    "sr": "srp_Cyrl",
    "sv": "swe_Latn",
    "sw": "swh_Latn",
    "ta": "tam_Taml",
    "te": "tel_Telu",
    "tg": "tgk_Cyrl",
    "th": "tha_Thai",
    "tl": "tgl_Latn",
    "tr": "tur_Latn",
    "uk": "ukr_Cyrl",
    "ur": "urd_Arab",
    "uz": "uzn_Latn",
    "vi": "vie_Latn",
    "xh": "xho_Latn",
    "yo": "yor_Latn",
    "zh": "zho_Hans",
    "zu": "zul_Latn",
}

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
_OPUS_RE = re.compile(r"opus-mt-(?:tc-big-|tc-)?([a-z]{2,3})-([a-z]{2,3})(?![a-zA-Z])")
_PAIR_RE = re.compile(r"^\s*([A-Za-z]{2,3})\s*[-_>]\s*([A-Za-z]{2,3})\s*$")


# --------------------------------------------------------------------------- pure helpers


def resolve_device(device: str = "auto") -> str:
    """``"auto"`` -> ``"cuda"`` when CUDA is available, else ``"cpu"``.

    ``"cpu"``, ``"cuda"`` and ``"cuda:N"`` are returned as given; asking for
    CUDA on a machine without it raises :class:`BackendError`.
    """
    dev = (device or "auto").strip().lower()
    if dev == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if not _DEVICE_RE.match(dev):
        raise ValueError(f"device must be 'auto', 'cpu', 'cuda' or 'cuda:N', got {device!r}")
    if dev.startswith("cuda") and not torch.cuda.is_available():
        raise BackendError(f"device {device!r} requested but CUDA is not available")
    return dev


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


def parse_language_pair(value: str) -> LanguagePair:
    """``"en-de"`` -> ``LanguagePair("en", "de")`` (``en_de`` also accepted)."""
    match = _PAIR_RE.match(value or "")
    if not match:
        raise ValueError(f"language_pair must look like 'en-de', got {value!r}")
    return LanguagePair(match.group(1).lower(), match.group(2).lower())


def pair_from_model_name(model: str) -> LanguagePair | None:
    """The pair of an OPUS-MT model from its id or folder, e.g. ``.../opus-mt-en-de``."""
    matches = _OPUS_RE.findall(str(model))
    if not matches:
        return None
    src, tgt = matches[-1]
    return LanguagePair(src, tgt)


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


# --------------------------------------------------------------------------- backend


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

        self.tokenizer, self.model = self._load(self._model_id, local_files_only)
        self.model_type: str = getattr(self.model.config, "model_type", "unknown")
        self.family = self._detect_family()
        self._languages: list[str] = []  # multilingual families: ISO codes offered
        self._lang_token_ids: dict[str, int] = {}  # ISO code -> forced BOS / source token id
        self._pair: LanguagePair | None = None  # single-pair families
        self._setup_languages()
        self._lang_id_set = frozenset(self._lang_token_ids.values())
        self.max_input_length = self._max_input_length()
        # Every call passes max_new_tokens; a checkpoint's max_length (200/512 on the
        # hub) would only trigger a "both set" warning on each generate.
        self.model.generation_config.max_length = None

    # ------------------------------------------------------------------ loading

    def _load(self, model: str, local_files_only: bool):
        from transformers import AutoModelForSeq2SeqLM

        source = model_source(model)
        tokenizer = load_tokenizer(source, local_files_only)
        try:
            seq2seq = AutoModelForSeq2SeqLM.from_pretrained(
                source, dtype=self.dtype, local_files_only=local_files_only
            )
            seq2seq.to(self.device)
            seq2seq.eval()
        except Exception as exc:  # noqa: BLE001
            raise ModelLoadError(f"cannot load model from {model!r}: {type(exc).__name__}: {exc}") from exc
        if not getattr(seq2seq.config, "is_encoder_decoder", False):
            raise ModelLoadError(f"model {model!r} is not an encoder-decoder (seq2seq) model")
        return tokenizer, seq2seq

    def _detect_family(self) -> str:
        tok_class = type(self.tokenizer).__name__
        if tok_class.startswith("Nllb"):
            return "nllb"
        if self.model_type == "m2m_100" and hasattr(self.tokenizer, "get_lang_id"):
            return "m2m100"
        if self.model_type == "marian":
            return "marian"
        return "seq2seq"

    def _setup_languages(self) -> None:
        tok = self.tokenizer
        if self.family == "m2m100":
            # language ids are not in get_vocab(); the tokenizer keeps them apart
            self._lang_token_ids = {code: tok.get_lang_id(code) for code in tok.lang_code_to_id}
            self._languages = list(self._lang_token_ids)
        elif self.family == "nllb":
            vocab = tok.get_vocab()
            self._lang_token_ids = {iso: vocab[fl] for iso, fl in ISO_TO_FLORES.items() if fl in vocab}
            self._languages = list(self._lang_token_ids)
        elif self.family == "marian":
            pair = self._explicit_pair or pair_from_model_name(self._model_id)
            if pair is None:
                raise ModelLoadError(
                    f"cannot tell the language pair of Marian model {self._model_id!r}: its name does not "
                    "contain 'opus-mt-{src}-{tgt}'; set language_pair (e.g. 'en-de')"
                )
            self._pair = pair
        else:
            if self._explicit_pair is None:
                raise ModelLoadError(
                    f"model {self._model_id!r} (model_type {self.model_type!r}) carries no language "
                    "information; set language_pair (e.g. 'en-de')"
                )
            self._pair = self._explicit_pair
        if self.family in ("m2m100", "nllb") and not self._languages:
            raise ModelLoadError(f"model {self._model_id!r}: no known language tokens in its tokenizer")

    def _max_input_length(self) -> int:
        limits = []
        tok_max = getattr(self.tokenizer, "model_max_length", None)
        if isinstance(tok_max, int) and 0 < tok_max < 1_000_000:
            limits.append(tok_max)
        pos_max = getattr(self.model.config, "max_position_embeddings", None)
        if isinstance(pos_max, int) and pos_max > 0:
            limits.append(pos_max)
        return min(limits) if limits else 512

    # ------------------------------------------------------------------ interface

    @property
    def model_id(self) -> str:
        return self._model_id

    def supported_pairs(self) -> list[LanguagePair]:
        if self._pair is not None:
            return [self._pair]
        return [LanguagePair(s, t) for s in self._languages for t in self._languages if s != t]

    def supports(self, source: str, target: str) -> bool:
        if self._pair is not None:
            return LanguagePair(source, target) == self._pair
        return source != target and source in self._lang_token_ids and target in self._lang_token_ids

    def describe(self) -> dict:
        return {
            "device": self.device,
            "dtype": str(self.dtype).replace("torch.", ""),
            "num_beams": self.num_beams,
            "max_new_tokens": self.max_new_tokens,
            "min_new_tokens": self.min_new_tokens,
            "model_type": self.model_type,
            "family": self.family,
        }

    def token_lengths(self, texts: Sequence[str], source: str) -> list[int]:
        """Input tokens per text, as `generate_ids` will see them (truncated to max_input_length)."""
        with self._lock:
            self._set_source_language(source)
            encoded = self.tokenizer(list(texts), truncation=True, max_length=self.max_input_length)
        return [len(ids) for ids in encoded["input_ids"]]

    def translate(self, texts: Sequence[str], source: str, target: str) -> list[str]:
        sequences = self.generate_ids(texts, source, target)
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
        if isinstance(texts, str):
            raise TypeError("texts must be a sequence of strings, not a string")
        if not self.supports(source, target):
            raise ValueError(
                f"{self.name} model {self._model_id!r} does not translate {source}->{target}"
                + (f" (only {self._pair})" if self._pair is not None else "")
            )
        texts = list(texts)
        if not texts:
            return []

        with self._lock:
            self._set_source_language(source)
            encoded = self.tokenizer(texts, truncation=True, max_length=self.max_input_length)["input_ids"]
            return self._generate_encoded(encoded, target)

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
            with torch.inference_mode():
                out = self.model.generate(
                    input_ids=input_ids.to(self.device),
                    attention_mask=attention_mask.to(self.device),
                    **gen_kwargs,
                )
        except Exception as exc:  # noqa: BLE001
            raise BackendError(f"generation failed for {self._model_id!r}: {type(exc).__name__}: {exc}") from exc

        rows = [self._trim(row) for row in out.tolist()]
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
        if self.family == "m2m100":
            self.tokenizer.src_lang = source
        elif self.family == "nllb":
            self.tokenizer.src_lang = ISO_TO_FLORES[source]

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


__all__ = [
    "ISO_TO_FLORES",
    "TransformersBackend",
    "pair_from_model_name",
    "parse_language_pair",
    "resolve_device",
    "resolve_dtype",
]
