"""Fault 2: the Ingress replica SIGKILLed under steady load. Serve's proxy must route to
the restarted replica; the test measures the blip (failed requests, how long it lasted)."""

from __future__ import annotations

import asyncio
import os
import signal
import time


from .harness import deployment_replicas, wait_for
from .helpers import steady_load

HEALTHY_TAIL = 20


def test_ingress_killed_under_load(chaos_run, figures):
    run = chaos_run
    victim = run.replica_pids("Ingress")[0]
    outcomes: list = []

    async def scenario():
        stop = asyncio.Event()
        load = asyncio.create_task(steady_load(run.url, stop, outcomes, workers=4, records=1))
        # Steady state first: the load is being answered.
        while sum(o.status == 200 for o in outcomes) < 10:
            await asyncio.sleep(0.02)
        os.kill(victim, signal.SIGKILL)
        killed_at = time.monotonic()

        def recovered():
            if not [p for p in run.replica_pids("Ingress") if p != victim]:
                return False
            st, states = deployment_replicas(run, "Ingress")
            return st == "HEALTHY" and "RUNNING" in states
        await asyncio.get_running_loop().run_in_executor(
            None, lambda: wait_for(recovered, 60, "a new RUNNING Ingress replica", 0.2))
        replaced_s = time.monotonic() - killed_at
        # Keep the load on until the last HEALTHY_TAIL answers, all sent after the kill, are 200.
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
    after = [o for o in outcomes if o.finished >= killed_at]
    failed = [o for o in after if o.status != 200]
    blip = (max(o.finished for o in failed) - killed_at) if failed else 0.0
    figures["ingress_kill"] = {
        "requests_answered_after_kill": len(after),
        "failed": len(failed),
        "failed_as": sorted({f"{o.status or o.error}" + (f" {o.body.get('error_type')}" if isinstance(o.body, dict) else "")
                             for o in failed}),
        "blip_s": round(blip, 2),
        "new_ingress_running_after_s": round(replaced_s, 1),
        "max_latency_of_a_request_in_flight_s": round(max(o.seconds for o in after), 2),
    }
    print(figures["ingress_kill"])
    assert all(o.status == 200 for o in outcomes[-HEALTHY_TAIL:])
    assert blip < 30, blip


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
