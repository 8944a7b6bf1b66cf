"""What greedy `generate` applies for a seq2seq model's generation config, read once for the continuous
decoders (continuous_decoder.py, slot_decoder.py), which apply the same per row (`greedy_choice`): or
`UnsupportedModel` when the config asks for a logits processor they do not apply (their outputs would
differ from `generate`'s)."""

from __future__ import annotations

import math

import torch

#: generation-config fields whose logits processors this decoder does not apply: (field, neutral value)
_UNSUPPORTED = (
    ("repetition_penalty", 1.0), ("encoder_repetition_penalty", 1.0), ("no_repeat_ngram_size", 0),
    ("encoder_no_repeat_ngram_size", 0), ("sequence_bias", None), ("suppress_tokens", None),
    ("begin_suppress_tokens", None), ("exponential_decay_length_penalty", None), ("guidance_scale", None),
    ("stop_strings", None), ("max_time", None), ("renormalize_logits", False), ("remove_invalid_values", False),
)


class UnsupportedModel(ValueError):
    """The model (or its generation config) cannot be decoded continuously with equal outputs."""


def generation_rules(model) -> dict:
    """The bans, end-of-sentence ids, forced ids and start token greedy `generate` uses for `model`."""
    gen = model.generation_config
    for name, neutral in _UNSUPPORTED:
        value = getattr(gen, name, None)
        if value is not None and value != neutral and value not in ([], {}):
            raise UnsupportedModel(f"continuous decoding does not apply generation_config.{name}={value!r}")
    bad = getattr(gen, "bad_words_ids", None) or []
    if any(len(words) != 1 for words in bad):
        raise UnsupportedModel(f"continuous decoding only bans single-token bad_words_ids, got {bad!r}")
    eos = gen.eos_token_id if gen.eos_token_id is not None else model.config.eos_token_id
    forced_eos = gen.forced_eos_token_id
    start = gen.decoder_start_token_id
    if start is None:
        start = model.config.decoder_start_token_id
    as_list = lambda v: [] if v is None else (list(v) if isinstance(v, (list, tuple)) else [v])  # noqa: E731
    if start is None or not as_list(eos):
        raise UnsupportedModel("the model names no decoder_start_token_id or eos_token_id")
    return {"bad": [w[0] for w in bad], "eos": as_list(eos), "forced_eos": as_list(forced_eos),
            "start": int(start), "min_length": int(getattr(gen, "min_length", 0) or 0)}


def greedy_choice(scores: torch.Tensor, pos: torch.Tensor, bos: torch.Tensor, max_new: torch.Tensor,
                  min_new: torch.Tensor, rules: dict) -> torch.Tensor:
    """The token greedy `generate` picks per row after its logits processors, in its order: single-token
    bans, min_length / min_new_tokens (EOS banned), forced BOS at the first step (bos >= 0), forced EOS at a
    row's last step. Tensor ops only (a CUDA graph replays it). `pos`: tokens each row has fed; `rules`:
    bad_t, eos_t (id tensors), min_length, forced_eos (ids)."""
    return forced_choice(ban_(scores, pos, min_new, rules).argmax(dim=-1), pos, bos, max_new, rules)


def ban_(scores: torch.Tensor, pos: torch.Tensor, min_new: torch.Tensor, rules: dict) -> torch.Tensor:
    """greedy_choice's bans, in place (banned -> -inf): the single-token bad words, and EOS before a row's
    min_length / min_new_tokens. Returns `scores`."""
    neg = -math.inf
    if rules["bad_t"] is not None:
        scores.index_fill_(1, rules["bad_t"], neg)
    suppress = (pos + 1 < rules["min_length"]) | (pos < min_new)
    eos_t = rules["eos_t"]
    eos = scores.index_select(1, eos_t)
    scores.index_copy_(1, eos_t, torch.where(suppress[:, None], torch.full_like(eos, neg), eos))
    return scores


def forced_choice(best: torch.Tensor, pos: torch.Tensor, bos: torch.Tensor, max_new: torch.Tensor,
                  rules: dict) -> torch.Tensor:
    """greedy_choice's forced tokens over each row's `best` (argmax after `ban_`)."""
    chosen = torch.where((pos == 0) & (bos >= 0), bos, best)
    if rules["forced_eos"]:  # several forced ids: generate's argmax takes the lowest
        chosen = torch.where(pos + 1 == max_new, min(rules["forced_eos"]), chosen)
    return chosen
