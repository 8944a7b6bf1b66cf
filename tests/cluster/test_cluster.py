"""The RayService on a multi-node Ray cluster, as KubeRay runs it, changed under load.

One cluster (conftest.py) serves these tests in this order: each measures what clients see and
leaves the cluster at full strength for the next. The pod is lost first, while the application runs
at its minimum (after the ramp, the autoscaled replicas would not fit on the surviving pods until
they scale down; on Kubernetes the Ray autoscaler would add a pod for them); a pod is deleted (it
drains first) after it, not before: the lost pod's replacements then landed on the deleted pod, started
again cold, and took 77 s (ci-local, 2026-11-29). The head goes last: lost (SIGKILLed), then its pod deleted.

Why this module is long: the order of these tests is part of what they test (the states each leaves
for the next), and one module is the order pytest keeps.
"""

from __future__ import annotations

import time
import uuid

import pytest

from tests.support import wait_for

from .helpers import (NODE_START_BOUND_S, Recovery, above_minimum, at_full_strength, controller_recovery,
                      deployment_configs, deployment_of, deployments, downscale_begun, finished_job, job_payload,
                      pod_to_lose, ready, replica_ids, replica_states, running_by_node, running_counts, serving,
                      submit_job, translator_batch_size,
                      updated_config, wait_full_strength, worker_ips)
from .plots import save_timeline
from .traffic import (PATIENT_TIMEOUT_S, Load, cut_in_flight, describe_failed, failures_after_loss,
                      summarize)

pytestmark = pytest.mark.cluster

#: The issue's bounds: back at full strength within 60 s of losing a pod.
RECOVERY_BOUND_S = 60
#: No bound in the issue for a rejoined pod taking replicas again; this one only stops a run that hangs.
REJOIN_BOUND_S = 300


@pytest.mark.smoke  # CI: make cluster-smoke
def test_every_worker_with_a_replica_answers_and_the_head_holds_none(cluster, endpoints, figures):
    ready(cluster)
    start = time.monotonic()
    try:
        by_node, holding = wait_for(lambda: serving(cluster, endpoints.ready()), 120,
                                    "the ready proxies to be those of the workers holding a replica", 0.5)
    except AssertionError as exc:
        raise AssertionError(f"{exc}; ready {endpoints.ready()}; replicas (state, node): {replica_states(cluster)}") from None
    figures["cluster_endpoints_ready_after_running_s"] = round(time.monotonic() - start, 1)
    head = cluster.head.address
    assert all(head not in nodes for nodes in by_node.values()), f"a replica runs on the head: {by_node}"
    # No single point of failure: two Ingress replicas on two pods, models spread over pods.
    for name in ("Ingress", "Translator", "Embedder"):
        assert len(by_node[name]) >= 2, f"{name} is not spread over two pods: {dict(by_node[name])}"
    assert len(holding) >= 2, f"fewer than two pods serve: {holding}"
    with Load(endpoints, cluster.api_key, clients=4) as load:
        load.wait_answers(20, 60)
    hit = {a.endpoint for r in load.requests for a in r.attempts if a.status == 200}
    assert holding <= hit, f"ready endpoints that answered nothing: {holding - hit}"
    figures["cluster_replicas_at_start"] = {k: dict(v) for k, v in by_node.items()}


