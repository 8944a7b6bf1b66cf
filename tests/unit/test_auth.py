"""Fail-closed API keys (serve_app/auth.py): refused keys, refused start-ups, keys never in `args:`,
keys from a file that rotates without a restart, and what callers without a key may read."""

from __future__ import annotations

import logging
import os

import pytest

from serve_app import auth
from serve_app.auth import AuthConfigError, KeysFile, key_problems, startup_check
from serve_app.config_check import check_config
from serve_app.settings import load_settings

from .fakes import FakeEmbedder, FakeTranslator, install

KEY_A = "a3f1c9e07b2d4f6a8c0e1b3d5f7a9c2e"  # 32 characters, as `openssl rand -hex 16` gives
KEY_B = "5d8e2a7c4f1b9e3a6c0d8f2b4e7a1c9d5b3f"
BODY = {"payload": {"fromLang": "en", "toLang": "pt", "records": [{"id": "1", "text": "hi"}]}}



@pytest.fixture(autouse=True)
def no_key_environment(monkeypatch):
    for name in ("SERVE_APP_INGRESS_API_KEYS", "SERVE_APP_INGRESS_API_KEYS_FILE", "SERVE_APP_INGRESS_AUTH_DISABLED"):
        monkeypatch.delenv(name, raising=False)


def ingress(**values):
    return load_settings({"ingress": values}).ingress


# --- which keys are refused ----------------------------------------------------------------------

@pytest.mark.parametrize("key, problem", [
    ("PLACEHOLDER-not-a-real-key", "placeholder"),
    ("changeme-changeme-changeme-changeme", "'changeme'"),
    ("k1", "2 characters long; at least 32"),
    ("x" * 31, "31 characters long"),
    ("ab" * 20, "only 2 distinct characters"),
    ("\u00e9" + KEY_A[1:], "printable ASCII"),  # a client sends it as UTF-8 bytes; the header reads them as latin-1
])
def test_unsafe_keys_are_refused_without_quoting_them(key, problem):
    (message,) = key_problems([KEY_A, key], "SERVE_APP_INGRESS_API_KEYS")
    assert problem in message and "key 2 of 2" in message
    assert key not in message
    with pytest.raises(AuthConfigError) as err:
        startup_check(ingress(api_keys=f"{KEY_A},{key}"), "127.0.0.1")
    assert problem in str(err.value) and key not in str(err.value)


def test_good_keys_pass():
    assert key_problems([KEY_A, KEY_B], "x") == []
    startup_check(ingress(api_keys=f"{KEY_A}, {KEY_B}"), "0.0.0.0")


# --- fail closed on a reachable host ---------------------------------------------------------------

@pytest.mark.parametrize("host, loopback", [
    ("127.0.0.1", True), ("127.0.0.53", True), ("::1", True), ("[::1]", True), ("localhost", True),
    ("0.0.0.0", False), ("::", False), ("10.1.2.3", False), ("serve-app.example.com", False), (None, False),
])
def test_loopback_hosts(host, loopback):
    assert auth.is_loopback(host) is loopback


def test_no_key_on_a_reachable_host_refuses_to_start():
    with pytest.raises(AuthConfigError, match=r"listens on '0.0.0.0'.*no API key"):
        startup_check(ingress(), "0.0.0.0")
    startup_check(ingress(), "127.0.0.1")  # `make run`: key-less on loopback
    startup_check(ingress(), None)  # not under Serve (unit tests building the app): nothing listens


def test_auth_off_only_by_its_named_setting(monkeypatch, caplog):
    monkeypatch.setenv("SERVE_APP_INGRESS_AUTH_DISABLED", "true")
    caplog.set_level(logging.WARNING, logger="serve_app")
    startup_check(ingress(), "0.0.0.0")
    assert "API keys are off" in caplog.text
    with pytest.raises(AuthConfigError, match="auth_disabled is true but API keys are configured"):
        startup_check(ingress(api_keys=KEY_A), "0.0.0.0")


