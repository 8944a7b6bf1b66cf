"""The CTranslate2 backend on the tiny random models: same language handling and, in
float32, the same tokens as the transformers backend; conversion done once and cached."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ctranslate2 = pytest.importorskip("ctranslate2")

from deployments.backends import load_translation_backend  # noqa: E402
from deployments.backends.base import ModelLoadError  # noqa: E402
from deployments.backends.ctranslate2_backend import (  # noqa: E402
    CTranslate2Backend,
    convert_once,
    converted_model_dir,
    resolve_compute_type,
)
from deployments.backends.segments import CutText  # noqa: E402
from deployments.settings import TranslationSettings  # noqa: E402

from .conftest import TEST_MAX_NEW_TOKENS  # noqa: E402
from .test_transformers_backend import FAMILIES, TEXTS  # noqa: E402

DIRS = {"marian": "tiny_marian_dir", "m2m100": "tiny_m2m100_dir", "nllb": "tiny_nllb_dir"}


@pytest.fixture(scope="module")
def ct2_cache(tmp_path_factory):
    return tmp_path_factory.mktemp("ct2-cache")


@pytest.fixture(scope="module")
def make_ct2(ct2_cache):
    def make(path, **kwargs):
        kwargs.setdefault("max_new_tokens", TEST_MAX_NEW_TOKENS)
        kwargs.setdefault("cache_dir", ct2_cache)
        return CTranslate2Backend(str(path), device="cpu", local_files_only=True, **kwargs)

    return make


@pytest.fixture(params=sorted(FAMILIES))
def pair_case(request):
    fixture, source, target = FAMILIES[request.param]
    return request.param, request.getfixturevalue(DIRS[request.param]), request.getfixturevalue(fixture), source, target


@pytest.mark.parametrize("min_new_tokens", [None, 5, TEST_MAX_NEW_TOKENS])
def test_float32_gives_the_transformers_tokens(pair_case, make_ct2, make_backend, min_new_tokens):
    family, path, hf_default, source, target = pair_case
    hf = hf_default if min_new_tokens is None else make_backend(path, min_new_tokens=min_new_tokens)
    ct2 = make_ct2(path, compute_type="float32", min_new_tokens=min_new_tokens)
    assert ct2.describe()["family"] == family
    expected = hf.generate_ids(TEXTS, source, target)
    assert ct2.generate_ids(TEXTS, source, target) == expected
    assert ct2.translate(TEXTS, source, target) == hf.translate(TEXTS, source, target)
    # and the same rows cut short (segments.py), which the Translator translates again by sentence
    assert ([isinstance(t, CutText) for t in ct2.translate(TEXTS, source, target)]
            == [isinstance(t, CutText) for t in hf.translate(TEXTS, source, target)])
    if family == "marian" and min_new_tokens is None:
        # the tiny Marian stops early on some inputs: rows ending at EOS and at the limit both agree
        assert len({len(row) for row in expected}) >= 2


def test_same_pairs_as_transformers(pair_case, make_ct2):
    family, path, hf, source, target = pair_case
    ct2 = make_ct2(path)
    assert ct2.supported_pairs() == hf.supported_pairs()
    assert ct2.supports(source, target)
    assert not ct2.supports(source, source)
    with pytest.raises(ValueError, match=f"{source}->{source}"):
        ct2.translate(["Hello."], source, source)


def test_int8_is_the_cpu_default_batch_invariant_and_in_order(pair_case, make_ct2):
    _, path, _, source, target = pair_case
    ct2 = make_ct2(path)
    facts = ct2.describe()
    assert facts["compute_type"] == "int8" and facts["device"] == "cpu"
    assert "/" not in repr(facts), facts  # the converted model's path is the log's, not /v1/models' (tenants')
    batch = ct2.translate(TEXTS, source, target)
    assert batch == [ct2.translate([t], source, target)[0] for t in TEXTS]
    assert ct2.translate(list(reversed(TEXTS)), source, target) == list(reversed(batch))
    assert len(set(batch)) >= 3 and ct2.translate([], source, target) == []


def test_m2m100_target_language_is_the_prefix_token(tiny_m2m100_dir, make_ct2):
    ct2 = make_ct2(tiny_m2m100_dir, compute_type="float32")
    tok = ct2.tokenizer
    for target in ("pt", "de"):
        rows = ct2.generate_ids(TEXTS[:3], "en", target)
        assert {row[1] for row in rows} == {tok.get_lang_id(target)}
        assert all(f"__{target}__" not in text for text in ct2.translate(TEXTS[:3], "en", target))


def test_m2m100_conversion_keeps_the_language_tokens(tiny_m2m100_dir, make_ct2):
    ct2 = make_ct2(tiny_m2m100_dir, compute_type="float32")
    vocab = ct2._id_to_token
    assert len(vocab) == ct2.model.config.vocab_size
    assert vocab[ct2.tokenizer.get_lang_id("pt")] == "__pt__"


def test_converts_once_and_reuses_the_cache(tiny_marian_dir, tmp_path, monkeypatch):
    first = convert_once(str(tiny_marian_dir), "int8", tmp_path)
    stamp = (first / "model.bin").stat().st_mtime_ns

    def no_conversion(*_args, **_kwargs):
        raise AssertionError("converted again although the cache has the model")

    monkeypatch.setattr("deployments.backends.ctranslate2_backend._converter_class", no_conversion)
    backend = CTranslate2Backend(str(tiny_marian_dir), device="cpu", compute_type="int8", cache_dir=tmp_path,
                                 max_new_tokens=TEST_MAX_NEW_TOKENS)
    assert backend.converted_path == first
    assert (first / "model.bin").stat().st_mtime_ns == stamp
    assert [p.name for p in tmp_path.iterdir()] == [first.name]  # no temporary folder left behind


def test_cache_key_follows_model_quantization_and_files(tiny_marian_dir, tmp_path):
    int8 = converted_model_dir(str(tiny_marian_dir), "int8", tmp_path)
    assert int8 == converted_model_dir(str(tiny_marian_dir), "int8", tmp_path)
    assert int8 != converted_model_dir(str(tiny_marian_dir), "float32", tmp_path)
    assert int8.name.startswith("opus-mt-en-de-int8-")
    config = tiny_marian_dir / "config.json"
    stat = config.stat()
    try:
        os.utime(config, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))
        assert converted_model_dir(str(tiny_marian_dir), "int8", tmp_path) != int8  # changed model: convert again
    finally:
        os.utime(config, ns=(stat.st_atime_ns, stat.st_mtime_ns))


def test_cache_keys_follow_every_weights_shard(tmp_path):
    """A checkpoint in shards (model-0000x-of-0000n.safetensors and their index): a changed shard is a
    changed model, for the CTranslate2 conversion and the ONNX export alike."""
    from deployments.backends import embedding_onnx

    model = tmp_path / "sharded"
    model.mkdir()
    (model / "config.json").write_text("{}")
    (model / "model.safetensors.index.json").write_text("{}")
    for shard in (1, 2):
        (model / f"model-0000{shard}-of-00002.safetensors").write_bytes(b"weights")
    converted, key = converted_model_dir(str(model), "int8", tmp_path / "cache"), embedding_onnx.model_key(model)
    (model / "model-00002-of-00002.safetensors").write_bytes(b"other weights")
    assert converted_model_dir(str(model), "int8", tmp_path / "cache") != converted
    assert embedding_onnx.model_key(model) != key


def test_replicas_converting_at_once_get_one_complete_model(tiny_marian_dir, tmp_path):
    # replicas are processes: three convert the same model into the same cache at once
    code = ("import sys; from deployments.backends.ctranslate2_backend import convert_once; "
            "print(convert_once(sys.argv[1], 'float32', sys.argv[2]))")
    procs = [subprocess.Popen([sys.executable, "-c", code, str(tiny_marian_dir), str(tmp_path)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              cwd=Path(__file__).resolve().parents[2]) for _ in range(3)]
    outs = [proc.communicate(timeout=300) for proc in procs]
    assert [proc.returncode for proc in procs] == [0, 0, 0], [err[-2000:] for _, err in outs]
    paths = {out.strip().splitlines()[-1] for out, _ in outs}
    assert len(paths) == 1
    assert [p.name for p in tmp_path.iterdir()] == [Path(paths.pop()).name]  # no temporary folder left
    ctranslate2.Translator(str(next(tmp_path.iterdir())), device="cpu")  # loads: not half-written


def test_compute_type_errors_quote_the_value():
    assert resolve_compute_type("auto", "cpu") == "int8"
    assert resolve_compute_type("FLOAT32", "cpu") == "float32"
    with pytest.raises(ValueError, match="'int3'"):
        resolve_compute_type("int3", "cpu")
    if "float16" not in ctranslate2.get_supported_compute_types("cpu"):
        with pytest.raises(ValueError, match="'float16' is not supported on cpu"):
            resolve_compute_type("float16", "cpu")


def test_missing_model_folder(tmp_path, make_ct2):
    with pytest.raises(ModelLoadError, match="does not exist"):
        make_ct2(tmp_path / "nope")


def test_folder_without_a_model(tmp_path, make_ct2):
    with pytest.raises(ModelLoadError, match="cannot load tokenizer"):
        make_ct2(tmp_path)


def test_settings_choose_the_backend(tiny_marian_dir, ct2_cache):
    settings = TranslationSettings(backend="ctranslate2", model=str(tiny_marian_dir), device="cpu",
                                   ctranslate2_compute_type="float32", ctranslate2_cache_dir=str(ct2_cache),
                                   max_new_tokens=TEST_MAX_NEW_TOKENS)
    backend = load_translation_backend(settings, num_threads=1)
    assert isinstance(backend, CTranslate2Backend)
    assert backend.describe()["compute_type"] == "float32"
    assert backend.name == "ctranslate2"


def test_settings_need_a_model_and_a_known_compute_type():
    with pytest.raises(ValueError, match="'ctranslate2' needs translation.model"):
        TranslationSettings(backend="ctranslate2")
    with pytest.raises(ValueError, match="ctranslate2_compute_type"):
        TranslationSettings(backend="ctranslate2", model="x", ctranslate2_compute_type="int3")


def test_marian_pad_in_a_text_is_unknown_not_a_failed_batch(tiny_marian_dir, make_ct2):
    """The Marian conversion drops <pad> from the vocabulary, while the tokenizer gives its id for
    "<pad>" written in a text: that record reads it as unknown, and its batch still translates."""
    ct2 = make_ct2(tiny_marian_dir, compute_type="float32")
    pad_id = ct2.tokenizer.pad_token_id
    assert pad_id in ct2.tokenizer("a <pad> b")["input_ids"] and pad_id >= len(ct2._id_to_token)
    together = ct2.translate(["a <pad> b", "Hello."], "en", "de")
    assert len(together) == 2 and all(isinstance(text, str) for text in together)
    assert together[1] == ct2.translate(["Hello."], "en", "de")[0]


#: in a process of its own: the hub cache is read from the environment when huggingface_hub is imported
_OFFLINE_HUB_LOAD = """
import shutil, socket, sys
tiny, hub, ct2 = sys.argv[1:4]
snapshot = f"{hub}/models--fake-org--opus-mt-en-de/snapshots/" + "a" * 40
shutil.copytree(tiny, snapshot)
with open(f"{hub}/models--fake-org--opus-mt-en-de/refs/main", "w") as ref:
    ref.write("a" * 40)
