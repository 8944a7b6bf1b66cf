"""A Serve application's settings as its build reads them. Serve builds an application (`build_app`) in the
application's `runtime_env`, so its `env_vars` are part of the environment its settings come from: the config check
and HAProxy's bounds (proxy_shedding.py), which run in the launcher, read them so too."""

from __future__ import annotations

import contextlib
import os
from typing import Any, Iterator, Mapping

from .settings import AppSettings, load_settings


def app_settings(app: Mapping[str, Any]) -> AppSettings:
    """`load_settings(app["args"])` in the environment with the application's runtime_env env_vars."""
    runtime_env = app.get("runtime_env")
    env_vars = runtime_env.get("env_vars") if isinstance(runtime_env, Mapping) else None
    with _environment(env_vars if isinstance(env_vars, Mapping) else {}):
        return load_settings(app.get("args"))


@contextlib.contextmanager
def _environment(env_vars: Mapping[Any, Any]) -> Iterator[None]:
    """os.environ with `env_vars` while the settings are read; as it was afterwards."""
    overlay = {str(name): str(value) for name, value in env_vars.items()}
    saved = {name: os.environ.get(name) for name in overlay}
    os.environ.update(overlay)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
