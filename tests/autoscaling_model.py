"""What the unit and deploy tiers check the clusters' autoscaling policy (serve_app/autoscaling.py) against: the
worst recovery a head restart can bring, and Ray's context for calling a policy directly. No Ray started."""

from __future__ import annotations

import time

from ray.serve.config import AutoscalingConfig, AutoscalingContext


def serving_left_after_recovery(target: int, running: int, removed: int) -> int:
    """A step removes `removed` of `target` replicas (`running` of them serving; Serve stops the pending first),
    the head restarts before any stopped actor is gone, and the recovering controller stops `removed` of the
    `target` live actors, the serving ones first (the worst of its unordered choice)."""
    pending = max(0, target - running)
    stopped_serving = max(0, removed - pending)
    return max(0, running - stopped_serving - removed)


def autoscaling_context(config: AutoscalingConfig, target: int, running: int, requests: float) -> AutoscalingContext:
    return AutoscalingContext(
        deployment_id=None, deployment_name="Ingress", app_name="serve-app", current_num_replicas=running,
        target_num_replicas=target, running_replicas=[], total_num_requests=requests, total_queued_requests=None,
        aggregated_metrics=None, raw_metrics=None, capacity_adjusted_min_replicas=config.min_replicas,
        capacity_adjusted_max_replicas=config.max_replicas, policy_state={}, last_scale_up_time=None,
        last_scale_down_time=None, current_time=time.time(), config=config)
