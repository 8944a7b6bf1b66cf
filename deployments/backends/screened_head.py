"""Greedy decoding's choice over a float32 output projection on the CPU, screened in bfloat16, exact.

At the few rows a continuous decoding step has, a step on the CPU is bound by reading weights, and the
output projection is most of them: the Marian-sized model's (512 -> 58,101) is 57 % of its decoder's bytes,
7.6 ms of a 1-row step's ~17 ms on this project's 2-core box (docs/benchmarks/continuous-batching.md,
"Tenth sitting"). Greedy decoding needs only each row's best token, not every logit. So `ScreenedHead`:

1. computes every logit from a bfloat16 copy of the weight (half the bytes; oneDNN's bf16 matmul where the
   CPU has it), then applies `ban` (generate's bans, as the full path does);
2. bounds each row's error against the float32 layer: bfloat16 rounds the hidden state and the weight to
   8 significant bits (relative error u = 2^-8 each) and the output once more, so for every token j
   |screened_j - exact_j| <= (2u + u^2 + K * 2^-23) * ||w_j|| ||h|| + 2.1u |screened_j| (Cauchy-Schwarz;
   K * 2^-23 covers float32 accumulation of K products), bounded per row by the largest ||w_j|| and |screened_j|;
3. keeps as candidates the tokens whose screened logit is within twice that bound of the row's best. The
   exact best is among them: a token outside is below the best's exact logit by construction;
4. computes the candidates' logits in float32 on the very op the full layer uses, on their rows of the weight
   reordered as the full layer's are. oneDNN then answers bit for bit as the full layer does (checked on 677
   row / candidate counts, and by `for_model`'s probe on the model itself), so the choice, ties to the
   lowest id included, is the full layer's.

When more than `SCREEN_TOP` tokens of a row fall within the bound (a flat distribution) or a value is not
finite, `argmax` returns None and the caller computes the full layer for that step.

Two users: the CPU continuous decoder (`ScreenedHead.argmax`), and greedy `generate` for static batching
(`screened_generate` swaps `ScreenedLogits` in for the output projection for the call).
"""

from __future__ import annotations

import logging
import math
from contextlib import contextmanager
from typing import Callable, Optional

import torch
from torch import nn

from .cpu_linears import PACKED_FOR_ROWS, OneDnnLinear
from .generation_rules import UnsupportedModel, generation_rules

logger = logging.getLogger(__name__)

#: bfloat16's unit roundoff (8 significant bits)
UNIT_ROUNDOFF = 2.0 ** -8
#: candidates the screen looks at per row; more within the error bound -> the full layer for that step
SCREEN_TOP = 8
#: the candidates are found block by block: blocks of this many tokens whose largest screened logit is
#: within the bound, then their tokens (one pass over the logits instead of a top-k: 0.2 against 1.0 ms at 13 rows)
SCREEN_BLOCK = 64
#: the candidates' weight rows are padded to a multiple of this: with a single row oneDNN picks another
#: kernel, whose sums are rounded differently from the full layer's
EXACT_ROWS_MULTIPLE = 16

_linear = None if not hasattr(torch.ops, "mkldnn") else getattr(torch.ops.mkldnn, "_linear_pointwise", None)


def native_bfloat16() -> bool:
    """This CPU multiplies bfloat16 in hardware (AVX-512 BF16 or AMX). Elsewhere oneDNN would emulate it,
    and the screen could cost more than the float32 layer it saves."""
    probes = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
    return any(getattr(torch.cpu, name, lambda: False)() for name in probes)


def _reorder(weight: torch.Tensor) -> torch.Tensor:
    return torch.ops.mkldnn._reorder_linear_weight(weight, PACKED_FOR_ROWS)


