"""Pure batching policy, shared by the model deployments (no Ray here).

A batch from `@serve.batch` is a list of *items*; each item is one call from
the ingress holding several records. The model works on records, so items are
flattened, grouped by key (the language pair; a batch may mix pairs), run one
model call per group, and the outputs scattered back to their items in order.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from typing import Any, Awaitable, Callable, Hashable, NamedTuple, Sequence, TypeVar, Union

from .errors import describe_exception

logger = logging.getLogger("ray.serve")

R = TypeVar("R")
K = TypeVar("K", bound=Hashable)


class RanAlone(list):
    """A batch's outputs after its joined call raised and each call ran again alone (each output a result or that
    call's exception): its time is not one batch's, so ModelQueue reports it `rerun`. If every call then succeeded,
    its size failed (an out of memory), and the adaptive sizer counts it over its target (ModelReplica)."""


class Chunk(NamedTuple):
    """One call's records for one language pair (what the ingress sends in one handle call)."""

    source: str
    target: str
    texts: list


def count_records(items: Sequence) -> int:
    """`batch_size_fn` for `@serve.batch`: a batch's size is its records, not its calls.

    An item is a `Chunk` (its texts count) or a plain list of texts.
    """
    return sum(len(item.texts) if isinstance(item, Chunk) else len(item) for item in items)


async def gather_or_cancel(*calls: Awaitable[R]) -> list[R]:
    """`asyncio.gather`, but the first failure cancels the other calls: the pieces of a request that has
    already failed are not computed for nobody."""
    tasks = [asyncio.ensure_future(call) for call in calls]
    try:
        return await asyncio.gather(*tasks)
    except BaseException:
        for task in tasks:
            task.cancel()
        raise


def run_joined(items: Sequence[Sequence], run: Callable[[list], Any], cut: Callable[[Any, int, int], Any],
               what: str) -> list:
    """On a model thread: one `run` over every call's inputs joined, each call's share cut out of its result
    (`cut(result, start, stop)`). A batch of several calls that raises is run again call by call, so that a
    call's failure stays its own: each gets its result or its exception (as a value, what `ModelQueue` hands
    each caller). A lone call's error is raised."""
    try:
        result = run([x for item in items for x in item])
    except Exception as exc:
        if len(items) == 1:
            raise
        # The class and place, not the message: it may quote the inputs (deployments/errors.py).
        logger.warning("%s: a batch of %d calls raised %s; running each call alone", what, len(items),
                       describe_exception(exc))
        return RanAlone(_run_call(run, list(item)) for item in items)
    out, offset = [], 0
    for item in items:
        out.append(cut(result, offset, offset + len(item)))
        offset += len(item)
    return out


def _run_call(run: Callable[[list], Any], inputs: list) -> Any:
    try:
        return run(inputs)
    except Exception as exc:  # noqa: BLE001 - this call's own failure, handed to its caller
        return exc


def split(records: Sequence[R], size: int) -> list[list[R]]:
    """Cut `records` into consecutive pieces of at most `size`, keeping order."""
    if size < 1:
        raise ValueError(f"piece size must be >= 1, got {size!r}")
    return [list(records[i:i + size]) for i in range(0, len(records), size)]


def run_grouped(
    keys: Sequence[K],
    items: Sequence[Sequence[str]],
    run: Callable[[K, list[str]], Sequence[R]],
    *,
    isolate: bool = False,
) -> list[Union[list[R], Exception]]:
    """Run `run(key, texts)` once per distinct key over all items with that key.

    `keys[i]` is item i's key. Returns, for each item, its outputs in the
    order of its texts. Raises if `run` returns the wrong number of outputs.

    `isolate=True`: a group's failure (an `Exception`) stays with its own items. A group of several
    items that raises is re-run one item at a time; each item gets its outputs or its own exception
    (as a value), and items of other groups keep theirs (what `ModelQueue` hands each caller).
    """
    if len(keys) != len(items):
        raise ValueError("one key per item is required")
    groups: "OrderedDict[K, list[int]]" = OrderedDict()
    for index, key in enumerate(keys):
        groups.setdefault(key, []).append(index)
    results: list[Union[list[R], Exception]] = [[] for _ in items]
    ran_alone = False
    for key, indices in groups.items():
        try:
            outputs = _run_checked(run, key, [text for i in indices for text in items[i]])
        except Exception as exc:
            if not isolate:
                raise
            if len(indices) == 1:
                results[indices[0]] = exc
                continue
            # The class and place, not the message: it may quote the inputs (deployments/errors.py).
            logger.warning("a model call for %d calls raised %s; running each call alone", len(indices),
                           describe_exception(exc))
            for i in indices:
                results[i] = _run_alone(run, key, list(items[i]))
            ran_alone = True
            continue
        offset = 0
        for i in indices:
            n = len(items[i])
            results[i] = outputs[offset:offset + n]
            offset += n
    return RanAlone(results) if ran_alone else results


def _run_checked(run: Callable[[K, list[str]], Sequence[R]], key: K, texts: list[str]) -> list[R]:
    outputs = list(run(key, texts))
    if len(outputs) != len(texts):
        raise RuntimeError(f"model returned {len(outputs)} outputs for {len(texts)} inputs")
    return outputs


def _run_alone(run: Callable[[K, list[str]], Sequence[R]], key: K, texts: list[str]) -> Union[list[R], Exception]:
    try:
        return _run_checked(run, key, texts)
    except Exception as exc:
        return exc
