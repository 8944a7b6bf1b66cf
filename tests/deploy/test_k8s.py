"""k8s/: the kustomize overlays render, every object is valid, and the pieces refer to each other."""

from __future__ import annotations

import pytest
import yaml

from serve_app.config_check import check_config

from .helpers import (
    CUSTOM_KINDS, OVERLAYS, ROOT, as_pod_template, core_errors, crd_dir, crd_errors, kustomize, ray_pod_templates,
)

NAMESPACE = "serve-app"


@pytest.fixture(scope="module", params=OVERLAYS)
def overlay(request) -> tuple[str, list[dict]]:
    return request.param, kustomize(ROOT / "k8s" / "overlays" / request.param)


def _by_kind(objects: list[dict], kind: str) -> list[dict]:
    return [o for o in objects if o["kind"] == kind]


def _one(objects: list[dict], kind: str) -> dict:
    found = _by_kind(objects, kind)
    assert len(found) == 1, f"expected one {kind}, found {len(found)}"
    return found[0]


def test_overlay_deploys_everything_into_one_namespace(overlay):
    name, objects = overlay
    kinds = sorted(o["kind"] for o in objects)
    # No Secret: every secret (API keys, Redis password) is created by the user, never committed.
    expected = {"Namespace", "NetworkPolicy", "RayService", "Ingress", "PodMonitor", "PodDisruptionBudget", "ConfigMap",
                # k8s/base/redis.yaml: GCS fault tolerance and the job store
                "Deployment", "Service", "PersistentVolumeClaim"}
    if name == "gpu":
        expected |= {"Job"}
    assert set(kinds) == expected, kinds
    singles = [k for k in kinds if k != "NetworkPolicy"]  # network-policies.yaml: one per port group
    assert len(singles) == len(expected) - 1 + (name == "gpu"), kinds  # gpu: the model cache's claim too
    assert _one(objects, "Namespace")["metadata"]["name"] == NAMESPACE
    for obj in objects:
        if obj["kind"] != "Namespace":
            assert obj["metadata"].get("namespace") == NAMESPACE, obj["metadata"]["name"]
    assert _one(objects, "RayService")["metadata"]["name"] == f"serve-app-{name}"


def test_core_objects_are_valid_kubernetes(overlay):
    _, objects = overlay
    errors, checked = [], 0
    for obj in objects:
        if (obj["apiVersion"], obj["kind"]) in CUSTOM_KINDS:
            continue
        errors += core_errors(obj)
        checked += 1
    assert checked >= 4 and errors == []


def test_rayservice_is_valid_after_kustomize(overlay):
    _, objects = overlay
    rayservice = _one(objects, "RayService")
    assert crd_errors(rayservice) == []
    errors = []
    for group, template in ray_pod_templates(rayservice):
        errors += core_errors(as_pod_template(group, template))
    assert errors == []
    config = yaml.safe_load(rayservice["spec"]["serveConfigV2"])
    assert check_config(config) == []


def test_only_known_custom_kinds(overlay):
    """Anything outside Kubernetes' own API groups must be one of the kinds checked elsewhere."""
    _, objects = overlay
    core_groups = {"", "apps", "batch", "policy", "networking.k8s.io"}
    custom = {(o["apiVersion"], o["kind"]) for o in objects
              if (o["apiVersion"].rpartition("/")[0]) not in core_groups}
    assert custom <= CUSTOM_KINDS, custom


def test_ingress_routes_to_the_serve_service_kuberay_creates(overlay):
    _, objects = overlay
    rayservice = _one(objects, "RayService")
    service = _one(objects, "Ingress")["spec"]["rules"][0]["http"]["paths"][0]["backend"]["service"]
    assert service["name"] == rayservice["spec"]["serveService"]["metadata"]["name"]
    head = rayservice["spec"]["rayClusterConfig"]["headGroupSpec"]["template"]["spec"]["containers"][0]
    assert service["port"]["name"] in {p["name"] for p in head["ports"]}


def test_the_ingress_resends_a_request_whose_pod_was_lost(overlay):
    """nginx resends no POST by default, and every model route is one: the cluster figures (0 failed while
    a pod is lost) assume the controller's next-upstream retry."""
    _, objects = overlay
    annotations = _one(objects, "Ingress")["metadata"]["annotations"]
    assert set(annotations["nginx.ingress.kubernetes.io/proxy-next-upstream"].split()) >= {"error", "non_idempotent"}
    assert int(annotations["nginx.ingress.kubernetes.io/proxy-next-upstream-tries"]) == 3


