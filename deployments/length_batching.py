"""Length-aware batching: cut one batch into model calls of similar length, under a token budget.

A padded model call costs about (records x longest record) tokens: in a batch
that mixes a 5-token and a 150-token sentence, the short one is computed as if
it were 150 tokens long (and, in a seq2seq model, decodes until the longest
output is done). Sorting the records by token length and cutting the sorted run
into calls of at most `max_batch_tokens` padded tokens (as fairseq's
`--max-tokens` and Marian's `--mini-batch-words` do) spends the compute on real
tokens instead of padding.

Pure logic, no Ray and no model: the caller gives the token lengths and a
function that runs one model call.
"""

from __future__ import annotations

from typing import Callable, Sequence, TypeVar

R = TypeVar("R")


def padded_tokens(lengths: Sequence[int]) -> int:
    """Tokens one padded model call over records of these lengths computes: rows x longest row."""
    return len(lengths) * max(lengths, default=0)


def plan_token_batches(lengths: Sequence[int], max_batch_tokens: int) -> list[list[int]]:
    """Indices of the records, longest first, cut into consecutive groups whose padded size
    (group size x its longest record) is at most `max_batch_tokens`.

    Every index appears exactly once. A record longer than the budget forms a group of its
    own (it cannot be split). Equal lengths keep their input order (stable sort).
    """
    if max_batch_tokens < 1:
        raise ValueError(f"max_batch_tokens must be >= 1, got {max_batch_tokens!r}")
    order = sorted(range(len(lengths)), key=lambda i: lengths[i], reverse=True)
    groups: list[list[int]] = []
    current: list[int] = []
    longest = 0  # longest record of `current`: its first, as the order is descending
    for index in order:
        if current and (len(current) + 1) * longest > max_batch_tokens:
            groups.append(current)
            current = []
        if not current:
            longest = max(lengths[index], 1)
        current.append(index)
    if current:
        groups.append(current)
    return groups


def run_token_batched(
    texts: Sequence[str],
    lengths: Sequence[int],
    max_batch_tokens: int,
    run: Callable[[list[str]], Sequence[R]],
) -> list[R]:
    """Run `run` once per group of `plan_token_batches` and return the outputs in input order.

    Raises if `run` returns the wrong number of outputs for a group.
    """
    if len(lengths) != len(texts):
        raise ValueError(f"one length per text is required: {len(lengths)} lengths for {len(texts)} texts")
    results: list = [None] * len(texts)
    for group in plan_token_batches(lengths, max_batch_tokens):
        outputs = list(run([texts[i] for i in group]))
        if len(outputs) != len(group):
            raise RuntimeError(f"model returned {len(outputs)} outputs for {len(group)} inputs")
        for i, output in zip(group, outputs):
            results[i] = output
    return results
