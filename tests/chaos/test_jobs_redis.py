"""Jobs in Redis (what the RayServices run), against Debian's redis-server started here with a
password and AOF persistence: in the middle of a 1,000-record translation job, redis-server is
SIGKILLed (GET /jobs answers 503 `job_store_unavailable` meanwhile) and started again, then the
JobManager replica is SIGKILLed too. The job is readable throughout the restarts, resumes after its
stored chunks and its result equals the same records sent to /translation. The cluster is named as KubeRay
names it (RAY_CLUSTER_NAME): its jobs carry that name in Redis (blue/green upgrades, docs/jobs.md). docs/jobs.md
quotes it.
"""

from __future__ import annotations

import os
import signal
import time
import uuid

import httpx
import pytest
import redis as redis_client

from tests.redis_server import RedisServer

from .harness import ServeRun, wait_for
from .test_jobs_restarts import (CHUNK_RECORDS, RECORDS, RESUMED, _direct, _finished, _payload, _submit, _view,
                                 _wait_progress)


@pytest.mark.smoke  # CI: make chaos-smoke
def test_jobs_in_redis_survive_a_redis_restart_and_a_job_manager_kill(own_run, tmp_path, figures):
    password = uuid.uuid4().hex + uuid.uuid4().hex
    secret = tmp_path / "redis-password"
    secret.write_text(password + "\n")
    redis = RedisServer(tmp_path / "redis", password=password).start()
    tag = uuid.uuid4().hex
    run = ServeRun(tmp_path / "run", env={"SERVE_APP_JOBS_STORE": "redis", "SERVE_APP_JOBS_REDIS_URL": redis.url,
                                          "SERVE_APP_JOBS_REDIS_PASSWORD_FILE": str(secret),
                                          "RAY_CLUSTER_NAME": f"blue-{tag[:8]}"})
    try:
        run.start()
        with httpx.Client(base_url=run.url, timeout=120) as http:
            done = _finished(http, _submit(http, _payload(3, f"done-{tag}"), f"done-{tag}")["job_id"])
            client = redis_client.Redis.from_url(redis.url, password=password)
            stamp = client.hget(f"serve-app:jobs:job:{done['job_id']}", "cluster")
            client.close()
            payload = _payload(RECORDS, tag)
            job = _submit(http, payload, f"big-{tag}")
            at_redis_kill = _wait_progress(http, job["job_id"], 320)["progress"]["records_done"]
            redis.kill(signal.SIGKILL)
            outage = http.get(f"/jobs/{job['job_id']}")
            redis.start()
            back = wait_for(lambda: _view(http, job["job_id"]), 120, "GET /jobs/<id> after Redis restarted", 0.2)
            at_manager_kill = _wait_progress(http, job["job_id"], back["progress"]["records_done"] + 128)
            (pid,) = run.replica_pids("JobManager")
            killed = time.monotonic()
            os.kill(pid, signal.SIGKILL)
            wait_for(lambda: run.replica_pids("JobManager") not in ([], [pid]), 120, "a new JobManager", 0.2)
            view = _finished(http, job["job_id"])
            finished_s = time.monotonic() - killed
            kept = _view(http, done["job_id"])
            direct = _direct(http, payload)
        resumed = [(int(m.group(2)), int(m.group(3))) for log in run.replica_logs("JobManager")
                   for m in RESUMED.finditer(log.read_text(errors="replace")) if m.group(1) == job["job_id"]]
    finally:
        run.stop()
        redis.kill()
    assert stamp == f"blue-{tag[:8]}".encode()
    assert outage.status_code == 503 and outage.json()["error_type"] == "job_store_unavailable"
    assert outage.headers.get("Retry-After")
    assert back["progress"]["records_done"] >= at_redis_kill  # nothing acknowledged was lost
    assert view["status"] == "succeeded" and view["result"]["result"] == direct
    assert kept == done
    assert resumed and max(stored for stored, _ in resumed) * CHUNK_RECORDS >= at_manager_kill["progress"]["records_done"]
    figures["jobs_redis_restarts"] = {
        "records_total": RECORDS, "records_done_at_redis_kill": at_redis_kill,
        "records_done_after_redis_restart": back["progress"]["records_done"],
        "records_done_at_job_manager_kill": at_manager_kill["progress"]["records_done"],
        "chunks_stored_when_resumed": [stored for stored, _ in resumed], "chunks_total": resumed[0][1],
        "job_finished_after_job_manager_kill_s": round(finished_s, 1), "jobs_kept": 2}
