"""kuberay/: RayServices valid against the KubeRay v1.7.0 CRDs, with a valid embedded Serve config."""

from __future__ import annotations

import copy
import re

import pytest
import yaml

from deploy import serve_profiles as sp
from serve_app.config_check import check_config

from .helpers import (
    KUBERAY_FILES, ROOT, as_pod_template, core_errors, crd_errors, load_yaml, pyproject, python_tag,
    ray_pin, ray_pod_templates,
)


@pytest.fixture(scope="module", params=KUBERAY_FILES)
def rayservice(request) -> dict:
    return load_yaml(ROOT / request.param)


def _container(template: dict) -> dict:
    """The Ray container (KubeRay's convention: the first one)."""
    return template["spec"]["containers"][0]


def _ports(container: dict) -> dict[str, int]:
    return {p["name"]: p["containerPort"] for p in container.get("ports", [])}


def test_rayservice_is_valid_against_the_crd(rayservice):
    assert rayservice["apiVersion"] == "ray.io/v1" and rayservice["kind"] == "RayService"
    assert crd_errors(rayservice) == []


def test_a_misspelled_field_is_rejected():
    bad = load_yaml(ROOT / KUBERAY_FILES[0])
    head = bad["spec"]["rayClusterConfig"]["headGroupSpec"]
    head["rayStartParam"] = head.pop("rayStartParams")
    errors = crd_errors(bad)
    assert any("rayStartParam" in e and "headGroupSpec" in e for e in errors), errors


def test_a_wrongly_typed_or_unknown_nested_field_is_rejected():
    bad = load_yaml(ROOT / KUBERAY_FILES[1])
    cluster = bad["spec"]["rayClusterConfig"]
    cluster["headGroupSpec"]["rayStartParams"]["num-cpus"] = 0  # must be a string
    cluster["workerGroupSpecs"][0]["template"]["spec"]["containers"][0]["imagePullPolicyy"] = "Always"
    bad["spec"]["upgradeStrategy"]["maxSurge"] = 1
    errors = "\n".join(crd_errors(bad))
    assert "num-cpus" in errors and "0 is not of type 'string'" in errors
    assert "imagePullPolicyy" in errors and "maxSurge" in errors


def test_serve_config_v2_is_the_rendered_cluster_profile(rayservice):
    name = rayservice["metadata"]["name"]
    profile = {"serve-app-cpu": "cpu-cluster", "serve-app-gpu": "gpu"}[name]
    config = yaml.safe_load(rayservice["spec"]["serveConfigV2"])
    assert config == sp.serve_config(profile, "cluster")


def test_serve_config_v2_is_accepted_by_serve_and_the_strict_checker(rayservice):
    from ray.serve.schema import ServeDeploySchema

    config = yaml.safe_load(rayservice["spec"]["serveConfigV2"])
    ServeDeploySchema.model_validate(config)
    assert check_config(config) == []


def test_pod_templates_are_valid_core_pod_templates(rayservice):
    errors = []
    for group, template in ray_pod_templates(rayservice):
        errors += core_errors(as_pod_template(f"{rayservice['metadata']['name']}-{group}", template))
    assert errors == []


def test_head_takes_no_replicas_and_exposes_dashboard_serve_and_metrics(rayservice):
    cluster = rayservice["spec"]["rayClusterConfig"]
    head = cluster["headGroupSpec"]
    assert head["rayStartParams"]["num-cpus"] == "0"
    ports = _ports(_container(head["template"]))
    config = yaml.safe_load(rayservice["spec"]["serveConfigV2"])
    assert ports["serve"] == config["http_options"]["port"] == 9527
    assert ports["dashboard"] == 8265 and ports["metrics"] == 8080
    assert rayservice["spec"]["excludeHeadPodFromServeSvc"] is True


def test_workers_expose_serve_and_metrics_and_size_their_resources(rayservice):
    for group in rayservice["spec"]["rayClusterConfig"]["workerGroupSpecs"]:
        assert 0 < group["minReplicas"] <= group["replicas"] <= group["maxReplicas"]
        container = _container(group["template"])
        assert _ports(container) == {"serve": 9527, "metrics": 8080, "haproxy-metrics": 9101}, group["groupName"]
        resources = container["resources"]
        for key in ("cpu", "memory"):
            assert key in resources["requests"] and key in resources["limits"], (group["groupName"], key)


