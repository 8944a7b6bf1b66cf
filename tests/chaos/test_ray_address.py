"""Issue 30: `make run` (python -m serve_app.run) serves on a Ray instance of its own, whatever the
machine's last `ray start` recorded in Ray's temp folder (`ray_current_cluster`, which `ray.init()`
with no address joins, dead or alive).

- A record naming a dead cluster: the launcher still starts, serves and stops cleanly (before the
  fix, ray.init gave up after 20 s with ConnectionError; replayed CI: 87 integration errors).
- A record naming a live cluster (a real `ray start --head`): the launcher does not deploy onto it.

Each test points RAY_TMPDIR at a folder of its own, so the record it writes or makes is seen by the
launcher it starts and by nothing else on the machine.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import pytest

from tests.support import session_pids

from .harness import ROOT, ServeRun, free_port, wait_for

RECORD = "ray_current_cluster"
BODY = {"payload": {"fromLang": "en", "toLang": "pt", "records": [{"id": "1", "text": "good morning"}]}}


@pytest.fixture
def ray_tmpdir():
    """A short Ray temp folder (Ray's socket paths must stay under 107 characters), removed after."""
    folder = Path(tempfile.mkdtemp(prefix="sa-rec-", dir="/tmp"))
    (folder / "ray").mkdir()
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _serve_and_stop(run: ServeRun) -> dict:
    """Start the launcher, translate one record, stop it with SIGTERM to its main process (as `kill PID`
    would); what happened."""
    run.command = [sys.executable, "-m", "serve_app.run"]
    try:
        took = run.start(timeout_s=240)
        answer = httpx.post(f"{run.url}/translation", json=BODY, timeout=60)
        signalled = time.monotonic()
        os.kill(run.proc.pid, signal.SIGTERM)
        code = run.proc.wait(90)
        stopped = time.monotonic() - signalled
    finally:
        run.stop(signal.SIGKILL)  # whatever is left of it, also when it failed
    assert answer.status_code == 200, answer.text
    assert [r["id"] for r in answer.json()["result"]] == ["1"]
    assert code == 0, run.log_tail()
    return {"ready_after_s": round(took, 1), "stopped_after_s": round(stopped, 1)}


@pytest.mark.smoke  # CI: make chaos-smoke
def test_a_dead_clusters_record_does_not_stop_make_run(own_run, ray_tmpdir, tmp_path, figures):
    dead = f"127.0.0.1:{free_port()}"  # nothing listens there
    (ray_tmpdir / "ray" / RECORD).write_text(dead)
    run = ServeRun(tmp_path / "dead-record", config="serve_config.placed.yaml", env={"RAY_TMPDIR": str(ray_tmpdir)})
    figures["make_run_with_a_dead_record"] = outcome = _serve_and_stop(run)
    print(outcome)


def _named_actors(address: str, env: dict) -> list[str]:
    probe = ("import json, ray; ray.init(address=%r, logging_level='ERROR'); "
             "print(json.dumps(sorted(a['name'] for a in ray.util.list_named_actors(all_namespaces=True))))" % address)
    # Ray 2.60 turns token auth on for `ray start`: the probe reads the token ray start wrote.
    done = subprocess.run([sys.executable, "-c", probe], env=dict(env, RAY_AUTH_MODE="token"), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.smoke  # CI: make chaos-smoke
def test_a_live_foreign_cluster_is_not_joined_by_make_run(own_run, ray_tmpdir, tmp_path, figures):
    env = dict(os.environ, RAY_TMPDIR=str(ray_tmpdir), RAY_USAGE_STATS_ENABLED="0")
    port = free_port()
    foreign = subprocess.Popen(
        [str(Path(sys.executable).with_name("ray")), "start", "--head", "--block", "--node-ip-address=127.0.0.1",
         f"--port={port}", "--num-cpus=0", "--include-dashboard=false", "--disable-usage-stats",
         f"--temp-dir={ray_tmpdir / 'ray'}"],
        cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_for(lambda: (ray_tmpdir / "ray" / RECORD).exists() or foreign.poll() is not None, 120,
                 "the foreign head's record")
        assert foreign.poll() is None, "the foreign `ray start --head` exited"
        run = ServeRun(tmp_path / "live-record", config="serve_config.placed.yaml", env={"RAY_TMPDIR": str(ray_tmpdir)})
        outcome = _serve_and_stop(run)
        actors = _named_actors(f"127.0.0.1:{port}", env)
        figures["make_run_with_a_live_foreign_record"] = dict(outcome, foreign_named_actors=actors)
        print(figures["make_run_with_a_live_foreign_record"])
        assert not any("SERVE" in name.upper() for name in actors), actors
    finally:
        for pid in [foreign.pid, *session_pids(foreign.pid)]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        foreign.wait(30)
