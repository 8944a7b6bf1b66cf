"""The benchmark harness's pure logic: statistics, the saturation / 50% rate pick, wrk parsing,
request bodies, profiles and the rendered table (bench/compare). No servers, no Ray.

Why this module is long: one short test per rule of the benchmark harness's pure logic, sharing its sample data.
"""

import json

import pytest

from bench.compare import report, stats
from bench.compare.load import Target, closed_cell_figures, parse_wrk
from bench.compare.profiles import PROFILES


def cell(contender, concurrency, rps, records=1, workload="embeddings", **extra):
    return {"contender": contender, "workload": workload, "records": records, "mode": "closed",
            "concurrency": concurrency, "records_per_s": rps, "requests_per_s": rps / records,
            "p50_ms": 1.0, "p99_ms": 2.0, "errors": 0, **extra}


def open_(contender, p99, records=1, workload="embeddings"):
    return {"contender": contender, "workload": workload, "records": records, "mode": "open",
            "offered_rps": 10.0, "p50_ms": p99 / 2, "p95_ms": p99 * 0.9, "p99_ms": p99}


def test_percentile_interpolates_like_numpy():
    values = [4.0, 1.0, 3.0, 2.0]
    assert stats.percentile(values, 0) == 1.0
    assert stats.percentile(values, 100) == 4.0
    assert stats.percentile(values, 50) == pytest.approx(2.5)
    assert stats.percentile(values, 90) == pytest.approx(3.7)
    assert stats.percentile([], 50) is None
    with pytest.raises(ValueError, match="101"):
        stats.percentile(values, 101)


def test_latency_summary_is_in_milliseconds():
    summary = stats.latency_summary([0.010, 0.020, 0.030])
    assert summary["p50_ms"] == 20.0 and summary["max_ms"] == 30.0
    assert stats.latency_summary([])["p99_ms"] is None


def test_saturation_is_the_best_closed_cell_of_that_contender_workload_and_size():
    cells = [cell("a", 1, 50.0), cell("a", 8, 120.0), cell("a", 64, 110.0),
             cell("a", 8, 999.0, records=16), cell("b", 8, 500.0), open_("a", 5.0)]
    best = stats.saturation(cells, "a", "embeddings", 1)
    assert best["concurrency"] == 8 and best["records_per_s"] == 120.0
    assert stats.saturation(cells, "a", "translation-embedded", 1) is None


def test_saturation_ties_go_to_the_lower_concurrency():
    cells = [cell("a", 64, 100.0), cell("a", 8, 100.0)]
    assert stats.saturation(cells, "a", "embeddings", 1)["concurrency"] == 8


def test_half_load_rate_is_a_fraction_of_the_saturated_request_rate():
    saturated = cell("a", 8, 160.0, records=16)  # 10 requests/s
    assert stats.half_load_rate(saturated) == pytest.approx(5.0)
    assert stats.half_load_rate(saturated, 0.25) == pytest.approx(2.5)
    assert stats.half_load_rate(None) is None
    with pytest.raises(ValueError, match="1.5"):
        stats.half_load_rate(saturated, 1.5)


def test_ratio_and_best_batch():
    assert stats.ratio(8.0, 10.0) == 0.8
    assert stats.ratio(None, 10.0) is None and stats.ratio(1.0, 0) is None
    sweep = {1: {"records_per_s": 10.0}, 32: {"records_per_s": 90.0}, 64: {"records_per_s": 90.0}}
    assert stats.best_batch(sweep) == 32
    assert stats.best_batch({}) is None


def test_parse_wrk_reads_the_line_closed_lua_prints():
    raw = {"requests": 100, "duration_us": 5_000_000, "connect": 0, "read": 0, "write": 0, "status": 4,
           "timeout": 1, "p50_us": 10_000, "p95_us": 20_000, "p99_us": 30_000, "max_us": 40_000}
    parsed = parse_wrk("Running 5s test\nBENCH_JSON " + json.dumps(raw) + "\n")
    figures = closed_cell_figures(parsed, records=16)
    assert figures["ok"] == 96 and figures["errors"] == 5
    assert figures["requests_per_s"] == pytest.approx(19.2)
    assert figures["records_per_s"] == pytest.approx(307.2)
    assert figures["p99_ms"] == 30.0
    with pytest.raises(ValueError, match="no BENCH_JSON"):
        parse_wrk("wrk: connection refused")


