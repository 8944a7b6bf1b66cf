"""The manifests are secure by default (docs/security.md): checked by a real policy linter (checkov,
offline) and by the project's own assertions: every pod template meets the `restricted` Pod
Security Standard with a read-only root filesystem, no secret is committed, NetworkPolicies admit
each port only from where it is needed, the Ingress serves TLS, images can be pinned by digest.

Why this module is long: one assertion per protection in docs/security.md, each a few lines, over the same rendered manifests.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Iterator

import pytest
import yaml

from .helpers import OVERLAYS, ROOT, kustomize, load_all, ray_pod_templates

#: every folder `kubectl apply -k` is pointed at
KUSTOMIZATIONS = tuple(f"k8s/overlays/{o}" for o in OVERLAYS) + ("locustfiles",)
#: writable places a pod may have besides its volumes of data (PVCs): Ray's /tmp, caches, reports
WRITABLE_EMPTYDIRS = {"/tmp", "/home/ray/.cache", "/reports"}
RAY_COMPONENTS = {"ray-head", "ray-worker"}

#: checkov checks that do not apply here, each with the reason (docs/security.md says the same)
CHECKOV_SKIPS = {
    "CKV_K8S_43": "Image digests: the serve-app image is the user's own build and redis/locust are pulled "
                  "by the user's registry; pin them in an overlay with kustomize `images: digest:` "
                  "(test_an_overlay_pins_every_image_by_digest).",
    "CKV_K8S_15": "imagePullPolicy Always: with images pinned by digest, IfNotPresent pulls the same bytes "
                  "and keeps pods starting while a registry is down.",
    "CKV_K8S_40": "UID above 10000: the rayproject/ray image's files belong to its `ray` user (uid 1000); "
                  "the pods run as that non-root user with no capabilities and no privilege escalation.",
}


# --- what is checked: every object the kustomizations render, and the pods inside RayServices ---------------

@pytest.fixture(scope="module")
def rendered() -> dict[str, list[dict]]:
    return {k: kustomize(ROOT / k) for k in KUSTOMIZATIONS}


def pod_specs(objects: list[dict]) -> Iterator[tuple[str, dict]]:
    """(name, pod spec) of every pod template among `objects`, RayService groups included."""
    for obj in objects:
        name = f"{obj['kind']}/{obj['metadata']['name']}"
        if obj["kind"] == "RayService":
            for group, template in ray_pod_templates(obj):
                yield f"{name}/{group}", template["spec"]
        elif obj["kind"] in ("Deployment", "StatefulSet", "DaemonSet", "Job"):
            yield name, obj["spec"]["template"]["spec"]
        elif obj["kind"] == "Pod":
            yield name, obj["spec"]


def as_pods(objects: list[dict]) -> list[dict]:
    """The RayServices' pod templates as Pods (what KubeRay creates), for the linter; KubeRay's
    autoscaler sidecar in the head pod carries autoscalerOptions' securityContext."""
    pods = []
    for obj in objects:
        if obj["kind"] != "RayService":
            continue
        cluster = obj["spec"]["rayClusterConfig"]
        for group, template in ray_pod_templates(obj):
            spec = json.loads(json.dumps(template["spec"]))
            if group == "head" and cluster.get("enableInTreeAutoscaling"):
                options = cluster.get("autoscalerOptions", {})
                spec["containers"].append({
                    "name": "autoscaler", "image": spec["containers"][0]["image"],
                    "imagePullPolicy": "IfNotPresent", "securityContext": options.get("securityContext", {}),
                    "resources": options.get("resources", {}), "volumeMounts": options.get("volumeMounts", []),
                })
            # KubeRay gives a Ray container that sets none exec probes of the raylet's (and on the
            # head, GCS's) health through the dashboard agent (KubeRay's BuildPod).
            ray = spec["containers"][0]
            for probe in ("readinessProbe", "livenessProbe"):
                ray.setdefault(probe, {"exec": {"command": ["bash", "-c", "wget -T 2 -q -O- "
                                                            "http://localhost:52365/api/local_raylet_healthz"]}})
            pods.append({"apiVersion": "v1", "kind": "Pod",
                         "metadata": {"name": f"{obj['metadata']['name']}-{group}",
                                      "namespace": obj["metadata"].get("namespace", "serve-app"),
                                      "labels": template["metadata"].get("labels", {}),
                                      "annotations": template["metadata"].get("annotations", {})},
                         "spec": spec})
    return pods


# --- the project's own assertions ------------------------------------------------------------------------

