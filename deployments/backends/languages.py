"""Languages of the Hugging Face translation families: which pairs a model translates, and the
tokens that name its languages.

* ``m2m100``  - ``facebook/m2m100_418M`` & co. (M2M100Tokenizer, ``__xx__`` tokens)
* ``nllb``    - ``facebook/nllb-200-*`` (NllbTokenizer, FLORES-200 codes such as
  ``eng_Latn``; the API speaks ISO 639-1 and maps through :data:`ISO_TO_FLORES`)
* ``marian``  - ``Helsinki-NLP/opus-mt-{src}-{tgt}`` (one pair per model)
* ``seq2seq`` - anything else; the pair must be given with ``language_pair``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Optional

from .base import LanguagePair, ModelLoadError

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
    # Chinese in its two scripts: a script (Hant, Hans) or a region that writes one (TW, HK, MO; CN, SG)
    "zh-hant": "zho_Hant",
    "zh-tw": "zho_Hant",
    "zh-hk": "zho_Hant",
    "zh-mo": "zho_Hant",
    "zh-hans": "zho_Hans",
    "zh-cn": "zho_Hans",
    "zh-sg": "zho_Hans",
    "zu": "zul_Latn",
}

_OPUS_RE = re.compile(r"opus-mt-(?:tc-big-|tc-)?([a-z]{2,3})-([a-z]{2,3})(?![a-zA-Z])")
_PAIR_RE = re.compile(r"^\s*([A-Za-z]{2,3})\s*[-_>]\s*([A-Za-z]{2,3})\s*$")


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


def detect_family(tokenizer: Any, model_type: str) -> str:
    tok_class = type(tokenizer).__name__
    if tok_class.startswith("Nllb"):
        return "nllb"
    if model_type == "m2m_100" and hasattr(tokenizer, "get_lang_id"):
        return "m2m100"
    if model_type == "marian":
        return "marian"
    return "seq2seq"


@dataclass
class Languages:
    """What a model translates: a multilingual family's language tokens (ISO code -> token id), or
    the one pair of a single-pair model."""

    token_ids: dict[str, int] = field(default_factory=dict)
    pair: Optional[LanguagePair] = None

    @classmethod
    def of(cls, family: str, tokenizer: Any, model_id: str, model_type: str,
           explicit_pair: Optional[LanguagePair]) -> "Languages":
        if family == "m2m100":
            # language ids are not in get_vocab(); the tokenizer keeps them apart
            found = cls({code: tokenizer.get_lang_id(code) for code in tokenizer.lang_code_to_id})
        elif family == "nllb":
            vocab = tokenizer.get_vocab()
            found = cls({iso: vocab[fl] for iso, fl in ISO_TO_FLORES.items() if fl in vocab})
        elif family == "marian":
            pair = explicit_pair or pair_from_model_name(model_id)
            if pair is None:
                raise ModelLoadError(
                    f"cannot tell the language pair of Marian model {model_id!r}: its name does not "
                    "contain 'opus-mt-{src}-{tgt}'; set language_pair (e.g. 'en-de')"
                )
            return cls(pair=pair)
        else:
            if explicit_pair is None:
                raise ModelLoadError(
                    f"model {model_id!r} (model_type {model_type!r}) carries no language "
                    "information; set language_pair (e.g. 'en-de')"
                )
            return cls(pair=explicit_pair)
        if not found.token_ids:
            raise ModelLoadError(f"model {model_id!r}: no known language tokens in its tokenizer")
        return found


def source_language_code(family: str, source: str) -> Optional[str]:
    """What the tokenizer's `src_lang` is set to for `source` (None: the family has none)."""
    if family == "m2m100":
        return source
    if family == "nllb":
        return ISO_TO_FLORES[source]
    return None