def test_a_closed_cell_s_rate_is_little_s_law_not_the_answers_in_its_window():
    """32 clients x 16 texts, ~1.2 s a request, 8 s: a server answering its 32 requests at once finishes 6 rounds in
    the window (its 7th still computing when wrk stops), one answering evenly ~213 requests; both serve 437 texts/s.
    Counted in the window, the first served 12 % less. Little's law (clients / mean latency) gives both 437."""
    def raw(requests, mean_s, **errors):
        return {"requests": requests, "duration_us": 8_000_000, "connect": 0, "read": 0, "write": 0, "status": 0,
                "timeout": 0, "p50_us": 1, "p95_us": 1, "p99_us": 1, "max_us": 1, "mean_us": mean_s * 1e6, **errors}
    at_once = closed_cell_figures(raw(192, 32 * 16 / 437), records=16, concurrency=32)
    evenly = closed_cell_figures(raw(213, 32 * 16 / 437), records=16, concurrency=32)
    assert at_once["records_per_s"] == evenly["records_per_s"] == pytest.approx(437, rel=1e-3)
    assert at_once["window_requests_per_s"] * 16 == pytest.approx(384)
    half_refused = closed_cell_figures(raw(100, 0.5, status=50), records=1, concurrency=4)
    assert half_refused["requests_per_s"] == pytest.approx(4)  # 8 requests/s, half of them OK
    timed_out = closed_cell_figures(raw(100, 0.5, timeout=3), records=1, concurrency=4)
    assert timed_out["requests_per_s"] == pytest.approx(100 / 8)  # a client lost time outside the mean: the window


def test_a_target_is_judged_on_the_unrounded_ratio():
    """0.7496 rounded to 0.75 and was judged met; a lead of 1.09975 passed the 10 % margin."""
    from bench.compare import peer_targets

    assert peer_targets._judged(439.8, 586.7, lambda x: x >= 0.75) == (0.75, False)
    assert peer_targets._judged(109.975, 100.0, lambda x: x >= 1.10) == (1.1, False)
    assert peer_targets._judged(110.0, 100.0, lambda x: x >= 1.10) == (1.1, True)


def test_target_bodies_follow_each_contract():
    texts = ("a", "b", "c")
    assert Target("u", "/embeddings", "embeddings", 1, texts).body(1) == {"input": "b"}
    assert Target("u", "/embeddings", "embeddings", 2, texts).body(2) == {"input": ["c", "a"]}
    assert Target("u", "/translation", "texts", 2, texts).body(0) == {"texts": ["a", "b"]}
    body = Target("u", "/translation", "translation", 2, texts).body(0)
    assert body["payload"]["fromLang"] == "en"
    assert [r["text"] for r in body["payload"]["records"]] == ["a", "b"]


def test_profiles_override_concurrency_only_where_configured():
    default = PROFILES["default"]
    assert default.concurrencies_for("embeddings", 1) == default.concurrencies
    assert 64 in default.concurrencies_for("embeddings", 16)
    assert set(PROFILES["full"].concurrencies) == {1, 8, 32, 64, 128}
    # The Marian-sized model at 16 records: 8 clients saturate it; more only queue past peers' timeouts.
    for name in ("default", "full"):
        assert max(PROFILES[name].concurrencies_for("translation-transformers", 16)) == 8
    assert 128 in PROFILES["full"].concurrencies_for("translation-transformers", 1)
    for profile in PROFILES.values():
        assert set(profile.cell_s) == set(profile.workloads) == set(profile.open_s)


def test_drain_probes_until_the_backlog_is_worked_off(monkeypatch):
    """A probe that fails (a peer's own request timeout while its backlog is queued) is retried; the
    drain gives up only at its deadline."""
    from bench.compare import load

    answers = iter([False, False, True])
    calls = []

    async def probe(target, timeout_s):
        calls.append(timeout_s)
        return next(answers)

    monkeypatch.setattr(load, "_probe", probe)
    target = Target("http://x", "/embeddings", "embeddings", 1, ("a",))
    assert load.drain(target, timeout_s=30, retry_pause_s=0) is True
    assert len(calls) == 3 and all(0 < t <= 30 for t in calls)

    async def never(target, timeout_s):
        calls.append(timeout_s)
        return False

    monkeypatch.setattr(load, "_probe", never)
    calls.clear()
    assert load.drain(target, timeout_s=0.05, retry_pause_s=0.01) is False
    assert calls


