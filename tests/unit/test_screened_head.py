"""The CPU continuous decoder's greedy choice from a bfloat16 screen of the output projection, exact
(deployments/backends/screened_head.py): it must pick what the full float32 layer's argmax picks."""

from __future__ import annotations

import logging
import random
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from deployments.backends import screened_head
from deployments.backends.cpu_linears import linears_on_onednn
from deployments.backends.screened_head import ScreenedHead

pytestmark = pytest.mark.skipif(
    not (torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported()
         and screened_head.native_bfloat16()),
    reason="no bfloat16 arithmetic in this CPU (oneDNN would emulate it)")


class _Model(nn.Module):
    """An output projection tied to embeddings (so its plain weight stays), with Marian's logits bias."""

    def __init__(self, vocab: int = 3000, hidden: int = 64, seed: int = 0, bias: bool = True,
                 same_rows: tuple[int, int] | None = None):
        super().__init__()
        generator = torch.Generator().manual_seed(seed)
        self.embed = nn.Embedding(vocab, hidden)
        self.lm_head = nn.Linear(hidden, vocab, bias=False)
        with torch.no_grad():
            self.lm_head.weight.copy_(torch.randn(vocab, hidden, generator=generator) * 0.1)
            if same_rows:  # two tokens with the same logit everywhere
                self.lm_head.weight[same_rows[1]] = self.lm_head.weight[same_rows[0]]
        self.embed.weight = self.lm_head.weight
        self.register_buffer("final_logits_bias", torch.randn(1, vocab, generator=generator) * (0.5 if bias else 0))
        self.config = SimpleNamespace(model_type="marian")
        self.requires_grad_(False)
        assert linears_on_onednn(self) == 1

    def get_output_embeddings(self):
        return self.lm_head

    def full(self, hidden: torch.Tensor) -> torch.Tensor:
        """The float32 logits as the continuous decoder computes them without the screen."""
        return self.lm_head(hidden[:, None, :])[:, -1, :] + self.final_logits_bias[0]


def _ban(banned: dict[int, list[int]]):
    def ban(scores: torch.Tensor) -> torch.Tensor:
        for row, ids in banned.items():
            scores[row, ids] = -float("inf")
        return scores
    return ban


def test_the_screen_picks_what_the_full_layer_picks_on_random_states():
    model = _Model()
    screen = ScreenedHead.for_model(model)
    assert screen is not None and ScreenedHead.for_model(model) is screen  # built once per model
    rng = random.Random(1)
    generator = torch.Generator().manual_seed(1)
    decided = 0
    with torch.inference_mode():
        for trial in range(200):
            rows = rng.choice([1, 2, 3, 7, 16])
            hidden = torch.randn(rows, 64, generator=generator) * rng.choice([0.3, 1.0, 8.0])
            banned = {row: rng.sample(range(3000), rng.choice([0, 1, 40])) for row in range(rows)}
            expected = _ban(banned)(model.full(hidden)).argmax(dim=-1)
            got = screen.argmax(hidden, _ban(banned))
            if got is not None:
                decided += 1
                assert torch.equal(got, expected), trial
    assert decided >= 150  # the screen decides most steps; the rest fall back to the full layer


def test_a_token_banned_in_one_row_is_not_chosen_there_though_another_row_wants_it():
    model = _Model()
    screen = ScreenedHead.for_model(model)
    hidden = torch.randn(1, 64, generator=torch.Generator().manual_seed(3)).expand(2, 64).contiguous()
    with torch.inference_mode():
        best = int(model.full(hidden)[0].argmax())
        second = int(model.full(hidden)[0].topk(2).indices[1])
        got = screen.argmax(hidden, _ban({0: [best]}))
    assert got is not None and got.tolist() == [second, best]


def test_equal_best_logits_pick_the_lowest_id_as_argmax_does():
    model = _Model(bias=False, same_rows=(700, 2500))
    hidden = (model.lm_head.weight[700] * 40)[None, :]
    with torch.inference_mode():
        full = model.full(hidden)
        assert full[0, 700] == full[0, 2500] == full.max()
        got = ScreenedHead.for_model(model).argmax(hidden, _ban({}))
    assert got is not None and got.tolist() == [700] == full.argmax(dim=-1).tolist()


def test_a_flat_or_broken_step_falls_back_to_the_full_layer():
    model = _Model(bias=False)
    screen = ScreenedHead.for_model(model)
    with torch.inference_mode():
        assert screen.argmax(torch.zeros(2, 64), _ban({})) is None  # every logit equal: more than SCREEN_TOP tie
        assert screen.argmax(torch.full((1, 64), float("nan")), _ban({})) is None
    assert screen.full_steps == 2


def test_a_probe_that_disagrees_keeps_the_full_layer(monkeypatch, caplog):
    exact = ScreenedHead.exact
    monkeypatch.setattr(ScreenedHead, "exact",
                        lambda self, hidden, ids, bias=True: exact(self, hidden, ids, bias) * (1 + 1e-6))
    with caplog.at_level(logging.WARNING, logger=screened_head.__name__):
        assert ScreenedHead.for_model(_Model()) is None
    assert "disagrees" in caplog.text


def test_a_cpu_without_bfloat16_arithmetic_keeps_the_full_layer(monkeypatch):
    monkeypatch.setattr(screened_head, "native_bfloat16", lambda: False)
    assert ScreenedHead.for_model(_Model()) is None


