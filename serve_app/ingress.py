"""The ingress deployment: Serve's HTTP entry, mounting the FastAPI app of `api.py`.

It may also hold models: a model with `placement: ingress` (settings) has no deployment of its
own; each Ingress replica loads it and batches its requests in-process (serve_app/placement.py).
"""

from __future__ import annotations

import logging
from typing import Any, Optional

from ray import serve

from deployments.health import ReplicaHealth

from . import auth, drain_signal, middleware
from .api import app, set_service
from .cache import ResponseCache
from .cache_metrics import CacheMetrics
from .model_clients import INGRESS_DEPLOYMENT
from .placement import Handle, PlacedModels, handle_client, model_clients
from .service import Service
from .settings import INGRESS_MAX_ONGOING_REQUESTS, AppSettings

logger = logging.getLogger("ray.serve")



def build_service(settings: AppSettings, placed: PlacedModels, translator: Handle, embedder: Handle,
                  models: Optional[dict[str, Handle]] = None, jobs: Handle = None) -> Service:
    """The ingress's Service: a client per model (serve_app/placement.py: its deployment's handle,
    or the model placed here when there is no handle), the response cache and the job store's client."""
    clients = model_clients(settings, translator, embedder, models, placed=lambda name: placed.clients[name])
    return Service(
        settings,
        translator=clients.translator,
        embedder=clients.embedder,
        models=clients.models,
        # One cache per ingress replica, in its memory (None when cache.enabled is false).
        cache=ResponseCache.from_settings(settings.cache, observer=CacheMetrics.in_serve()),
        # the JobManager deployment (POST /jobs), None when jobs.enabled is false
        jobs=handle_client(settings, "JobManager", jobs) if jobs is not None else None,
    )


@serve.deployment(
    name=INGRESS_DEPLOYMENT,
    max_ongoing_requests=INGRESS_MAX_ONGOING_REQUESTS,
    # The ingress does little CPU work; a small share leaves whole CPUs to models.
    ray_actor_options={"num_cpus": 0.1},
)
@serve.ingress(app)
class Ingress:
    def __init__(self, translator: Handle, embedder: Handle, settings: dict,
                 models: Optional[dict[str, Handle]] = None, jobs: Handle = None):
        # API keys are not in `settings` (never dumped): validation reads this replica's environment.
        self.settings = AppSettings.model_validate(settings)
        self.health = ReplicaHealth(INGRESS_DEPLOYMENT)
        auth.startup_check(self.settings.ingress, auth.serve_http_host())
        # Models with `placement: ingress` (no deployment of their own, so no handle) load here.
        self.placed = PlacedModels(self.settings)
        set_service(build_service(self.settings, self.placed, translator, embedder, models, jobs))
        # Under `make run`, the launcher's stop reaches every replica (serve_app/drain_signal.py).
        drain_signal.watch(serve.get_replica_context().replica_id.unique_id, self._drain)
        logger.info("Ingress ready with limits %s, response cache %s, models placed here: %s",
                    self.settings.ingress.model_dump(), self.settings.cache.model_dump(),
                    self.placed.names() or "none")

    def reconfigure(self, user_config: dict) -> None:
        """The batch knobs of the models placed in this Ingress, by deployment name
        (`user_config: {Translator: {max_batch_size: 32, ...}}`); `serve deploy` changes them
        without a restart, as a model deployment's own user_config does."""
        self.placed.reconfigure(user_config)

    def check_health(self) -> None:
        """A model placed here that keeps failing marks this replica unhealthy, as it would its own;
        so does a graceful shutdown already done (ReplicaHealth.shut_down)."""
        self.health.check()
        self.placed.check_health()

    def __del__(self) -> None:
        """Serve calls this at the end of a graceful shutdown."""
        if hasattr(self, "health"):
            self.health.shut_down()
        if hasattr(self, "placed"):  # their decoding loops and model threads stop too
            self.placed.shut_down()

    async def call_placed(self, name: str, method: str, *args: Any, **kwargs: Any) -> Any:
        """A call to a model placed in this Ingress from another deployment (the JobManager's job work)."""
        return await self.placed.call(name, method, *args, **kwargs)

    @staticmethod
    async def _drain(timeout_s: float) -> dict:
        """Stop admitting model requests (503 `shutting_down` + Retry-After, /readyz 503) and
        wait up to `timeout_s` for the admitted ones to finish. On Ctrl-C / SIGTERM,
        `python -m serve_app.run` has every replica do this before it shuts Serve down."""
        # Through the module: this class is pickled by value, a global would be a copy.
        result = await middleware.DRAIN.drain(timeout_s)
        logger.info("Ingress drained: %s", result)
        return result
