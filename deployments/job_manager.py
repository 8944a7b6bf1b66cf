"""The JobManager deployment: holds every asynchronous job and computes them in the background.

One replica (its memory is the job store), called by every ingress replica, so any
ingress sees every job and an ingress restart loses none. It runs each job through
the same `Service` as the HTTP routes (same validation, chunking and model calls),
but with the job limits (`jobs.*`) and with every model call marked `background`:
the model replicas compute job records only when no interactive request waits.

What a restart of *this* replica loses: every job (queued, running and finished);
clients then get 404 for their ids. Jobs are meant for work that can be resubmitted.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
from typing import Any, Callable, Optional

from pydantic import BaseModel, ValidationError
from ray import serve
from ray.serve.handle import DeploymentHandle

from serve_app.clients import INGRESS_DEPLOYMENT, HandleClient, ModelClient, ViaIngressClient
from serve_app.custom_models import deployment_name
from serve_app.errors import InvalidRequest, ServeAppError, describe_validation_errors
from serve_app.jobs import Job, JobFinished, JobStore, UnsupportedTask, job_settings
from serve_app.schemas import EmbeddingsRequest, PredictRequest, TranslationPayload
from serve_app.service import Service
from serve_app.settings import AppSettings

logger = logging.getLogger("ray.serve")

#: model methods that compute records (the ones that take `background=`)
COMPUTE_METHODS = frozenset({"translate", "embed", "predict"})


class BackgroundClient:
    """A model client whose compute calls are marked `background=True` (they queue behind
    interactive requests in the replicas) and report the records each call finished."""

    def __init__(self, inner: ModelClient, on_records: Callable[[int], None]):
        self.name = inner.name
        self._inner = inner
        self._on_records = on_records

    async def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        if method not in COMPUTE_METHODS:
            return await self._inner.call(method, *args, **kwargs)
        result = await self._inner.call(method, *args, background=True, **kwargs)
        item = args[0] if args else kwargs.get("chunk")
        self._on_records(len(getattr(item, "texts", item)))
        return result

    def __getattr__(self, name: str) -> Any:  # deployment_status, retried, ...
        return getattr(self._inner, name)


def submission_key(request_id: Optional[str], task: str, payload: Any) -> Optional[str]:
    """What makes two job submissions the same one: the request id and the exact task and payload
    (a client that reuses an id for another payload gets a new job). None without a request id."""
    if not request_id:
        return None
    body = json.dumps([task, payload], sort_keys=True, separators=(",", ":"), default=str)
    return f"{request_id}:{hashlib.sha256(body.encode()).hexdigest()}"


def _parse(model: type[BaseModel], payload: Any) -> BaseModel:
    try:
        return model.model_validate(payload)
    except ValidationError as exc:
        errors = [{**e, "loc": ("payload", *e["loc"])} for e in exc.errors()]
        raise InvalidRequest(describe_validation_errors(errors)) from None


class JobRunner:
    """The job store plus the tasks computing its jobs (no Ray: unit tests drive it with fakes)."""

    def __init__(self, settings: AppSettings, clients: dict[str, ModelClient]):
        self.settings = settings
        limits = settings.jobs
        self.store = JobStore(max_unfinished_jobs=limits.max_unfinished_jobs,
                              max_finished_jobs=limits.max_finished_jobs, result_ttl_s=limits.result_ttl_s,
                              retry_after_s=settings.ingress.retry_after_s)
        self._tasks: dict[str, asyncio.Task] = {}
        self._running = asyncio.Semaphore(limits.max_running_jobs)
        self._clients = clients
        #: the HTTP limits with the job limits in their place (model_timeout_s = jobs.job_timeout_s,
        #: so a job's deadline is the Service's own)
        self._job_settings = job_settings(settings)
        #: validates submissions (and answers model info) with the job limits
        self._validator = self._service(clients)

    def _service(self, clients: dict[str, ModelClient]) -> Service:
        models = {name: c for name, c in clients.items() if name not in ("translation", "embeddings")}
        return Service(self._job_settings, translator=clients["translation"],
                       embedder=clients["embeddings"], models=models)

    def _service_for(self, job: Job) -> Service:
        """A Service whose compute calls run in the background and count the job's progress."""
        def done(records: int) -> None:
            job.records_done += records

        return self._service({name: BackgroundClient(c, done) for name, c in self._clients.items()})

    async def submit(self, task: str, payload: Any, request_id: Optional[str] = None) -> dict:
        """Validate the job now (the client hears 4xx at once) and queue it; returns its view.

        A submission with the `request_id` (the HTTP request's `x-request-id`) and the task and
        payload of a job still held is the same submission sent again (HAProxy resends a request
        whose Ingress replica died before answering; a client may retry with its own id): it gets
        that job's view, and nothing is queued twice."""
        key = submission_key(request_id, task, payload)
        if key is not None and (existing := self.store.find(key)) is not None:
            logger.info("job %s: submitted again with request id %s; not queued twice", existing.id, request_id)
            return existing.view()
        service = self._validator
        if task == "translation":
            body = _parse(TranslationPayload, payload)
            texts, *_ = await service.validate_translation(body)
            total = len(texts)
        elif task == "embeddings":
            body = _parse(EmbeddingsRequest, payload)
            total = len(service.validate_embeddings(body)[0])
        elif task in service.custom_models:
            body = _parse(PredictRequest, payload)
            total = len(service.validate_predict(task, body.inputs)[1])
        else:
            tasks = ", ".join(repr(t) for t in ("translation", "embeddings", *sorted(service.custom_models)))
            raise UnsupportedTask(f"Unknown task {task!r}; tasks: {tasks}.")
        job = self.store.create(task, body, total, submission_key=key)
        self._tasks[job.id] = asyncio.create_task(self._run(job), name=f"job-{job.id}")
        logger.info("job %s queued: %s, %d records", job.id, task, total)
        return job.view()

    async def _run(self, job: Job) -> None:
        try:
            async with self._running:
                self.store.start(job)
                # Past jobs.job_timeout_s the Service's deadline raises RequestTimeout (`timeout`).
                result = await self._compute(self._service_for(job), job)
            self.store.finish(job, "succeeded", result=result)
        except asyncio.CancelledError:
            self.store.finish(job, "cancelled")
            raise
        except ServeAppError as exc:
            self.store.finish(job, "failed", error={"error": exc.message, "error_type": exc.error_type})
        except Exception as exc:  # never leave a job running forever
            logger.exception("job %s failed", job.id)
            self.store.finish(job, "failed", error={"error": f"The job failed: {type(exc).__name__}.",
                                                    "error_type": "internal_error"})
        finally:
            self._tasks.pop(job.id, None)
        logger.info("job %s %s: %d/%d records", job.id, job.status, job.records_done, job.records_total)

    @staticmethod
    async def _compute(service: Service, job: Job) -> Any:
        body = job.payload
        if job.task == "translation":
            response, _ = await service.translate(body)
        elif job.task == "embeddings":
            response, _ = await service.embed(body)
        else:
            response, _ = await service.predict(job.task, body.inputs)
        return response.model_dump(mode="json")

    def get(self, job_id: str) -> dict:
        return self.store.get(job_id).view()

    async def cancel(self, job_id: str) -> dict:
        """Cancel a queued or running job: its calls still waiting are never computed."""
        job = self.store.get(job_id)
        if job.finished:
            raise JobFinished(f"Job {job_id!r} already {job.status}; there is nothing to cancel.")
        task = self._tasks.get(job_id)
        if task is not None:
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                pass
        self.store.finish(job, "cancelled")  # no-op when the task recorded it
        return job.view()

    def stats(self) -> dict[str, int]:
        return self.store.counts()