@pytest.mark.smoke  # CI: make cluster-smoke
def test_a_worker_lost_under_load_then_rejoining(cluster, endpoints, figures):
    ready(cluster)
    victim, held = pod_to_lose(cluster)
    lost_url = cluster.serve_url(victim)
    # A job in flight across the loss: its state is in Redis, so it survives its JobManager's pod.
    job_records = 300
    job_id = submit_job(endpoints.ready(), cluster.api_key, job_payload(job_records, "lost-pod"), key=uuid.uuid4().hex)
    with Load(endpoints, cluster.api_key, clients=16) as load:
        load.wait_answers(30, 60)
        before = running_counts(cluster)
        killed_at = time.monotonic()
        processes = cluster.kill_node(victim)
        # Back at full strength: the lost replicas replaced on the survivors (what the autoscaler adds
        # for the load meanwhile may not fit on two pods; a Kubernetes cluster would add a pod for it).
        recovery = Recovery(cluster, before, victim.address, killed_at)
        recovered_s = wait_for(recovery, RECOVERY_BOUND_S + 60, "the lost replicas replaced on the surviving pods", 0.5)
        load.wait_answers(30, 60)  # and keeps answering at full strength
        requests = load.since(killed_at - 10)
    summary = summarize(requests)
    in_flight_until = killed_at + 1.0
    not_ok, bad_on_survivors = failures_after_loss(requests, lost_url, in_flight_until)
    on_lost = [r for r in requests if r.attempts[0].endpoint == lost_url and r.attempts[0].status is None]
    figures["cluster_worker_lost"] = {
        "victim_held": held, "processes_killed": processes, "recovered_s": round(recovered_s, 1),
        "replaced_after_s": {name: s for name, s in recovery.back_after_s.items() if name in held},
        "connections_broken_on_lost_pod_and_resent": len(on_lost),
        "in_flight_responses_cut_through_a_surviving_pod_and_resent": cut_in_flight(requests, lost_url,
                                                                                       in_flight_until),
        **summary}
    assert not not_ok, (f"requests not answered with 200 / 503+Retry-After: {summary}; "
                        f"{describe_failed(not_ok, killed_at, lost_url)}")
    assert not bad_on_survivors, f"attempts on surviving pods failed: {bad_on_survivors[:5]}"
    assert summary["slowest_s"] <= 10.0
    assert recovered_s <= RECOVERY_BOUND_S, f"full strength after {recovered_s:.0f} s"
    job = finished_job(endpoints.ready, cluster.api_key, job_id, 240)
    result = (job.get("result") or {}).get("result") or []
    figures["cluster_job_across_the_loss"] = {
        "records": job_records, "job_manager_on_lost_pod": bool(held.get("JobManager")), "status": job["status"],
        "records_in_result": len(result), "finished_after_loss_s": round(time.monotonic() - killed_at, 1)}
    assert job["status"] == "succeeded", job.get("error")
    assert [r["id"] for r in result] == [f"lost-pod-{i}" for i in range(job_records)] and all(r["text"] for r in result)

    # The pod comes back (same address, as a replaced pod of the group) and takes replicas again.
    cluster.start_node(victim)
    started_at = time.monotonic()
    cluster.wait_nodes(len(cluster.nodes), NODE_START_BOUND_S)
    rejoined_at = time.monotonic()
    with Load(endpoints, cluster.api_key, clients=48, timeout_s=PATIENT_TIMEOUT_S) as load:
        # The autoscaler adding replicas (~25 s), Ray starting a worker on the fresh pod (~30 s on two shared
        # cores under 48 clients), the constructor: 67-109 s here, once over 180 s in CI.
        try:
            wait_for(lambda: any(nodes[victim.address] for nodes in running_by_node(cluster).values()),
                     REJOIN_BOUND_S, "a replica on the rejoined pod", 1.0)
        except AssertionError as exc:
            raise AssertionError(f"{exc}; replicas (state, node): {replica_states(cluster)}") from None
        requests = load.since(rejoined_at)
    figures["cluster_worker_rejoined"] = {
        "node_alive_after_s": round(rejoined_at - started_at, 1),
        "ray_starts_that_failed": victim.failed_starts,
        "first_replica_after_s": round(time.monotonic() - rejoined_at, 1),
        "replicas_on_it": {k: v[victim.address] for k, v in running_by_node(cluster).items() if v[victim.address]},
        **summarize(requests)}
    assert not [r for r in requests if not r.ok]


