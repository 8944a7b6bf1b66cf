"""Fault 2: the Ingress replica SIGKILLed under steady load. Serve's proxy must route to
the restarted replica; the test measures the blip (failed requests, how long it lasted). With the
models placed in the Ingress and two Ingress replicas, no request may fail."""

from __future__ import annotations

import asyncio
import os
import signal
import time

import pytest

from .harness import (TWO_INGRESS_REPLICAS, HAProxyLog, ServeRun, deployment_replicas, wait_for,
                      wait_for_running_ingress)
from .helpers import steady_load

HEALTHY_TAIL = 20


def _kill_an_ingress_under_load(run, workers: int, replicas: int = 1) -> tuple[list, float, float, float]:
    """SIGKILL one of the `replicas` Ingress replicas of `run` while `workers` clients send
    one-record translations; keep the load on until a replacement runs (`replicas` live and RUNNING
    again) and the last HEALTHY_TAIL answers, all sent after the kill, are 200.
    (outcomes, monotonic time of the kill, seconds until the replacement ran, epoch time of the kill)."""
    victim = run.replica_pids("Ingress")[0]
    outcomes: list = []
    killed_wall = [0.0]

    async def scenario():
        stop = asyncio.Event()
        load = asyncio.create_task(steady_load(run.url, stop, outcomes, workers=workers, records=1))
        # Steady state first: the load is being answered.
        while sum(o.status == 200 for o in outcomes) < 10:
            await asyncio.sleep(0.02)
        os.kill(victim, signal.SIGKILL)
        killed_at, killed_wall[0] = time.monotonic(), time.time()

        def recovered():
            if len([p for p in run.replica_pids("Ingress") if p != victim]) < replicas:
                return False
            st, states = deployment_replicas(run, "Ingress")
            return st == "HEALTHY" and states.count("RUNNING") >= replicas
        await asyncio.get_running_loop().run_in_executor(
            None, lambda: wait_for(recovered, 60, "a new RUNNING Ingress replica", 0.2))
        replaced_s = time.monotonic() - killed_at
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            tail = outcomes[-HEALTHY_TAIL:]
            if (len(tail) == HEALTHY_TAIL and tail[0].started > killed_at
                    and all(o.status == 200 for o in tail)):
                break
            await asyncio.sleep(0.05)
        stop.set()
        await load
        return killed_at, replaced_s

    killed_at, replaced_s = asyncio.run(scenario())
    assert victim not in run.replica_pids("Ingress")
    return outcomes, killed_at, replaced_s, killed_wall[0]


def _figures(outcomes: list, killed_at: float, replaced_s: float) -> dict:
    after = [o for o in outcomes if o.finished >= killed_at]
    failed = [o for o in after if o.status != 200]
    blip = (max(o.finished for o in failed) - killed_at) if failed else 0.0
    return {
        "requests_answered_after_kill": len(after),
        "failed": len(failed),
        "failed_as": sorted({f"{o.status or o.error}" + (f" {o.body.get('error_type')}" if isinstance(o.body, dict) else "")
                             for o in failed}),
        "blip_s": round(blip, 2),
        "new_ingress_running_after_s": round(replaced_s, 1),
        "max_latency_of_a_request_in_flight_s": round(max(o.seconds for o in after), 2),
    }


@pytest.mark.smoke  # CI: make chaos-smoke
def test_ingress_killed_under_load(chaos_run, figures):
    outcomes, killed_at, replaced_s, _ = _kill_an_ingress_under_load(chaos_run, workers=4)
    figures["ingress_kill"] = measured = _figures(outcomes, killed_at, replaced_s)
    print(measured)
    assert all(o.status == 200 for o in outcomes[-HEALTHY_TAIL:])
    assert measured["blip_s"] < 30, measured


