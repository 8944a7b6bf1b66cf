"""An input that crashes a model placed in the Ingress (`placement: ingress`, make run's layout) kills the Ingress
replica itself, and every request it held, and the crash quarantine in its memory with it. The crash journal on the
node (serve_app/crash_journal.py) outlives it: on a real Serve run of serve_config.placed.yaml, a client retrying
the crashing input gets JSON 503s (not Ray's bare 500) until three replicas died, then 500 `model_crashed` without
reaching the model, while clients sending other inputs to the same model all the while are all answered in the
end and never refused; a job holding the input fails at once."""

from __future__ import annotations

import collections
import threading
import time

import httpx

from .crashing_model import POISON, deaths
from .harness import ServeRun, wait_for
from .helpers import retrying_post

def test_a_crashing_input_of_a_placed_model_costs_three_ingress_replicas_then_is_refused(own_run, tmp_path,
                                                                                         figures):
    deaths_file = tmp_path / "deaths"
    run = ServeRun(tmp_path / "placed-crash", config="serve_config.placed.yaml", args={"models": [
        {"name": "iris", "module": "examples.iris_classifier", "options": {"seed": 0}, "placement": "ingress"},
        {"name": "crasher", "module": "tests.chaos.crashing_model", "options": {"deaths_file": str(deaths_file)},
         "placement": "ingress"},
    ]})
    url = f"{run.url}/models/crasher/predict"
    stop, others = threading.Event(), collections.Counter()

    def other_inputs(i: int) -> None:  # a client of the same model, retrying its 503s as the poison's does
        with httpx.Client(timeout=60) as client:
            n = 0
            while not stop.is_set():
                body = {"inputs": [{"text": f"fine {i} {n % 3}"}]}
                for status, error_type, _ in retrying_post(client, url, body):
                    others[(status, error_type)] += 1
                others["answered" if status == 200 else "failed"] += 1
                n += 1

    try:
        run.start()
        clients = [threading.Thread(target=other_inputs, args=(i,), daemon=True) for i in range(4)]
        for client in clients:
            client.start()
        wait_for(lambda: others["answered"] >= 20, 60, "the other clients answered")
        with httpx.Client(timeout=60) as client:
            outcomes = retrying_post(client, url, POISON)
        replicas_lost = deaths(deaths_file)
        assert outcomes[-1][:2] == (500, "model_crashed"), outcomes
        assert all(o[:2] == (503, "model_unavailable") for o in outcomes[:-1]), outcomes
        assert replicas_lost == 3, outcomes

        started = time.monotonic()
        refused = httpx.post(url, json=POISON, timeout=60)
        refused_s = time.monotonic() - started
        assert refused.status_code == 500 and refused.json()["error_type"] == "model_crashed", refused.text

        job = httpx.post(f"{run.url}/jobs", json={"task": "crasher", "payload": {
            "inputs": [{"text": "poison"}]}}, timeout=30)
        assert job.status_code == 202, job.text
        done = wait_for(lambda: (lambda j: j if j["status"] in ("succeeded", "failed") else None)(
            httpx.get(f"{run.url}/jobs/{job.json()['job_id']}", timeout=10).json()), 120, "the job to end", 0.5)
        assert done["status"] == "failed" and done["error"]["error_type"] == "model_crashed", done
        answered_before = others["answered"]
        wait_for(lambda: others["answered"] >= answered_before + 20, 60, "the other clients still answered")
        stop.set()
        for client in clients:
            client.join(120)
        assert deaths(deaths_file) == 3  # neither the refusal nor the job reached the model
        # Every request of the others answered in the end, none refused. An attempt may get a 503 or, as a client
        # of a replica that dies may, a connection closed without an answer (status 0; 1 of 255 once): retried.
        bad = [k for k in others if isinstance(k, tuple) and (k[1] == "model_crashed" or k[0] not in (0, 200, 503))]
        assert others["failed"] == 0 and not bad, others
        figures["crashing_placed_model"] = {
            "client_attempts": [o[:2] for o in outcomes], "client_seconds": [round(o[2], 2) for o in outcomes],
            "ingress_replicas_lost": replicas_lost, "refusal_s": round(refused_s, 3),
            "other_clients": {str(k): v for k, v in others.items()},
        }
    finally:
        stop.set()
        run.stop()
