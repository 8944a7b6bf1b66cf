"""A float32 CPU seq2seq model's linear layers run on oneDNN (deployments/backends/cpu_linears.py)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from deployments.backends import cpu_linears
from deployments.backends.cpu_linears import OneDnnLinear, dense_weight, linears_on_onednn


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
    assert _layers(model) == ["Linear"]


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
