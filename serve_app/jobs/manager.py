"""The JobManager deployment: runs every asynchronous job, kept in the job store.

One replica, called by every ingress replica. The jobs themselves live in the job store
(`jobs.store`: a SQLite file on one machine, Redis on a cluster; serve_app/jobs/store), written as
they progress: a restart of this replica (crash, SIGKILL, node loss with Redis) or of `make run`
loses no job. The new replica takes the store's lease and resumes every queued or running job after
its last stored chunk (serve_app/jobs/runner.py); finished jobs stay readable until they expire.

Jobs are stamped with the Ray cluster they were submitted to: `RAY_CLUSTER_NAME`, which KubeRay sets in
every pod of a RayCluster. During a RayService's blue/green upgrade both clusters share the Redis store;
each JobManager runs its own cluster's jobs (the old code never runs the new cluster's), and the new one adopts
the old one's unfinished jobs once the old cluster is gone.

It computes each job through the same `Service` as the HTTP routes (same validation, chunking and
model calls), with the job limits (`jobs.*`) and every model call marked `background`: the model
replicas compute job records only when no interactive request waits.
"""

from __future__ import annotations

import asyncio
import logging
import os
from typing import Any, Optional

from ray import serve

from deployments.health import ReplicaHealth

from ..handle_client import HandleClient
from ..model_clients import INGRESS_DEPLOYMENT, ModelClient, ViaIngressClient
from ..placement import Handle, handle_client, model_clients
from ..settings import AppSettings
from .job import ANONYMOUS
from .metrics import JobGauges, export_forever
from .runner import JobRunner

logger = logging.getLogger("ray.serve")

#: the Ray cluster's name, which KubeRay sets in every pod of a RayCluster (the new cluster of a blue/green
#: upgrade has a new one); unset elsewhere: one unnamed cluster
CLUSTER_NAME_ENV = "RAY_CLUSTER_NAME"


@serve.deployment(
    name="JobManager",
    # One replica runs the jobs (it holds the store's lease); the jobs are in the store.
    num_replicas=1,
    # Submits, polls and cancels are quick; many clients poll at once.
    max_ongoing_requests=1024,
    # The reservations deploy/serve_profiles.py gives it (JOB_MANAGER_DEPLOYMENT); the config's win.
    ray_actor_options={"num_cpus": 0.05, "memory": 512 * 1024 * 1024},
)
class JobManager:
    async def __init__(self, translator: Handle, embedder: Handle, settings: dict,
                 models: Optional[dict[str, Handle]] = None):
        self.settings = AppSettings.model_validate(settings)
        self.health = ReplicaHealth("JobManager")
        ingress: Optional[HandleClient] = None

        def via_ingress(name: str) -> ModelClient:
            # Placed in the Ingress (`placement: ingress`): no deployment of its own, so job work
            # goes to the Ingress replicas' model queues. By name: the Ingress is bound after this
            # deployment (it holds this one's handle).
            nonlocal ingress
            if ingress is None:
                handle = serve.get_deployment_handle(INGRESS_DEPLOYMENT, serve.get_replica_context().app_name)
                ingress = handle_client(self.settings, INGRESS_DEPLOYMENT, handle)
            return ViaIngressClient(name, ingress)

        chosen = model_clients(self.settings, translator, embedder, models, placed=via_ingress)
        clients = {"translation": chosen.translator, "embeddings": chosen.embedder, **chosen.models}
        self.runner = JobRunner(self.settings, clients, cluster=os.environ.get(CLUSTER_NAME_ENV, ""))
        # Takes the store's lease and resumes the queued and running jobs of a previous replica.
        await self.runner.start()
        self._gauges = asyncio.create_task(export_forever(self.runner.stats, JobGauges()), name="job-gauges")
        jobs = self.settings.jobs
        logger.info("JobManager ready: store %s (%s), cluster %r, holding its lease: %s", jobs.store,
                    jobs.redis_url if jobs.store == "redis" else jobs.store_path, self.runner.store.cluster,
                    self.runner.holding)

    # Every method is a coroutine: they run on the replica's event loop, with the job tasks.
    async def submit(self, task: str, payload: Any, request_id: Optional[str] = None, owner: str = ANONYMOUS,
                     idempotency_key: Optional[str] = None) -> dict:
        return await self.runner.submit(task, payload, request_id, owner, idempotency_key)

    async def get(self, job_id: str, owner: str = ANONYMOUS, offset: Optional[int] = None,
                  limit: Optional[int] = None) -> dict:
        return await self.runner.get(job_id, owner, offset, limit)

    async def cancel(self, job_id: str, owner: str = ANONYMOUS) -> dict:
        return await self.runner.cancel(job_id, owner)

    async def stats(self) -> dict[str, int]:
        return await self.runner.stats()

    async def ready(self) -> dict:
        return {"deployment": "JobManager"}

    def check_health(self) -> None:
        self.health.check()  # fails once a graceful shutdown is done (ReplicaHealth.shut_down)

    async def __del__(self) -> None:
        # Graceful stop (Serve calls this): the jobs stay queued or running in the store, where
        # the next replica resumes them; the lease is released at once.
        self.health.shut_down()
        self._gauges.cancel()
        await self.runner.stop()
