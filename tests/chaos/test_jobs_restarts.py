"""Jobs across restarts, with the real SQLite store (docs/jobs.md quotes the figures):

- the JobManager replica SIGKILLed in the middle of a 1,000-record translation job: the job
  resumes after its stored chunks (counted from the new replica's log), and its result equals the
  same records sent to /translation; a finished and a cancelled job are kept as they were;
- `make run` (python -m serve_app.run) stopped and started again on the same SQLite file: every
  job is readable with its id, the running one resumes and finishes, the cancelled one stays so.
"""

from __future__ import annotations

import os
import re
import signal
import sys
import time
import uuid

import httpx
import pytest

from serve_app.jobs.settings import JobSettings

from .harness import ServeRun, wait_for

SENTENCE = "The catalogue entry number {i} describes a small blue house near the river ({tag})."
RESUMED = re.compile(r"job (\S+) resumed: (\d+) of (\d+) chunks already stored")
#: records of the job each test interrupts: 16 stored chunks. 2,000 made these tests 150-241 s each of CI's
#: chaos smoke (ci-local, 2026-11-29), most of it translating the records twice (the job, then /translation).
RECORDS = 1000
CHUNK_RECORDS = JobSettings().chunk_records


def _payload(n: int, tag: str) -> dict:
    return {"fromLang": "en", "toLang": "pt",
            "records": [{"id": f"r{i}", "text": SENTENCE.format(i=i, tag=tag)} for i in range(n)]}


def _view(http: httpx.Client, job_id: str):
    """The job's view, or None while the JobManager is being replaced (503, connection errors)."""
    try:
        resp = http.get(f"/jobs/{job_id}")
    except httpx.HTTPError:
        return None
    if resp.status_code == 200:
        return resp.json()
    assert resp.status_code in (503, 504), resp.text
    return None


def _finished(http: httpx.Client, job_id: str, timeout_s: float = 300) -> dict:
    def done():
        view = _view(http, job_id)
        return view if view and view["status"] in ("succeeded", "failed", "cancelled") else None
    return wait_for(done, timeout_s, f"job {job_id} to finish", interval_s=0.5)


def _submit(http: httpx.Client, payload: dict, key: str) -> dict:
    resp = http.post("/jobs", json={"task": "translation", "payload": payload}, headers={"Idempotency-Key": key})
    assert resp.status_code == 202, resp.text
    return resp.json()


def _direct(http: httpx.Client, payload: dict) -> list[dict]:
    """The same records through POST /translation, 250 per request: a request of 1,000 took over the
    service's 60 s deadline (504) once, when the 2 cores were shared with another Ray cluster."""
    out = []
    records = payload["records"]
    for start in range(0, len(records), 250):
        part = {**payload, "records": records[start:start + 250]}
        resp = http.post("/translation", json={"payload": part}, timeout=300)
        assert resp.status_code == 200, resp.text
        out += resp.json()["result"]
    return out


def _resumed(run: ServeRun, job_id: str) -> tuple[int, int]:
    """(chunks found stored, chunks in all) from the JobManager replica log that resumed `job_id`."""
    for log in run.replica_logs("JobManager"):
        for m in RESUMED.finditer(log.read_text(errors="replace")):
            if m.group(1) == job_id:
                return int(m.group(2)), int(m.group(3))
    raise AssertionError(f"no JobManager log says job {job_id} resumed")


def _wait_progress(http: httpx.Client, job_id: str, records: int) -> dict:
    return wait_for(lambda: (v := _view(http, job_id)) and v["progress"]["records_done"] >= records and v,
                    300, f"job {job_id} to compute {records} records", interval_s=0.1)


