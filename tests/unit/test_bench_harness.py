"""The benchmark harness's pure logic: statistics, the saturation / 50% rate pick, wrk parsing,
request bodies, profiles and the rendered table (bench/compare). No servers, no Ray."""

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


def test_batch_join_pins_the_model_deployment_and_keeps_the_config_valid(tmp_path):
    import yaml

    from bench.batch_join import ROOT, write_config

    out = write_config(ROOT, "embeddings", 9700, 2, tmp_path / "c.yaml")  # raises if config_check refuses it
    config = yaml.safe_load(out.read_text())
    assert config["http_options"]["port"] == 9700
    app = next(a for a in config["applications"] if a["import_path"].startswith("serve_app."))
    embedder = next(d for d in app["deployments"] if d["name"] == "Embedder")
    assert embedder["autoscaling_config"]["min_replicas"] == embedder["autoscaling_config"]["max_replicas"] == 2
    assert app["args"]["cache"] == {"enabled": False}


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
    results = {"cells": [], "failures": [], "contender_info": {}, "startup_s": {}, "wall_s": {}}
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


def test_batch_join_tree_specs_carry_env():
    from bench.batch_join import parse_tree

    name, path, env = parse_tree("off=.:SERVE_APP_A=1,SERVE_APP_B=x=y")
    assert name == "off" and path.is_absolute() and env == {"SERVE_APP_A": "1", "SERVE_APP_B": "x=y"}
    assert parse_tree("before=/tmp/b")[2] == {}


def test_batch_join_options_merge_into_the_tree_s_config(tmp_path):
    import yaml

    from bench.batch_join import ROOT, parse_option, write_config

    tree, option = parse_option("big=Translator.user_config.max_batch_size=64")
    assert (tree, option) == ("big", {"Translator": {"user_config": {"max_batch_size": 64}}})
    out = write_config(ROOT, "translation-transformers", 9702, 2, tmp_path / "c.yaml", option)
    app = next(a for a in yaml.safe_load(out.read_text())["applications"] if a["import_path"].startswith("serve_app."))
    translator = next(d for d in app["deployments"] if d["name"] == "Translator")
    assert translator["user_config"]["max_batch_size"] == 64
    assert translator["autoscaling_config"]["max_replicas"] == 2  # the pinning stays
    assert translator["user_config"]["batch_wait_timeout_s"] > 0  # the rest of user_config stays


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