def _results(cells, offline):
    return {"profile": "test", "started_at": "now", "machine": "m", "workloads": ["embeddings",
            "translation-transformers"], "records": [1], "contenders": ["naive", "serve_app"],
            "labels": {"naive": "Naive", "serve_app": "serve-app"}, "offline": offline, "cells": cells,
            "failures": [{"contender": "bentoml", "workload": "embeddings", "error": "ImportError: x"}]}


def test_targets_and_markdown_report_met_and_unmet_honestly():
    tt = "translation-transformers"
    cells = [cell("naive", 64, 100.0), cell("serve_app", 64, 150.0), open_("serve_app", 300.0),
             cell("naive", 8, 2.0, workload=tt), cell("serve_app", 64, 12.0, workload=tt)]
    offline = {"embeddings": {"records_per_s": 300.0, "best_batch": 32, "full_batch_s": 0.2},
               tt: {"records_per_s": 20.0, "best_batch": 32, "full_batch_s": 1.5}}
    verdicts = {t["target"].split(":")[1].strip()[:12]: t for t in report.targets(_results(cells, offline))}
    assert verdicts["served >= 0."]["figure"] == 0.6 and verdicts["served >= 0."]["met"] is False
    assert verdicts["served >= 5 "]["figure"] == 6.0 and verdicts["served >= 5 "]["met"] is True
    assert verdicts["ahead of eve"]["figure"] == 1.5 and verdicts["ahead of eve"]["met"] is True
    assert verdicts["p99 at 50% l"]["figure"] == 1.5 and verdicts["p99 at 50% l"]["met"] is True
    text = report.markdown(_results(cells, offline))
    assert "| embeddings | 1 | serve-app | 150.0 (64) | 150.0 | 0.50 |" in text
    assert "**not met**" in text and "`ImportError: x`" in text


def test_targets_say_not_measured_without_figures():
    verdicts = report.targets(_results([], {}))
    assert verdicts and all(t["met"] is None for t in verdicts)


def test_append_keeps_other_workloads_and_replaces_the_measured_one():
    from bench.compare.__main__ import merge_previous

    previous = {"profile": "default", "started_at": "16:00", "workloads": ["embeddings", "translation-embedded"],
                "offline": {"embeddings": {"records_per_s": 1}, "translation-embedded": {"records_per_s": 2}},
                "cells": [cell("a", 8, 1.0), cell("a", 8, 2.0, workload="translation-embedded")],
                "failures": [], "wall_s": {"a/embeddings": 5, "a/translation-embedded": 6}, "total_wall_s": 11}
    fresh = {"profile": "default", "started_at": "16:30", "workloads": ["translation-embedded"], "offline": {},
             "cells": [], "failures": [], "wall_s": {}}
    merged = merge_previous(previous, fresh)
    assert merged["workloads"] == ["embeddings", "translation-embedded"]
    assert merged["offline"] == {"embeddings": {"records_per_s": 1}}
    assert [c["workload"] for c in merged["cells"]] == ["embeddings"]
    assert merged["wall_s"] == {"a/embeddings": 5} and merged["total_wall_s"] == 11
    assert merged["started_at"] == "16:00 .. 16:30"
    with pytest.raises(SystemExit, match="smoke"):
        merge_previous({**previous, "profile": "smoke"}, fresh)


def test_serve_app_settles_at_the_busiest_load_before_its_cells_and_peers_do_not():
    from bench.compare.contenders import CONTENDERS

    settle = {c.name: c.settle_s for c in CONTENDERS}
    for mode in report.PROJECT:  # its autoscaler's upscale delay + look-back + a model load
        assert settle.pop(mode) >= 30
    assert set(settle.values()) == {0.0}


