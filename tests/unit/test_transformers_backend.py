"""Offline tests of the transformers backend on tiny random models.

The models are random, so the translations are gibberish; what is checked is
the plumbing: loading, language tokens, batching/padding, ordering, lengths,
errors.

Why this module is long: one short test per behaviour of the transformers backend, over the same tiny models built once per session.
"""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from deployments.backends.base import BackendError, LanguagePair, ModelLoadError
from deployments.backends.hf_loading import avoid_per_shape_attention_plans, resolve_device, resolve_dtype
from deployments.backends.languages import ISO_TO_FLORES, pair_from_model_name, parse_language_pair
from deployments.backends.transformers_backend import TransformersBackend

from .conftest import TEST_MAX_NEW_TOKENS

#: Mixed lengths (1 word .. long sentence), mixed languages.
TEXTS = [
    "Hello.",
    "The quick brown fox jumps over the lazy dog, and then it runs far away into the forest.",
    "Where is the train station?",
    "a",
    "Das Wetter ist schön und die Sonne scheint heute den ganzen Tag.",
    "Eu gostaria de uma xícara de café, por favor.",
    "Numbers like 1, 2, 3 and 42.",
]

FAMILIES = {
    "marian": ("marian_backend", "en", "de"),
    "m2m100": ("m2m100_backend", "en", "pt"),
    "nllb": ("nllb_backend", "en", "pt"),
}


@pytest.fixture(params=sorted(FAMILIES))
def family_case(request):
    fixture, source, target = FAMILIES[request.param]
    return request.param, request.getfixturevalue(fixture), source, target


class GenerateSpy:
    """Wraps ``model.generate`` and records its keyword arguments and outputs."""

    def __init__(self, model):
        self._generate = model.generate
        self.calls: list[dict] = []

    def __call__(self, *args, **kwargs):
        out = self._generate(*args, **kwargs)
        self.calls.append({**kwargs, "_output": out})
        return out


def spy_generate(monkeypatch, backend) -> GenerateSpy:
    spy = GenerateSpy(backend.model)
    monkeypatch.setattr(backend.model, "generate", spy)
    return spy


# --------------------------------------------------------------------------- loading + translating


def test_family_detected(marian_backend, m2m100_backend, nllb_backend):
    assert marian_backend.describe()["family"] == "marian"
    assert m2m100_backend.describe()["family"] == "m2m100"
    assert nllb_backend.describe()["family"] == "nllb"
    assert marian_backend.describe()["model_type"] == "marian"
    assert m2m100_backend.describe()["model_type"] == "m2m_100"
    assert nllb_backend.describe()["model_type"] == "m2m_100"


def test_translates_a_batch_in_order(family_case):
    _, backend, source, target = family_case
    out = backend.translate(TEXTS, source, target)
    assert len(out) == len(TEXTS)
    assert all(isinstance(s, str) for s in out)
    # the random model must react to its input, or the order checks prove nothing
    assert len(set(out)) >= 3, out
    reversed_out = backend.translate(list(reversed(TEXTS)), source, target)
    assert reversed_out == list(reversed(out))


def test_batch_equals_solo(family_case):
    _, backend, source, target = family_case
    lengths = {len(backend.tokenizer(t)["input_ids"]) for t in TEXTS}
    assert len(lengths) >= 6, "texts must have different token lengths to exercise padding"

    batch_ids = backend.generate_ids(TEXTS, source, target)
    solo_ids = [backend.generate_ids([t], source, target)[0] for t in TEXTS]
    assert batch_ids == solo_ids
    assert len({tuple(r) for r in batch_ids}) >= 3

    batch = backend.translate(TEXTS, source, target)
    solo = [backend.translate([t], source, target)[0] for t in TEXTS]
    assert batch == solo


def test_batch_mixes_finished_and_unfinished_rows(marian_backend):
    # The tiny Marian model stops early for some inputs only, so the batch above
    # also compares outputs that generate() had to pad after EOS.
    rows = marian_backend.generate_ids(TEXTS, "en", "de")
    eos = marian_backend.model.generation_config.eos_token_id
    lengths = [len(r) for r in rows]
    assert min(lengths) < 1 + TEST_MAX_NEW_TOKENS == max(lengths)
    for row in rows:
        assert row.count(eos) <= 1 and (eos not in row or row[-1] == eos)