def test_a_worker_pod_deleted_under_load_drains_first_and_no_request_fails(cluster, endpoints, figures):
    """Deleted as Kubernetes deletes a pod for a scale-down, a rollout, a node drain or an eviction
    (deploy/local_cluster/kubelet.py). On SIGTERM, Ray 2.60's `ray start` drains its node: Serve starts
    its replicas on the other pods, then stops these once they have answered what they hold; the manifest
    gives that 150 s (RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S) in a 180 s grace period. So no request may
    fail, be cut or be resent, unlike those of the pod lost in the test before."""
    ready(cluster)
    victim, held = pod_to_lose(cluster)
    deleted_url = cluster.serve_url(victim)
    log_before = victim.log_path.stat().st_size if victim.log_path.exists() else 0
    with Load(endpoints, cluster.api_key, clients=16) as load:
        load.wait_answers(30, 60)
        deleted_at = time.monotonic()
        deletion = cluster.delete_pod(victim)
        # Serve stops a draining node's replicas once their replacements run: at full strength already
        # (every deployment at its target, which the autoscaler moves with the load; not counting the pod).
        whole_when_stopped = at_full_strength(cluster, victim.address)
        wait_full_strength(cluster, 60, victim.address)
        load.wait_answers(30, 60)
        requests = load.since(deleted_at - 5)
    summary = summarize(requests)
    figures["cluster_worker_pod_deleted"] = {
        "victim_held": held, "grace_s": deletion.grace_s, "pod_stopped_after_s": deletion.stopped_after_s,
        "processes_left_behind": deletion.left_behind, "at_full_strength_when_it_stopped": whole_when_stopped,
        **summary}
    assert deletion.graceful, f"`ray start` was still running when the grace period ran out: {deletion}"
    with victim.log_path.open("rb") as log:
        log.seek(log_before)
        said = log.read().decode(errors="replace")
    assert "finished draining" in said, f"Ray did not say that {victim.name} drained: {said[-2000:]}"
    # As the contract allows (200, or 503 + Retry-After), at the first try: none cut, none resent.
    failed = [r for r in requests if not r.ok or len(r.attempts) > 1]
    assert not failed, (f"requests failed or resent while the pod drained: {summary}; "
                        f"{describe_failed(failed, deleted_at, deleted_url)}")


def test_in_place_updates_under_load_fail_no_request(cluster, endpoints, figures):
    ready(cluster)
    config = cluster.spec.serve_config
    batch = updated_config(config,
                           lambda app: deployment_of(app, "Translator")["user_config"].update(max_batch_size=16))
    args = updated_config(batch, lambda app: app["args"]["ingress"].update(max_text_chars=4999))
    ingress_before = replica_ids(cluster)["Ingress"]
    with Load(endpoints, cluster.api_key, clients=16, timeout_s=PATIENT_TIMEOUT_S) as load:
        load.wait_answers(30, 60)
        t0 = time.monotonic()
        cluster.submit_serve(batch)
        wait_for(lambda: translator_batch_size(cluster) == 16 and at_full_strength(cluster), 120,
                 "the Translator's new user_config, RUNNING", 1.0)
        user_config_s = time.monotonic() - t0
        t1 = time.monotonic()
        cluster.submit_serve(args)
        wait_for(lambda: at_full_strength(cluster) and cluster.applications_running()
                 and not (replica_ids(cluster)["Ingress"] & ingress_before), 300, "every Ingress replaced, the app RUNNING", 1.0)
        args_s = time.monotonic() - t1
        load.wait_answers(30, 60)
        requests = load.since(t0)
    summary = summarize(requests)
    figures["cluster_updates"] = {"user_config_applied_s": round(user_config_s, 1),
                                  "args_rolled_s": round(args_s, 1), **summary}
    failed = [r for r in requests if r.final.status != 200]
    assert not failed, f"{len(failed)} requests failed during the updates: {summary}"
    cluster.submit_serve(config)  # back to the manifest's config for the next test
    wait_for(lambda: at_full_strength(cluster) and cluster.applications_running(), 300, "the manifest's config", 1.0)