def restricted_problems(spec: dict) -> list[str]:
    """What the `restricted` Pod Security Standard (v1.30) would refuse in a pod spec, plus what this
    project asks on top: a read-only root filesystem and a numeric non-root user."""
    problems = []
    pod = spec.get("securityContext", {})
    for flag in ("hostNetwork", "hostPID", "hostIPC"):
        if spec.get(flag):
            problems.append(flag)
    allowed_volumes = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim",
                       "projected", "secret"}
    for volume in spec.get("volumes", []):
        kinds = set(volume) - {"name"}
        if not kinds <= allowed_volumes:
            problems.append(f"volume {volume['name']}: {kinds - allowed_volumes}")
    if pod.get("seccompProfile", {}).get("type") not in ("RuntimeDefault", "Localhost"):
        problems.append("pod seccompProfile is not RuntimeDefault")
    if pod.get("runAsNonRoot") is not True:
        problems.append("pod runAsNonRoot is not true")
    if not isinstance(pod.get("runAsUser"), int) or pod["runAsUser"] == 0:
        problems.append("pod runAsUser is not a non-root uid")
    for container in spec.get("containers", []) + spec.get("initContainers", []):
        where = f"container {container['name']}"
        sc = container.get("securityContext", {})
        if sc.get("privileged"):
            problems.append(f"{where}: privileged")
        if sc.get("allowPrivilegeEscalation") is not False:
            problems.append(f"{where}: allowPrivilegeEscalation is not false")
        if sc.get("capabilities", {}).get("drop") != ["ALL"]:
            problems.append(f"{where}: capabilities.drop is not [ALL]")
        if set(sc.get("capabilities", {}).get("add", [])) - {"NET_BIND_SERVICE"}:
            problems.append(f"{where}: adds capabilities")
        if sc.get("runAsUser") == 0 or sc.get("runAsNonRoot") is False:
            problems.append(f"{where}: runs as root")
        if sc.get("readOnlyRootFilesystem") is not True:
            problems.append(f"{where}: root filesystem is writable")
        for port in container.get("ports", []):
            if port.get("hostPort"):
                problems.append(f"{where}: hostPort {port['hostPort']}")
    return problems


def test_every_pod_template_is_restricted_with_a_read_only_root(rendered):
    checked = []
    for kustomization, objects in rendered.items():
        for name, spec in pod_specs(objects):
            assert restricted_problems(spec) == [], (kustomization, name)
            checked.append(name)
    # both RayServices' head and worker groups, the model-cache Job, Redis, Locust's master and workers
    assert len([c for c in checked if c.startswith("RayService/")]) == 2 + 3, checked
    assert {"Job/model-cache-fill", "Job/locust-master", "Deployment/locust-worker"} <= set(checked), checked


def test_the_restricted_check_can_fail():
    head = ray_pod_templates(yaml.safe_load((ROOT / "kuberay/rayservice-cpu.yaml").read_text()))
    spec = next(head)[1]["spec"]
    assert restricted_problems(spec) == []
    weakened = json.loads(json.dumps(spec))
    weakened["containers"][0]["securityContext"]["readOnlyRootFilesystem"] = False
    del weakened["securityContext"]["seccompProfile"]
    weakened["volumes"].append({"name": "host", "hostPath": {"path": "/"}})
    assert len(restricted_problems(weakened)) == 3


def test_autoscaler_sidecars_are_hardened(rendered):
    for kustomization in KUSTOMIZATIONS[:2]:
        (rayservice,) = [o for o in rendered[kustomization] if o["kind"] == "RayService"]
        (pod,) = [p for p in as_pods([rayservice]) if p["metadata"]["name"].endswith("-head")]
        assert restricted_problems(pod["spec"]) == [], kustomization


def test_writable_places_are_only_the_needed_empty_dirs(rendered):
    for kustomization, objects in rendered.items():
        for name, spec in pod_specs(objects):
            empty = {v["name"] for v in spec.get("volumes", []) if "emptyDir" in v}
            for container in spec["containers"] + spec.get("initContainers", []):
                for mount in container.get("volumeMounts", []):
                    if mount["name"] in empty:
                        assert mount["mountPath"] in WRITABLE_EMPTYDIRS, (name, mount)
            for volume in spec.get("volumes", []):
                if "emptyDir" in volume:
                    assert volume["emptyDir"].get("sizeLimit"), (name, volume["name"])


def test_the_namespace_enforces_the_restricted_standard(rendered):
    for kustomization in KUSTOMIZATIONS[:2]:
        (namespace,) = [o for o in rendered[kustomization] if o["kind"] == "Namespace"]
        assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"


def _yaml_files() -> Iterator[Path]:
    for folder in ("k8s", "kuberay", "locustfiles", "deploy"):
        yield from (ROOT / folder).rglob("*.yaml")
        yield from (ROOT / folder).rglob("*.yml")