class ScreenedHead:
    """Greedy choice over `weight` (vocab, hidden), float32 and plain, plus `bias` (or None)."""

    def __init__(self, weight: torch.Tensor, bias: Optional[torch.Tensor]):
        self.weight, self.bias = weight.detach(), None if bias is None else bias.detach().reshape(-1)
        self.screen = _reorder(self.weight.to(torch.bfloat16))
        hidden_size = self.weight.shape[1]
        u = UNIT_ROUNDOFF
        self._per_norm = (2 * u + u * u + hidden_size * 2.0 ** -23) * float(self.weight.norm(dim=1).max())
        self._per_output = 2.1 * u
        self.screened_steps = self.full_steps = 0
        self._block = torch.arange(SCREEN_BLOCK)
        self._tail = torch.arange(self.weight.shape[0] // SCREEN_BLOCK * SCREEN_BLOCK, self.weight.shape[0])

    @classmethod
    def for_model(cls, model) -> Optional["ScreenedHead"]:
        """The screen for `model`'s output projection (and Marian's `final_logits_bias`), built once per
        model; None where it does not apply: not a float32 `OneDnnLinear` on blocked weights with its plain
        weight at hand (a tied projection keeps it), no bfloat16 arithmetic in this CPU, or the probe disagrees."""
        head = model.get_output_embeddings()
        if hasattr(head, "_serve_app_screen"):
            return head._serve_app_screen
        screen = None
        usable = (isinstance(head, OneDnnLinear) and head.packed_weight is not None and head.weight is not None
                  and head.bias is None and head.weight.dtype == torch.float32 and _linear is not None
                  and torch.ops.mkldnn._is_mkldnn_bf16_supported() and native_bfloat16())
        if usable:
            bias = model.final_logits_bias if model.config.model_type == "marian" else None
            screen = cls(head.weight, bias)
            if not screen._agrees_with(head, bias):
                logger.warning("the screened output projection disagrees with the full one on a probe; not used")
                screen = None
        head._serve_app_screen = screen
        return screen

    def _agrees_with(self, head, bias) -> bool:
        """The candidates' logits equal the full layer's bit for bit, and the choice too, on random states."""
        generator = torch.Generator().manual_seed(0)
        scale = float(self.weight.norm(dim=1).mean()) or 1.0
        with torch.inference_mode():
            for rows in (1, 2, 5):
                hidden = torch.randn(rows, self.weight.shape[1], generator=generator) / scale * 8
                full = head(hidden[:, None, :])[:, 0]
                if bias is not None:
                    full = full + bias.reshape(1, -1)
                some = torch.randperm(self.weight.shape[0], generator=generator)[:3].sort().values
                if not torch.equal(self.exact(hidden, some), full.index_select(1, some)):
                    return False
                chosen = self.argmax(hidden, lambda scores: scores)
                if chosen is not None and not torch.equal(chosen, full.argmax(dim=-1)):
                    return False
        self.screened_steps = self.full_steps = 0
        return True

    def exact(self, hidden: torch.Tensor, ids: torch.Tensor, bias: bool = True) -> torch.Tensor:
        """The float32 logits of tokens `ids` for every row, as the full layer computes them (plus the bias)."""
        count = len(ids)
        padded = -(-count // EXACT_ROWS_MULTIPLE) * EXACT_ROWS_MULTIPLE
        rows = torch.cat([ids, ids[:1].expand(padded - count)]) if padded > count else ids
        logits = _linear(hidden, _reorder(self.weight.index_select(0, rows)), None, "none", [], "")[:, :count]
        return logits if self.bias is None or not bias else logits + self.bias.index_select(0, ids)

    def candidates(self, hidden: torch.Tensor, ban: Callable[[torch.Tensor], torch.Tensor]):
        """The tokens that can be a row's best after `ban` (in place on (rows, vocab) scores, banned -> -inf),
        sorted, and which row each can be the best of ((rows, tokens) bool); None where the screen cannot
        decide this step."""
        screened = _linear(hidden.to(torch.bfloat16), self.screen, None, "none", [], "").float()
        largest = torch.maximum(screened.amax(dim=1), screened.amin(dim=1).neg())  # |.| max, no (rows, vocab) temporary
        error = self._per_norm * hidden.norm(dim=1) + self._per_output * largest
        if self.bias is not None:
            screened += self.bias
        ban(screened)
        whole = screened.shape[1] // SCREEN_BLOCK * SCREEN_BLOCK
        blocks = screened[:, :whole].unflatten(1, (-1, SCREEN_BLOCK)).amax(dim=2)  # (rows, blocks): each one's best
        best = blocks.amax(dim=1) if whole else screened.new_full(screened.shape[:1], -math.inf)
        if whole < screened.shape[1]:  # the tokens after the last whole block: always looked at
            best = torch.maximum(best, screened[:, whole:].amax(dim=1))
        floor = best - 2 * error  # a token below it cannot be the best
        hot = blocks >= floor[:, None]  # blocks holding a token within the bound
        if bool(torch.isfinite(error).all()) and bool((hot.sum(dim=1) <= SCREEN_TOP).all()):
            tokens = (hot.any(dim=0).nonzero()[:, :1] * SCREEN_BLOCK + self._block).reshape(-1)
            tokens = torch.cat([tokens, self._tail])
            near = screened.index_select(1, tokens) >= floor[:, None]
            if bool((near.sum(dim=1) <= SCREEN_TOP).all()):
                self.screened_steps += 1
                keep = near.any(dim=0)
                return tokens[keep], near[:, keep]  # sorted ids
        self.full_steps += 1
        return None

    def argmax(self, hidden: torch.Tensor, ban: Callable[[torch.Tensor], torch.Tensor]) -> Optional[torch.Tensor]:
        """Each row's best token id after `ban` (see `candidates`), as the float32 layer's argmax picks it;
        None where the screen cannot decide this step."""
        found = self.candidates(hidden, ban)
        if found is None:
            return None
        ids, own = found
        # a row weighs only its own candidates (another row's may be banned here); sorted ids: the first of
        # equal maxima is the lowest id, as argmax over the vocabulary picks
        return ids[self.exact(hidden, ids).masked_fill_(~own, -math.inf).argmax(dim=1)]


class ScreenedLogits(nn.Module):
    """The output projection inside greedy `generate` (static batching): per step, exact logits for every
    token that can be chosen (each row's screened candidates among the tokens other than EOS and the banned
    ones, and EOS) and -inf for the rest, so that generate's own logits processors and argmax pick what they
    pick on the full logits (whether they ban EOS this step or not); the full layer where the screen cannot
    decide. The model adds its logits bias to the output, as to the full layer's."""

    def __init__(self, head: nn.Module, screen: ScreenedHead, eos_ids: list[int], bad_ids: list[int]):
        super().__init__()
        self.head, self.screen = head, screen
        self.eos = torch.tensor(sorted(set(eos_ids)), dtype=torch.long)
        self.excluded = torch.tensor(sorted(set(eos_ids) | set(bad_ids)), dtype=torch.long)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        if hidden.dim() != 3 or hidden.shape[1] != 1:  # not a decoding step of one token per row
            return self.head(hidden)
        found = self.screen.candidates(hidden[:, 0], lambda scores: scores.index_fill_(1, self.excluded, -math.inf))
        if found is None:
            return self.head(hidden)
        ids = torch.cat([found[0], self.eos])
        logits = hidden.new_full((hidden.shape[0], 1, self.screen.weight.shape[0]), -math.inf)
        logits[:, 0, ids] = self.screen.exact(hidden[:, 0], ids, bias=False)
        return logits


@contextmanager
def screened_generate(model):
    """Greedy `generate` on `model` with its output projection screened (`ScreenedLogits`) where a screen
    applies (`ScreenedHead.for_model`) and continuous decoding's rules cover its generation config (greedy
    only: a beam search needs every logit). Callers serialize their `generate` calls on the model."""
    head = model.get_output_embeddings()
    screened = getattr(head, "_serve_app_logits", None)
    if screened is None and not hasattr(head, "_serve_app_logits"):
        screen = ScreenedHead.for_model(model)
        try:
            rules = generation_rules(model) if screen is not None else None
        except UnsupportedModel:
            rules = None
        screened = None if rules is None else ScreenedLogits(head, screen, rules["eos"], rules["bad"])
        # Not through nn.Module's __setattr__, which would register it as the head's submodule: it holds the head,
        # so the model would contain itself (eval(), state_dict() and repr() recursing without end).
        object.__setattr__(head, "_serve_app_logits", screened)
    if screened is None:
        yield
        return
    model.set_output_embeddings(screened)
    try:
        yield
    finally:
        model.set_output_embeddings(head)


__all__ = ["EXACT_ROWS_MULTIPLE", "SCREEN_BLOCK", "SCREEN_TOP", "ScreenedHead", "ScreenedLogits", "UNIT_ROUNDOFF", "native_bfloat16",
           "screened_generate"]
