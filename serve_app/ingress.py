"""The ingress deployment: Serve's HTTP entry, mounting the FastAPI app of `api.py`.

It may also hold models: a model with `placement: ingress` (settings) has no deployment of its
own; each Ingress replica loads it and batches its requests in-process (`PlacedModels`).
"""

from __future__ import annotations

import logging
from typing import Any, Optional

from ray import serve
from ray.serve.handle import DeploymentHandle

from . import middleware
from .api import app, set_service
from .cache import CacheMetrics, ResponseCache
from .clients import INGRESS_DEPLOYMENT, HandleClient, LocalClient, ModelClient
from .custom_models import deployment_name
from .service import Service
from .settings import AppSettings

logger = logging.getLogger("ray.serve")

#: HTTP requests one ingress replica handles at once. The ingress only validates
#: and fans out (no model), so it holds many concurrent requests cheaply.
INGRESS_MAX_ONGOING_REQUESTS = 512


class PlacedModels:
    """The models placed in this Ingress replica (`placement: ingress`), by deployment name: each is
    the model deployment's own class (deployments/), constructed as its replica would be, behind a
    `LocalClient`. Their batch knobs start at the deployments' defaults; `reconfigure` (the
    Ingress's `user_config`) sets them."""

    def __init__(self, settings: AppSettings):
        from deployments.custom_model import CustomModel
        from deployments.embedder import Embedder
        from deployments.translator import Translator

        placed = settings.placed_in_ingress()
        self.clients: dict[str, LocalClient] = {}
        for name, cls, section in (("Translator", Translator, settings.translation),
                                   ("Embedder", Embedder, settings.embeddings)):
            if name in placed:
                self.clients[name] = LocalClient(name, cls.func_or_class(section.model_dump()))
        for spec in settings.models:  # custom models (`models:`), as their `Model.<name>` replica
            name = deployment_name(spec.name)
            if name in placed:
                self.clients[name] = LocalClient(name, CustomModel.func_or_class(spec.model_dump()))

    def names(self) -> list[str]:
        return sorted(self.clients)

    def reconfigure(self, user_config: Optional[dict]) -> None:
        """`{Translator: {max_batch_size: 32, ...}, Embedder: {...}, Model.iris: {...}}`: each model's
        batch config, as its own deployment's `user_config` would carry it."""
        unknown = sorted(set(user_config or {}) - set(self.clients))
        if unknown:
            raise ValueError(f"Ingress user_config has {unknown!r}, but the models placed in the Ingress are "
                             f"{self.names()!r} (a model's `placement: ingress` puts it here)")
        for name, batch in (user_config or {}).items():
            self.clients[name].replica.reconfigure(batch)

    def check_health(self) -> None:
        for client in self.clients.values():
            client.replica.check_health()

    async def call(self, name: str, method: str, *args: Any, **kwargs: Any) -> Any:
        if name not in self.clients:
            raise ValueError(f"no model {name!r} is placed in the Ingress (placed: {self.names()!r})")
        return await self.clients[name].call(method, *args, **kwargs)


def build_service(settings: AppSettings, placed: PlacedModels, translator: Optional[DeploymentHandle],
                  embedder: Optional[DeploymentHandle], models: Optional[dict[str, Optional[DeploymentHandle]]] = None,
                  jobs: Optional[DeploymentHandle] = None) -> Service:
    """The ingress's Service: a client per model (its deployment's handle, or the model placed here
    when there is no handle), the response cache and the job store's client."""
    retry = settings.ingress.retry_after_s
    retry_timeout = settings.ingress.replica_retry_timeout_s

    def handle_client(name: str, handle: DeploymentHandle) -> HandleClient:
        return HandleClient(name, handle, retry_after_s=retry, retry_timeout_s=retry_timeout)

    def model_client(name: str, handle: Optional[DeploymentHandle]) -> ModelClient:
        return placed.clients[name] if handle is None else handle_client(name, handle)

    return Service(
        settings,
        translator=model_client("Translator", translator),
        embedder=model_client("Embedder", embedder),
        # custom models (`models:`): name -> the client of its deployment `Model.<name>`, or of the
        # model placed here (no handle)
        models={name: model_client(deployment_name(name), handle) for name, handle in (models or {}).items()},
        # One cache per ingress replica, in its memory (None when cache.enabled is false).
        cache=ResponseCache.from_settings(settings.cache, observer=CacheMetrics.in_serve()),
        # the JobManager deployment (POST /jobs), None when jobs.enabled is false
        jobs=handle_client("JobManager", jobs) if jobs is not None else None,
    )


@serve.deployment(
    name=INGRESS_DEPLOYMENT,
    max_ongoing_requests=INGRESS_MAX_ONGOING_REQUESTS,
    # The ingress does little CPU work; a small share leaves whole CPUs to models.
    ray_actor_options={"num_cpus": 0.1},
)
@serve.ingress(app)
class Ingress:
    def __init__(self, translator: Optional[DeploymentHandle], embedder: Optional[DeploymentHandle], settings: dict,
                 models: Optional[dict[str, Optional[DeploymentHandle]]] = None, jobs: Optional[DeploymentHandle] = None):
        self.settings = AppSettings.model_validate(settings)
        # Models with `placement: ingress` (no deployment of their own, so no handle) load here.
        self.placed = PlacedModels(self.settings)
        set_service(build_service(self.settings, self.placed, translator, embedder, models, jobs))
        logger.info("Ingress ready with limits %s, response cache %s, models placed here: %s",
                    self.settings.ingress.model_dump(), self.settings.cache.model_dump(),
                    self.placed.names() or "none")

    def reconfigure(self, user_config: dict) -> None:
        """The batch knobs of the models placed in this Ingress, by deployment name
        (`user_config: {Translator: {max_batch_size: 32, ...}}`); `serve deploy` changes them
        without a restart, as a model deployment's own user_config does."""
        self.placed.reconfigure(user_config)

    def check_health(self) -> None:
        """A model placed here that keeps failing marks this replica unhealthy, as it would its own."""
        self.placed.check_health()

    async def call_placed(self, name: str, method: str, *args: Any, **kwargs: Any) -> Any:
        """A call to a model placed in this Ingress from another deployment (the JobManager's job work)."""
        return await self.placed.call(name, method, *args, **kwargs)

    async def drain(self, timeout_s: float = 30.0) -> dict:
        """Stop admitting model requests (503 `shutting_down` + Retry-After, /readyz 503) and
        wait up to `timeout_s` for the admitted ones to finish. `python -m serve_app.run`
        calls this on Ctrl-C / SIGTERM before it shuts Serve down."""
        # Through the module: this class is pickled by value, a global would be a copy.
        result = await middleware.DRAIN.drain(timeout_s)
        # The launcher calls every replica this way, and counts them by this id.
        result["replica"] = serve.get_replica_context().replica_id.unique_id
        logger.info("Ingress drained: %s", result)
        return result
