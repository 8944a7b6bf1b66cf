import copy
from pathlib import Path

import pytest

from serve_app.config_check import check_config, load_config, main

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def config():
    return load_config(ROOT / "serve_config.yaml")


def test_checked_in_config_is_valid(config):
    assert check_config(config) == []


def _deployment(config, name):
    return next(d for d in config["applications"][0]["deployments"] if d["name"] == name)


@pytest.mark.parametrize("mutate, expected", [
    (lambda c: _deployment(c, "Translator").__setitem__("max_ongoing_request", 5), "max_ongoing_request"),
    (lambda c: _deployment(c, "Translator").__setitem__("autoscaling_config", {"min_replica": 1}), "min_replica"),
    (lambda c: _deployment(c, "Translator")["ray_actor_options"].__setitem__("num_cpu", 1), "num_cpu"),
    (lambda c: _deployment(c, "Translator").__setitem__("name", "Translater"), "Translater"),
    (lambda c: _deployment(c, "Embedder")["user_config"].__setitem__("max_batch_size", 0), "max_batch_size=0"),
    (lambda c: _deployment(c, "Embedder")["user_config"].__setitem__("batch_wait_s", 1), "batch_wait_s"),
    (lambda c: _deployment(c, "Translator").__setitem__("max_ongoing_requests", 4), "below max_batch_size"),
    (lambda c: c["applications"][0]["args"]["translation"].__setitem__("backend", "nope"), "args"),
    (lambda c: c["http_options"].__setitem__("prot", 1), "prot"),
    (lambda c: _deployment(c, "Ingress").__setitem__("max_ongoing_requests", 64), "must exceed"),
    # the waiting room holds requests too: 64 admitted + 400 waiting need more than 100 ongoing
    (lambda c: (_deployment(c, "Ingress").__setitem__("max_ongoing_requests", 100),
                c["applications"][0]["args"]["ingress"].update(max_inflight_requests=64, max_waiting_requests=400)),
     "max_ongoing_requests=100 must exceed args.ingress.max_inflight_requests=64 + max_waiting_requests=400"),
    # without its own max_ongoing_requests the Ingress has Serve's default for it, 512
    (lambda c: (_deployment(c, "Ingress").pop("max_ongoing_requests", None),
                c["applications"][0]["args"]["ingress"].update(max_inflight_requests=2000)),
     "max_ongoing_requests=512 (the default) must exceed"),
    (lambda c: _deployment(c, "Ingress")["backpressure_config"].__setitem__("retry_after", 1), "retry_after"),
    # 8 shared calls in flight cannot show the autoscaler 2 Translators x 8 ongoing calls
    (lambda c: c["applications"][0]["args"]["ingress"].__setitem__("max_inflight_calls_per_model", 8),
     "so Translator could never reach 2 replicas; raise max_inflight_calls_per_model to at least 16"),
    (lambda c: _deployment(c, "Embedder")["autoscaling_config"].__setitem__("max_replicas", 9),
     "Embedder's max_replicas=9 x target_ongoing_requests=4 = 36"),
    # shapes Serve's schema refuses are reported, not a crash of the checker (the launcher showed a traceback)
    (lambda c: c.__setitem__("applications", ["serve-app"]), "applications.0"),
    (lambda c: c.__setitem__("applications", "serve-app"), "applications"),
    (lambda c: c["applications"][0].__setitem__("args", [1]), "applications.0.args"),
    (lambda c: c["applications"][0]["deployments"].append("Ingress"), "Serve rejects the config"),
    # Serve keeps the deployment's own user_config when its entry sets none: Translator's batches of 32
    (lambda c: (_deployment(c, "Translator").pop("user_config"), _deployment(c, "Translator").__setitem__(
        "max_ongoing_requests", 4)), "max_ongoing_requests=4 is below max_batch_size=32 (its default user_config)"),
    # without its own max_ongoing_requests a model deployment has the code's, 128
    (lambda c: (_deployment(c, "Embedder").pop("max_ongoing_requests", None),
                _deployment(c, "Embedder")["user_config"].__setitem__("max_batch_size", 256)),
     "max_ongoing_requests=128 (the default) is below max_batch_size=256"),
])
def test_typos_and_bad_values_are_reported(config, mutate, expected):
    bad = copy.deepcopy(config)
    mutate(bad)
    problems = check_config(bad)
    assert problems, "the checker accepted a broken config"
    assert any(expected in p for p in problems), problems


