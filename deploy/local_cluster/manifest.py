"""What a RayService manifest asks of each Ray node, read the way the KubeRay operator reads it.

The local cluster starts its nodes from these specs, so the manifest (kuberay/rayservice-cpu.yaml)
is what the cluster tests test: each group's `rayStartParams`, the container's `env` and its
resource limits (KubeRay turns `limits.cpu` / `limits.memory` / `nvidia.com/gpu` into
`--num-cpus` / `--memory` / `--num-gpus` unless rayStartParams set them), the Serve config
(`serveConfigV2`), Ray token authentication (`authOptions`) and GCS fault tolerance
(`gcsFaultToleranceOptions`, with the variables the operator injects for it).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Optional

import yaml

#: Kubernetes quantity suffixes (memory) -> bytes.
_SUFFIXES = {"": 1, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12,
             "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}


class ManifestError(ValueError):
    """The manifest cannot be run as KubeRay would run it (e.g. an env var from a Secret we lack)."""


def quantity_bytes(value: Any) -> int:
    m = re.fullmatch(r"(\d+(?:\.\d+)?)([kMGT]i?)?", str(value))
    if not m:
        raise ManifestError(f"memory quantity {value!r} is not a Kubernetes quantity like 4Gi")
    return int(float(m.group(1)) * _SUFFIXES[m.group(2) or ""])


def quantity_cpus(value: Any) -> float:
    text = str(value)
    return int(text[:-1]) / 1000 if text.endswith("m") else float(text)


@dataclass
class NodeSpec:
    """One Ray node as a pod of a group would start it."""

    group: str
    head: bool
    start_params: dict[str, str]
    env: dict[str, str]
    num_cpus: float
    memory_bytes: int
    num_gpus: int = 0
    #: Secret volumes: mount path -> Secret name (files named by the Secret's keys)
    secret_mounts: dict[str, str] = field(default_factory=dict)
    #: the pod's `terminationGracePeriodSeconds` (Kubernetes' default 30): from SIGTERM to SIGKILL
    termination_grace_s: float = 30.0

    def ray_start_args(self) -> list[str]:
        """`ray start` flags: the group's rayStartParams plus what KubeRay derives from the limits."""
        params = dict(self.start_params)
        # KubeRay rounds limits.cpu up to a whole logical CPU count when rayStartParams omit it.
        params.setdefault("num-cpus", str(math.ceil(self.num_cpus)))
        params.setdefault("memory", str(self.memory_bytes))
        if self.num_gpus:
            params.setdefault("num-gpus", str(self.num_gpus))
        return [f"--{key}={value}" for key, value in params.items()]


@dataclass
class RayServiceSpec:
    head: NodeSpec
    workers: NodeSpec
    worker_replicas: int
    worker_min_replicas: int
    worker_max_replicas: int
    serve_config: dict
    auth_mode: Optional[str]
    gcs_ft: Optional[dict] = None
    raw: dict = field(default_factory=dict, repr=False)

    @property
    def serve_port(self) -> int:
        return int(self.serve_config.get("http_options", {}).get("port", 8000))


def _container(template: dict) -> dict:
    return template["spec"]["containers"][0]


def _env(container: dict, secrets: Mapping[tuple[str, str], str]) -> dict[str, str]:
    env: dict[str, str] = {}
    for item in container.get("env") or []:
        if "value" in item:
            env[item["name"]] = str(item["value"])
            continue
        ref = (item.get("valueFrom") or {}).get("secretKeyRef")
        if ref is None:
            continue  # fieldRef / resourceFieldRef: pod metadata the local nodes have no use for
        key = (ref["name"], ref["key"])
        if key in secrets:
            env[item["name"]] = secrets[key]
        elif not ref.get("optional", False):
            # Kubernetes would not start this pod: CreateContainerConfigError.
            raise ManifestError(f"env {item['name']!r} needs Secret {ref['name']!r} key {ref['key']!r}, "
                                f"which is missing (the pod would not start)")
    return env


def _secret_mounts(pod: dict, container: dict) -> dict[str, str]:
    secret_volumes = {v["name"]: v["secret"]["secretName"] for v in pod.get("volumes") or [] if "secret" in v}
    return {m["mountPath"]: secret_volumes[m["name"]] for m in container.get("volumeMounts") or []
            if m["name"] in secret_volumes}


def _node(group: str, head: bool, spec: dict, secrets: Mapping[tuple[str, str], str]) -> NodeSpec:
    container = _container(spec["template"])
    limits = (container.get("resources") or {}).get("limits") or {}
    return NodeSpec(
        group=group, head=head,
        start_params={k: str(v) for k, v in (spec.get("rayStartParams") or {}).items()},
        env=_env(container, secrets),
        num_cpus=quantity_cpus(limits.get("cpu", 1)),
        memory_bytes=quantity_bytes(limits.get("memory", "2Gi")),
        num_gpus=int(limits.get("nvidia.com/gpu", 0)),
        secret_mounts=_secret_mounts(spec["template"]["spec"], container),
        termination_grace_s=float(spec["template"]["spec"].get("terminationGracePeriodSeconds", 30)),
    )


def load(path: Path, secrets: Mapping[tuple[str, str], str] = {}) -> RayServiceSpec:
    """The RayService in `path` (one document; its first worker group is the workers')."""
    raw = yaml.safe_load(Path(path).read_text())
    if raw.get("kind") != "RayService":
        raise ManifestError(f"{path} is a {raw.get('kind')!r}, not a RayService")
    cluster = raw["spec"]["rayClusterConfig"]
    group = cluster["workerGroupSpecs"][0]
    return RayServiceSpec(
        head=_node("head", True, cluster["headGroupSpec"], secrets),
        workers=_node(group["groupName"], False, group, secrets),
        worker_replicas=int(group.get("replicas", 1)),
        worker_min_replicas=int(group.get("minReplicas", 0)),
        worker_max_replicas=int(group.get("maxReplicas", 1)),
        serve_config=yaml.safe_load(raw["spec"]["serveConfigV2"]),
        auth_mode=(cluster.get("authOptions") or {}).get("mode"),
        gcs_ft=cluster.get("gcsFaultToleranceOptions"),
        raw=raw,
    )


def redis_password_ref(gcs_ft: dict) -> Optional[tuple[str, str]]:
    """The (Secret, key) that gcsFaultToleranceOptions.redisPassword reads, if any."""
    ref = ((gcs_ft.get("redisPassword") or {}).get("valueFrom") or {}).get("secretKeyRef")
    return (ref["name"], ref["key"]) if ref else None