def _labels_match(selector: dict, labels: dict) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


def test_pdb_and_pod_monitor_select_the_ray_pods(overlay):
    _, objects = overlay
    rayservice = _one(objects, "RayService")
    pdb = _one(objects, "PodDisruptionBudget")["spec"]["selector"]["matchLabels"]
    monitor = _one(objects, "PodMonitor")["spec"]
    cluster = rayservice["spec"]["rayClusterConfig"]
    # KubeRay adds ray.io/node-type=head|worker to the pods it creates from these templates.
    head_labels = {**cluster["headGroupSpec"]["template"]["metadata"]["labels"], "ray.io/node-type": "head"}
    assert not _labels_match(pdb, head_labels), "the PDB must not cover the head"
    assert _labels_match(monitor["selector"]["matchLabels"], head_labels)
    for group in cluster["workerGroupSpecs"]:
        labels = {**group["template"]["metadata"]["labels"], "ray.io/node-type": "worker"}
        assert _labels_match(pdb, labels), group["groupName"]
        assert _labels_match(monitor["selector"]["matchLabels"], labels), group["groupName"]


def test_pod_monitor_scrapes_ray_and_haproxy_metrics_on_every_ray_pod(overlay):
    """Ray's exporter (8080, metrics_export_port) and, since every Ray container runs Serve's
    HAProxy ingress, HAProxy's own exporter (RAY_SERVE_HAPROXY_METRICS_PORT, 9101 unless set):
    each endpoint names a port that every Ray pod declares with that number."""
    _, objects = overlay
    endpoints = {e["port"]: e for e in _one(objects, "PodMonitor")["spec"]["podMetricsEndpoints"]}
    assert set(endpoints) == {"metrics", "haproxy-metrics"}
    assert endpoints["haproxy-metrics"]["path"] == "/metrics"  # Ray's HAProxyConfig.metrics_uri
    for group, template in ray_pod_templates(_one(objects, "RayService")):
        container = template["spec"]["containers"][0]
        ports = {p["name"]: p["containerPort"] for p in container["ports"]}
        env = {e["name"]: e.get("value") for e in container["env"]}
        assert ports["metrics"] == 8080, group
        assert ports["haproxy-metrics"] == int(env.get("RAY_SERVE_HAPROXY_METRICS_PORT", 9101)), group


def test_api_keys_come_from_a_secret_the_user_creates_mounted_as_a_file(overlay):
    """Every Ray pod mounts the Secret `serve-app-api-key` (not optional: a pod without it does not
    start) and points SERVE_APP_INGRESS_API_KEYS_FILE at its file; no key in env or args."""
    _, objects = overlay
    rayservice = _one(objects, "RayService")
    for group, template in ray_pod_templates(rayservice):
        spec = template["spec"]
        (volume,) = [v for v in spec["volumes"] if v.get("secret", {}).get("secretName") == "serve-app-api-key"]
        assert volume["secret"]["optional"] is False, group
        container = spec["containers"][0]
        (mount,) = [m for m in container["volumeMounts"] if m["name"] == volume["name"]]
        assert mount["readOnly"] is True
        env = {e["name"]: e for e in container["env"]}
        assert "SERVE_APP_INGRESS_API_KEYS" not in env, group
        assert env["SERVE_APP_INGRESS_API_KEYS_FILE"]["value"] == mount["mountPath"] + "/api-keys", group
    args = yaml.safe_load(rayservice["spec"]["serveConfigV2"])["applications"][0]["args"]
    assert "api_keys" not in args.get("ingress", {})