def test_empty_batch(family_case):
    _, backend, source, target = family_case
    assert backend.translate([], source, target) == []


def test_generate_gets_one_padded_sorted_batch(monkeypatch, family_case):
    _, backend, source, target = family_case
    spy = spy_generate(monkeypatch, backend)
    backend.translate(TEXTS, source, target)
    assert len(spy.calls) == 1
    call = spy.calls[0]
    ids, mask = call["input_ids"], call["attention_mask"]
    assert ids.shape[0] == len(TEXTS)
    real_lengths = mask.sum(dim=1).tolist()
    assert real_lengths == sorted(real_lengths, reverse=True)  # length-sorted
    assert len(set(real_lengths)) >= 6
    pad = backend.tokenizer.pad_token_id
    for row, n in zip(ids.tolist(), real_lengths):
        assert all(tok == pad for tok in row[n:])  # right padding, masked
    assert call["num_beams"] == 1
    assert call["do_sample"] is False
    assert call["max_new_tokens"] == TEST_MAX_NEW_TOKENS


def test_long_input_is_truncated(monkeypatch, family_case):
    _, backend, source, target = family_case
    spy = spy_generate(monkeypatch, backend)
    monkeypatch.setattr(backend, "max_input_length", 10)
    out = backend.translate(["word " * 200, "Hello."], source, target)
    assert len(out) == 2
    assert spy.calls[0]["input_ids"].shape[1] <= 10


def test_describe(m2m100_backend):
    info = m2m100_backend.describe()
    assert info["device"] == "cpu"
    assert info["dtype"] == "float32"
    assert info["num_beams"] == 1
    assert info["max_new_tokens"] == TEST_MAX_NEW_TOKENS
    assert m2m100_backend.name == "transformers"
    assert m2m100_backend.model_id.endswith("tiny-m2m100")
    assert next(m2m100_backend.model.parameters()).dtype == torch.float32
    assert not m2m100_backend.model.training


def test_warm_up_runs(marian_backend):
    marian_backend.warm_up()
    assert marian_backend.max_new_tokens == TEST_MAX_NEW_TOKENS  # restored


# --------------------------------------------------------------------------- lengths


@pytest.mark.parametrize("fixture,source,target", list(FAMILIES.values()))
def test_min_equals_max_new_tokens_fixes_length(request, make_backend, fixture, source, target):
    path = request.getfixturevalue(fixture).model_id
    n = 7
    backend = make_backend(path, min_new_tokens=n, max_new_tokens=n)
    rows = backend.generate_ids(TEXTS, source, target)
    eos = backend.model.generation_config.eos_token_id
    for row in rows:
        assert len(row) == 1 + n  # decoder start + exactly n generated tokens
        assert eos not in row[1:-1]


def test_max_new_tokens_caps_length(make_backend, tiny_m2m100_dir):
    backend = make_backend(tiny_m2m100_dir, max_new_tokens=3)
    for row in backend.generate_ids(TEXTS, "en", "de"):
        assert len(row) <= 1 + 3


def test_invalid_generation_settings(tiny_m2m100_dir):
    with pytest.raises(ValueError):
        TransformersBackend(str(tiny_m2m100_dir), device="cpu", max_new_tokens=4, min_new_tokens=5)
    with pytest.raises(ValueError):
        TransformersBackend(str(tiny_m2m100_dir), device="cpu", num_beams=0)


def test_a_marian_output_past_its_position_table_is_refused_at_load(tiny_marian_dir, tiny_m2m100_dir):
    """Marian's decoder positions are a fixed table (512 here): a longer output would crash its batch
    mid-decode, so such a max_new_tokens is a configuration error. M2M100's positions grow."""
    with pytest.raises(ValueError, match="max_new_tokens=600.*decodes at most 511 tokens"):
        TransformersBackend(str(tiny_marian_dir), device="cpu", local_files_only=True, max_new_tokens=600)
    TransformersBackend(str(tiny_marian_dir), device="cpu", local_files_only=True, max_new_tokens=511)
    TransformersBackend(str(tiny_m2m100_dir), device="cpu", local_files_only=True, max_new_tokens=600)