def test_no_secret_with_data_is_committed(rendered):
    files = list(_yaml_files())
    assert len(files) >= 10
    for path in files:
        for doc in load_all(path.read_text(encoding="utf-8")):
            if isinstance(doc, dict) and doc.get("kind") == "Secret":
                assert not doc.get("data") and not doc.get("stringData"), path
    for kustomization, objects in rendered.items():
        assert not [o for o in objects if o["kind"] == "Secret"], kustomization
    assert not (ROOT / "k8s/base/api-key-secret.yaml").exists()


def test_secret_references_are_not_optional_where_the_service_needs_them(rendered):
    """A pod whose API-keys Secret is missing must not start (rather than serve without keys)."""
    for kustomization, objects in rendered.items():
        for name, spec in pod_specs(objects):
            for volume in spec.get("volumes", []):
                if volume.get("secret", {}).get("secretName") == "serve-app-api-key":
                    assert volume["secret"]["optional"] is False, name
            for container in spec["containers"]:
                for env in container.get("env", []):
                    ref = env.get("valueFrom", {}).get("secretKeyRef")
                    assert not ref or ref["name"] != "serve-app-api-key", (name, env["name"])


# --- network ------------------------------------------------------------------------------------------

def _selects(selector: dict, labels: dict) -> bool:
    if not all(labels.get(k) == v for k, v in selector.get("matchLabels", {}).items()):
        return False
    for expr in selector.get("matchExpressions", []):
        value = labels.get(expr["key"])
        if expr["operator"] == "In" and value not in expr["values"]:
            return False
        if expr["operator"] == "NotIn" and value in expr["values"]:
            return False
        if expr["operator"] == "Exists" and expr["key"] not in labels:
            return False
    return True


def admitted(policies: list[dict], labels: dict, port: int) -> list[dict]:
    """The `from` peers that policies admit to a pod with `labels` on `port` (a peer {} = anyone)."""
    peers = []
    for policy in policies:
        spec = policy["spec"]
        if not _selects(spec["podSelector"], labels) or "Ingress" not in spec.get("policyTypes", ["Ingress"]):
            continue
        for rule in spec.get("ingress", []):
            ports = {p["port"] for p in rule.get("ports", [])}
            if ports and port not in ports:
                continue
            peers += rule.get("from", [{}])
    return peers


#: the sources each port of a Ray pod may be opened from
RAY_PEER = {"podSelector": {"matchLabels": {"app.kubernetes.io/name": "serve-app"},
                            "matchExpressions": [{"key": "app.kubernetes.io/component", "operator": "In",
                                                  "values": ["ray-head", "ray-worker"]}]}}
INGRESS_NS = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "ingress-nginx"}}}
MONITORING_NS = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}
OWN_NAMESPACE = {"podSelector": {}}
OPERATOR = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kuberay-system"}},
            "podSelector": {"matchLabels": {"app.kubernetes.io/name": "kuberay-operator"}}}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_network_policies_admit_each_port_only_from_where_it_is_needed(rendered, overlay):
    objects = rendered[f"k8s/overlays/{overlay}"]
    policies = [o for o in objects if o["kind"] == "NetworkPolicy"]
    # Default deny: every pod in the namespace is selected by a policy without rules.
    assert any(p["spec"]["podSelector"] == {} and not p["spec"].get("ingress") for p in policies)
    (rayservice,) = [o for o in objects if o["kind"] == "RayService"]
    for group, template in ray_pod_templates(rayservice):
        labels = template["metadata"]["labels"]
        assert labels["app.kubernetes.io/component"] in RAY_COMPONENTS, group
        ports = {p["containerPort"] for c in template["spec"]["containers"] for p in c.get("ports", [])}
        for port in ports | {52365, 8076, 10002}:  # declared, plus the agent's, an object manager's, a worker's
            peers = admitted(policies, labels, port)
            allowed = [RAY_PEER] + {9527: [INGRESS_NS, OWN_NAMESPACE], 8080: [MONITORING_NS],
                                    9101: [MONITORING_NS], 8265: [OPERATOR], 52365: [OPERATOR]}.get(port, [])
            assert peers and all(p in allowed for p in peers), (group, port, peers)
            assert RAY_PEER in peers, (group, port)
    # Only Ray pods are Ray peers: the model-cache Job's and Locust's pods are not.
    for other in ({"app.kubernetes.io/name": "serve-app", "app.kubernetes.io/component": "model-cache"},
                  {"app.kubernetes.io/name": "locust", "app.kubernetes.io/component": "worker"}):
        assert not _selects(RAY_PEER["podSelector"], other)
    # Redis (GCS fault tolerance, jobs), where present: from the Ray pods only.
    if any(o["kind"] == "Deployment" and o["metadata"]["name"] == "serve-app-redis" for o in objects):
        assert admitted(policies, {"app.kubernetes.io/name": "serve-app-redis"}, 6379) == [RAY_PEER]