def test_a_placed_ingress_killed_under_load_loses_no_request(own_run, tmp_path, figures):
    """With the models in the Ingress (serve_config.placed.yaml, what `make run` serves) a model that crashes takes its
    Ingress replica down. With two Ingress replicas, HAProxy resends the requests the dead one held
    to the other (serve_app/proxy.py haproxy_retry_policy): no client
    sees the crash but as latency."""
    log = HAProxyLog()
    # Two Ingress replicas, as the autoscaler runs them under load (or min_replicas: 2 at any load).
    run = ServeRun(tmp_path / "placed-kill", config="serve_config.placed.yaml", env=log.env,
                   deployments=TWO_INGRESS_REPLICAS)
    if run.proxy != "haproxy":
        pytest.skip("resending a request whose replica died is HAProxy's (the Python proxy answers it 500)")
    try:
        run.start()
        wait_for_running_ingress(run, 2)
        outcomes, killed_at, replaced_s, killed_wall = _kill_an_ingress_under_load(run, workers=8, replicas=2)
    finally:
        run.stop()
        log.close()
    # Requests HAProxy had accepted before the kill and sent on to another server: those the dead
    # replica held (HAProxy logs a request when it ends, with `+N` retries when it was redispatched).
    logged = log.requests("/translation")
    resent = [r for r in logged if r["accepted"] < killed_wall and r["redispatched"]]
    figures["placed_ingress_kill"] = measured = {**_figures(outcomes, killed_at, replaced_s),
                                                 "requests_logged_by_haproxy": len(logged),
                                                 "in_flight_on_the_dead_replica_resent": len(resent)}
    print(measured)
    # The kill hit requests in flight (8 clients, two replicas, least-connections balancing) ...
    assert logged and resent, measured
    # ... and none of them, nor any other, failed.
    assert measured["failed"] == 0, measured


@pytest.mark.smoke  # CI: make chaos-smoke
def test_jobs_survive_an_ingress_restart(chaos_run, figures):
    """Job state lives in the JobManager replica, not the ingress: a job submitted before the
    ingress dies is still there afterwards, keeps computing and its result can be read."""
    import httpx

    run = chaos_run
    with httpx.Client(base_url=run.url, timeout=30) as http:
        def submit(n: int, tag: str) -> str:
            records = [{"id": str(i), "text": f"The river {i} runs to the sea ({tag})."} for i in range(n)]
            resp = http.post("/jobs", json={"task": "translation",
                                            "payload": {"fromLang": "en", "toLang": "pt", "records": records}})
            assert resp.status_code == 202, resp.text
            return resp.json()["job_id"]

        def view(job_id: str) -> dict:
            resp = http.get(f"/jobs/{job_id}")
            assert resp.status_code == 200, resp.text
            return resp.json()

        done_id = submit(4, f"small-{time.time()}")
        wait_for(lambda: view(done_id)["status"] == "succeeded", 60, "the small job to finish", 0.2)
        running_id = submit(400, f"large-{time.time()}")
        wait_for(lambda: view(running_id)["progress"]["records_done"] > 0, 60, "the large job to compute", 0.2)

        victim = run.replica_pids("Ingress")[0]
        os.kill(victim, signal.SIGKILL)
        killed_at = time.monotonic()

        def answered():
            try:
                return http.get(f"/jobs/{running_id}").status_code == 200
            except httpx.HTTPError:
                return False
        wait_for(answered, 90, "the restarted ingress to answer GET /jobs", 0.2)
        back_s = time.monotonic() - killed_at
        assert victim not in run.replica_pids("Ingress")
        assert view(done_id)["status"] == "succeeded"
        assert len(view(done_id)["result"]["result"]) == 4
        final = wait_for(lambda: (v := view(running_id))["status"] != "running" and v, 300,
                         "the large job to finish after the restart", 0.5)
    assert final["status"] == "succeeded", final
    assert [r["id"] for r in final["result"]["result"]] == [str(i) for i in range(400)]
    figures["jobs_across_ingress_restart"] = {"jobs_kept": 2, "ingress_answering_again_after_s": round(back_s, 1)}