def test_builder_refuses_keys_in_args_and_unsafe_keys(monkeypatch):
    from serve_app.builder import build_app

    for args in ({"ingress": {"api_keys": KEY_A}}, {"ingress.api_keys": KEY_A},
                 {"jobs": {"redis_password": KEY_A}}, {"jobs.redis_password": KEY_A},
                 # pydantic-settings reads these in any case: so does the check
                 {"ingress": {"API_KEYS": KEY_A}}, {"ingress.API_KEYS": KEY_A}, {"Ingress": {"Api_Keys": KEY_A}},
                 {"jobs": {"REDIS_PASSWORD": KEY_A}}):
        with pytest.raises(AuthConfigError, match="must not be in the Serve config") as err:
            build_app(args)
        assert KEY_A not in str(err.value) and next(iter(args)).split(".")[0].lower() in str(err.value)
    monkeypatch.setenv("SERVE_APP_INGRESS_API_KEYS", "short")
    with pytest.raises(AuthConfigError, match="5 characters long"):
        build_app({})


def test_config_check_rejects_keys_in_args():
    config = {"applications": [{"name": "serve-app", "route_prefix": "/", "import_path": "serve_app.builder:build_app",
                                "args": {"ingress": {"api_keys": KEY_A}}}]}
    problems = check_config(config)
    assert any("must not be in the Serve config" in p for p in problems), problems
    assert not any(KEY_A in p for p in problems)


def test_keys_from_the_environment_never_travel_in_the_dumped_settings(monkeypatch):
    monkeypatch.setenv("SERVE_APP_INGRESS_API_KEYS", f"{KEY_A},{KEY_B}")
    settings = load_settings({})
    assert settings.ingress.api_key_list() == [KEY_A, KEY_B]
    dumped = settings.model_dump()
    assert "api_keys" not in dumped["ingress"] and KEY_A not in repr(dumped)
    # What a replica does with the dump: its own environment supplies the keys again.
    assert load_settings(dumped).ingress.api_key_list() == [KEY_A, KEY_B]


# --- keys from a file, rotated without a restart -------------------------------------------------------

def _write_secret_volume(folder, text: str, generation: int) -> str:
    """Write the keys as the kubelet updates a Secret volume: a new timestamped folder, then an
    atomic swap of the `..data` symlink that `keys` points through."""
    data = folder / f"..{generation}"
    data.mkdir()
    (data / "keys").write_text(text)
    tmp = folder / "..data_tmp"
    os.symlink(data.name, tmp)
    os.replace(tmp, folder / "..data")
    if not (folder / "keys").is_symlink():
        os.symlink("..data/keys", folder / "keys")
    return str(folder / "keys")


def test_keys_file_is_read_again_when_the_secret_rotates(tmp_path, caplog):
    path = _write_secret_volume(tmp_path, f"# rotation 1\n{KEY_A}\n", 1)
    keys = KeysFile(path, interval_s=0)
    assert keys.keys().identify(KEY_A) == auth.key_id(KEY_A) and keys.keys().identify(KEY_B) is None
    _write_secret_volume(tmp_path, f"{KEY_B}\n", 2)
    assert keys.keys().identify(KEY_B) and keys.keys().identify(KEY_A) is None
    assert keys.reloads == 2
    # A bad rotation (a short key) keeps the keys read before, and says so without the key.
    caplog.set_level(logging.ERROR, logger="serve_app")
    _write_secret_volume(tmp_path, "tooshort\n", 3)
    assert keys.keys().identify(KEY_B)
    assert "keeping the 1 keys read before" in caplog.text and "tooshort" not in caplog.text


