"""The cluster's Redis (GCS fault tolerance's store and the jobs'; k8s/base/redis.yaml runs one replica) lost
under load and started again, as when its pod is rescheduled. GCS exits without its store, so the head's
`ray start` exits, and the kubelet restarts the head's container: here once Redis answers again (the
kubelet's restarts before that would fail and back off). The workers keep serving throughout, and GCS
reloads the cluster from Redis. Runs after tests/cluster/test_pod_restarts.py, on the same cluster."""

from __future__ import annotations

import time

import pytest

from tests.support import wait_for

from .helpers import (NODE_START_BOUND_S, above_minimum, deployment_configs, downscale_begun, ready, replica_ids,
                      wait_full_strength)
from .traffic import Load, summarize

pytestmark = pytest.mark.cluster

#: How long Redis stays away, GCS with it: a rescheduled pod's start, at the least.
REDIS_AWAY_S = 30


@pytest.mark.xfail(strict=False, reason=(
    "open: in 1 of 11 runs (after the lost-pod test, the app scaled up; the head's leftover processes killed) 13 of "
    "2,322 requests, /embeddings on one worker, timed out at the clients' 10 s while GCS was down; cause not found "
    "(an xfail keeps the logs: tests/cluster/conftest.py)"))
def test_the_clusters_redis_lost_under_load_and_started_again(cluster, endpoints, figures):
    assert cluster.spec.gcs_ft is not None, "the RayService must set gcsFaultToleranceOptions"
    ready(cluster)
    before = replica_ids(cluster)
    above = above_minimum(before, deployment_configs(cluster))
    with Load(endpoints, cluster.api_key, clients=8) as load:
        load.wait_answers(20, 60)
        stopping_at_loss = downscale_begun(cluster, above)  # an earlier test's replicas: lose Redis meanwhile
        lost_at = time.monotonic()
        cluster.kill_redis()
        wait_for(lambda: not cluster.head.alive, 60, "the head's `ray start` to exit with GCS", 0.5)
        head_exited_s = time.monotonic() - lost_at
        cluster.kill_node(cluster.head)  # the container runtime: what `ray start` left (HAProxy is not its child)
        # The outage's length, not a wait for an event:
        time.sleep(max(0.0, REDIS_AWAY_S - (time.monotonic() - lost_at)))
        without_gcs = load.since(lost_at)
        cluster.restore(NODE_START_BOUND_S)  # Redis, then the kubelet restarting the head's container
        back_s = wait_for(lambda: cluster.applications_running() and time.monotonic() - lost_at, 180,
                          "the Serve application RUNNING again", 1.0)
        load.wait_answers(20, 60)
        requests = load.since(lost_at)
    after = replica_ids(cluster)
    figures["cluster_redis_lost"] = {
        "head_ray_start_exited_after_s": round(head_exited_s, 1), "redis_away_s": REDIS_AWAY_S,
        "above_minimum_before": above, "stopping_at_loss": stopping_at_loss,
        "serve_running_again_after_s": round(back_s, 1), "while_gcs_was_down": summarize(without_gcs),
        "whole": summarize(requests), "replicas_kept": {k: len(before[k] & after.get(k, set())) for k in before}}
    print(figures["cluster_redis_lost"])
    assert not [r for r in requests if not r.ok], summarize(requests)
    assert summarize(without_gcs)["statuses"].get("200", 0) >= 40
    for name in ("Ingress", "Translator", "Embedder"):  # the workers' replicas outlived GCS
        assert before[name] & after[name], \
            f"{name}'s replicas were all replaced: {sorted(before[name])} -> {sorted(after[name])}"
    wait_full_strength(cluster, 300)
