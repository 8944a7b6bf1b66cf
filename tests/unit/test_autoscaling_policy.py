"""serve_app.autoscaling: a downscale step leaves a serving replica through the worst recovery a head restart
can bring (Serve's recovering controller stops any of the live actors). Pure arithmetic and Ray's policy
functions called directly: no Ray started."""

from __future__ import annotations

import pytest
from ray.serve.config import AutoscalingConfig

from deploy.serve_profiles import CLUSTER_AUTOSCALING_POLICY
from deploy.annotated import plain
from serve_app.autoscaling import keep_one_serving, lowest_safe_target
from tests.autoscaling_model import autoscaling_context, serving_left_after_recovery


@pytest.mark.parametrize("target", range(1, 17))
def test_every_step_down_to_the_lowest_safe_target_keeps_one_serving_and_one_more_would_not(target):
    for running in range(1, target + 1):
        lowest = lowest_safe_target(target, running)
        assert 1 <= lowest <= target
        for removed in range(target - lowest + 1):
            assert serving_left_after_recovery(target, running, removed) >= 1, (target, running, removed)
        if lowest > 1:  # the bound is tight: one replica more removed can leave none
            assert serving_left_after_recovery(target, running, target - lowest + 1) == 0, (target, running)


def test_the_case_the_local_cluster_hit():
    # target 4 with 3 running (one pod short): Ray's step from the 3 running went to 2, and the recovering
    # controller stopped both serving replicas; the safe step removes only the pending one.
    assert serving_left_after_recovery(4, 3, 2) == 0
    assert lowest_safe_target(4, 3) == 3
    assert lowest_safe_target(3, 3) == 2
    assert lowest_safe_target(16, 16) == 9  # 16 -> 9 -> 5 -> 3 -> 2: four steps


def test_the_policy_holds_an_idle_downscale_at_the_safe_target_and_leaves_upscaling_to_ray():
    config = AutoscalingConfig(min_replicas=2, max_replicas=8, target_ongoing_requests=16,
                               policy=plain(CLUSTER_AUTOSCALING_POLICY))
    assert config.policy.get_policy().__name__ == keep_one_serving.__name__  # the profiles' path resolves
    assert keep_one_serving(autoscaling_context(config, 4, 3, 0))[0] == 3
    assert keep_one_serving(autoscaling_context(config, 8, 8, 0))[0] == 5
    assert keep_one_serving(autoscaling_context(config, 2, 2, 160))[0] == pytest.approx(10)  # Ray's: 160 / 16
    assert keep_one_serving(autoscaling_context(config, 6, 6, 48))[0] == pytest.approx(4)  # a small step: Ray's own
