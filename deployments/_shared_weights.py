"""Zero-copy model weights: one copy per node in Ray's object store, mapped by every replica.

Without it every Translator replica loads its own copy of the weights (a
Marian model is ~300 MB in float32; M2M100-418M ~1.7 GB). With
``translation.share_weights``:

1. a replica asks the node's *weights holder* for the model (a small named,
   detached actor keyed by model, dtype and node id, pinned to the node);
2. the first one is told to load: it loads the checkpoint as usual, turns its
   parameters and buffers into numpy arrays and sends them to the holder, which
   ``ray.put``s them (so the holder owns the object and it outlives the replica
   that loaded it); the replica then drops its own copy;
3. every replica, the first included, ``ray.get``s the arrays - numpy arrays
   read from the object store are read-only views of shared memory, no copy -
   and builds the model around them: the module tree is created on the meta
   device (no memory, no random init) and each parameter/buffer is set to
   ``torch.from_numpy`` of its array.

The holder counts the replicas (by pid, all on its node) that use the weights
and drops them - and exits - once none is alive, so deleting the application
frees the object store. If the loading replica dies before publishing, the next
waiting replica takes over.

CPU only: a GPU replica needs its own copy in device memory anyway.
Measured in ``bench/shared_weights.py`` (docs/benchmarks/weights-and-ctranslate2.md).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import warnings
from typing import Any, Callable

import numpy as np
import torch

logger = logging.getLogger("ray.serve")

#: Ray namespace of the holders: the same for every application and job on the cluster.
HOLDER_NAMESPACE = "serve-app-weights"
#: How often a waiting replica checks that the loading one is still alive, and the holder
#: that its users are; a dead loader is replaced, a holder with no live user exits.
LIVENESS_CHECK_INTERVAL_S = 1.0
#: Attempts to reach a holder that exits (its last user just died) as we ask it.
_HOLDER_ATTEMPTS = 3

# numpy has no bfloat16: such tensors travel as int16 and are viewed back.
_VIA_INT16 = {torch.bfloat16}


# --------------------------------------------------------------------------- pure helpers (no Ray)


def export_tensors(model: torch.nn.Module) -> dict[str, Any]:
    """Parameters and buffers (non-persistent ones too) as numpy arrays, each storage once.

    Returns ``{"arrays": {name: ndarray}, "aliases": {name: canonical name},
    "dtypes": {name: torch dtype name}}``; tied weights appear once in ``arrays``.
    """
    arrays: dict[str, np.ndarray] = {}
    aliases: dict[str, str] = {}
    dtypes: dict[str, str] = {}
    seen: dict[tuple[int, tuple, torch.dtype], str] = {}
    named = list(model.named_parameters(remove_duplicate=False)) + list(model.named_buffers(remove_duplicate=False))
    for name, tensor in named:
        if tensor is None:
            continue
        tensor = tensor.detach()
        key = (tensor.data_ptr(), tuple(tensor.shape), tensor.dtype)
        if key in seen:
            aliases[name] = seen[key]
            continue
        seen[key] = name
        cpu = tensor.to("cpu").contiguous()
        if cpu.dtype in _VIA_INT16:
            cpu = cpu.view(torch.int16)
        arrays[name] = cpu.numpy()
        dtypes[name] = str(tensor.dtype).replace("torch.", "")
    return {"arrays": arrays, "aliases": aliases, "dtypes": dtypes}


def _as_tensor(array: np.ndarray, dtype_name: str) -> torch.Tensor:
    with warnings.catch_warnings():
        # Arrays from the object store are read-only; the model only ever reads them.
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        tensor = torch.from_numpy(array)
    dtype = getattr(torch, dtype_name)
    return tensor.view(dtype) if dtype in _VIA_INT16 else tensor


def assign_tensors(model: torch.nn.Module, exported: dict[str, Any]) -> torch.nn.Module:
    """Point every parameter and buffer of ``model`` (built on the meta device) at the exported arrays.

    No copy: the tensors share memory with the arrays. Raises ``ValueError`` naming
    the tensors that the model has and the export lacks, or that stayed on meta.
    """
    arrays, aliases, dtypes = exported["arrays"], exported["aliases"], exported["dtypes"]
    tensors = {name: _as_tensor(array, dtypes[name]) for name, array in arrays.items()}
    for name, canonical in aliases.items():
        tensors[name] = tensors[canonical]
    params = {name for name, _ in model.named_parameters(remove_duplicate=False)}
    buffers = {name for name, _ in model.named_buffers(remove_duplicate=False)}
    missing = sorted((params | buffers) - set(tensors))
    if missing:
        raise ValueError(f"shared weights lack {len(missing)} tensors of the model, e.g. {missing[:5]}")
    shared_params: dict[str, torch.nn.Parameter] = {}
    for name in params | buffers:
        module_name, _, leaf = name.rpartition(".")
        module = model.get_submodule(module_name)
        if name in params:
            # one Parameter object per array, so tied weights stay tied
            source = aliases.get(name, name)
            if source not in shared_params:
                shared_params[source] = torch.nn.Parameter(tensors[name], requires_grad=False)
            module._parameters[leaf] = shared_params[source]
        else:
            module._buffers[leaf] = tensors[name]
    on_meta = [n for n, t in list(model.named_parameters()) + list(model.named_buffers()) if t.is_meta]
    if on_meta:
        raise ValueError(f"tensors left on the meta device after sharing: {on_meta[:5]}")
    return model


def build_model(source: str, dtype: torch.dtype, exported: dict[str, Any], local_files_only: bool = False):
    """The seq2seq model of ``source`` (config + generation config from it), weights from ``exported``."""
    from transformers import AutoConfig, AutoModelForSeq2SeqLM, GenerationConfig

    config = AutoConfig.from_pretrained(source, local_files_only=local_files_only)
    with torch.device("meta"):
        model = AutoModelForSeq2SeqLM.from_config(config, dtype=dtype)
    assign_tensors(model, exported)
    try:
        model.generation_config = GenerationConfig.from_pretrained(source, local_files_only=local_files_only)
    except OSError:  # no generation_config.json: keep the one derived from the config
        pass
    return model.eval()


def _load_private(source: str, dtype: torch.dtype, local_files_only: bool):
    from transformers import AutoModelForSeq2SeqLM

    return AutoModelForSeq2SeqLM.from_pretrained(source, dtype=dtype, local_files_only=local_files_only)


def holder_name(source: str, dtype: torch.dtype, node_id: str) -> str:
    """Name of the holder of ``source``'s weights in ``dtype`` on node ``node_id``."""
    key = hashlib.sha256(f"{os.path.abspath(source) if os.path.isdir(source) else source}\n{dtype}\n{node_id}"
                         .encode()).hexdigest()[:20]
    return f"weights-{key}"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


