"""A float32 CPU seq2seq model's linear layers run on oneDNN (deployments/backends/cpu_linears.py)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from deployments.backends import cpu_linears
from deployments.backends.cpu_linears import OneDnnLinear, dense_weight, linears_on_onednn, weight_layout


def _layers(model: nn.Module) -> list[str]:
    return sorted({type(m).__name__ for m in model.modules() if isinstance(m, nn.Linear)})


def test_a_loaded_cpu_model_runs_every_linear_on_onednn(make_backend, tiny_marian_dir):
    backend = make_backend(tiny_marian_dir)
    assert _layers(backend.model) == ["OneDnnLinear"]
    assert not any(p.requires_grad for p in backend.model.parameters())  # the op has no autograd formula
    # the output projection stays tied to the embeddings: the class changed, not the parameter
    assert backend.model.get_output_embeddings().weight is backend.model.get_input_embeddings().weight
    layers = [m for m in backend.model.modules() if isinstance(m, OneDnnLinear)]
    assert all(m.packed_weight is not None for m in layers)  # every weight in oneDNN's blocked layout
    # ...and only the tied one keeps its plain copy: no layer's weight is held twice
    assert [m for m in layers if m.weight is not None] == [backend.model.get_output_embeddings()]
    assert backend.describe()["cpu_weight_layout"] == "blocked"


def test_the_plain_layout_keeps_every_weight_and_copies_none(make_backend, tiny_marian_dir):
    """`cpu_weight_layout: plain`: oneDNN's matmul on the model file's own weights, no blocked copy."""
    blocked = make_backend(tiny_marian_dir)
    plain = make_backend(tiny_marian_dir, cpu_weight_layout="plain")
    layers = [m for m in plain.model.modules() if isinstance(m, nn.Linear)]
    assert layers and all(type(m) is OneDnnLinear and m.packed_weight is None and m.weight is not None
                          for m in layers)
    assert plain.describe()["cpu_weight_layout"] == "plain"
    ids = torch.tensor([[5, 9, 17, 23, 4, 11, 0]])
    with torch.inference_mode():
        outputs = [b.model.generate(input_ids=ids, max_new_tokens=12, min_new_tokens=12, do_sample=False,
                                    num_beams=1).tolist() for b in (blocked, plain)]
    assert outputs[0] == outputs[1]


def test_an_unknown_layout_is_refused_quoted():
    with pytest.raises(ValueError, match="'dense'"):
        linears_on_onednn(nn.Sequential(nn.Linear(8, 8)), "dense")


def test_the_layout_is_a_setting_with_an_env_var(monkeypatch):
    from pydantic import ValidationError

    from deployments.settings import EmbeddingSettings, TranslationSettings

    assert TranslationSettings().cpu_weight_layout == EmbeddingSettings().cpu_weight_layout == "blocked"
    monkeypatch.setenv("SERVE_APP_TRANSLATION_CPU_WEIGHT_LAYOUT", "plain")
    assert TranslationSettings().cpu_weight_layout == "plain"
    with pytest.raises(ValidationError, match="dense"):
        EmbeddingSettings(cpu_weight_layout="dense")


@pytest.mark.parametrize("rows", [1, 2, 4, 33])
def test_a_blocked_weight_answers_as_the_plain_one_and_gives_it_back(rows):
    torch.manual_seed(rows)
    layer = nn.Linear(64, 301)
    plain = layer.weight.detach().clone()
    x = torch.randn(rows, 1, 64)
    expected = layer(x).detach()
    layer.__class__ = OneDnnLinear
    assert layer.pack(keep_plain=False) and layer.weight is None
    with torch.inference_mode():
        got = layer(x)
    torch.testing.assert_close(got, expected, **cpu_linears.PROBE_TOLERANCE)
    assert torch.equal(dense_weight(layer), plain)  # the reorder moves values, it does not round them


@pytest.mark.parametrize("rows", [1, 2, 3, 8, 33])
def test_onednn_linear_answers_as_nn_linear(rows):
    torch.manual_seed(rows)
    layer = nn.Linear(64, 301)
    x = torch.randn(rows, 1, 64)
    expected = layer(x)
    layer.__class__ = OneDnnLinear
    with torch.inference_mode():
        got = layer(x)
        strided = layer(torch.randn(64, rows).T)  # a transposed view as input
    assert got.shape == expected.shape and strided.shape == (rows, 301)
    torch.testing.assert_close(got, expected.detach(), **cpu_linears.PROBE_TOLERANCE)


def test_greedy_outputs_are_unchanged(make_backend, tiny_marian_dir):
    """The same token ids from `generate` with torch's linear and with oneDNN's on blocked weights."""
    backend = make_backend(tiny_marian_dir)
    ids = torch.tensor([[5, 9, 17, 23, 4, 11, 0], [7, 3, 30, 0, 1, 1, 1]])
    mask = (torch.arange(7) < torch.tensor([[7], [4]])).long()

    def generate(model):
        with torch.inference_mode():
            return model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=12,
                                  min_new_tokens=12, do_sample=False, num_beams=1).tolist()

    plain = make_backend(tiny_marian_dir).model  # a model of its own: its plain weights go back in
    for layer in [m for m in plain.modules() if type(m) is OneDnnLinear]:
        layer.weight = nn.Parameter(dense_weight(layer), requires_grad=False)
        layer.__class__, layer.packed_weight = nn.Linear, None
    assert generate(backend.model) == generate(plain)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_other_dtypes_keep_torchs_linear(dtype):
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 4)).to(dtype)
    assert linears_on_onednn(model) == 0
    assert _layers(model) == ["Linear"] and weight_layout(model) is None


def test_without_the_op_nothing_changes(monkeypatch):
    monkeypatch.setattr(torch.backends.mkldnn, "is_available", lambda: False)
    model = nn.Sequential(nn.Linear(8, 8))
    assert linears_on_onednn(model) == 0
    assert _layers(model) == ["Linear"]


def test_a_probe_that_disagrees_keeps_torchs_linear(monkeypatch, caplog):
    monkeypatch.setattr(OneDnnLinear, "forward", lambda self, x: nn.functional.linear(x, self.weight, self.bias) + 1)
    model = nn.Sequential(nn.Linear(8, 8))
    assert linears_on_onednn(model) == 0
    assert _layers(model) == ["Linear"]
    assert "disagrees" in caplog.text


def test_a_probe_that_fails_keeps_torchs_linear(monkeypatch):
    def refuse(self, x):
        raise RuntimeError("no oneDNN kernel for this CPU")
    monkeypatch.setattr(OneDnnLinear, "forward", refuse)
    model = nn.Sequential(nn.Linear(8, 8))
    assert linears_on_onednn(model) == 0
    assert _layers(model) == ["Linear"]


def test_the_torch_embedder_runs_its_linears_on_onednn():
    """The embeddings' torch engine too: 1.8 x MiniLM's texts/s at batches of 8-64 on one thread."""
    from deployments.backends.embedding import SentenceEmbedder

    embedder = SentenceEmbedder(num_threads=1)
    assert _layers(embedder._model) == ["OneDnnLinear"]
    vectors, tokens = embedder.embed(["hello world", "a longer sentence to embed"])
    assert vectors.shape == (2, embedder.dimensions) and tokens[0] < tokens[1]
    assert embedder.describe()["cpu_weight_layout"] == "blocked"
    plain = SentenceEmbedder(num_threads=1, cpu_weight_layout="plain")
    assert plain.describe()["cpu_weight_layout"] == "plain"
    again, _ = plain.embed(["hello world", "a longer sentence to embed"])
    assert (again * vectors).sum(axis=1).min() > 0.99999
