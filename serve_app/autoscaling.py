"""The clusters' autoscaling policy: Ray Serve's queue-length policy, with downscale steps that a head
restart cannot turn into an outage.

Serve's controller stops replicas gracefully: an Ingress drains for 30 s, and a replica the autoscaler
stops before it was placed stays a live actor until the controller kills it. When the head dies in the
middle of a downscale, the controller that GCS fault tolerance brings back finds every live actor, the
stopping ones among them, and stops as many as exceed the target, choosing among them without knowing which
were already stopping (Ray 2.60: `DeploymentScheduler._get_replicas_to_stop` takes recovering replicas in
no order). On the local cluster (tests/cluster, 2026-11-30) the Ingress was at a target of 4 with 3
running (one pod short); Ray's step went from 4 to 2, computed from the 3 running; the head was deleted;
the restarted controller found 4 live and stopped the only 2 that served. For 26 s no Ingress answered.

A step may therefore remove only as many replicas as leave one serving in the worst case of such a recovery,
`lowest_safe_target`. With at most one replica running and the rest pending, that holds the target where it
is: the pending ones keep asking for pods. A redeploy that lowers `max_replicas` (or `target_capacity`) cuts
the target at once, outside any policy. The cluster profiles name `keep_one_serving` as every autoscaled
deployment's policy (deploy/serve_profiles.py). It assumes what the cluster profiles ensure (tests/deploy): a
stopped replica is gone before the next step, `downscale_delay_s` later (Serve kills it after its shutdown
timeout), and no scaling factor: the hold is a target, and Serve applies a factor to the difference from the
running count. Upscaling is Ray's.
"""

from __future__ import annotations

from typing import Any

from ray.serve.autoscaling_policy import replica_queue_length_autoscaling_policy
from ray.serve.config import AutoscalingContext


def lowest_safe_target(target: int, running: int) -> int:
    """The lowest target one downscale step may set, from `target` with `running` of them serving.

    A step that removes k of them leaves, if the head restarts at once, `target` live actors of which
    the recovering controller may stop any k. Serve removes replicas that are not running first, so
    the k stopped by the step are the pending ones first. Serving actors left in the worst case:
    `running - k` while k <= pending, else `running - (k - pending) - k`; at least one must stay.
    """
    pending = max(0, target - running)
    half = (target - 1) // 2  # k > pending: 2k <= target - 1
    removable = half if half > pending else min(pending, running - 1)
    return target - max(0, removable)


def keep_one_serving(ctx: AutoscalingContext) -> tuple[float, dict[str, Any]]:
    """Ray's queue-length policy, its downscale held at `lowest_safe_target`. Serve applies the
    deployment's delays, scaling factors and bounds to the result, as to its own policy's."""
    desired, state = replica_queue_length_autoscaling_policy(ctx)
    if desired < ctx.target_num_replicas:
        desired = max(desired, lowest_safe_target(ctx.target_num_replicas, ctx.current_num_replicas))
    return desired, state