def test_serve_app_settles_before_each_request_size_at_that_size_s_busiest_load(tmp_path, monkeypatch):
    """The previous size's light cells last long enough for a downscale: without a settle per size,
    the 16-record cells of the Marian-sized model measured a replica loading its model."""
    import dataclasses

    from bench.compare import __main__ as bench_main
    from bench.compare.contenders import CONTENDERS

    class FakeServer:
        def __init__(self, *args, **kwargs):
            pass

        def wait_ready(self, url, timeout_s):
            return 1.0

        def since_start(self):
            return 2.0

        def memory(self):
            return {"pss_mib": 1.0, "rss_mib": 2.0, "processes": 1}

        def stop(self):
            pass

    runs = []

    def run_closed(target, texts_file, concurrency, seconds):
        runs.append((target.records, concurrency, seconds))
        return {"records_per_s": 10.0 * concurrency, "requests_per_s": 10.0 * concurrency / target.records,
                "p50_ms": 1.0, "p99_ms": 2.0, "errors": 0}

    monkeypatch.setattr(bench_main, "Server", FakeServer)
    monkeypatch.setattr(bench_main.load, "run_closed", run_closed)
    monkeypatch.setattr(bench_main.load, "drain", lambda target: True)
    monkeypatch.setattr(bench_main.load, "run_open", lambda target, rate, seconds: {"p50_ms": 1.0, "p99_ms": 2.0, "errors": 0})
    contender = dataclasses.replace(next(c for c in CONTENDERS if c.name == "serve_app"), info_path=None)
    profile = PROFILES["default"]
    results = {"cells": [], "failures": [], "contender_info": {}, "startup_s": {}, "first_answer_s": {}, "memory": {},
               "wall_s": {}}
    bench_main.run_contender(contender, "translation-transformers", profile, 9999, tmp_path, tmp_path / "t", results)

    assert results["failures"] == []
    settles = [(records, clients) for records, clients, seconds in runs if seconds == contender.settle_s]
    assert settles == [(1, 64), (16, 8)]  # each size's busiest cell, before that size's cells
    for records, clients in settles:
        first_cell = next(i for i, run in enumerate(runs) if run[0] == records and run[2] != contender.settle_s
                          and run[2] != profile.warmup_s)
        assert runs.index((records, clients, contender.settle_s)) < first_cell


def test_serve_app_python_proxy_is_the_same_start_on_serve_s_python_proxy_and_is_not_a_peer(tmp_path):
    from bench.compare.contenders import CONTENDERS

    modes = {c.name: c for c in CONTENDERS if c.name in report.PROJECT}
    assert set(modes) == set(report.PROJECT)
    default, python = modes["serve_app"], modes["serve_app_python_proxy"]
    assert python.argv("embeddings", 9701, tmp_path) == default.argv("embeddings", 9701, tmp_path)
    assert python.env("embeddings") == {**default.env("embeddings"), "SERVE_APP_PROXY": "python"}
    assert "SERVE_APP_PROXY" not in default.env("embeddings")  # the default: as `make run` picks it
    # Embeddings at 64 clients: serve-app 400, its Python-proxy mode 150, the best peer 100. The other
    # mode is serve-app, not a peer: serve-app leads 4x, and the Python proxy's own row says 1.5x.
    cells = [cell("naive", 64, 100.0), cell("serve_app", 64, 400.0), cell("serve_app_python_proxy", 64, 150.0)]
    results = {**_results(cells, {}), "contenders": ["naive", "serve_app", "serve_app_python_proxy"],
               "labels": {"naive": "Naive", "serve_app": "serve-app", "serve_app_python_proxy": "serve-app, Python proxy"}}
    lead = {p: next(t for t in report.targets(results, p) if "ahead of every peer" in t["target"])["figure"]
            for p in ("serve_app", "serve_app_python_proxy")}
    assert lead == {"serve_app": 4.0, "serve_app_python_proxy": 1.5}
    text = report.markdown(results)
    assert text.index("serve-app:") < text.index("serve-app, Python proxy:")


def test_serve_app_placed_serves_the_placed_profile_with_the_workload_s_model_args(tmp_path):
    import yaml

    from bench.compare.contenders import CONTENDERS

    placed = next(c for c in CONTENDERS if c.name == "serve_app_placed")
    argv = placed.argv("translation-transformers", 9702, tmp_path)  # raises if config_check refuses it
    config = yaml.safe_load(open(argv[-1]).read())
    app = next(a for a in config["applications"] if a["import_path"].startswith("serve_app."))
    assert app["args"]["translation"]["placement"] == app["args"]["embeddings"]["placement"] == "ingress"
    assert app["args"]["translation"]["backend"] == "transformers"  # the bench's model, as for serve_app
    assert {d["name"] for d in app["deployments"]} == {"Ingress", "JobManager"}  # every model in the Ingress
    assert "serve_app_placed" in report.PROJECT  # judged against the peers, never counted as one


