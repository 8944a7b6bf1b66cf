"""Language codes a request may send, against what a multilingual model writes (from a read-only review of the
backends, 2026-11-30): Chinese in its two scripts on NLLB (zh-Hant was answered in Simplified), two codes of one
language are not a pair (nb -> no "translated" Norwegian into Norwegian), and a script is never dropped to find a
pair (sr-Latn was answered in Cyrillic); regions still fall back (pt-BR -> pt)."""

from __future__ import annotations

import pytest

from deployments.backends.base import LanguagePair
from serve_app.calls import resolve_pair
from serve_app.errors import UnsupportedLanguagePair
from tests.fixtures.tiny_models import build_tiny_nllb


@pytest.fixture(scope="module")
def nllb(tmp_path_factory, make_backend):
    return make_backend(build_tiny_nllb(tmp_path_factory.mktemp("nllb-scripts"), ("en", "zh", "zh-hant", "nb", "sr")))


def test_nllb_writes_chinese_in_the_script_asked_for(nllb):
    token = nllb.tokenizer.convert_tokens_to_ids
    for code, flores in (("zh-hant", "zho_Hant"), ("zh-tw", "zho_Hant"), ("zh-hk", "zho_Hant"), ("zh", "zho_Hans"),
                         ("zh-cn", "zho_Hans")):
        assert nllb.supports("en", code), code
        rows = nllb.generate_ids(["Hello there."], "en", code)
        assert rows[0][1] == token(flores), code  # the forced first token
    pairs = [f"{p.source}-{p.target}" for p in nllb.supported_pairs()]
    assert resolve_pair("en", "zh-Hant-TW", pairs) == ("en", "zh-hant") and resolve_pair("EN", "zh_TW", pairs) == \
        ("en", "zh-tw")
    assert nllb.supports("zh", "zh-hant")  # Simplified into Traditional: two tokens, a pair


def test_two_codes_of_one_language_token_are_not_a_pair(nllb):
    assert not nllb.supports("nb", "no") and not nllb.supports("zh", "zh-cn")
    assert LanguagePair("nb", "no") not in set(nllb.supported_pairs())
    assert LanguagePair("en", "no") in set(nllb.supported_pairs())


def test_a_script_is_never_dropped_but_a_region_is(nllb):
    pairs = [f"{p.source}-{p.target}" for p in nllb.supported_pairs()]
    with pytest.raises(UnsupportedLanguagePair):
        resolve_pair("en", "sr-Latn", pairs)  # the model writes Serbian in Cyrillic only
    assert resolve_pair("en", "sr-RS", pairs) == ("en", "sr") and resolve_pair("en", "pt-BR", ["en-pt"]) == ("en", "pt")
    assert resolve_pair("nb-NO", "en", pairs) == ("nb", "en")


def test_a_chinese_region_keeps_its_script_and_simplified_may_drop_its_own():
    """zh-TW fell back to `zh` on a model without Traditional Chinese and was answered in Simplified; zh-Hans was
    refused (400) by a model whose `zh` is Simplified. From a review (2026-12-01)."""
    simplified_only = ["en-zh", "zh-en"]
    for traditional in ("zh-TW", "zh-HK", "zh_MO", "zh-Hant"):
        with pytest.raises(UnsupportedLanguagePair):
            resolve_pair("en", traditional, simplified_only)
    for simplified in ("zh-Hans", "zh-CN", "zh-SG", "zh-Hans-CN", "zh"):
        assert resolve_pair("en", simplified, simplified_only) == ("en", "zh"), simplified
    assert resolve_pair("en", "zh-TW", ["en-zh", "en-zh-hant"]) == ("en", "zh-hant")


def test_long_texts_into_chinese_of_any_tag_join_without_spaces_and_cjk_halves_into_english_with_one():
    from deployments.backends.segments import join

    for target in ("zh", "zh-hant", "zh-tw", "ja", "zho_Hant"):
        assert join(["甲。", "乙。"], [("a。", " "), ("b。", " ")], target) == "甲。乙。", target
    # a run of CJK without any whitespace, cut in two: its halves translated into English get a space between them
    assert join(["Part one", "part two."], [("中" * 3, ""), ("文。", " ")], "en") == "Part one part two."
    assert join(["http://x", "yz"], [("http://x", ""), ("yz", " ")], "pt") == "http://xyz"  # a Latin run: glued