def _at_minimum(cluster) -> bool:
    deps = deployments(cluster)
    return all(deps[n]["target_num_replicas"] <= 2 for n in ("Translator", "Embedder")) and at_full_strength(cluster)


def test_a_ramp_scales_replicas_across_nodes(cluster, endpoints, figures, tmp_path):
    # From the application's minimum (earlier tests' load scaled it up; downscale_delay_s is 60 s).
    ready(cluster)
    wait_for(lambda: _at_minimum(cluster), 240, "Translator and Embedder back at 2 replicas", 2.0)
    before = running_by_node(cluster)
    timeline: list[dict] = []
    start = time.monotonic()
    with Load(endpoints, cluster.api_key, clients=8, timeout_s=PATIENT_TIMEOUT_S) as load:
        def sample():
            now = running_by_node(cluster)
            timeline.append({"t": round(time.monotonic() - start, 1),
                             "replicas": {k: dict(v) for k, v in now.items()}, "clients": load.clients})
            return now

        def ingress_everywhere_and_spread():
            now = sample()  # the plot ends on the state that ended the wait
            grown = {n for n in ("Translator", "Embedder") if sum(now[n].values()) > sum(before[n].values())}
            return (set(now["Ingress"]) == set(worker_ips(cluster)) and grown
                    and all(len(now[n]) >= 2 for n in grown))

        try:
            for clients in (16, 32, 48):  # the ramp: +16 clients every 10 s
                load.set_clients(clients)
                deadline = time.monotonic() + 10
                while time.monotonic() < deadline:
                    sample()
                    time.sleep(1)
            wait_for(ingress_everywhere_and_spread, 150, "an Ingress on every worker and grown models spread", 1.0)
        finally:
            save_timeline(timeline, worker_ips(cluster))
            print({name: (d["status"], d["target_num_replicas"], [(r.get("node_ip"), r["state"]) for r in d["replicas"]])
                   for name, d in deployments(cluster).items()})
        ramp_requests = list(load.requests)
    after = running_by_node(cluster)
    summary = summarize(ramp_requests)
    figures["cluster_ramp"] = {"replicas_before": {k: dict(v) for k, v in before.items()},
                               "replicas_after": {k: dict(v) for k, v in after.items()},
                               "seconds": round(time.monotonic() - start, 1), **summary}
    # Replicas the autoscaler added went to more than one pod. Replacements of a lost pod's replicas are
    # placed by Ray's best-effort SPREAD and were seen packed on one pod (docs/deploy.md): recorded,
    # and asserted only where max_replicas_per_node makes it a rule (Ingress, Model.iris).
    figures["cluster_ramp"]["packed_on_one_pod"] = sorted(
        name for name, nodes in after.items() if sum(nodes.values()) >= 2 and len(nodes) < 2)
    for name in ("Ingress", "Model.iris"):
        assert all(count == 1 for count in after[name].values()), f"{name}: {dict(after[name])}"
    grown = [n for n in ("Translator", "Embedder") if sum(after[n].values()) > sum(before[n].values())]
    assert grown and all(len(after[n]) >= 2 for n in grown), {n: dict(after[n]) for n in grown}
    not_ok, _ = failures_after_loss(ramp_requests)
    assert not not_ok, f"{len(not_ok)} requests failed during the ramp: {summary}"