def test_the_ingress_serves_tls_from_cert_manager(rendered):
    for kustomization in KUSTOMIZATIONS[:2]:
        (ingress,) = [o for o in rendered[kustomization] if o["kind"] == "Ingress"]
        hosts = {rule["host"] for rule in ingress["spec"]["rules"]}
        (tls,) = ingress["spec"]["tls"]
        assert set(tls["hosts"]) == hosts and tls["secretName"]
        annotations = ingress["metadata"]["annotations"]
        assert annotations["cert-manager.io/cluster-issuer"]
        assert annotations["nginx.ingress.kubernetes.io/force-ssl-redirect"] == "true"


# --- images -----------------------------------------------------------------------------------------------

def test_an_overlay_pins_every_image_by_digest(tmp_path):
    """What docs/security.md tells users: an overlay whose `images:` gives each image's digest
    renders every container (RayService groups and jobs included) with `@sha256:`."""
    digest = "sha256:" + "0" * 64
    overlay = tmp_path / "pinned"
    overlay.mkdir()
    for name in ("cpu", "gpu"):
        (overlay / "kustomization.yaml").write_text(yaml.safe_dump({
            "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
            "resources": [os.path.relpath(ROOT / "k8s/overlays" / name, overlay)],
            "images": [{"name": image, "digest": digest} for image in
                       ("registry.example.com/serve-app", "redis")],
        }))
        images = []
        for _, spec in pod_specs(kustomize(overlay)):
            images += [c["image"] for c in spec["containers"] + spec.get("initContainers", [])]
        assert images and all(i.endswith("@" + digest) for i in images), images


# --- checkov: the policy linter ---------------------------------------------------------------------------

def checkov_command() -> str:
    for candidate in (os.environ.get("SERVE_APP_CHECKOV"), ROOT / ".venv-checkov" / "bin" / "checkov",
                      shutil.which("checkov")):
        if candidate and Path(candidate).exists():
            return str(candidate)
    pytest.fail("checkov is not installed: `make install-test` puts it in .venv-checkov "
                "(or set SERVE_APP_CHECKOV to a checkov binary)", pytrace=False)


def run_checkov(folder: Path) -> dict:
    out = subprocess.run([checkov_command(), "-d", str(folder), "--framework", "kubernetes", "--output", "json",
                          "--skip-check", ",".join(CHECKOV_SKIPS)],
                         capture_output=True, text=True, timeout=300,
                         env=dict(os.environ, BC_SKIP_MAPPING="TRUE", CHECKOV_RUN_SCA_PACKAGE_SCAN_V2="false"))
    assert out.stdout.strip(), f"checkov printed nothing (exit {out.returncode}):\n{out.stderr[-3000:]}"
    report = json.loads(out.stdout)
    reports = report if isinstance(report, list) else [report]
    results = {"passed_checks": [], "failed_checks": []}
    for r in reports:
        for key in results:
            results[key] += r.get("results", {}).get(key, [])
    return results


def _write_objects(folder: Path, name: str, objects: list[dict]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.yaml").write_text(yaml.safe_dump_all(objects, sort_keys=False))


def test_checkov_passes_every_object_and_every_ray_pod(rendered, tmp_path):
    for kustomization, objects in rendered.items():
        name = kustomization.replace("/", "-")
        _write_objects(tmp_path, name, [o for o in objects if o["kind"] != "RayService"])
        _write_objects(tmp_path, f"{name}-ray-pods", as_pods(objects))
    results = run_checkov(tmp_path)
    failed = [f"{c['check_id']} {c['check_name']}: {c['resource']}" for c in results["failed_checks"]]
    assert failed == []
    passed_resources = {c["resource"] for c in results["passed_checks"]}
    for pod in ("Pod.serve-app.serve-app-cpu-head", "Pod.serve-app.serve-app-gpu-gpu",
                "Job.serve-app.model-cache-fill", "Deployment.serve-app.locust-worker"):
        assert any(r.startswith(pod) for r in passed_resources), (pod, sorted(passed_resources))
    assert len(results["passed_checks"]) > 300


def test_checkov_catches_a_weakened_pod(tmp_path):
    """The linter is not a no-op: the CPU head pod without its security contexts fails it."""
    (pod,) = [p for p in as_pods([yaml.safe_load((ROOT / "kuberay/rayservice-cpu.yaml").read_text())])
              if p["metadata"]["name"].endswith("-head")]
    del pod["spec"]["securityContext"]
    for container in pod["spec"]["containers"]:
        container.pop("securityContext", None)
    _write_objects(tmp_path, "weak", [pod])
    failed = {c["check_id"] for c in run_checkov(tmp_path)["failed_checks"]}
    # root allowed, privilege escalation, capabilities, writable root, seccomp
    assert {"CKV_K8S_23", "CKV_K8S_20", "CKV_K8S_37", "CKV_K8S_22", "CKV_K8S_31"} <= failed, failed
