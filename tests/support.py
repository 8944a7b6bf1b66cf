"""Helpers shared by the test tiers: waiting on an event (`wait_for`; `until`, on an event loop), Ray's metrics."""

from __future__ import annotations

import asyncio
import inspect
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Optional

import httpx

from serve_app import proxy
from tests import ray_metrics

#: request headers that make the service compute every text even when its response cache
#: holds the answer: for tests about model computation (batching, cancellation, kills)
NO_CACHE = {"Cache-Control": "no-cache"}


def save_figures(path, collected: dict, title: str) -> None:
    """Merge `collected` (measured outcomes) into the JSON file `path` and print them (docs quote them)."""
    import json
    from pathlib import Path

    if not collected:
        return
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    old = json.loads(path.read_text()) if path.exists() else {}
    old.update(collected)
    old["_measured_at"] = time.strftime("%Y-%m-%d %H:%M:%S")
    path.write_text(json.dumps(old, indent=2, sort_keys=True))
    print(f"\n{title} figures:\n" + json.dumps(collected, indent=2, sort_keys=True))


def free_port() -> int:
    """A TCP port free now, from the launcher's own fallback range (serve_app.proxy.FALLBACK_PORTS): below the
    kernel's ephemeral range, where a port handed out for a bind to port 0 could be taken by an outgoing
    connection (Ray makes hundreds) before the server we start binds it (a ci-local chaos run lost HAProxy
    that way: 45249, "Address already in use")."""
    return proxy.free_port()


def anonymous_mib() -> float:
    """This process's anonymous memory (MiB, /proc/self/smaps_rollup): what a model's allocations grow."""
    for line in open("/proc/self/smaps_rollup"):
        if line.startswith("Anonymous:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no Anonymous line in /proc/self/smaps_rollup")


def wait_for(condition: Callable[[], Any], timeout_s: float, what: str, interval_s: float = 0.1) -> Any:
    """Poll `condition` until it returns something truthy (and return that); fail after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(interval_s)


async def until(condition: Callable[[], Any], timeout_s: float = 5.0, interval_s: float = 0.005) -> None:
    """On the running event loop, look at `condition()` every `interval_s` (0: at every turn of the loop) until it
    holds, for at most `timeout_s` (then TimeoutError): for state a test can only observe by looking. `condition`
    may be a coroutine function."""
    async with asyncio.timeout(timeout_s):
        while True:
            held = condition()
            if inspect.isawaitable(held):
                held = await held
            if held:
                return
            await asyncio.sleep(interval_s)


def scrape(url: str, listening_within_s: float = 30.0) -> dict[tuple[str, tuple], float]:
    """A Prometheus endpoint (Ray's metrics port) as {(name, sorted labels): value}. Ray's metrics agent
    writes its port file before it listens (a CI run's first scrape, 17 s after Serve was ready, was
    refused): a refused connection is retried for `listening_within_s`."""
    def answer():
        try:
            return (httpx.get(url, timeout=10).text,)
        except httpx.ConnectError:
            return None
    return ray_metrics.parse(wait_for(answer, listening_within_s, f"{url} to listen", interval_s=0.5)[0])


#: Sum of a metric's samples whose labels include `labels` (Ray prefixes names with `ray_`); the
#: bench reads the same endpoint with the same function.
metric_sum = ray_metrics.total

#: The checked-in Serve config `make run` serves (the Makefile's `CONFIG ?=`; tests/unit/test_readme.py
#: keeps the two equal).
MAKE_RUN_CONFIG = "serve_config.placed.yaml"

#: Flowers of examples/iris_classifier.py's three species, for the custom-model tests.
SETOSA = {"sepal_length_cm": 5.1, "sepal_width_cm": 3.5, "petal_length_cm": 1.4, "petal_width_cm": 0.2}
VERSICOLOR = {"sepal_length_cm": 6.0, "sepal_width_cm": 2.7, "petal_length_cm": 4.2, "petal_width_cm": 1.3}
VIRGINICA = {"sepal_length_cm": 6.7, "sepal_width_cm": 3.0, "petal_length_cm": 5.2, "petal_width_cm": 2.3}


def deep_update(target: dict, updates: dict) -> None:
    """Merge `updates` into `target` in place, recursing into dicts both hold (the update wins)."""
    for key, value in updates.items():
        if isinstance(value, dict) and isinstance(target.get(key), dict):
            deep_update(target[key], value)
        else:
            target[key] = value


#: The session's `python -m serve_app.run` (tests/conftest.py `serve_process`), while it runs.
_SESSION_SERVE: dict[str, subprocess.Popen] = {}


def register_session_serve(proc: subprocess.Popen) -> None:
    _SESSION_SERVE["proc"] = proc


def stop_session_serve() -> Optional[int]:
    """Stop the session's Serve run if it is running, as `kill PID` would (the launcher drains, then
    stops Serve and its Ray cluster), then whatever of its process group outlived it. The chaos
    tests that start Serve runs of their own call it: two clusters on 2 cores starve each other.
    Idempotent; returns the launcher's exit status, or None if there was none."""
    proc = _SESSION_SERVE.pop("proc", None)
    if proc is None:
        return None
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=90)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    return proc.returncode


def session_pids(leader: int) -> list[int]:
    """PIDs of the processes in the session `leader` started (start_new_session=True), itself excluded:
    the Ray processes a `serve run` or `ray start` left, each in a process group of its own."""
    out = subprocess.run(["ps", "-eo", "pid=,sid="], capture_output=True, text=True).stdout
    return [int(p) for p, s in (line.split() for line in out.splitlines()) if int(s) == leader and int(p) != leader]


def make_status(port: int, env: Optional[dict] = None) -> tuple[int, str, dict]:
    """`make status` of the `make run` launcher serving on `port` (python -m serve_app.status, which reads Serve
    through Ray: the launcher starts no dashboard): (exit status, stderr, the YAML it printed, parsed)."""
    import yaml

    done = subprocess.run([sys.executable, "-m", "serve_app.status", "--port", str(port)], capture_output=True,
                          text=True, timeout=120, env=env, cwd=Path(__file__).resolve().parents[1])
    return done.returncode, done.stderr, (yaml.safe_load(done.stdout) or {}) if done.returncode == 0 else {}