@pytest.mark.parametrize("how", ["lost", "deleted"])
def test_the_head_restarted_with_gcs_fault_tolerance(cluster, endpoints, figures, how):
    """The head lost in the middle of a downscale, as CI once hit by chance: the ramp before left replicas
    above the minimum, and the head dies while the autoscaler stops some. Serve's recovering controller
    then stops as many again, not knowing which were draining; the cluster profile's autoscaling policy
    holds every step down so that a replica of every deployment keeps serving through it, and a call no
    replica takes is 503, never a hang (serve_app/autoscaling.py, HandleClient in serve_app/handle_client.py).
    Then the head's pod deleted as Kubernetes deletes it (kubelet.py): the head
    holds no replica and no traffic, so it has nothing to drain and must stop well within its grace period."""
    assert cluster.spec.gcs_ft is not None, "the RayService must set gcsFaultToleranceOptions"
    ready(cluster)
    before_ids = replica_ids(cluster)
    before_config = deployment_configs(cluster)
    above = above_minimum(before_ids, before_config)
    # Jobs live in Redis on clusters (issue 21): one finished before the head is lost, one running across it.
    jobs = {"finished": (submit_job(endpoints.ready(), cluster.api_key, job_payload(20, "before-head"),
                                    key=uuid.uuid4().hex), 20, "before-head")}
    finished_job(endpoints.ready, cluster.api_key, jobs["finished"][0], 120)
    with Load(endpoints, cluster.api_key, clients=8) as load:
        load.wait_answers(20, 60)
        # the ramp's replicas: the autoscaler stops some once its downscale_delay_s passed
        stopping_at_kill = downscale_begun(cluster, above)
        jobs["across"] = (submit_job(endpoints.ready(), cluster.api_key, job_payload(300, "across-head"),
                                     key=uuid.uuid4().hex), 300, "across-head")
        down_at = time.monotonic()
        deletion = cluster.delete_pod(cluster.head) if how == "deleted" else None
        if deletion is None:
            cluster.kill_node(cluster.head)
        # The head is away for a while, as a pod being rescheduled: the workers keep answering.
        load.wait_answers(40, 60, started_from=down_at)
        outage = load.since(down_at)
        cluster.start_node(cluster.head)
        cluster.wait_nodes(len(cluster.nodes), NODE_START_BOUND_S)  # started again if its start fails
        back_s = wait_for(lambda: cluster.applications_running() and time.monotonic() - down_at, 180,
                          "the Serve application RUNNING on the restarted head", 1.0)
        load.wait_answers(20, 60)
        requests = load.since(down_at)
    after_ids = replica_ids(cluster)
    after_config = deployment_configs(cluster)
    outage_summary = summarize(outage)
    jobs_after = {name: finished_job(endpoints.ready, cluster.api_key, job_id, 240) for name, (job_id, _, _) in jobs.items()}
    figures[f"cluster_head_{how}"] = {
        "pod_deleted": deletion and {"grace_s": deletion.grace_s, "ray_start_exited_after_s": deletion.stopped_after_s,
                                     "processes_left_behind": deletion.left_behind},
        "above_minimum_before": above, "stopping_at_kill": stopping_at_kill,
        "restarted_controller": controller_recovery(cluster),
        "answered_during_outage": outage_summary["statuses"].get("200", 0),
        "head_back_and_serve_running_s": round(back_s, 1), "outage": outage_summary,
        "whole": summarize(requests),
        "replicas_kept": {k: len(before_ids[k] & after_ids.get(k, set())) for k in before_ids},
        "jobs_after_the_restart": {name: job["status"] for name, job in jobs_after.items()}}
    print(figures[f"cluster_head_{how}"])
    assert not [r for r in requests if not r.ok], summarize(requests)
    assert outage_summary["statuses"].get("200", 0) >= 40
    if deletion is not None:  # with Ray's default 30 s drain it was SIGKILLed after the grace, having drained nothing
        assert deletion.graceful, deletion
    assert after_config == before_config
    for name, (_, records, tag) in jobs.items():
        job = jobs_after[name]
        assert job["status"] == "succeeded", (name, job.get("error"))
        assert [r["id"] for r in job["result"]["result"]] == [f"{tag}-{i}" for i in range(records)], name
    for name in ("Ingress", "Translator", "Embedder"):
        # GCS fault tolerance keeps the workers' replicas: some of each survive, even mid-downscale. In CI
        # with Ray's default policy the Embedder went from 6 to 2 as the head died, the recovering
        # controller stopped the 2 kept (of the 6 it found live), and every Embedder after was new.
        before, after = before_ids[name], after_ids[name]
        assert before & after, f"{name}'s replicas were all replaced: {sorted(before)} -> {sorted(after)}"