def test_num_threads(make_backend, tiny_m2m100_dir):
    before = torch.get_num_threads()
    try:
        make_backend(tiny_m2m100_dir, num_threads=1)
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


# --------------------------------------------------------------------------- M2M100


def test_m2m100_forces_target_language_token(monkeypatch, m2m100_backend):
    tok = m2m100_backend.tokenizer
    rows_pt = m2m100_backend.generate_ids(TEXTS, "en", "pt")
    rows_de = m2m100_backend.generate_ids(TEXTS, "en", "de")
    pt_id = tok.convert_tokens_to_ids("__pt__")
    de_id = tok.convert_tokens_to_ids("__de__")
    assert pt_id == tok.get_lang_id("pt") != de_id
    decoder_start = m2m100_backend.model.config.decoder_start_token_id
    assert all(r[0] == decoder_start and r[1] == pt_id for r in rows_pt)
    assert all(r[0] == decoder_start and r[1] == de_id for r in rows_de)

    spy = spy_generate(monkeypatch, m2m100_backend)
    m2m100_backend.generate_ids(TEXTS, "en", "fr")
    assert spy.calls[0]["forced_bos_token_id"] == tok.get_lang_id("fr")


def test_m2m100_sets_source_language_per_batch(monkeypatch, m2m100_backend):
    tok = m2m100_backend.tokenizer
    spy = spy_generate(monkeypatch, m2m100_backend)
    for source in ("pt", "de", "en"):
        m2m100_backend.translate(TEXTS[:3], source, "fr")
        assert tok.src_lang == source
        ids = spy.calls[-1]["input_ids"]
        assert (ids[:, 0] == tok.get_lang_id(source)).all()  # M2M100 input: __src__ text </s>


def test_m2m100_output_has_no_language_tokens(m2m100_backend):
    for text in m2m100_backend.translate(TEXTS, "en", "pt"):
        assert "__pt__" not in text and "__en__" not in text


def test_m2m100_supported_pairs(m2m100_backend):
    pairs = m2m100_backend.supported_pairs()
    codes = list(m2m100_backend.tokenizer.lang_code_to_id)
    assert len(codes) == 100
    assert len(pairs) == len(codes) * (len(codes) - 1)
    assert len(set(pairs)) == len(pairs)
    for pair in [LanguagePair("en", "pt"), LanguagePair("pt", "de"), LanguagePair("fr", "en")]:
        assert pair in pairs
        assert m2m100_backend.supports(pair.source, pair.target)
    assert LanguagePair("en", "en") not in pairs
    assert not m2m100_backend.supports("en", "xx")
    with pytest.raises(ValueError):
        m2m100_backend.translate(["Hello."], "en", "xx")
    with pytest.raises(ValueError):
        m2m100_backend.translate(["Hello."], "en", "en")


def test_language_pair_ignored_for_multilingual(make_backend, tiny_m2m100_dir):
    backend = make_backend(tiny_m2m100_dir, language_pair="en-de")
    assert len(backend.supported_pairs()) == 100 * 99
    assert backend.supports("pt", "fr")


# --------------------------------------------------------------------------- NLLB


def test_nllb_supported_pairs_come_from_the_tokenizer(nllb_backend):
    pairs = set(nllb_backend.supported_pairs())
    langs = ("en", "pt", "de", "fr")
    assert pairs == {LanguagePair(s, t) for s in langs for t in langs if s != t}
    assert not nllb_backend.supports("en", "es")  # es is in ISO_TO_FLORES, not in this tokenizer
    with pytest.raises(ValueError):
        nllb_backend.translate(["Hello."], "en", "es")