import traceback
attempts = []  # by the conversion (huggingface_hub's own user-agent lookup is not ours to stop)
def blocked(address, *args, **kwargs):
    if any("ctranslate2/converters" in frame.filename for frame in traceback.extract_stack()):
        attempts.append(address)
    raise ConnectionRefusedError("offline")
socket.create_connection = blocked
from deployments.backends.ctranslate2_backend import CTranslate2Backend
backend = CTranslate2Backend("fake-org/opus-mt-en-de", device="cpu", local_files_only=True, max_new_tokens=4,
                             cache_dir=ct2, compute_type="float32")
print(len(backend.translate(["Hello."], "en", "de")), len(attempts))
"""


def test_a_hub_model_is_converted_from_the_local_cache_without_asking_the_hub(tiny_marian_dir, tmp_path):
    """local_files_only: never contact the hub, the conversion included (CTranslate2's converter loads the
    model by its id, and on an air-gapped cluster would retry for minutes)."""
    hub = tmp_path / "hub"
    (hub / "models--fake-org--opus-mt-en-de" / "refs").mkdir(parents=True)
    env = {**os.environ, "HF_HUB_CACHE": str(hub), "HF_HUB_OFFLINE": "0"}
    done = subprocess.run([sys.executable, "-c", _OFFLINE_HUB_LOAD, str(tiny_marian_dir), str(hub), str(tmp_path / "ct2")],
                          env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split()[-2:] == ["1", "0"]  # translated, the conversion attempting no connection