# --------------------------------------------------------------------------- the holder actor


class WeightsHolder:
    """Keeps one model's weights (an ObjectRef it owns) alive on one node while replicas use them."""

    def __init__(self, name: str):
        self.name = name
        self._ref = None
        self._loader: int | None = None  # pid of the replica loading the weights
        self._users: set[int] = set()  # pids of replicas that got the weights
        self._changed = asyncio.Event()
        self._watch = None

    async def acquire(self, pid: int) -> tuple[str, Any]:
        """``("ready", [ref])`` when the weights are there; ``("load", None)``: caller must load and publish."""
        if self._watch is None:
            self._watch = asyncio.get_running_loop().create_task(self._watch_users())
        while True:
            if self._ref is not None:
                self._users.add(pid)
                return "ready", [self._ref]
            if self._loader is None or not _pid_alive(self._loader):
                if self._loader is not None:
                    logger.warning("%s: loading replica (pid %d) died; pid %d takes over", self.name, self._loader, pid)
                self._loader = pid
                return "load", None
            try:
                await asyncio.wait_for(self._changed.wait(), LIVENESS_CHECK_INTERVAL_S)
            except asyncio.TimeoutError:
                pass

    def publish(self, exported: dict, pid: int) -> list:
        """Keep the loader's exported weights (as an object this actor owns, so it outlives the
        loader) and hand them to every waiter; returns ``[ref]``. The loader (``pid``) uses them too."""
        self._ref = self._put(exported)
        self._users.add(pid)
        self._loader = None
        self._wake()
        return [self._ref]

    def _put(self, value: Any):
        import ray

        return ray.put(value)

    def abandon(self) -> None:
        """The loader failed: let the next waiting replica load."""
        self._loader = None
        self._wake()

    def users(self) -> list[int]:
        return sorted(self._users)

    def _wake(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    async def _watch_users(self) -> None:
        while True:
            await asyncio.sleep(LIVENESS_CHECK_INTERVAL_S)
            self._users = {pid for pid in self._users if _pid_alive(pid)}
            if self._ref is not None and not self._users and self._loader is None:
                logger.info("%s: no replica uses the weights any more; releasing them", self.name)
                self._ref = None
                self._exit()
                return

    def _exit(self) -> None:
        import ray

        # from a background task exit_actor() would only end the task: ask Ray to end the actor
        ray.kill(ray.get_runtime_context().current_actor, no_restart=True)


# --------------------------------------------------------------------------- replica side


def _holder(name: str, node_id: str):
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    actor_cls = ray.remote(WeightsHolder)
    return actor_cls.options(
        name=name,
        namespace=HOLDER_NAMESPACE,
        lifetime="detached",
        get_if_exists=True,
        num_cpus=0,
        max_concurrency=1000,
        max_restarts=0,
        scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False),
    ).remote(name)