def test_gpu_overlay_fills_the_model_cache_the_workers_mount():
    objects = kustomize(ROOT / "k8s" / "overlays" / "gpu")
    (pvc,) = [c for c in _by_kind(objects, "PersistentVolumeClaim") if c["metadata"]["name"] != "serve-app-redis"]
    job = _one(objects, "Job")["spec"]["template"]["spec"]
    rayservice = _one(objects, "RayService")
    claim = pvc["metadata"]["name"]
    # The Job writes the volume and downloads facebook/m2m100_418M into /models/m2m100_418M.
    (download,) = job["containers"]
    env = {e["name"]: e.get("value") for e in download["env"]}
    assert env["MODEL_ID"] == "facebook/m2m100_418M" and env["TARGET"] == "/models/m2m100_418M"
    assert "snapshot_download" in download["args"][0]
    job_mount = next(m for m in download["volumeMounts"] if m["mountPath"] == "/models")
    assert not job_mount.get("readOnly")
    assert next(v for v in job["volumes"] if v["name"] == job_mount["name"])["persistentVolumeClaim"]["claimName"] == claim
    # Serving pods only read it, and no serving container downloads anything.
    for group, template in ray_pod_templates(rayservice):
        for volume in template["spec"].get("volumes", []):
            if "persistentVolumeClaim" in volume:
                assert volume["persistentVolumeClaim"]["claimName"] == claim
        pvcs = {v["name"] for v in template["spec"].get("volumes", []) if "persistentVolumeClaim" in v}
        for container in template["spec"]["containers"] + template["spec"].get("initContainers", []):
            for mount in container.get("volumeMounts", []):
                if mount["name"] in pvcs:
                    assert mount["readOnly"] is True, (group, container["name"])
            assert "snapshot_download" not in str(container.get("args", "")) + str(container.get("command", ""))
    config = yaml.safe_load(rayservice["spec"]["serveConfigV2"])
    assert config["applications"][0]["args"]["translation"]["model"] == env["TARGET"]


def test_the_model_cache_s_storage_class_is_the_gpu_overlay_s_knob_and_documented():
    """ReadWriteMany without a storageClassName took the cluster's default class, block storage (ReadWriteOnce only)
    on common clouds: the claim stayed Pending. The class is named, set in one place (the overlay's patch), and
    docs/deploy.md says what class is needed and where to set it."""
    objects = kustomize(ROOT / "k8s" / "overlays" / "gpu")
    (pvc,) = [c for c in _by_kind(objects, "PersistentVolumeClaim") if c["metadata"]["name"] == "model-cache"]
    assert pvc["spec"]["accessModes"] == ["ReadWriteMany"]
    knob = pvc["spec"].get("storageClassName")
    assert knob, "the model cache's claim names no storage class: the cluster's default is taken"
    overlay = (ROOT / "k8s/overlays/gpu/kustomization.yaml").read_text(encoding="utf-8")
    assert overlay.count(f"value: {knob}") == 1 and "storageClassName" in overlay
    assert "storageClassName" not in (ROOT / "k8s/overlays/gpu/model-cache-pvc.yaml").read_text(encoding="utf-8")
    docs = (ROOT / "docs/deploy.md").read_text(encoding="utf-8")
    assert knob in docs and "k8s/overlays/gpu/kustomization.yaml" in docs and "ReadWriteMany" in docs


def test_cpu_overlay_needs_no_model_cache():
    objects = kustomize(ROOT / "k8s" / "overlays" / "cpu")
    claims = [c["metadata"]["name"] for c in _by_kind(objects, "PersistentVolumeClaim")]
    assert claims == ["serve-app-redis"] and not _by_kind(objects, "Job")
    for _, template in ray_pod_templates(_one(objects, "RayService")):
        assert not [v for v in template["spec"].get("volumes", []) if "persistentVolumeClaim" in v]


def test_core_validation_is_strict():
    """kubernetes-validate in strict mode rejects what `kubectl --validate=strict` would."""
    pdb = yaml.safe_load((ROOT / "k8s/base/pod-disruption-budget.yaml").read_text())
    assert core_errors(pdb) == []
    pdb["spec"]["maxUnavailabe"] = 1
    assert any("maxUnavailabe" in e for e in core_errors(pdb))


def test_the_pdb_lets_a_drain_take_a_worker_at_each_profile_s_minimum(overlay):
    """Ray's worker pods are owned by a RayCluster, whose CRD has no `scale` subresource: Kubernetes then honours
    only an integer `minAvailable`. The `maxUnavailable: 1` this PDB had left it at 0 allowed disruptions, and every
    drain of a node with a Ready worker hung."""
    _, objects = overlay
    spec = _one(objects, "PodDisruptionBudget")["spec"]
    assert "maxUnavailable" not in spec and isinstance(spec["minAvailable"], int)
    crd = yaml.safe_load((crd_dir() / "ray.io_rayclusters.yaml").read_text())
    assert all("scale" not in (v.get("subresources") or {}) for v in crd["spec"]["versions"])  # still none
    workers = sum(g["minReplicas"] for g in _one(objects, "RayService")["spec"]["rayClusterConfig"]["workerGroupSpecs"])
    assert 1 <= spec["minAvailable"] < workers, (spec, workers)