def test_a_keys_file_rotated_to_bytes_that_are_not_utf8_keeps_the_keys_and_one_with_a_bom_reads(tmp_path, caplog):
    """A Secret made `--from-file` of a Latin-1 or binary file: an error logged, the keys read before kept
    (it used to raise, 500 on every route once a second). A byte-order mark an editor wrote is not part of a key."""
    path = _write_secret_volume(tmp_path, "\ufeff" + KEY_A + "\n", 1)
    keys = KeysFile(path, interval_s=0)
    assert keys.keys().identify(KEY_A)
    folder = tmp_path / "..2"
    folder.mkdir()
    (folder / "keys").write_bytes(b"\xff\xfe" + KEY_B.encode("latin-1") + b"\xe9\n")
    os.symlink(folder.name, tmp_path / "..data_tmp")
    os.replace(tmp_path / "..data_tmp", tmp_path / "..data")
    caplog.set_level(logging.ERROR, logger="serve_app")
    assert keys.keys().identify(KEY_A) and keys.keys().identify(KEY_B) is None
    assert "not UTF-8 text" in caplog.text and "keeping the 1 keys read before" in caplog.text


def test_keys_file_is_looked_at_once_per_interval(tmp_path):
    now = [0.0]
    path = _write_secret_volume(tmp_path, KEY_A, 1)
    keys = KeysFile(path, interval_s=1.0, clock=lambda: now[0])
    assert keys.keys().identify(KEY_A)
    _write_secret_volume(tmp_path, KEY_B, 2)
    now[0] = 0.5
    assert keys.keys().identify(KEY_A) and not keys.keys().identify(KEY_B)
    now[0] = 1.0
    assert keys.keys().identify(KEY_B) and not keys.keys().identify(KEY_A)


def test_missing_or_empty_keys_file_refuses_to_start(tmp_path):
    with pytest.raises(AuthConfigError, match="Refusing to start.*No such file"):
        startup_check(ingress(api_keys_file=str(tmp_path / "absent")), "0.0.0.0")
    (tmp_path / "empty").write_text("# no keys yet\n")
    with pytest.raises(AuthConfigError, match="holds no key"):
        startup_check(ingress(api_keys_file=str(tmp_path / "empty")), "0.0.0.0")


def test_a_rotated_key_works_through_the_api_without_a_restart(app_client, tmp_path, monkeypatch):
    folder = tmp_path / "secret"
    folder.mkdir()
    path = _write_secret_volume(folder, f"{KEY_A}\n", 1)
    monkeypatch.setattr(auth, "KEYS_FILE_CHECK_INTERVAL_S", 0.0)
    monkeypatch.setattr(auth, "_FILES", {path: KeysFile(path, interval_s=0)})
    install(ingress={"api_keys_file": path})
    assert app_client.post("/translation", json=BODY, headers={"X-API-Key": KEY_A}).status_code == 200
    assert app_client.post("/translation", json=BODY, headers={"X-API-Key": KEY_B}).status_code == 403
    _write_secret_volume(folder, f"{KEY_B}\n", 2)
    assert app_client.post("/translation", json=BODY, headers={"X-API-Key": KEY_B}).status_code == 200
    assert app_client.post("/translation", json=BODY, headers={"X-API-Key": KEY_A}).status_code == 403


# --- what a caller without a key may read ---------------------------------------------------------------

class FailedEmbedder(FakeEmbedder):
    """A deployment Serve gave up on, with a path and an exception text in its message."""

    async def call(self, method, *args, **kwargs):
        if method == "ready":
            from serve_app.errors import ModelUnavailable
            raise ModelUnavailable("no replica")
        return await super().call(method, *args, **kwargs)

    async def deployment_status(self):
        return "DEPLOY_FAILED", "Cause: ModelLoadError: no weights in /models/secret-path/minilm"


@pytest.mark.parametrize("settings, headers, detailed", [
    ({}, {}, True),                                        # make run: loopback, keys off
    ({"auth_disabled": True}, {}, False),                  # a cluster behind an authenticating proxy
    ({"api_keys": KEY_A}, {}, False),                      # no key
    ({"api_keys": KEY_A}, {"X-API-Key": KEY_B}, False),    # a wrong key: /readyz still answers, scrubbed
    ({"api_keys": KEY_A}, {"X-API-Key": KEY_A}, True),     # the operator's key
])
def test_readyz_shows_failure_details_only_to_callers_with_a_key(app_client, settings, headers, detailed):
    install(embedder=FailedEmbedder(), ingress=settings)
    resp = app_client.get("/readyz", headers=headers)
    assert resp.status_code == 503
    state = resp.json()["models"]["Embedder"]
    if detailed:
        assert "/models/secret-path" in state
    else:
        assert state == "failed" and "/models" not in resp.text and "ModelLoadError" not in resp.text
    assert resp.json()["models"]["Translator"] == "ready"


