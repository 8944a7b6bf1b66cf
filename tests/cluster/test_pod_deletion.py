"""A worker pod deleted under load, as Kubernetes deletes one for a scale-down, a rollout, a node drain
or an eviction (deploy/local_cluster/kubelet.py: out of the Service, SIGTERM, SIGKILL after the grace
period).

On SIGTERM, Ray 2.60's `ray start` drains its node before it stops: Serve starts the node's replicas on
the other pods, then stops these once they have answered what they hold. The manifest gives that drain
150 s (RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S) within a 180 s grace period. So no request may fail or be
cut, unlike a pod that is lost (test_cluster.py), whose requests in flight break and are sent again.
"""

from __future__ import annotations

import time

import pytest

from .helpers import at_full_strength, pod_to_lose, ready, wait_full_strength
from .traffic import Load, describe_failed, summarize

pytestmark = pytest.mark.cluster


@pytest.mark.smoke  # CI: make cluster-smoke
def test_a_worker_pod_deleted_under_load_drains_first_and_no_request_fails(cluster, endpoints, figures):
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
    # The pod is KubeRay's again (it recreates a deleted worker pod): up for the next test, as the others leave it.
    cluster.restore()
    assert deletion.graceful, f"`ray start` was still running when the grace period ran out: {deletion}"
    with victim.log_path.open("rb") as log:
        log.seek(log_before)
        said = log.read().decode(errors="replace")
    assert "finished draining" in said, f"Ray did not say that {victim.name} drained: {said[-2000:]}"
    # As the contract allows (200, or 503 + Retry-After), at the first try: none cut, none resent.
    failed = [r for r in requests if not r.ok or len(r.attempts) > 1]
    assert not failed, (f"requests failed or resent while the pod drained: {summary}; "
                        f"{describe_failed(failed, deleted_at, deleted_url)}")
