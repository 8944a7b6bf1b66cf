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
