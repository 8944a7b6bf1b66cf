"""An input that kills the model replica computing it, sent again and again, on a real Serve run: a client that
retries every 503 after its Retry-After, and a job (which waits out 503s for jobs.model_retry_s). Each must cost at
most three replicas, then get 500 `model_crashed` without reaching a replica (serve_app/crash_quarantine.py), while
other inputs of the same model are answered."""

from __future__ import annotations

import time

import httpx

from tests.support import SETOSA

from .crashing_model import POISON, deaths
from .harness import ServeRun, wait_for
from .helpers import retrying_post

def test_a_crashing_input_costs_three_replicas_then_is_refused_and_other_inputs_are_answered(own_run, tmp_path,
                                                                                              figures):
    deaths_file = tmp_path / "deaths"
    run = ServeRun(tmp_path / "crash", args={"models": [
        {"name": "iris", "module": "examples.iris_classifier", "options": {"seed": 0}},
        {"name": "crasher", "module": "tests.chaos.crashing_model", "options": {"deaths_file": str(deaths_file)}},
    ]})
    run.config["applications"][0]["deployments"].append(
        {"name": "Model.crasher", "num_replicas": 2, "ray_actor_options": {"num_cpus": 0.01}})
    try:
        run.start()
        fine = httpx.post(f"{run.url}/models/crasher/predict", json={"inputs": [{"text": "fine"}]}, timeout=60)
        assert fine.status_code == 200 and fine.json()["outputs"] == [{"text": "FINE"}], fine.text

        with httpx.Client(timeout=60) as client:
            outcomes = retrying_post(client, f"{run.url}/models/crasher/predict", POISON, attempts=12)
        interactive_deaths = deaths(deaths_file)
        status, error_type, _ = outcomes[-1]
        assert (status, error_type) == (500, "model_crashed"), outcomes
        assert all(o[:2] == (503, "model_unavailable") for o in outcomes[:-1]), outcomes
        assert interactive_deaths == 3, outcomes

        started = time.monotonic()
        refused = httpx.post(f"{run.url}/models/crasher/predict", json=POISON, timeout=60)
        refused_s = time.monotonic() - started
        assert refused.status_code == 500 and refused.json()["error_type"] == "model_crashed", refused.text
        assert deaths(deaths_file) == 3  # refused: no replica reached

        # Other inputs are answered once Serve has restarted the replicas; the iris model never noticed.
        assert httpx.post(f"{run.url}/models/iris/predict", json={"inputs": [SETOSA]}, timeout=60).status_code == 200
        wait_for(lambda: httpx.post(f"{run.url}/models/crasher/predict", json={"inputs": [{"text": "ok"}]},
                                    timeout=60).status_code == 200, 120, "the crasher's replicas back", 1)

        # A job holding it (the JobManager has its own memory of what crashed): fails, not retried for 300 s.
        submitted_at = time.monotonic()
        job = httpx.post(f"{run.url}/jobs", json={"task": "crasher", "payload": {
            "inputs": [{"text": "a"}, {"text": "poison"}, {"text": "b"}]}}, timeout=30)
        assert job.status_code == 202, job.text
        done = wait_for(lambda: (lambda j: j if j["status"] in ("succeeded", "failed") else None)(
            httpx.get(f"{run.url}/jobs/{job.json()['job_id']}", timeout=10).json()), 240, "the job to end", 0.5)
        job_s = time.monotonic() - submitted_at
        assert done["status"] == "failed" and done["error"]["error_type"] == "model_crashed", done
        job_deaths = deaths(deaths_file) - interactive_deaths
        assert job_deaths == 3, job_deaths
        figures["crashing_input"] = {
            "client_attempts": [o[:2] for o in outcomes], "client_seconds": [round(o[2], 2) for o in outcomes],
            "replicas_lost_to_the_client": interactive_deaths, "refusal_s": round(refused_s, 3),
            "replicas_lost_to_the_job": job_deaths, "job_failed_after_s": round(job_s, 1),
        }
    finally:
        run.stop()
