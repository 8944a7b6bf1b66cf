import asyncio

import pytest

from deployments.batching import Chunk, count_records, gather_or_cancel, run_grouped, split


def test_split_keeps_order_and_bounds_size():
    records = list(range(10))
    pieces = split(records, 4)
    assert pieces == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    assert split([], 3) == []
    with pytest.raises(ValueError, match="0"):
        split(records, 0)


def test_count_records_counts_texts_not_calls():
    assert count_records([Chunk("en", "pt", ["a", "b"]), Chunk("pt", "en", ["c"])]) == 3
    assert count_records([["a"], ["b", "c", "d"]]) == 4


def test_run_grouped_one_model_call_per_pair_and_scatter_in_order():
    calls = []

    def run(pair, texts):
        calls.append((pair, list(texts)))
        return [f"{pair[1]}:{t}" for t in texts]

    keys = [("en", "pt"), ("pt", "en"), ("en", "pt")]
    items = [["a", "b"], ["c"], ["d"]]
    out = run_grouped(keys, items, run)
    assert out == [["pt:a", "pt:b"], ["en:c"], ["pt:d"]]
    # Items of the same pair share one model call, in arrival order.
    assert calls == [(("en", "pt"), ["a", "b", "d"]), (("pt", "en"), ["c"])]


def test_run_grouped_rejects_wrong_output_count():
    with pytest.raises(RuntimeError, match="1 outputs for 2 inputs"):
        run_grouped(["k"], [["a", "b"]], lambda k, texts: ["only one"])


def test_run_grouped_isolate_keeps_a_failure_with_its_own_items():
    calls = []

    def run(pair, texts):
        calls.append(list(texts))
        if "boom" in texts:
            raise ValueError("boom")
        return [t.upper() for t in texts]

    keys = [("en", "pt"), ("pt", "en"), ("en", "pt"), ("en", "pt")]
    out = run_grouped(keys, [["a"], ["boom"], ["b", "boom"], ["c"]], run, isolate=True)
    assert out[0] == ["A"] and out[3] == ["C"]
    assert isinstance(out[1], ValueError) and isinstance(out[2], ValueError)
    assert calls == [["a", "b", "boom", "c"], ["a"], ["b", "boom"], ["c"], ["boom"]]
    # a wrong output count is the group's failure too; without isolate it still raises
    assert isinstance(run_grouped(["k"], [["a", "b"]], lambda k, texts: ["one"], isolate=True)[0], RuntimeError)
    with pytest.raises(ValueError, match="boom"):
        run_grouped(keys, [["a"], ["boom"], ["b"], ["c"]], run)


def test_run_grouped_isolate_lets_interrupts_through():
    def run(key, texts):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_grouped(["k", "k"], [["a"], ["b"]], run, isolate=True)


def test_the_first_failing_piece_cancels_the_request_s_other_pieces():
    """A request cut into pieces that has failed computes no more of them for nobody."""
    cancelled = []

    async def slow(name):
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.append(name)
            raise

    async def fails():
        raise ValueError("bad piece")

    async def scenario():
        with pytest.raises(ValueError, match="bad piece"):
            await asyncio.wait_for(gather_or_cancel(slow("a"), fails(), slow("b")), 5)
        await asyncio.sleep(0)
        return sorted(cancelled)

    assert asyncio.run(scenario()) == ["a", "b"]
    both = asyncio.run(asyncio.wait_for(gather_or_cancel(asyncio.sleep(0, "x"), asyncio.sleep(0, "y")), 5))
    assert both == ["x", "y"]