def test_autoscaling_and_upgrades(rayservice):
    spec = rayservice["spec"]
    cluster = spec["rayClusterConfig"]
    assert cluster["enableInTreeAutoscaling"] is True
    options = cluster["autoscalerOptions"]
    assert options["upscalingMode"] in ("Default", "Aggressive", "Conservative")
    assert 30 <= options["idleTimeoutSeconds"] <= 900
    assert spec["upgradeStrategy"]["type"] in ("NewCluster", "NewClusterWithIncrementalUpgrade", "None")
    # Deprecated (no effect since KubeRay 1.1): not used.
    assert "serviceUnhealthySecondThreshold" not in spec and "deploymentUnhealthySecondThreshold" not in spec
    assert spec["serveService"]["metadata"]["name"] == "serve-app"


def test_gpu_workers_get_a_gpu_and_the_read_only_model_cache():
    rs = load_yaml(ROOT / "kuberay/rayservice-gpu.yaml")
    groups = {g["groupName"]: g for g in rs["spec"]["rayClusterConfig"]["workerGroupSpecs"]}
    pod = groups["gpu"]["template"]["spec"]
    container = _container(groups["gpu"]["template"])
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]
    assert pod.get("nodeSelector") or pod.get("affinity")
    mount = next(m for m in container["volumeMounts"] if m["mountPath"] == "/models")
    assert mount["readOnly"] is True
    volume = next(v for v in pod["volumes"] if v["name"] == mount["name"])
    assert volume["persistentVolumeClaim"]["claimName"] == "model-cache"
    # Translator replicas: 2 per GPU pod, so the group's maxReplicas covers Serve's max_replicas.
    translator = next(d for d in sp.serve_config("gpu", "cluster")["applications"][0]["deployments"]
                      if d["name"] == "Translator")
    per_pod = int(1 / translator["ray_actor_options"]["num_gpus"])
    assert groups["gpu"]["maxReplicas"] * per_pod >= translator["autoscaling_config"]["max_replicas"]
    # No GPU in the CPU group.
    assert "nvidia.com/gpu" not in _container(groups["cpu"]["template"])["resources"]["limits"]


def test_the_gpu_profile_s_cpu_only_replicas_fit_the_cpu_group_at_their_minimum_counts():
    """At their minimum counts the GPU profile's CPU-only replicas need 5.1 CPUs, and the cpu group's one pod had 4:
    the rest landed on the GPU pod, whose CPUs are the Translators' (the second one could then get none). And its
    Ingress and Model.iris had no rule to keep one per pod: a lost pod could take both."""
    from deploy.render_configs import reserved_at_minimum

    rs = load_yaml(ROOT / "kuberay/rayservice-gpu.yaml")
    groups = {g["groupName"]: g for g in rs["spec"]["rayClusterConfig"]["workerGroupSpecs"]}
    config = sp.serve_config("gpu", "cluster")
    cpu_only = {"applications": [{"deployments": [
        d for d in config["applications"][0]["deployments"] if not d.get("ray_actor_options", {}).get("num_gpus")]}]}
    cpus, _ = reserved_at_minimum(cpu_only)
    per_pod = float(_container(groups["cpu"]["template"])["resources"]["limits"]["cpu"])
    assert cpus <= groups["cpu"]["minReplicas"] * per_pod, (cpus, groups["cpu"]["minReplicas"], per_pod)
    assert groups["cpu"]["replicas"] == groups["cpu"]["minReplicas"]
    for profile in ("gpu", "cpu-cluster"):
        spread = {d["name"]: d.get("max_replicas_per_node")
                  for d in sp.serve_config(profile, "cluster")["applications"][0]["deployments"]}
        assert spread["Ingress"] == spread["Model.iris"] == 1, (profile, spread)
    local = {d["name"]: d for d in sp.serve_config("gpu", "local")["applications"][0]["deployments"]}
    assert "max_replicas_per_node" not in local["Ingress"]  # one workstation: one node