# --- the dedicated batching servers (issue 24): mosec, LitServe, Infinity; start-up and memory ---

def _fake_run(texts):
    """A model stand-in: one 'vector' per text, recording each call's batch."""
    _fake_run.calls.append(list(texts))
    return [[float(len(t))] for t in texts]


def test_a_batch_of_requests_is_one_model_call_and_each_request_gets_its_own_outputs_in_order():
    from bench.peers.contract import outputs_per_request

    _fake_run.calls = []
    out = outputs_per_request(_fake_run, [["a"], ["bb", "ccc"], [], ["dddd"]])
    assert _fake_run.calls == [["a", "bb", "ccc", "dddd"]]
    assert out == [[[1.0]], [[2.0], [3.0]], [], [[4.0]]]


def test_tree_pss_counts_every_process_once_and_pss_never_exceeds_rss():
    import subprocess
    import sys

    import psutil

    from bench.compare.procs import tree_pss

    me = psutil.Process()
    alone = tree_pss([me, psutil.Process(me.pid)])  # the same process twice counts once
    assert alone["processes"] == 1 and 0 < alone["pss_mib"] <= alone["rss_mib"]
    assert [v["processes"] for v in alone["by_kind"].values()] == [1]
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        both = tree_pss([me, *me.children(recursive=True)])
        assert both["processes"] >= 2 and both["pss_mib"] > alone["pss_mib"] * 0.5
        assert both["rss_mib"] - both["pss_mib"] >= alone["rss_mib"] - alone["pss_mib"]  # shared pages: RSS twice
    finally:
        child.kill()
        child.wait()
    gone = tree_pss([psutil.Process(child.pid)] if psutil.pid_exists(child.pid) else [])
    assert gone["processes"] == 0


def test_a_server_whose_log_says_it_failed_is_not_waited_for(tmp_path):
    """A Serve app that failed to import leaves its launcher running: wait_ready's `fatal` pattern in the
    log ends the wait at once (on the GPU machine such a wait cost 2 x 120 s of device time)."""
    import sys
    import time

    from bench.compare.procs import Server, ServerFailed

    code = "import time; print('WARNING controller -- Exception importing application x.', flush=True); time.sleep(60)"
    server = Server([sys.executable, "-c", code], {}, tmp_path / "log.txt", tmp_path)
    try:
        began = time.monotonic()
        with pytest.raises(ServerFailed, match="Exception importing application"):
            server.wait_ready("http://127.0.0.1:9/readyz", 60, fatal=r"Exception importing application")
        assert time.monotonic() - began < 20
    finally:
        server.proc.kill()
        server.proc.wait()


def test_the_batching_servers_are_contenders_with_serve_app_s_cap_and_infinity_serves_embeddings_only(tmp_path):
    from bench.compare.contenders import CONTENDERS
    from bench.peers.infinity_peer import ENGINE, infinity_argv
    from bench.peers.models import project_batching

    by_name = {c.name: c for c in CONTENDERS}
    for name in ("mosec", "litserve", "infinity"):
        assert name in by_name and name not in report.PROJECT
    assert by_name["mosec"].argv("embeddings", 9701, tmp_path)[-5:] == [
        "bench.peers.mosec_peer", "--workload", "embeddings", "--port", "9701"]
    infinity = by_name["infinity"]
    assert "serves only embeddings" in infinity.unavailable_for("translation-embedded")
    argv = infinity_argv("embeddings", 9701, "/models/minilm")
    assert argv[argv.index("--batch-size") + 1] == str(project_batching("embeddings")[0])
    assert argv[argv.index("--engine") + 1] == ENGINE == "torch"
    assert argv[argv.index("--model-id") + 1] == "/models/minilm" and "--no-vector-disk-cache" in argv
    with pytest.raises(SystemExit, match="embedding models only"):
        infinity_argv("translation-embedded", 9701, "/models/minilm")


def test_mosec_worker_decodes_serve_app_s_contract_and_answers_each_request_of_a_batch():
    mosec = pytest.importorskip("mosec")
    from bench.peers.mosec_peer import Model

    worker = Model.__new__(Model)  # no model load: the stand-in below
    worker.workload, worker.run = "embeddings", _fake_run
    _fake_run.calls = []
    data = [worker.deserialize(b'{"input": "ab"}'), worker.deserialize(b'{"input": ["a", "abc"]}')]
    answers = worker.forward(data)
    assert _fake_run.calls == [["ab", "a", "abc"]]
    assert [[d["embedding"] for d in a["data"]] for a in answers] == [[[2.0]], [[1.0], [3.0]]]
    assert json.loads(worker.serialize(answers[0]))["object"] == "list"
    with pytest.raises(mosec.ValidationError):
        worker.deserialize(b'{"inputs": "typo"}')