def test_a_pair_string_is_split_where_its_codes_are_not_where_the_request_s_hyphen_falls():
    """NLLB's `zh-tw-en` (zh-TW -> en) also reads as zh -> `tw-en`: a request for that matched it, and the backend
    refused the pair with a 500 instead of the 400 every other unsupported pair gets. From a review (2026-12-01)."""
    codes = ["en", "zh", "zh-tw", "zh-hant", "pt"]
    pairs = [f"{a}-{b}" for a in codes for b in codes if a != b]
    with pytest.raises(UnsupportedLanguagePair):
        resolve_pair("zh", "tw-en", pairs)
    assert resolve_pair("zh-TW", "en", pairs) == ("zh-tw", "en") and resolve_pair("en", "zh-tw", pairs) == \
        ("en", "zh-tw")
    assert resolve_pair("zh", "tw-en", pairs + ["zh-tw"]) == ("zh", "tw")  # Twi (region EN), where it is served


def test_a_tag_naming_its_language_s_default_script_means_the_language():
    """en-Latn, pt-Latn-BR and en-Latn-US were refused (400) although they mean en, pt-BR and en-US: only
    Chinese's Simplified script could be named. From a review (2026-12-02)."""
    pairs = ["en-pt", "pt-en", "ru-uk", "ar-en", "ja-ko"]
    for source, target, resolved in (("en-Latn", "pt-Latn-BR", ("en", "pt")), ("en_latn_us", "PT-LATN", ("en", "pt")),
                                     ("pt-Latn-PT", "en", ("pt", "en")), ("ru-Cyrl", "uk-Cyrl-UA", ("ru", "uk")),
                                     ("ar-Arab-EG", "en-Latn", ("ar", "en")), ("ja-Jpan", "ko-Kore-KR", ("ja", "ko"))):
        assert resolve_pair(source, target, pairs) == resolved, (source, target)
    regional = ["en-pt", "en-pt-br", "pt-br-en", "pt-en"]  # a regional code served: the tag is that region's
    assert resolve_pair("en", "pt-Latn-BR", regional) == ("en", "pt-br")
    assert resolve_pair("pt-Latn-BR", "en", regional) == ("pt-br", "en")


def test_a_script_other_than_the_language_s_default_is_still_not_another_script_s_model(nllb):
    pairs = [f"{p.source}-{p.target}" for p in nllb.supported_pairs()]
    assert resolve_pair("en", "sr-Cyrl", pairs) == ("en", "sr") and resolve_pair("nb-Latn-NO", "en", pairs) == \
        ("nb", "en")
    for source, target in (("en", "sr-Latn"), ("en", "sr-Latn-RS"), ("en-Cyrl", "sr"), ("en", "zh-Latn")):
        with pytest.raises(UnsupportedLanguagePair):
            resolve_pair(source, target, pairs)
    for cyrillic_uzbek in ("uz-Cyrl", "uz-Cyrl-UZ"):  # Uzbek's bare code is Latin: Cyrillic is another model's
        with pytest.raises(UnsupportedLanguagePair):
            resolve_pair("en", cyrillic_uzbek, ["en-uz"])
    # Chinese keeps its rules: Traditional only where served, Simplified named in a Traditional region is `zh`
    assert resolve_pair("en", "zh-Hant-TW", pairs) == ("en", "zh-hant")
    assert resolve_pair("en", "zh-Hans-TW", ["en-zh"]) == ("en", "zh")
    with pytest.raises(UnsupportedLanguagePair):
        resolve_pair("en", "zh-Hant-TW", ["en-zh"])


