"""bench/gpu's Serve config (no Ray, no GPU): the GPU run serves the GPU profile exactly as
deploy.serve_profiles renders it, with only its models, decode length, cache and job store changed, so
the figures in docs/benchmarks/gpu-run are the profile's."""

from __future__ import annotations

import copy

import pytest

from bench.gpu.common import GPU_PLAN, TINY_PLAN
from bench.gpu.serving import app_config
from deploy.serve_profiles import serve_config

MODELS = {"translation": "/models/m2m100-sized", "embeddings": "/models/minilm-shaped"}


def _deployments(config: dict) -> dict:
    return {d["name"]: d for d in config["applications"][0]["deployments"]}


def test_the_gpu_run_serves_the_gpu_profile_with_only_its_models_changed(tmp_path):
    config = app_config(MODELS, GPU_PLAN, False, 9527, "static", tmp_path)
    profile = serve_config("gpu", "local")
    assert _deployments(config) == _deployments(profile)
    translator = _deployments(config)["Translator"]
    assert translator["ray_actor_options"]["num_gpus"] == 0.5
    assert translator["autoscaling_config"]["min_replicas"] == 2
    args = config["applications"][0]["args"]
    assert args["translation"]["model"] == MODELS["translation"]
    assert args["translation"]["max_new_tokens"] == args["translation"]["min_new_tokens"] == GPU_PLAN.decode_tokens
    assert args["translation"]["scheduling"] == "static"  # named: the profile's own is continuous
    assert profile["applications"][0]["args"]["translation"]["scheduling"] == "continuous"
    assert args["embeddings"]["model_path"] == MODELS["embeddings"]
    assert args["cache"] == {"enabled": False}
    assert str(tmp_path) in args["jobs"]["store_path"]
    for key in ("backend", "device", "dtype", "local_files_only"):
        assert args["translation"][key] == profile["applications"][0]["args"]["translation"][key]


def test_the_continuous_run_differs_only_in_scheduling(tmp_path):
    static = app_config(MODELS, GPU_PLAN, False, 9527, "static", tmp_path)
    continuous = app_config(MODELS, GPU_PLAN, False, 9527, "continuous", tmp_path)
    assert continuous["applications"][0]["args"]["translation"].pop("scheduling") == "continuous"
    assert static["applications"][0]["args"]["translation"].pop("scheduling") == "static"
    for config in (static, continuous):
        config["applications"][0]["args"]["jobs"].pop("store_path")
    assert static == continuous


def test_tiny_mode_runs_the_same_deployments_without_a_gpu(tmp_path):
    gpu = app_config(MODELS, GPU_PLAN, False, 9527, "static", tmp_path)
    tiny = app_config(MODELS, TINY_PLAN, True, 9527, "static", tmp_path)
    assert set(_deployments(tiny)) == set(_deployments(gpu))
    assert _deployments(tiny)["Translator"]["ray_actor_options"]["num_gpus"] == 0
    untouched = copy.deepcopy(_deployments(tiny)["Translator"])
    untouched["ray_actor_options"] = _deployments(gpu)["Translator"]["ray_actor_options"]
    assert untouched == _deployments(gpu)["Translator"]


def test_the_gpu_site_packs_only_pinned_packages():
    """scripts/gpu-site takes each package's version from requirements.lock: one missing there (renamed,
    dropped by a re-lock) would stop the build where PyPI is reachable, not on the GPU machine."""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    script = (root / "scripts" / "gpu-site").read_text()
    names = re.search(r'NAMES="([^"]+)"', script).group(1).split()
    lock = {line.split("==")[0].lower() for line in (root / "requirements.lock").read_text().splitlines()
            if "==" in line and not line.startswith(" ")}
    assert "ray" in names and "tenacity" in names  # Serve itself, and what serve_app.jobs imports
    assert [n for n in names if n.lower() not in lock] == []


