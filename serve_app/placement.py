"""Where a model runs: its own deployment, or placed in the Ingress. One choice, one interface.

Every model (Translator, Embedder, `Model.<name>`) runs either in a Serve deployment of its own,
reached from the Ingress by a Ray call through a DeploymentHandle, or (`placement: ingress`) inside
each Ingress replica, called in-process on the replica's event loop. Either way the same class
(deployments/) with the same batching answers, and the HTTP side sees it as a `ModelClient`
(serve_app/model_clients.py): `HandleClient` (serve_app/handle_client.py) for a deployment,
`LocalClient` for a model placed here, `ViaIngressClient` for the JobManager reaching a model placed
in the Ingress. The choice is made once, by the settings (`AppSettings.placed_in_ingress()`):
serve_app/builder.py binds no deployment for a placed model (its handle is None), and `model_clients`
below turns each handle, or its absence, into the client. docs/architecture.md explains when to
choose which.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

from ray.serve.handle import DeploymentHandle

from deployments.batch_config import parse_batch_config
from deployments.custom_model import CustomModel
from deployments.embedder import Embedder
from deployments.model_module import deployment_name
from deployments.translator import Translator

from .crash_journal import CrashJournal, journal_folder
from .handle_client import HandleClient
from .model_clients import COMPUTE_METHODS, LocalClient, ModelClient
from .settings import AppSettings

logger = logging.getLogger("serve_app")

#: A deployment's handle, or None when the model is placed in the Ingress.
Handle = Optional[DeploymentHandle]


class PlacedModels:
    """The models placed in this Ingress replica (`placement: ingress`), by deployment name: each is
    the model deployment's own class (deployments/), constructed as its replica would be, behind a
    `LocalClient`. Their batch knobs start at the deployments' defaults; `reconfigure` (the
    Ingress's `user_config`) sets them."""

    def __init__(self, settings: AppSettings, journal_folder: Callable[[], Optional[Path]] = journal_folder):
        placed, retry = settings.placed_in_ingress(), settings.ingress.retry_after_s
        self.clients: dict[str, LocalClient] = {}
        #: the records this process's models compute, for the process that outlives it (serve_app/crash_journal.py);
        #: None outside Ray, or where the node's folder cannot be written (the models are served all the same)
        self.journal = _crash_journal(journal_folder() if placed else None, settings.ingress.crash_quarantine_s)

        def client(name: str, replica: Any) -> LocalClient:
            return LocalClient(name, replica, retry, None if self.journal is None else self.journal.model(name))

        for name, cls, section in (("Translator", Translator, settings.translation),
                                   ("Embedder", Embedder, settings.embeddings)):
            if name in placed:
                self.clients[name] = client(name, cls.func_or_class(section.model_dump()))
        for spec in settings.models:  # custom models (`models:`), as their `Model.<name>` replica
            name = deployment_name(spec.name)
            if name in placed:
                self.clients[name] = client(name, CustomModel.func_or_class(spec.model_dump()))

    def names(self) -> list[str]:
        return sorted(self.clients)

    def reconfigure(self, user_config: Optional[dict]) -> None:
        """`{Translator: {max_batch_size: 32, ...}, Embedder: {...}, Model.iris: {...}}`: each model's
        batch config, as its own deployment's `user_config` would carry it."""
        unknown = sorted(set(user_config or {}) - set(self.clients))
        if unknown:
            raise ValueError(f"Ingress user_config has {unknown!r}, but the models placed in the Ingress are "
                             f"{self.names()!r} (a model's `placement: ingress` puts it here)")
        for name, batch in (user_config or {}).items():  # every model's checked first: none applied if one is bad
            parse_batch_config(batch, name)
        for name, batch in (user_config or {}).items():
            self.clients[name].replica.reconfigure(batch)

    def check_health(self) -> None:
        for client in self.clients.values():
            client.replica.check_health()

    def shut_down(self) -> None:
        """The Ingress replica's teardown is each placed model's (ModelReplica._shut_down)."""
        for client in self.clients.values():
            client.replica._shut_down()
        if self.journal is not None:
            self.journal.close()

    async def call(self, name: str, method: str, *args: Any, **kwargs: Any) -> Any:
        if name not in self.clients:
            raise ValueError(f"no model {name!r} is placed in the Ingress (placed: {self.names()!r})")
        client = self.clients[name]
        if client.journal is None or method not in COMPUTE_METHODS:
            return await client.call(method, *args, **kwargs)
        async with client.journal.holding(method, args):  # (a job's call: refused, or journaled while it computes)
            return await client.call(method, *args, **kwargs)


def _crash_journal(folder: Optional[Path], quarantine_s: float) -> Optional[CrashJournal]:
    if folder is None:
        return None
    try:
        return CrashJournal(folder, quarantine_s)
    except OSError as exc:
        logger.warning("no crash journal in %s (%s): an input that crashes a model placed here is not refused", folder,
                       exc)
        return None


@dataclass(frozen=True)
class ModelClients:
    """A client per model: what the Service (and through it the JobManager) calls."""

    translator: ModelClient
    embedder: ModelClient
    #: custom models (`models:`) by name (not deployment name)
    models: dict[str, ModelClient]


def handle_client(settings: AppSettings, name: str, handle: DeploymentHandle) -> HandleClient:
    """The client of a deployment, with the ingress's retry settings."""
    return HandleClient(name, handle, retry_after_s=settings.ingress.retry_after_s,
                        retry_timeout_s=settings.ingress.replica_retry_timeout_s,
                        quarantine_s=settings.ingress.crash_quarantine_s)


def model_clients(settings: AppSettings, translator: Handle, embedder: Handle, models: Optional[dict[str, Handle]],
                  placed: Callable[[str], ModelClient]) -> ModelClients:
    """The one place the two ways meet: a model with a handle has a deployment of its own; one
    without (None) is placed in the Ingress, and `placed(deployment name)` gives its client (a
    `LocalClient` in the Ingress, a `ViaIngressClient` in the JobManager)."""

    def client(name: str, handle: Handle) -> ModelClient:
        return placed(name) if handle is None else handle_client(settings, name, handle)

    return ModelClients(
        translator=client("Translator", translator),
        embedder=client("Embedder", embedder),
        models={name: client(deployment_name(name), handle) for name, handle in (models or {}).items()},
    )