def test_every_language_of_nllb_and_m2m100_knows_its_default_script():
    """The default scripts agree with NLLB's own FLORES codes (Korean aside: CLDR's Kore, NLLB's Hang) and
    cover every M2M100 language, so `xx-<its script>` resolves for each."""
    from transformers.models.m2m_100.tokenization_m2m_100 import FAIRSEQ_LANGUAGE_CODES

    from deployments.backends.languages import ISO_TO_FLORES

    scripts = {iso: flores.split("_")[1] for iso, flores in ISO_TO_FLORES.items() if "-" not in iso and iso != "ko"}
    scripts |= {"ko": "Kore", "ba": "Cyrl", "sd": "Arab", "yi": "Hebr", "or": "Orya"}
    scripts |= dict.fromkeys("ast br ceb ff fy gd ht ilo lb lg ln mg ns oc ss su tn wo".split(), "Latn")
    assert set(FAIRSEQ_LANGUAGE_CODES["m2m100"]) <= set(scripts)
    for code, script in scripts.items():
        assert resolve_pair(f"{code}-{script}", "xx", [f"{code}-xx"]) == (code, "xx"), code
        assert resolve_pair("xx", f"{code}_{script}", [f"xx-{code}"]) == ("xx", code), code


def test_nllb_s_own_codes_and_three_letter_codes_mean_their_two_letter_language(nllb):
    """A client of an NLLB model sends its FLORES-200 codes (`eng_Latn`); others send ISO 639-2 or 639-3 codes
    (`deu`, `ger`, `por`). They were refused (400) though the model served the language. From the last notes'
    "found and not fixed" list (2026-12-02)."""
    pairs = [f"{p.source}-{p.target}" for p in nllb.supported_pairs()]
    assert resolve_pair("eng_Latn", "zho_Hant", pairs) == ("en", "zh-hant")
    assert resolve_pair("eng_Latn", "zho_Hans", pairs) == resolve_pair("en", "zh-Hans", pairs)  # (its zh-hans)
    assert resolve_pair("nob_Latn", "srp_Cyrl", pairs) == ("nb", "sr")  # NLLB's nob is Bokmål, not `no`
    with pytest.raises(UnsupportedLanguagePair):
        resolve_pair("eng_Latn", "srp_Latn", pairs)  # still Serbian in another script than the model's
    plain = ["en-de", "de-en", "en-pt", "en-fa", "en-ko"]
    for source, target, resolved in (("eng", "deu", ("en", "de")), ("ENG", "ger", ("en", "de")),
                                     ("deu_Latn", "eng_Latn", ("de", "en")), ("en", "por_Latn", ("en", "pt")),
                                     ("en", "pes_Arab", ("en", "fa")), ("en", "per", ("en", "fa")),
                                     ("en", "kor_Hang", ("en", "ko"))):
        assert resolve_pair(source, target, plain) == resolved, (source, target)
    assert resolve_pair("eng", "xx", ["eng-xx", "en-xx"]) == ("eng", "xx")  # a code the model lists itself: as sent


def test_korean_in_hangul_is_korean_and_regions_written_in_another_script_keep_it():
    """`ko-Hang` (Korean in Hangul, NLLB's kor_Hang) was refused: CLDR's default script for Korean is Kore.
    `sr-ME` fell back to `sr` and was answered in Cyrillic, though Montenegro writes Serbian in Latin (CLDR's likely
    subtags); so did the other regions that write a language in another script than its bare code's."""
    assert resolve_pair("ko-Hang", "en", ["ko-en"]) == ("ko", "en")
    assert resolve_pair("en", "ko-Hang-KR", ["en-ko"]) == ("en", "ko")
    for region in ("sr-ME", "uz-AF", "pa-PK", "az-IR", "mn-CN", "sd-IN"):
        with pytest.raises(UnsupportedLanguagePair):
            resolve_pair("en", region, [f"en-{region.split('-')[0]}"])
    assert resolve_pair("en", "sr-ME", ["en-sr", "en-sr-latn"]) == ("en", "sr-latn")
    assert resolve_pair("en", "sr-Latn-ME", ["en-sr-latn"]) == ("en", "sr-latn")
    assert resolve_pair("en", "sr-RS", ["en-sr"]) == ("en", "sr") and resolve_pair("en", "pa-IN", ["en-pa"]) == (
        "en", "pa")
