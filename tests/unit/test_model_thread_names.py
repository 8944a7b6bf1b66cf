"""A replica's model threads carry their names in the OS (deployments/backends/libc.py name_native_thread):
`top -H` and bench.placed_probe --cpu tell them from Serve's threads, which Ray names `ray::IDLE`."""

from __future__ import annotations

import os
import sys
import threading

import pytest

from deployments.model_queue import ModelQueue


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="native thread names: Linux's prctl")
def test_the_model_thread_carries_its_name_in_the_os():
    queue = ModelQueue("Embedder-model")
    native_id = queue.submit(lambda items: [threading.get_native_id() for _ in items], None).result(10)[0]
    comm = f"/proc/{os.getpid()}/task/{native_id}/comm"
    assert open(comm).read().strip() == "Embedder-model"
    queue.shutdown()


def test_a_long_name_is_cut_to_what_linux_keeps_and_failure_is_not_fatal(monkeypatch):
    from deployments.backends import libc

    result = {}
    thread = threading.Thread(target=lambda: result.setdefault("ok", libc.name_native_thread("Translator-model-x")))
    thread.start(); thread.join()
    assert result["ok"] is sys.platform.startswith("linux")

    monkeypatch.setattr(libc, "libc_function", lambda name: None)  # a C library without prctl
    assert libc.name_native_thread("anything") is False