def test_litserve_api_decodes_serve_app_s_contract_and_refuses_a_bad_body_with_422():
    pytest.importorskip("litserve")
    from fastapi import HTTPException

    from bench.peers.litserve_peer import ModelAPI
    from bench.peers.models import WORKLOADS, peer_batching

    api = ModelAPI("embeddings")
    assert (api.max_batch_size, api.batch_timeout) == peer_batching("embeddings")
    assert api.api_path == WORKLOADS["embeddings"].route
    api.run = _fake_run
    _fake_run.calls = []
    batch = [api.decode_request({"input": ["a", "abc"]}), api.decode_request({"input": "ab"})]
    answers = [api.encode_response(out) for out in api.predict(batch)]
    assert _fake_run.calls == [["a", "abc", "ab"]]
    assert [[d["embedding"] for d in a["data"]] for a in answers] == [[[1.0], [3.0]], [[2.0]]]
    with pytest.raises(HTTPException) as refused:
        api.decode_request({"input": 3})
    assert refused.value.status_code == 422


def test_start_up_and_memory_are_reported_per_contender():
    results = {"labels": {"mosec": "mosec"}, "startup_s": {"mosec/embeddings": 1.5},
               "first_answer_s": {"mosec/embeddings": 6.2},
               "memory": {"mosec/embeddings": {"after_first_answer": {"pss_mib": 300.0, "rss_mib": 500.0, "processes": 2},
                                               "after_load": {"pss_mib": 320.0, "rss_mib": 520.0, "processes": 2}}}}
    lines = report.startup_memory_lines(results)
    assert lines[-1] == "| embeddings | mosec | 1.5 | 6.2 | 300 | 320 | 520 | 2 |"
    assert report.startup_memory_lines({"labels": {}, "startup_s": {}}) == []


def test_smoke_reads_both_answer_shapes_and_measures_cosine_per_vector():
    import numpy as np

    from bench.compare.smoke import cosines, vectors_of

    openai = {"data": [{"index": 1, "embedding": [0.0, 2.0]}, {"index": 0, "embedding": [1.0, 0.0]}]}
    assert vectors_of(openai).tolist() == [[1.0, 0.0], [0.0, 2.0]]  # by index, not by position
    assert vectors_of([[1.0, 0.0]]).tolist() == [[1.0, 0.0]]  # BentoML's
    expected = np.asarray([[1.0, 0.0], [0.0, 1.0]])
    assert cosines(vectors_of(openai), expected) == pytest.approx([1.0, 1.0])
    assert cosines(np.asarray([[1.0, 0.0], [1.0, 1.0]]), expected)[1] == pytest.approx(0.5 ** 0.5)
    with pytest.raises(ValueError, match="expected"):
        cosines(np.asarray([[1.0, 0.0]]), expected)


def test_placed_probe_splits_cpu_by_kind_of_thread():
    from bench.placed_probe import _TICK_S, cpu_split

    replica = "ray::ServeReplica:serve-app:Ingress "
    before = {("1", "1"): (replica, "ray::IDLE", 100), ("1", "2"): (replica, "Embedder-model", 0),
              ("2", "2"): ("/x/haproxy -db -f cfg ", "haproxy", 5), ("3", "3"): ("wrk -t1 ", "wrk", 0)}
    after = {("1", "1"): (replica, "ray::IDLE", 100 + 0.4 / _TICK_S),
             ("1", "2"): (replica, "Embedder-model", 1.2 / _TICK_S),
             ("1", "3"): (replica, "Translator-mode", 0.2 / _TICK_S),  # 15 bytes: Linux cuts the name
             ("2", "2"): ("/x/haproxy -db -f cfg ", "haproxy", 5 + 0.1 / _TICK_S),
             ("3", "3"): ("wrk -t1 ", "wrk", 0.05 / _TICK_S),
             ("4", "4"): ("/x/raylet ", "raylet", 0.1 / _TICK_S)}  # started meanwhile: all of it counts
    split = cpu_split(before, after, 2.0)
    assert split == {"model threads": 0.7, "Ingress request path": 0.2, "Ray and the rest": 0.075,
                     "HAProxy": 0.05}


