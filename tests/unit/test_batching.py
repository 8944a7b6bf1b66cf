import pytest

from deployments.batching import Chunk, count_records, run_grouped, split


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