def test_only_blocked_float32_projections_are_screened():
    plain = _Model()
    plain.lm_head.packed_weight = None  # as cpu_weight_layout: plain leaves it
    assert ScreenedHead.for_model(plain) is None
    untouched = nn.Module()
    untouched.lm_head = nn.Linear(8, 16)
    untouched.get_output_embeddings = lambda: untouched.lm_head
    untouched.config = SimpleNamespace(model_type="marian")
    assert ScreenedHead.for_model(untouched) is None


def test_the_continuous_decoder_on_the_cpu_decides_from_the_screen(marian_backend):
    from deployments.backends.continuous_decoder import DecodeRequest

    decoder = marian_backend.continuous_decoder()
    assert decoder.screen is not None
    before = decoder.screen.screened_steps
    decoder.join([DecodeRequest([5, 9, 17, 23, 4, 0], 8, 8), DecodeRequest([7, 3, 0], 8, 8)])
    while decoder.running:
        decoder.step()
    assert decoder.screen.screened_steps > before


@pytest.mark.parametrize("fixture", ["marian_backend", "m2m100_backend"])
def test_greedy_generate_with_the_screen_gives_the_full_layer_s_ids(fixture, request):
    """Static batching: `generate` with `ScreenedLogits` in place of the output projection, against plain
    `generate`, with EOS banned (min_new_tokens) and free, and M2M100's forced target language."""
    from deployments.backends.screened_head import screened_generate

    backend = request.getfixturevalue(fixture)
    model, head = backend.model, backend.model.get_output_embeddings()
    rng = random.Random(4)
    rows = [[rng.randint(5, 90) for _ in range(rng.randint(2, 12))] + [backend.tokenizer.eos_token_id]
            for _ in range(9)]
    input_ids, attention_mask = backend._pad(rows)
    extra = {"forced_bos_token_id": backend.forced_bos_token_id("pt")} if fixture == "m2m100_backend" else {}
    for min_new in (None, 4, 12):
        kwargs = dict(input_ids=input_ids, attention_mask=attention_mask, max_new_tokens=12, do_sample=False,
                      num_beams=1, **extra, **({} if min_new is None else {"min_new_tokens": min_new}))
        with torch.inference_mode():
            expected = model.generate(**kwargs).tolist()
            screen = ScreenedHead.for_model(model)
            before = screen.screened_steps
            with screened_generate(model):
                assert model.get_output_embeddings() is not head
                got = model.generate(**kwargs).tolist()
        assert got == expected, min_new
        assert screen.screened_steps > before
        assert model.get_output_embeddings() is head  # put back


def test_the_backend_s_greedy_generate_is_screened_and_a_beam_search_is_not(make_backend, tiny_marian_dir):
    greedy, beams = make_backend(tiny_marian_dir), make_backend(tiny_marian_dir, num_beams=2)
    texts = ["a b c d", "e f g", "h i j k l m"]
    screen = ScreenedHead.for_model(greedy.model)
    before = screen.screened_steps
    greedy.generate_ids(texts, "en", "de")
    assert screen.screened_steps > before
    seen = []
    original = beams.model.generate
    beams.model.generate = lambda **kw: seen.append(type(beams.model.get_output_embeddings())) or original(**kw)
    beams.generate_ids(texts, "en", "de")
    assert seen and seen[0].__name__ == "OneDnnLinear"


def test_the_output_projection_is_put_back_when_generate_fails(marian_backend):
    from deployments.backends.screened_head import screened_generate

    head = marian_backend.model.get_output_embeddings()
    with pytest.raises(RuntimeError):
        with screened_generate(marian_backend.model):
            raise RuntimeError("generation failed")
    assert marian_backend.model.get_output_embeddings() is head


@pytest.mark.parametrize("vocab", [40, 64, 3000, 3001])
def test_the_candidates_are_every_token_within_the_bound(vocab):
    """Found block by block (`SCREEN_BLOCK`): the same set a sort of each row's screened logits gives, whatever
    the vocabulary's remainder, with the full layer wherever a row has more than SCREEN_TOP of them."""
    model = _Model(vocab=vocab, seed=vocab)
    screen = ScreenedHead.for_model(model)
    generator = torch.Generator().manual_seed(1)
    decided = undecided = 0
    for spread in (0.02, 0.3, 1.0, 4.0, 16.0):  # from flat (many within the bound) to peaked
        hidden = torch.randn(6, 64, generator=generator) * spread
        screen._per_norm *= 40  # a wider bound: several candidates per row, and some rows past SCREEN_TOP
        found = screen.candidates(hidden, lambda scores: scores)
        screen._per_norm /= 40
        screened = torch.ops.mkldnn._linear_pointwise(hidden.to(torch.bfloat16), screen.screen, None, "none", [], "")
        screened = screened.float()
        largest = torch.maximum(screened.amax(dim=1), screened.amin(dim=1).neg())
        error = 40 * screen._per_norm * hidden.norm(dim=1) + screen._per_output * largest
        screened += screen.bias
        floor = screened.max(dim=1).values - 2 * error
        within = screened >= floor[:, None]
        if bool((within.sum(dim=1) > screened_head.SCREEN_TOP).any()):
            assert found is None
            undecided += 1
            continue
        decided += 1
        ids, own = found
        assert torch.equal(ids, within.any(dim=0).nonzero()[:, 0])
        assert torch.equal(own, within[:, ids])
    assert decided and undecided
