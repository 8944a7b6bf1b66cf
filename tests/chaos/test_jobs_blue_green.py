"""Two Ray clusters on one Redis job store, as during a RayService's blue/green (`NewCluster`) upgrade
(docs/jobs.md quotes the figures). Each cluster is a real `serve run` with its own Ray and its own name
(RAY_CLUSTER_NAME, as KubeRay names a RayCluster's pods):

- while both serve, each JobManager runs the jobs submitted to its own cluster: blue's long job stays blue's,
  green's job is computed by green (its JobManager's log, not blue's, says it succeeded);
- then blue is stopped mid-job (its lease released): green adopts blue's job, resumes it after the chunks blue
  stored, and its result equals the same records sent to green's /translation.

Two Serve instances on 2 cores: minutes, so `make chaos` runs it, not CI's smoke.
"""

from __future__ import annotations

import time
import uuid

import httpx
import redis as redis_client

from tests.redis_server import RedisServer

from .harness import ServeRun, wait_for
from .test_jobs_restarts import RECORDS, _direct, _finished, _payload, _resumed, _submit, _wait_progress

SUCCEEDED = "job {} succeeded"


def _stamp(client, job_id: str) -> str:
    return (client.hget(f"serve-app:jobs:job:{job_id}", "cluster") or b"").decode()


def _logs_say(run: ServeRun, text: str) -> bool:
    return any(text in log.read_text(errors="replace") for log in run.replica_logs("JobManager"))


def test_each_cluster_runs_its_own_jobs_and_the_new_one_adopts_the_old_one_s(own_run, tmp_path, figures):
    password = uuid.uuid4().hex + uuid.uuid4().hex
    secret = tmp_path / "redis-password"
    secret.write_text(password + "\n")
    redis = RedisServer(tmp_path / "redis", password=password).start()
    tag = uuid.uuid4().hex[:8]
    store = {"SERVE_APP_JOBS_STORE": "redis", "SERVE_APP_JOBS_REDIS_URL": redis.url,
             "SERVE_APP_JOBS_REDIS_PASSWORD_FILE": str(secret)}
    blue = ServeRun(tmp_path / "blue", env={**store, "RAY_CLUSTER_NAME": f"blue-{tag}"})
    green = ServeRun(tmp_path / "green", env={**store, "RAY_CLUSTER_NAME": f"green-{tag}"})
    client = redis_client.Redis.from_url(redis.url, password=password)
    try:
        blue.start()
        green.start()
        with httpx.Client(base_url=blue.url, timeout=120) as to_blue, \
                httpx.Client(base_url=green.url, timeout=120) as to_green:
            payload = _payload(RECORDS, f"blue-{tag}")
            old = _submit(to_blue, payload, f"old-{tag}")["job_id"]
            new = _submit(to_green, _payload(50, f"green-{tag}"), f"new-{tag}")["job_id"]
            new_view = _finished(to_green, new)
            at_stop = _wait_progress(to_green, old, 128)["progress"]["records_done"]  # read through green
            stamps_while_both = (_stamp(client, old), _stamp(client, new))
            new_run_by = ("green" if _logs_say(green, SUCCEEDED.format(new)) else "") + \
                         ("blue" if _logs_say(blue, SUCCEEDED.format(new)) else "")
            stopped = time.monotonic()
            blue.stop()
            adopted = wait_for(lambda: _stamp(client, old) == f"green-{tag}", 60, "green to adopt blue's job", 0.1)
            adopted_s = time.monotonic() - stopped
            old_view = _finished(to_green, old)
            finished_s = time.monotonic() - stopped
            direct = _direct(to_green, payload)
        stored, total = _resumed(green, old)
    finally:
        blue.stop()
        green.stop()
        client.close()
        redis.kill()
    assert adopted
    assert stamps_while_both == (f"blue-{tag}", f"green-{tag}")
    assert new_view["status"] == "succeeded" and new_run_by == "green", new_run_by
    assert old_view["status"] == "succeeded" and old_view["result"]["result"] == direct
    assert stored * 64 >= at_stop - 64 and stored < total
    figures["jobs_blue_green"] = {
        "records_total": RECORDS, "records_done_when_blue_stopped": at_stop,
        "adopted_by_green_after_s": round(adopted_s, 1), "chunks_stored_when_resumed": stored, "chunks_total": total,
        "finished_after_blue_stopped_s": round(finished_s, 1)}
    print(figures["jobs_blue_green"])