def test_cpu_worker_group_holds_the_cpu_profile_at_full_scale():
    rs = load_yaml(ROOT / "kuberay/rayservice-cpu.yaml")
    (group,) = rs["spec"]["rayClusterConfig"]["workerGroupSpecs"]
    cpus_per_pod = float(_container(group["template"])["resources"]["limits"]["cpu"])
    config = sp.serve_config("cpu", "cluster")
    need = sum((d.get("num_replicas") or d["autoscaling_config"]["max_replicas"]) * d["ray_actor_options"]["num_cpus"]
               for d in config["applications"][0]["deployments"])
    assert group["maxReplicas"] * cpus_per_pod >= need


def test_versions_and_images_follow_pyproject(rayservice):
    pin, py = ray_pin(), python_tag()
    version = pyproject()["project"]["version"]
    cluster = rayservice["spec"]["rayClusterConfig"]
    assert cluster["rayVersion"] == pin
    images = [c["image"] for _, t in ray_pod_templates(rayservice)
              for c in t["spec"]["containers"] + t["spec"].get("initContainers", [])]
    assert images
    for image in images:
        tag = image.rsplit(":", 1)[1]
        assert re.fullmatch(rf"{re.escape(version)}-ray{re.escape(pin)}-{py}(-gpu)?", tag), image


def test_the_two_rayservices_share_their_head_group():
    """Hand-written twice: keep them from drifting apart (images aside), GCS fault tolerance included (the GPU
    RayService had none: a lost head pod took its Serve applications and every GPU pod's loaded model with it)."""
    heads = []
    for name in KUBERAY_FILES:
        cluster = load_yaml(ROOT / name)["spec"]["rayClusterConfig"]
        head = copy.deepcopy(cluster["headGroupSpec"])
        for container in head["template"]["spec"]["containers"]:
            container["image"] = container["image"].removesuffix("-gpu")
        heads.append((head, cluster.get("gcsFaultToleranceOptions"), cluster.get("authOptions")))
    assert heads[0] == heads[1] and heads[0][1]["redisAddress"] == "serve-app-redis:6379"


def test_every_ray_container_serves_through_haproxy_as_make_run_does():
    """The proxy `make run` picks where a binary exists (serve_app/proxy.py), on every Ray pod: Ray's
    HAProxy mode must be set on all nodes before Ray starts."""
    from serve_app.proxy import haproxy_retry_policy
    from serve_app.proxy_shedding import FASTINTER_VARIABLE, shedding_for_config

    for name in KUBERAY_FILES:
        manifest = load_yaml(ROOT / name)
        spec = manifest["spec"]["rayClusterConfig"]
        shedding = shedding_for_config(yaml.safe_load(manifest["spec"]["serveConfigV2"]))
        groups = [spec["headGroupSpec"], *spec["workerGroupSpecs"]]
        for group in groups:
            for container in group["template"]["spec"]["containers"]:
                env = {e["name"]: e.get("value") for e in container.get("env", [])}
                assert env.get("RAY_SERVE_ENABLE_HA_PROXY") == "1", (name, group.get("groupName", "head"))
                # ... with the launcher's retry policy (one source).
                assert env.get("RAY_SERVE_HAPROXY_RETRY_ON") == haproxy_retry_policy(), (name, group.get("groupName", "head"))
                # ... and holding back what the Ingress replicas of its serveConfigV2 cannot hold (one source).
                assert env.get(FASTINTER_VARIABLE) == shedding.fastinter_value(), (name, group.get("groupName", "head"))


def test_every_ray_container_gets_the_launchers_control_plane_ticks():
    """The RayServices slow Serve's timers as `make run` does (serve_app/run.py LEAN_SERVE_TICKS, one
    source): the controller reads its interval on the head, replicas their export interval on workers."""
    from serve_app.run import LEAN_SERVE_TICKS

    for where, env in _ray_container_envs():
        assert {k: env.get(k) for k in LEAN_SERVE_TICKS} == LEAN_SERVE_TICKS, where