@pytest.mark.smoke  # CI: make chaos-smoke
def test_a_job_manager_killed_mid_job_resumes_after_its_stored_chunks(own_run, tmp_path, figures):
    run = ServeRun(tmp_path / "run")
    tag = uuid.uuid4().hex
    try:
        run.start()
        with httpx.Client(base_url=run.url, timeout=120) as http:
            small = _submit(http, _payload(3, f"small-{tag}"), f"small-{tag}")
            small_view = _finished(http, small["job_id"])
            to_cancel = _submit(http, _payload(500, f"cancel-{tag}"), f"cancel-{tag}")
            assert http.delete(f"/jobs/{to_cancel['job_id']}").status_code == 200
            payload = _payload(RECORDS, tag)
            key = f"big-{tag}"
            job = _submit(http, payload, key)
            at_kill = _wait_progress(http, job["job_id"], 448)["progress"]["records_done"]
            (pid,) = run.replica_pids("JobManager")
            killed_at = time.monotonic()
            os.kill(pid, signal.SIGKILL)
            back = wait_for(lambda: _view(http, job["job_id"]), 180, "GET /jobs/<id> to answer again", 0.2)
            back_s = time.monotonic() - killed_at
            resent = _submit(http, payload, key)  # a client's retry after the restart: the same job
            view = _finished(http, job["job_id"])
            kept_small, kept_cancelled = _view(http, small["job_id"]), _view(http, to_cancel["job_id"])
            direct = _direct(http, payload)
        stored, total = _resumed(run, job["job_id"])
    finally:
        run.stop()
    assert view["status"] == "succeeded", view
    assert view["result"]["result"] == direct  # complete, in order, equal to the route's answer
    assert resent["job_id"] == job["job_id"]
    assert stored * CHUNK_RECORDS >= at_kill and total == -(-RECORDS // CHUNK_RECORDS)  # the stored ones not recomputed
    assert kept_small == small_view and kept_cancelled["status"] == "cancelled"
    figures["jobs_job_manager_sigkill"] = {
        "records_total": RECORDS, "records_done_at_kill": at_kill, "chunks_total": total,
        "chunks_stored_before_kill_not_recomputed": stored, "chunks_computed_after_restart": total - stored,
        "job_answering_again_after_s": round(back_s, 1), "status_when_back": back["status"],
        "jobs_kept": 3, "duplicate_jobs_from_resubmission": 0}


@pytest.mark.smoke  # CI: make chaos-smoke
def test_make_run_stopped_and_started_again_keeps_every_job(own_run, tmp_path, figures):
    store = tmp_path / "data" / "jobs.sqlite3"
    env = {"SERVE_APP_JOBS_STORE_PATH": str(store)}
    tag = uuid.uuid4().hex
    first = ServeRun(tmp_path / "first", env=env, config="serve_config.placed.yaml")
    first.command = [sys.executable, "-m", "serve_app.run", "--address", "local"]  # whatever RAY_ADDRESS says
    try:
        first.start()
        with httpx.Client(base_url=first.url, timeout=120) as http:
            done = _finished(http, _submit(http, _payload(5, f"done-{tag}"), f"done-{tag}")["job_id"])
            cancelled = _submit(http, _payload(300, f"cancel-{tag}"), f"cancel-{tag}")
            http.delete(f"/jobs/{cancelled['job_id']}")
            payload = _payload(RECORDS, tag)
            running = _submit(http, payload, f"run-{tag}")
            before = _wait_progress(http, running["job_id"], 192)["progress"]["records_done"]
        # Ctrl-C / `kill PID` of the launcher, as a user stops `make run`: it drains, then stops Serve.
        signalled = time.monotonic()
        os.kill(first.proc.pid, signal.SIGTERM)
        first.proc.wait(timeout=120)
        stop_s = time.monotonic() - signalled
    finally:
        first.stop(signal.SIGKILL)  # reaps what is left of its session (nothing, after a clean stop)
    second = ServeRun(tmp_path / "second", env=env, config="serve_config.placed.yaml")
    second.command = [sys.executable, "-m", "serve_app.run", "--address", "local"]
    try:
        second.start()
        with httpx.Client(base_url=second.url, timeout=120) as http:
            after_restart = _view(http, running["job_id"])
            # It must have outlived the stop (1,000 records; the stop took 7 s): else nothing resumed.
            assert after_restart and after_restart["status"] in ("queued", "running"), \
                after_restart and (after_restart["status"], after_restart["progress"])
            kept_done, kept_cancelled = _view(http, done["job_id"]), _view(http, cancelled["job_id"])
            view = _finished(http, running["job_id"])
            direct = _direct(http, payload)
        stored, total = _resumed(second, running["job_id"])
    finally:
        second.stop(signal.SIGTERM)
    assert kept_done == done and kept_cancelled["status"] == "cancelled"
    assert after_restart is not None and after_restart["progress"]["records_done"] >= before
    assert view["status"] == "succeeded" and view["result"]["result"] == direct
    assert stored * CHUNK_RECORDS >= before
    figures["jobs_make_run_restart"] = {
        "jobs_kept": 3, "records_done_before_stop": before, "chunks_stored_before_stop_not_recomputed": stored,
        "chunks_total": total, "records_total": RECORDS, "launcher_stopped_after_s": round(stop_s, 1)}
