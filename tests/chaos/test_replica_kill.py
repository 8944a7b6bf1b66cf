"""Fault 1: a Translator replica SIGKILLed in the middle of a batch.

Every caller must get an answer within ~10 s of the kill (the wait for a replica, `replica_retry_timeout_s`, and
the load's own time): its records retried once on a healthy or restarted replica (HandleClient retries on
ActorDiedError; a call several requests shared, the coalescer retries one request's records at a time), else 503 +
Retry-After + JSON. Never a hang or a bare 500. The deployment must be back to full strength (Serve: HEALTHY, as
many RUNNING replicas as its target) within 30 s."""

from __future__ import annotations

import asyncio
import os
import signal
import time

import httpx
import pytest

from serve_app.settings import IngressSettings

from .harness import deployment_details, deployment_replicas, wait_for
from .helpers import Outcome, is_clean_error, post, start_while_computing, translation_body

CALLERS = 16
#: 16 x 4 long records: two full batches of 32, about 1-3 s of model time on one replica here,
#: so the retried records can finish well inside the 10 s budget.
RECORDS = 4


@pytest.mark.smoke  # CI: make chaos-smoke
def test_translator_killed_mid_batch(chaos_run, figures):
    run = chaos_run
    status, before = deployment_replicas(run, "Translator")
    assert status == "HEALTHY", status
    victim = run.replica_pids("Translator")[0]
    log_before = len(run.log_tail(10**9))
    pending: dict[str, int] = {}

    async def scenario() -> tuple[float, list[Outcome]]:
        async with httpx.AsyncClient(base_url=run.url, timeout=60) as client:
            # The event: the victim is computing a batch of this load.
            tasks = await start_while_computing(client, victim, CALLERS, RECORDS)
            # With two Translators, requests routed to the other one may be answered first; the kill
            # must still find some in flight (and `retries` below, that it hit the victim's batch).
            pending["at_kill"] = sum(not t.done() for t in tasks)
            assert pending["at_kill"], "every request finished before the kill: make them longer"
            os.kill(victim, signal.SIGKILL)
            killed_at = time.monotonic()
            return killed_at, await asyncio.gather(*tasks)

    async def baseline() -> float:
        async with httpx.AsyncClient(base_url=run.url, timeout=60) as client:
            started = time.monotonic()
            done = await asyncio.gather(*(post(client, "/translation", translation_body(RECORDS, i * RECORDS))
                                          for i in range(CALLERS)))
            assert all(o.status == 200 for o in done)
            return time.monotonic() - started

    baseline_s = asyncio.run(baseline())
    killed_at, outcomes = asyncio.run(scenario())
    answered_after_kill = [o.finished - killed_at for o in outcomes]
    ok = [o for o in outcomes if o.status == 200]
    unavailable = [o for o in outcomes if o.status == 503]
    # "retrying once" (HandleClient's retry) or "not retried here" (a shared call: the coalescer's retry)
    retries = run.log_tail(10**9)[log_before:].count("replica died during translate;")

    # Back to full strength: Serve reports HEALTHY and as many RUNNING replicas as it wants now, each
    # one a live process other than the victim. Counting RUNNING alone is not enough: just after a
    # SIGKILL, Serve still lists the killed replica as RUNNING until its controller notices. "As many
    # as it wants" is Serve's target, not the count before the kill: the Translator is autoscaled, and
    # once the load ends the autoscaler may take it from 2 back to 1 (seen: 2 -> 1 three seconds after
    # the kill, and a wait for 2 then never ended).
    def full_strength():
        d = deployment_details(run, "Translator")
        if not d or d["status"] != "HEALTHY":
            return False
        running = [r.get("pid") for r in d["replicas"] if r["state"] == "RUNNING"]
        live = set(run.replica_pids("Translator"))
        return (len(running) >= max(1, d["target_num_replicas"]) and victim not in running
                and all(pid in live for pid in running))
    wait_for(full_strength, 60, "the Translator deployment back to full strength", interval_s=0.2)
    recovered_s = time.monotonic() - killed_at
    probe = httpx.post(f"{run.url}/translation", json=translation_body(1), timeout=30)

    figures["replica_kill"] = {
        "callers": CALLERS, "records_each": RECORDS, "in_flight_at_kill": pending["at_kill"],
        "status_counts": {str(s): sum(o.status == s for o in outcomes) for s in {o.status for o in outcomes}},
        "calls_retried_after_ActorDiedError": retries,
        "max_answer_after_kill_s": round(max(answered_after_kill), 2),
        "full_strength_after_kill_s": round(recovered_s, 1),
        "replicas_before": len(before),
        "same_load_without_kill_s": round(baseline_s, 2),
    }
    print(figures["replica_kill"])
    assert all(o.status in (200, 503) for o in outcomes), [(o.status, o.error, o.body) for o in outcomes]
    assert all(is_clean_error(o, 503, "model_unavailable") for o in unavailable)
    # A retried call waits at most replica_retry_timeout_s for a replica, then computes: every caller is answered
    # within that plus twice the same load's time without a kill (measured above), or something hung. (A fixed 10 s
    # failed once on ci-local at 10.4 s: the replacement replica ran after 8 s, and the load took 2.5 s.)
    ingress = run.config["applications"][0]["args"].get("ingress", {})
    retry_s = ingress.get("replica_retry_timeout_s", IngressSettings().replica_retry_timeout_s)
    assert max(answered_after_kill) < retry_s + 2 * baseline_s, (answered_after_kill, baseline_s)
    assert all(len(o.body["result"]) == RECORDS for o in ok)
    assert retries >= 1, "no call was retried: the kill did not hit a batch"
    assert recovered_s < 30, recovered_s
    assert probe.status_code == 200
