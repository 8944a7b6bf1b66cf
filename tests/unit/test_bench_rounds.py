"""`bench.compare --rounds` (bench/compare/rounds.py): the order reversed in every other round, and a target
met only if it is met in every round. Pure arithmetic: no servers."""

from bench.compare import rounds


def cell(contender, concurrency, rps, records=1):
    return {"contender": contender, "workload": "embeddings", "records": records, "mode": "closed",
            "concurrency": concurrency, "records_per_s": rps, "requests_per_s": rps / records, "p50_ms": 8.0,
            "p99_ms": 20.0, "errors": 0}


def a_round(order, serve_app_at_8, mosec_at_8):
    return {"profile": "peers", "started_at": "2026-11-30 01:00 UTC", "contenders": order,
            "labels": {"serve_app_placed": "serve-app (make run)", "mosec": "mosec"},
            "offline": {"embeddings": {"records_per_s": 400.0, "best_batch": 32, "batches": {1: {"batch_s": 0.004}}}},
            "cells": [cell("serve_app_placed", 8, serve_app_at_8), cell("mosec", 8, mosec_at_8),
                      cell("serve_app_placed", 64, 300.0), cell("mosec", 64, 200.0)],
            "first_answer_s": {"serve_app_placed/embeddings": 14.0}}


def test_the_order_is_reversed_in_every_other_round():
    assert [rounds.round_order("abc", i) for i in range(3)] == [list("abc"), list("cba"), list("abc")]


def test_a_target_is_met_only_in_every_round():
    assert rounds.every_round([True, True]) is True
    assert rounds.every_round([True, False]) is False and rounds.every_round([None, False]) is False
    assert rounds.every_round([True, None]) is None and rounds.every_round([]) is None


def test_the_summary_gives_each_round_s_figure_and_the_verdict_over_all():
    text = rounds.summary_markdown([a_round(["serve_app_placed", "mosec"], 250.0, 200.0),
                                    a_round(["mosec", "serve_app_placed"], 190.0, 200.0)])
    row = next(line for line in text.splitlines() if line.startswith("| 8 clients x 1 text"))
    assert "| 1.25 (best peer: mosec) | 0.95 (best peer: mosec) | **not met** |" in row
    row = next(line for line in text.splitlines() if line.startswith("| 64 clients x 1 text: ahead"))
    assert row.endswith("| met |")  # 1.5 x in both rounds
    assert "| 2 | 2026-11-30 01:00 UTC | mosec, serve_app_placed |" in text
    assert rounds.summary_markdown([]) == ""


def test_a_lead_is_not_measured_in_a_round_where_a_peer_failed():
    broken = a_round(["mosec", "serve_app_placed"], 250.0, 200.0)
    broken["cells"] = [c for c in broken["cells"] if c["contender"] != "mosec"]
    broken["failures"] = [{"contender": "mosec", "workload": "embeddings", "error": "ServerFailed: boom"}]
    text = rounds.summary_markdown([a_round(["serve_app_placed", "mosec"], 250.0, 200.0), broken])
    row = next(line for line in text.splitlines() if line.startswith("| 8 clients x 1 text"))
    assert row.endswith("failed: mosec) | not measured |")  # never "met" against the peers that were left
    assert "- round 2: mosec / embeddings failed: `ServerFailed: boom`" in text


def test_each_round_s_report_links_the_harness_readme_one_folder_up():
    from bench.compare import report

    results = a_round(["serve_app_placed", "mosec"], 250.0, 200.0)
    results.update(machine="m", workloads=["embeddings"], records=[1], failures=[], startup_s={}, memory={})
    assert "[README.md](README.md)" in report.markdown(results)
    assert "[README.md](../README.md)" in report.markdown(dict(results, round=2))