def test_a_process_is_named_by_its_ray_title_module_script_or_executable():
    from bench.compare.procs import process_kind

    assert process_kind(["ray::ServeReplica:serve-app:Ingress"]) == "ServeReplica:serve-app:Ingress"
    assert process_kind(["ray::ServeController.listen_for_change"]) == "ServeController"
    assert process_kind(["ray-dashboard-NodeHead-0 (/v/bin/python -B -c ...)"]) == "ray-dashboard-NodeHead"
    assert process_kind(["/v/bin/python", "-m", "serve_app.run", "c.yaml"]) == "serve_app.run"
    assert process_kind(["/v/bin/python", "-u", "/v/ray/autoscaler/_private/monitor.py", "--x"]) == "monitor.py"
    assert process_kind(["/v/ray/core/src/ray/raylet/raylet", "--raylet_socket_name=x"]) == "raylet"
    assert process_kind(["/v/bin/python", "/v/bin/serve", "run", "c.yaml"]) == "serve"
    assert process_kind(["/v/bin/python", "-B", "-c", "from multiprocessing.forkserver import main; main(25)"]) \
        == "multiprocessing.forkserver"
    assert process_kind(["/v/bin/python3.11", "-X", "dev", "-c", "print(1)"]) == "python3.11 -c"
    assert process_kind(["/v/bin/python"]) == "python"
    assert process_kind([], "zombie") == "zombie"


def test_memory_of_a_many_process_server_is_broken_down_by_kind():
    def tree(kinds):
        return {"processes": sum(n for n, _ in kinds.values()),
                "by_kind": {k: {"processes": n, "pss_mib": m} for k, (n, m) in kinds.items()}}
    idle = tree({"ServeReplica:a:Ingress": (1, 480.0), "raylet": (1, 28.0), "x": (3, 6.0), "y": (2, 9.0)})
    loaded = tree({"ServeReplica:a:Ingress": (2, 990.0), "raylet": (1, 29.0), "x": (3, 6.0), "y": (2, 9.0)})
    small = tree({"mosec": (4, 260.0)})
    results = {"labels": {"s": "serve-app"}, "memory": {"s/embeddings": {"after_first_answer": idle, "after_load": loaded},
                                                        "mosec/embeddings": {"after_first_answer": small}}}
    lines = report.memory_by_kind_lines(results)
    assert lines[-3:] == ["| embeddings | serve-app | ServeReplica:a:Ingress | 1 / 2 | 480 | 990 |",
                          "| embeddings | serve-app | raylet | 1 / 1 | 28 | 29 |",
                          "| embeddings | serve-app | others | 5 / 5 | 15 | 15 |"]
    assert not any("mosec" in line for line in lines)  # 4 processes: no breakdown
    assert report.memory_by_kind_lines({"labels": {}, "memory": {"mosec/embeddings": {"after_first_answer": small}}}) == []


def test_placed_probe_variants_set_the_environment_and_the_models_batch_knobs():
    from bench.placed_probe import split_variant

    assert split_variant("base:") == ("base", {}, {})
    assert split_variant("wait0:Embedder.batch_wait_timeout_s=0,RAY_X=1,Embedder.max_batch_tokens=null") == (
        "wait0", {"RAY_X": "1"}, {"Embedder": {"batch_wait_timeout_s": 0, "max_batch_tokens": None}})
    assert split_variant("iris:Model.iris.max_batch_size=4")[2] == {"Model.iris": {"max_batch_size": 4}}
    with pytest.raises(ValueError, match="RAY_X"):
        split_variant("typo:RAY_X")


def test_batching_peers_get_serve_apps_batch_and_wait_but_never_less_than_a_millisecond():
    """LitServe busy-polls and service_streamer stops batching at a wait of 0; serve-app's Embedder runs at 0."""
    from bench.peers.models import PEER_MIN_WAIT_S, peer_batching, project_batching

    batch, wait_s = project_batching("embeddings")
    assert peer_batching("embeddings") == (batch, max(wait_s, PEER_MIN_WAIT_S)) and PEER_MIN_WAIT_S == 0.001
    assert peer_batching("translation-embedded") == project_batching("translation-embedded")  # 10 ms as it is