def test_the_engine_bench_runs_its_cells_on_a_cpu(tmp_path):
    """`make bench-gpu-engines` in its CPU form (the tiny M2M100, a few sentences): every engine gets
    every cell, and continuous decoding answers what solo `generate` answers."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, "-m", "bench.gpu.engines", "--out", str(tmp_path), "--device", "cpu",
                           "--tiny", "--records", "12", "--solo", "6", "--batch", "8", "--naive",
                           "--fixed-engines", "static,naive,continuous"],
                          cwd=root, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads((tmp_path / "engines.json").read_text())
    assert "failed_to_start" not in report
    for workload, cells in (("length_mix", ("saturation", "load_0.5", "at_static_half")), ("fixed", ("saturation",))):
        engines = report[workload]["cells"]
        assert set(engines) == {"static", "naive", "continuous"}
        assert all(cell in engines[name] for name in engines for cell in cells if name != "static" or
                   cell != "at_static_half")
        assert engines["continuous"]["saturation"]["differing_from_solo"] == 0
        assert engines["naive"]["saturation"]["differing_from_solo"] == 0  # each sentence alone: solo itself
        assert engines["continuous"]["saturation"]["steps"]["engine"] == "ContinuousDecoder"  # the CPU's
    # each sentence's solo time through the continuous engine too, and latencies over it
    assert report["solo_continuous_s_p50"] > 0 and report["warm_up"]["continuous"]["captured"] is None
    half = report["length_mix"]["cells"]["continuous"]["load_0.5"]
    assert half["p50_over_solo_continuous"] > 0
    # the slowest request's life: every step it waited on, its own included (one per output token, at least)
    assert half["slowest"]["steps"] >= half["slowest"]["output_tokens"] > 0
    assert 0 < half["decoding_busy_fraction"] <= 1
    assert (tmp_path / "engines.png").stat().st_size > 0


def test_a_peer_that_cannot_start_is_reported_and_the_bench_goes_on():
    """A peer missing where the bench runs (a GPU machine without BentoML's venv, say) is named with its error
    in engines.json; the other engines are measured."""
    from bench.gpu.engines import start_peer

    engines, failed = {"static": object()}, {}

    def missing():
        raise RuntimeError("no BentoML venv at /x")
    start_peer(engines, failed, "bentoml", missing)
    start_peer(engines, failed, "naive", lambda: "engine")
    assert engines == {"static": engines["static"], "naive": "engine"}
    assert failed == {"bentoml": "RuntimeError: no BentoML venv at /x"}


def test_the_engine_bench_runs_mlpool_one_job_per_sentence_at_its_drawn_length(tmp_path):
    """`--mlpool` (the bench extra's MLPool): its worker process loads the same backend and decodes each
    sentence alone at the length drawn for it, so its answers are solo `generate`'s."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    pytest.importorskip("ml_pool", reason="MLPool is in the bench extra (make bench installs it)")
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, "-m", "bench.gpu.engines", "--out", str(tmp_path), "--device", "cpu",
                           "--tiny", "--records", "8", "--solo", "4", "--batch", "4", "--mlpool", "--loads", "0.5"],
                          cwd=root, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    cells = json.loads((tmp_path / "engines.json").read_text())["length_mix"]["cells"]
    assert set(cells) == {"static", "mlpool", "continuous"}
    assert cells["mlpool"]["saturation"]["differing_from_solo"] == 0
    assert cells["mlpool"]["load_0.5"]["p50_s"] > 0


def test_the_engine_bench_runs_bentoml_over_http_and_stops_it(tmp_path):
    """`--bentoml` (make bench's BentoML venv): its server loads the same backend with the same draws, batches
    adaptively, answers the fixed workload (every sentence the same length) as solo `generate` does, and its
    process tree is gone when the bench ends."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    from bench.compare.contenders import BENTOML_VENV

    if not (BENTOML_VENV / "bin" / "bentoml").exists():
        pytest.skip("no BentoML venv (make bench creates it)")
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, "-m", "bench.gpu.engines", "--out", str(tmp_path), "--device", "cpu",
                           "--tiny", "--records", "8", "--solo", "4", "--batch", "4", "--bentoml", "--loads", "0.5"],
                          cwd=root, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads((tmp_path / "engines.json").read_text())
    assert set(report["length_mix"]["cells"]) == {"static", "bentoml", "continuous"}
    assert report["length_mix"]["cells"]["bentoml"]["load_0.5"]["p50_s"] > 0 and report["bentoml_ready_s"] > 0
    assert report["fixed"]["cells"]["bentoml"]["saturation"]["differing_from_solo"] == 0
    left = subprocess.run(["pgrep", "-f", f"--working-dir {root}.*LengthMix|bentoml_service:LengthMix"],
                          capture_output=True, text=True)
    assert left.stdout == "", left.stdout


def test_a_life_counts_the_steps_that_began_within_it_and_splits_joins_from_plain_steps():
    from types import SimpleNamespace as Step

    from bench.gpu.contenders import life_of

    steps = [Step(running=2, joined=1, seconds=0.05, failed=False), Step(running=3, joined=0, seconds=0.02, failed=False),
             Step(running=3, joined=0, seconds=0.04, failed=False), Step(running=0, joined=1, seconds=0.01, failed=True),
             Step(running=4, joined=1, seconds=0.06, failed=False), Step(running=1, joined=0, seconds=0.02, failed=False)]
    starts = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
    life = life_of(starts, steps, 2.0, 5.5)  # the failed step is no step of the batch
    assert life == {"steps": 3, "steps_s": 0.12, "join_steps": 1, "join_steps_s": 0.06, "plain_step_ms_p50": 30.0,
                    "mean_running": 3.3}
    assert life_of([1.99], steps[:1], 2.0, 3.0) == {"steps": 0, "steps_s": 0, "join_steps": 0, "join_steps_s": 0,
                                                   "plain_step_ms_p50": None, "mean_running": 0}
