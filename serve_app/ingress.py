"""The ingress deployment: Serve's HTTP entry, mounting the FastAPI app of `api.py`."""

from __future__ import annotations

import logging
from typing import Optional

from ray import serve
from ray.serve.handle import DeploymentHandle

from . import middleware
from .api import app, set_service
from .cache import CacheMetrics, ResponseCache
from .clients import HandleClient
from .custom_models import deployment_name
from .service import Service
from .settings import AppSettings

logger = logging.getLogger("ray.serve")

#: HTTP requests one ingress replica handles at once. The ingress only validates
#: and fans out (no model), so it holds many concurrent requests cheaply.
INGRESS_MAX_ONGOING_REQUESTS = 512


@serve.deployment(
    name="Ingress",
    max_ongoing_requests=INGRESS_MAX_ONGOING_REQUESTS,
    # The ingress does little CPU work; a small share leaves whole CPUs to models.
    ray_actor_options={"num_cpus": 0.1},
)
@serve.ingress(app)
class Ingress:
    def __init__(self, translator: DeploymentHandle, embedder: DeploymentHandle, settings: dict,
                 models: Optional[dict[str, DeploymentHandle]] = None, jobs: Optional[DeploymentHandle] = None):
        self.settings = AppSettings.model_validate(settings)
        retry = self.settings.ingress.retry_after_s
        retry_timeout = self.settings.ingress.replica_retry_timeout_s
        set_service(Service(
            self.settings,
            translator=HandleClient("Translator", translator, retry_after_s=retry, retry_timeout_s=retry_timeout),
            embedder=HandleClient("Embedder", embedder, retry_after_s=retry, retry_timeout_s=retry_timeout),
            # custom models (`models:`): name -> the client of its deployment `Model.<name>`
            models={name: HandleClient(deployment_name(name), handle, retry_after_s=retry,
                                       retry_timeout_s=retry_timeout)
                    for name, handle in (models or {}).items()},
            # One cache per ingress replica, in its memory (None when cache.enabled is false).
            cache=ResponseCache.from_settings(self.settings.cache, observer=CacheMetrics.in_serve()),
            # the JobManager deployment (POST /jobs), None when jobs.enabled is false
            jobs=HandleClient("JobManager", jobs, retry_after_s=retry, retry_timeout_s=retry_timeout)
            if jobs is not None else None,
        ))
        logger.info("Ingress ready with limits %s, response cache %s", self.settings.ingress.model_dump(),
                    self.settings.cache.model_dump())

    async def drain(self, timeout_s: float = 30.0) -> dict:
        """Stop admitting model requests (503 `shutting_down` + Retry-After, /readyz 503) and
        wait up to `timeout_s` for the admitted ones to finish. `python -m serve_app.run`
        calls this on Ctrl-C / SIGTERM before it shuts Serve down."""
        # Through the module: this class is pickled by value, a global would be a copy.
        result = await middleware.DRAIN.drain(timeout_s)
        logger.info("Ingress drained: %s", result)
        return result