def load_shared(source: str, dtype: torch.dtype, local_files_only: bool = False):
    """The model of ``source`` built on this node's shared copy of its weights (loading it if first)."""
    import ray

    node_id = ray.get_runtime_context().get_node_id()
    name = holder_name(source, dtype, node_id)
    pid = os.getpid()
    for attempt in range(1, _HOLDER_ATTEMPTS + 1):
        holder = _holder(name, node_id)
        try:
            state, refs = ray.get(holder.acquire.remote(pid))
            if state == "load":
                refs = [_load_and_publish(holder, source, dtype, local_files_only)]
            exported = ray.get(refs[0])
            return build_model(source, dtype, exported, local_files_only)
        except ray.exceptions.RayActorError:
            if attempt == _HOLDER_ATTEMPTS:
                raise
            logger.info("%s exited as we asked it (its last user died); asking a new one", name)
    raise AssertionError("unreachable")  # pragma: no cover


def _load_and_publish(holder, source: str, dtype: torch.dtype, local_files_only: bool):
    import ray

    try:
        model = _load_private(source, dtype, local_files_only)
        # The arrays travel to the holder as a task argument; the holder's own ray.put makes the
        # copy that stays (Ray 2.56 removed ray.put's _owner, which would have saved that copy).
        ref = ray.get(holder.publish.remote(export_tensors(model), os.getpid()))[0]
        del model
    except BaseException:
        holder.abandon.remote()
        raise
    logger.info("shared weights of %s (%s) published in the object store", source, dtype)
    return ref


def shared_model_loader(device: str = "auto") -> Callable[[str, torch.dtype, bool], Any] | None:
    """A ``load_model`` for :class:`TransformersBackend` that shares weights, or None where it cannot.

    None on CUDA (each GPU needs its own copy). Outside Ray (tests, scripts) the
    returned loader loads a private copy, as without sharing.
    """
    from .backends.transformers_backend import resolve_device

    if resolve_device(device) != "cpu":
        logger.info("share_weights: ignored on %s (each GPU holds its own copy)", device)
        return None

    def load(source: str, dtype: torch.dtype, local_files_only: bool = False):
        import ray

        if not ray.is_initialized():
            return _load_private(source, dtype, local_files_only)
        return load_shared(source, dtype, local_files_only)

    return load


__all__ = [
    "WeightsHolder",
    "assign_tensors",
    "build_model",
    "export_tensors",
    "holder_name",
    "load_shared",
    "shared_model_loader",
]
