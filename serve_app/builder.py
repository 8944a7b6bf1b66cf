"""The typed application builder: `serve_config.yaml` -> a Serve Application.

`serve run serve_config.yaml` imports `serve_app.builder:build_app` and passes
the application's `args:`; from the command line,
`serve run serve_app.builder:build_app translation.backend=transformers translation.model=...`
does the same with dotted keys. Deployment options (replicas, autoscaling,
batch sizes) are set per deployment in the `deployments:` section of the config.
"""

from __future__ import annotations

from typing import Any, Optional

from ray.serve import Application

from deployments.custom_model import CustomModel
from deployments.embedder import Embedder
from deployments.model_module import deployment_name
from deployments.translator import Translator

from .auth import reject_secrets_in_args, serve_http_host, startup_check
from .ingress import Ingress
from .jobs.manager import JobManager
from .settings import AppSettings, load_settings


def build_app(args: Optional[dict[str, Any]] = None) -> Application:
    reject_secrets_in_args(args)
    settings: AppSettings = load_settings(args)
    # Fail closed: no keys on a non-loopback host, or an unsafe key, stops the app here, with the
    # reason in `serve status` (every Ingress replica checks again: serve_app/auth.py).
    startup_check(settings.ingress, serve_http_host())
    # A model with `placement: ingress` has no deployment: each Ingress replica loads it (None here).
    placed = settings.placed_in_ingress()
    translator = None if "Translator" in placed else Translator.bind(settings.translation.model_dump())
    embedder = None if "Embedder" in placed else Embedder.bind(settings.embeddings.model_dump())
    # One deployment per custom model, named `Model.<name>`: its own `deployments:` entry
    # (replicas, autoscaling, batch size) in the Serve config; None for one placed in the Ingress.
    models = {
        spec.name: None if deployment_name(spec.name) in placed
        else CustomModel.options(name=deployment_name(spec.name)).bind(spec.model_dump())
        for spec in settings.models
    }
    # The job store: one replica that every ingress calls (serve_app/jobs/manager.py).
    jobs = (JobManager.bind(translator, embedder, settings.model_dump(), models)
            if settings.jobs.enabled else None)
    return Ingress.bind(translator, embedder, settings.model_dump(), models, jobs)