def test_unexpected_errors_reach_neither_the_body_nor_the_log_with_the_request_text(app_client, caplog):
    secret_text = "my card number is 4111 1111 1111 1111"
    install(FakeTranslator(fail=KeyError(secret_text)))
    caplog.set_level(logging.ERROR)
    body = {"payload": {"fromLang": "en", "toLang": "pt", "records": [{"id": "1", "text": secret_text}]}}
    resp = app_client.post("/translation", json=body)
    assert resp.status_code == 500 and resp.json()["error_type"] == "internal_error"
    assert "4111" not in resp.text
    assert "KeyError" in caplog.text and "message withheld" in caplog.text
    assert "4111" not in caplog.text


def test_an_unexpected_error_is_answered_inside_the_app_not_raised_to_the_server():
    """Past the app, Serve logs an exception with its message (which may quote the request): the ingress
    answers it and returns, where Starlette's handler for `Exception` would answer and re-raise."""
    from fastapi.testclient import TestClient

    from serve_app.api import app, set_service

    install(FakeTranslator(fail=KeyError("my card number is 4111 1111 1111 1111")))
    try:
        with TestClient(app, raise_server_exceptions=True) as client:
            resp = client.post("/translation", json=BODY)
    finally:
        set_service(None)
    assert resp.status_code == 500 and resp.json()["error_type"] == "internal_error"
    assert "4111" not in resp.text and resp.headers.get("x-request-id")


def test_exceptions_are_described_without_their_messages():
    from deployments.errors import describe_exception

    class RemoteError(Exception):  # as ray.exceptions.RayTaskError: the model's exception in `cause`
        def __init__(self, cause):
            super().__init__(f"remote traceback ... {cause}")
            self.cause = cause

    secret = "patient John Doe, born 1970"
    for exc in (ValueError(secret), RemoteError(KeyError(secret)), ExceptionGroup("g", [TypeError(secret)])):
        try:
            raise exc
        except Exception as caught:
            text = describe_exception(caught)
        assert secret not in text and "message withheld" in text
        assert text.split()[0] in ("ValueError", "KeyError", "TypeError")
        assert "test_auth.py" in text  # where it was raised


def test_config_check_rejects_secrets_in_args_and_in_runtime_env_vars():
    """The Redis password was silently dropped from args (the JobManager connected without it), and either secret
    in a runtime_env's env_vars was printed by `serve config` with the rest: both are refused, neither quoted."""
    app = {"name": "serve-app", "route_prefix": "/", "import_path": "serve_app.builder:build_app",
           "args": {"jobs": {"redis_password": KEY_A}},
           "runtime_env": {"env_vars": {"SERVE_APP_INGRESS_API_KEYS": KEY_A, "OMP_NUM_THREADS": "1"}},
           "deployments": [{"name": "Ingress", "ray_actor_options": {
               "runtime_env": {"env_vars": {"serve_app_jobs_redis_password": KEY_B}}}}]}  # (read in any case)
    problems = check_config({"applications": [app]})
    assert [p.split(":")[0] for p in problems if "must not be in the Serve config" in p] == [
        "applications[serve-app].runtime_env.env_vars.SERVE_APP_INGRESS_API_KEYS",
        "applications[serve-app].args.jobs.redis_password",
        "applications[serve-app].deployments[Ingress].ray_actor_options.runtime_env.env_vars."
        "serve_app_jobs_redis_password"], problems
    assert not any(KEY_A in p or KEY_B in p for p in problems)