def test_nllb_language_tokens(monkeypatch, nllb_backend):
    tok = nllb_backend.tokenizer
    spy = spy_generate(monkeypatch, nllb_backend)
    rows = nllb_backend.generate_ids(TEXTS, "pt", "de")
    assert tok.src_lang == "por_Latn"
    deu = tok.convert_tokens_to_ids("deu_Latn")
    assert deu != tok.unk_token_id
    assert spy.calls[-1]["forced_bos_token_id"] == deu
    assert all(r[1] == deu for r in rows)
    assert (spy.calls[-1]["input_ids"][:, 0] == tok.convert_tokens_to_ids("por_Latn")).all()

    rows_fr = nllb_backend.generate_ids(TEXTS, "de", "fr")
    assert tok.src_lang == "deu_Latn"
    assert all(r[1] == tok.convert_tokens_to_ids("fra_Latn") for r in rows_fr)
    for text in nllb_backend.translate(TEXTS, "en", "fr"):
        assert "fra_Latn" not in text


def test_iso_to_flores_table():
    from transformers.models.nllb.tokenization_nllb import FAIRSEQ_LANGUAGE_CODES

    assert len(ISO_TO_FLORES) >= 40
    assert ISO_TO_FLORES["en"] == "eng_Latn"
    assert ISO_TO_FLORES["pt"] == "por_Latn"
    assert ISO_TO_FLORES["de"] == "deu_Latn"
    assert ISO_TO_FLORES["zh"] == "zho_Hans"
    # every target is a real NLLB-200 language token
    assert set(ISO_TO_FLORES.values()) <= set(FAIRSEQ_LANGUAGE_CODES)


# --------------------------------------------------------------------------- Marian


def test_marian_one_pair(marian_backend):
    assert marian_backend.supported_pairs() == [LanguagePair("en", "de")]
    assert marian_backend.supports("en", "de")
    for source, target in [("de", "en"), ("en", "fr"), ("en", "en")]:
        assert not marian_backend.supports(source, target)
        with pytest.raises(ValueError):
            marian_backend.translate(["Hello."], source, target)


def test_marian_overrides_checkpoint_beam_setting(monkeypatch, marian_backend):
    assert marian_backend.model.generation_config.num_beams == 4  # like the hub checkpoint
    spy = spy_generate(monkeypatch, marian_backend)
    marian_backend.translate(TEXTS[:2], "en", "de")
    assert spy.calls[0]["num_beams"] == 1
    assert "forced_bos_token_id" not in spy.calls[0]


def test_marian_pair_needs_name_or_language_pair(tmp_path, make_backend, tiny_marian_dir):
    plain = tmp_path / "some-marian-model"
    shutil.copytree(tiny_marian_dir, plain)
    with pytest.raises(ModelLoadError, match="language_pair"):
        make_backend(plain)
    backend = make_backend(plain, language_pair="en-pt")
    assert backend.supported_pairs() == [LanguagePair("en", "pt")]
    assert len(backend.translate(["Hello.", "Bye."], "en", "pt")) == 2


def test_marian_language_pair_overrides_name(make_backend, tiny_marian_dir):
    backend = make_backend(tiny_marian_dir, language_pair="de-en")
    assert backend.supported_pairs() == [LanguagePair("de", "en")]


def test_pair_parsing():
    assert pair_from_model_name("Helsinki-NLP/opus-mt-en-de") == LanguagePair("en", "de")
    assert pair_from_model_name("/models/opus-mt-pt-en") == LanguagePair("pt", "en")
    assert pair_from_model_name("Helsinki-NLP/opus-mt-tc-big-en-pt") == LanguagePair("en", "pt")
    assert pair_from_model_name("facebook/m2m100_418M") is None
    assert pair_from_model_name("Helsinki-NLP/opus-mt-en-ROMANCE") is None
    assert parse_language_pair("en-de") == LanguagePair("en", "de")
    assert parse_language_pair(" PT_en ") == LanguagePair("pt", "en")
    with pytest.raises(ValueError):
        parse_language_pair("english")


# --------------------------------------------------------------------------- load errors


@pytest.mark.parametrize("name", ["/nonexistent/models/opus-mt-en-de", "./no-such-model-folder"])
def test_missing_folder(name):
    with pytest.raises(ModelLoadError) as info:
        TransformersBackend(name, device="cpu", local_files_only=True)
    assert name in str(info.value)


def test_corrupt_weights(tmp_path, tiny_marian_dir):
    broken = tmp_path / "opus-mt-en-de-broken"
    shutil.copytree(tiny_marian_dir, broken)
    (broken / "model.safetensors").write_bytes(b"this is not a safetensors file" * 10)
    with pytest.raises(ModelLoadError) as info:
        TransformersBackend(str(broken), device="cpu", local_files_only=True)
    assert str(broken) in str(info.value)