def test_cli_overrides_port_and_writes(tmp_path, capsys):
    out = tmp_path / "c.yaml"
    assert main([str(ROOT / "serve_config.yaml"), "--port", "9999", "--write", str(out)]) == 0
    assert load_config(out)["http_options"]["port"] == 9999


def test_more_ingress_replicas_allow_more_calls_in_flight(config):
    ok = copy.deepcopy(config)
    ok["applications"][0]["args"]["ingress"]["max_inflight_calls_per_model"] = 12
    _deployment(ok, "Ingress")["num_replicas"] = 2  # 2 x 12 = 24 >= 2 Translators x 8
    assert check_config(ok) == []


def test_serve_app_in_ray_s_dot_form_of_the_import_path_gets_every_check(config):
    """Ray takes `serve_app.builder.build_app` as well as the colon form; in it every check of serve-app's own
    (args, deployment names, the Ingress's bound) was skipped and the config passed."""
    bad = copy.deepcopy(config)
    bad["applications"][0]["args"]["ingress"]["max_wait_s"] = -1
    _deployment(bad, "Translator")["name"] = "Translater"
    colon = check_config(bad)
    bad["applications"][0]["import_path"] = "serve_app.builder.build_app"
    assert len(colon) >= 2 and check_config(bad) == colon


def test_the_application_s_runtime_env_vars_are_read_as_its_build_reads_them(config, monkeypatch):
    """Serve builds the application in its runtime_env: a setting there that the build refuses passed the check (and
    HAProxy's bounds were computed without it), while the same variable in the launcher's shell was refused."""
    import os

    from serve_app.proxy_shedding import shedding_for_config
    from serve_app.settings import load_settings

    monkeypatch.delenv("SERVE_APP_TRANSLATION_BACKEND", raising=False)
    bad = copy.deepcopy(config)
    bad["applications"][0].setdefault("runtime_env", {}).setdefault("env_vars", {})[
        "SERVE_APP_TRANSLATION_BACKEND"] = "nonsense"
    assert any("nonsense" in problem for problem in check_config(bad))
    assert "SERVE_APP_TRANSLATION_BACKEND" not in os.environ  # only while the settings are read
    more = copy.deepcopy(config)
    more["applications"][0].setdefault("runtime_env", {}).setdefault("env_vars", {})[
        "SERVE_APP_INGRESS_RETRY_AFTER_S"] = "7"  # (not in its args, which come first)
    assert load_settings(config["applications"][0]["args"]).ingress.retry_after_s != 7
    assert shedding_for_config(more).apps[0].retry_after_s == 7 and "SERVE_APP_INGRESS_RETRY_AFTER_S" not in os.environ


@pytest.mark.parametrize("deployments", [5, True, "Ingress"])
def test_deployments_that_are_not_a_list_are_a_problem_not_a_crash(config, deployments):
    bad = copy.deepcopy(config)
    bad["applications"][0]["deployments"] = deployments
    assert any("Serve rejects the config" in problem for problem in check_config(bad))


def test_another_application_s_deployments_are_not_held_to_serve_app_s_batch_rules(config):
    """A second application (not serve-app's builder) may name a deployment Translator with a user_config of its own:
    Serve's schema checks it, serve-app's batch knobs do not (it was refused as an unknown batch knob)."""
    both = copy.deepcopy(config)
    both["applications"].append({
        "name": "theirs", "route_prefix": "/theirs", "import_path": "their_pkg.app:app",
        "deployments": [{"name": "Translator", "user_config": {"beam": 4}, "max_ongoing_requests": 1}]})
    assert check_config(both) == []
    both["applications"][1]["deployments"][0]["max_ongoing_request"] = 1  # Serve's own schema still applies
    assert any("max_ongoing_request" in problem for problem in check_config(both))