def test_every_worker_group_drains_its_ray_node_within_its_grace_period(rayservice):
    """A deleted worker pod drains its Ray node on SIGTERM (measured: tests/cluster/test_cluster.py):
    for longer than Ray's default 30 s, and Kubernetes' SIGKILL only after the drain, with room to stop."""
    for group in rayservice["spec"]["rayClusterConfig"]["workerGroupSpecs"]:
        env = {e["name"]: e.get("value") for e in _container(group["template"]).get("env", [])}
        drain_s = float(env["RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S"])
        grace_s = group["template"]["spec"].get("terminationGracePeriodSeconds", 30)
        assert 60 <= drain_s <= grace_s - 15, (group["groupName"], drain_s, grace_s)
        assert "lifecycle" not in _container(group["template"]), "one drain: Ray's, on SIGTERM"


def test_a_deleted_head_stops_at_once(rayservice):
    """The head holds no replica (num-cpus 0) and no traffic (excluded from the serve Service): Ray's SIGTERM
    drain has nothing to move there, so it is off; the pod's grace period is short (docs/deploy.md)."""
    spec = rayservice["spec"]
    head = spec["rayClusterConfig"]["headGroupSpec"]
    assert head["rayStartParams"]["num-cpus"] == "0" and spec["excludeHeadPodFromServeSvc"] is True
    env = {e["name"]: e.get("value") for e in _container(head["template"]).get("env", [])}
    assert env["RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S"] == "0"
    # and its autoscaler sidecar, which ignores SIGTERM, is SIGKILLed sooner than Kubernetes' 30 s
    assert head["template"]["spec"]["terminationGracePeriodSeconds"] <= 15


#: Every Ray process (clients and servers of Ray's RPCs, so every container) notices a peer that stopped
#: answering, a pod cut off from the network, within ~4 s and drops its calls to it once GCS declares that
#: node dead; HAProxy marks an Ingress there down within ~3 s (tests/cluster/test_partition.py, docs/deploy.md).
PARTITION_ENVIRONMENT = {
    "RAY_SERVE_HAPROXY_HEALTH_CHECK_INTER": "1s",
    "RAY_grpc_client_keepalive_time_ms": "2000",
    "RAY_grpc_client_keepalive_timeout_ms": "2000",
    "RAY_core_worker_rpc_server_reconnect_timeout_base_s": "1",
    "RAY_core_worker_rpc_server_reconnect_timeout_max_s": "2",
}


def test_every_ray_container_gives_up_on_an_unreachable_peer_within_seconds():
    for where, env in _ray_container_envs():
        assert {k: env.get(k) for k in PARTITION_ENVIRONMENT} == PARTITION_ENVIRONMENT, where


def _ray_container_envs():
    """((file, group), {name: value}) for every container of both RayServices."""
    for name in KUBERAY_FILES:
        spec = load_yaml(ROOT / name)["spec"]["rayClusterConfig"]
        for group in [spec["headGroupSpec"], *spec["workerGroupSpecs"]]:
            for container in group["template"]["spec"]["containers"]:
                env = {e["name"]: e.get("value") for e in container.get("env", [])}
                yield (name, group.get("groupName", "head")), env


def test_every_ray_pod_is_guaranteed_qos(rayservice):
    """Kubernetes gives a pod Guaranteed QoS only if every container, init containers and the autoscaler sidecar
    KubeRay adds to the head (autoscalerOptions.resources) included, has requests equal to its limits. The
    sidecar's 200m request against a 500m limit made the head Burstable, against its comment."""
    cluster = rayservice["spec"]["rayClusterConfig"]
    containers = [("autoscaler", cluster["autoscalerOptions"]["resources"])]
    for group in [cluster["headGroupSpec"], *cluster["workerGroupSpecs"]]:
        spec = group["template"]["spec"]
        containers += [(c["name"], c["resources"]) for c in spec.get("initContainers", []) + spec["containers"]]
    for name, resources in containers:
        assert resources["requests"] == resources["limits"], (name, resources)