def test_missing_weights(tmp_path, tiny_m2m100_dir):
    broken = tmp_path / "no-weights"
    shutil.copytree(tiny_m2m100_dir, broken)
    (broken / "model.safetensors").unlink()
    with pytest.raises(ModelLoadError) as info:
        TransformersBackend(str(broken), device="cpu", local_files_only=True)
    assert str(broken) in str(info.value)


def test_bad_config(tmp_path, tiny_m2m100_dir):
    broken = tmp_path / "bad-config"
    shutil.copytree(tiny_m2m100_dir, broken)
    (broken / "config.json").write_text("{ not json", encoding="utf-8")
    with pytest.raises(ModelLoadError) as info:
        TransformersBackend(str(broken), device="cpu", local_files_only=True)
    assert str(broken) in str(info.value)


def test_unknown_hub_id_offline():
    name = "nobody-here/no-such-model-xyz"
    with pytest.raises(ModelLoadError) as info:
        TransformersBackend(name, device="cpu", local_files_only=True)
    assert name in str(info.value)


def test_model_load_error_is_backend_error():
    assert issubclass(ModelLoadError, BackendError)


# --------------------------------------------------------------------------- device / dtype


def test_auto_device_and_dtype_with_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    device = resolve_device("auto")
    assert device == "cuda"
    assert resolve_dtype("auto", device) == torch.float16
    assert resolve_device("cuda:1") == "cuda:1"
    assert resolve_device("cpu") == "cpu"


@pytest.mark.parametrize("gpus, expected", [([], "cpu"), (["0"], "cuda")])
def test_auto_device_inside_ray_follows_the_gpus_ray_gave(monkeypatch, gpus, expected):
    """Ray 2.60 leaves a GPU-less worker's CUDA_VISIBLE_DEVICES alone: on a GPU node a CPU replica sees
    CUDA, and `auto` must not put it on GPU 0 beside the replicas Ray gave that GPU to."""
    from types import SimpleNamespace

    import ray

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(ray, "is_initialized", lambda: True)
    context = SimpleNamespace(get_accelerator_ids=lambda: {"GPU": gpus})
    monkeypatch.setattr(ray, "get_runtime_context", lambda: context)
    assert resolve_device("auto") == expected


def test_auto_device_and_dtype_without_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    device = resolve_device("auto")
    assert device == "cpu"
    assert resolve_dtype("auto", device) == torch.float32
    with pytest.raises(BackendError):
        resolve_device("cuda")


@pytest.mark.parametrize("device, calls", [("cuda", [False]), ("cuda:1", [False]), ("cpu", [])])
def test_cudnn_attention_is_turned_off_on_cuda_only(monkeypatch, device, calls):
    """cuDNN's attention builds a plan per new shape, and decoding meets one per step (bench/gpu/step_probe.py)."""
    seen = []
    monkeypatch.setattr(torch.backends.cuda, "enable_cudnn_sdp", seen.append)
    avoid_per_shape_attention_plans(device)
    assert seen == calls


def test_explicit_dtypes_and_bad_values():
    assert resolve_dtype("float32", "cuda") == torch.float32
    assert resolve_dtype("float16", "cpu") == torch.float16
    assert resolve_dtype("bfloat16", "cuda") == torch.bfloat16
    with pytest.raises(ValueError):
        resolve_dtype("int8", "cpu")
    with pytest.raises(ValueError):
        resolve_device("tpu")


def test_bfloat16_on_cpu_loads(make_backend, tiny_m2m100_dir):
    backend = make_backend(tiny_m2m100_dir, dtype="bfloat16")
    assert next(backend.model.parameters()).dtype == torch.bfloat16
    assert backend.describe()["dtype"] == "bfloat16"
    assert len(backend.translate(TEXTS[:2], "en", "de")) == 2


def test_config_file_is_json(tiny_marian_dir):
    # guards the fixture itself: a real config the loader reads
    assert json.loads((tiny_marian_dir / "config.json").read_text())["model_type"] == "marian"