@serve.deployment(
    name="JobManager",
    # Its memory is the job store: exactly one replica (see the module docstring).
    num_replicas=1,
    # Submits, polls and cancels are quick; many clients poll at once.
    max_ongoing_requests=1024,
    # It only waits on model calls.
    ray_actor_options={"num_cpus": 0.05},
)
class JobManager:
    def __init__(self, translator: Optional[DeploymentHandle], embedder: Optional[DeploymentHandle], settings: dict,
                 models: Optional[dict[str, Optional[DeploymentHandle]]] = None):
        self.settings = AppSettings.model_validate(settings)
        retry = self.settings.ingress.retry_after_s
        retry_timeout = self.settings.ingress.replica_retry_timeout_s
        ingress: Optional[HandleClient] = None

        def client(name: str, handle: Optional[DeploymentHandle]) -> ModelClient:
            nonlocal ingress
            if handle is None:
                # Placed in the Ingress (`placement: ingress`): no deployment of its own, so job work
                # goes to the Ingress replicas' model queues. By name: the Ingress is bound after
                # this deployment (it holds this one's handle).
                if ingress is None:
                    handle = serve.get_deployment_handle(INGRESS_DEPLOYMENT, serve.get_replica_context().app_name)
                    ingress = HandleClient(INGRESS_DEPLOYMENT, handle, retry_after_s=retry,
                                           retry_timeout_s=retry_timeout)
                return ViaIngressClient(name, ingress)
            return HandleClient(name, handle, retry_after_s=retry, retry_timeout_s=retry_timeout)

        clients = {"translation": client("Translator", translator), "embeddings": client("Embedder", embedder)}
        clients.update({name: client(deployment_name(name), h) for name, h in (models or {}).items()})
        self.runner = JobRunner(self.settings, clients)
        logger.info("JobManager ready: %s", self.settings.jobs.model_dump())

    async def submit(self, task: str, payload: Any, request_id: Optional[str] = None) -> dict:
        return await self.runner.submit(task, payload, request_id)

    # Every method is a coroutine: they run on the replica's event loop, with the job tasks,
    # never on a thread beside them (the store is not locked).
    async def get(self, job_id: str) -> dict:
        return self.runner.get(job_id)

    async def cancel(self, job_id: str) -> dict:
        return await self.runner.cancel(job_id)

    async def stats(self) -> dict[str, int]:
        return self.runner.stats()

    async def ready(self) -> dict:
        return {"deployment": "JobManager"}
