"""Strict checks of a Serve config file, because Serve itself ignores misspelled keys.

    python -m serve_app.config_check serve_config.yaml [--port 8000 --write out.yaml]

Checks every key against Ray's own schemas (unknown keys are errors, quoted),
validates with `ServeDeploySchema`, validates each application's `args:` with
`AppSettings`, the deployments' names and `user_config`, and that
`max_ongoing_requests` leaves room for a full batch. Exits 1 listing every problem.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from typing import Any, Iterable

import yaml

MODEL_DEPLOYMENTS = ("Translator", "Embedder")
#: the job store (POST /jobs); in the app only when jobs.enabled
JOB_DEPLOYMENT = "JobManager"
DEPLOYMENT_NAMES = ("Ingress", JOB_DEPLOYMENT) + MODEL_DEPLOYMENTS
BUILDER = "serve_app.builder:build_app"


def is_builder(import_path: Any) -> bool:
    """Whether an application is serve-app's, in either of the forms Ray accepts (`module:attr`, `module.attr`)."""
    return isinstance(import_path, str) and import_path.replace(":", ".") == BUILDER.replace(":", ".")


class ConfigError(ValueError):
    def __init__(self, problems: list[str]):
        super().__init__("\n".join(problems))
        self.problems = problems


def _unknown(section: dict, allowed: Iterable[str], where: str) -> list[str]:
    allowed = set(allowed)
    return [f"{where}: unknown key {key!r} (allowed: {', '.join(sorted(allowed))})"
            for key in section if key not in allowed]


def _ingress_holds(app: dict, settings, where: str) -> list[str]:
    """The Ingress's max_ongoing_requests (Serve's default for it when its entry does not set it) must
    exceed what its admission holds, admitted and waiting; past that, requests queue inside Serve, where
    the ingress cannot shed them."""
    from .settings import INGRESS_MAX_ONGOING_REQUESTS

    entry = next((d for d in _entries(app) if d.get("name") == "Ingress"), {})
    ongoing = entry.get("max_ongoing_requests", INGRESS_MAX_ONGOING_REQUESTS)
    ingress = settings.ingress
    if not isinstance(ongoing, int) or ongoing > ingress.max_inflight_requests + ingress.max_waiting_requests:
        return []
    return [f"{where}.deployments[Ingress]: max_ongoing_requests={ongoing}"
            f"{'' if 'max_ongoing_requests' in entry else ' (the default)'} must exceed "
            f"args.ingress.max_inflight_requests={ingress.max_inflight_requests} + max_waiting_requests="
            f"{ingress.max_waiting_requests}, or requests queue inside Serve where the ingress cannot shed them"]


def _entries(app: dict) -> list[dict]:
    """An application's deployment entries that are mappings (Serve's schema says what the others must be)."""
    deployments = app.get("deployments")
    return [d for d in deployments if isinstance(d, dict)] if isinstance(deployments, list) else []


def check_config(config: dict[str, Any]) -> list[str]:
    """Every problem found in a Serve config (empty when it is valid)."""
    from ray.serve.config import AutoscalingConfig
    from ray.serve.schema import (
        DeploymentSchema, HTTPOptionsSchema, LoggingConfig, RayActorOptionsSchema, ServeApplicationSchema,
        ServeDeploySchema,
    )

    from deployments.batch_config import MODEL_MAX_ONGOING_REQUESTS, default_batch, parse_batch_config

    from .auth import reject_secrets_in_args, reject_secrets_in_env_vars
    from deployments.model_module import deployment_name
    from .app_settings import app_settings

    if not isinstance(config, dict):
        return ["the config must be a mapping"]
    problems = _unknown(config, ServeDeploySchema.model_fields, "top level")
    for key, schema in (("http_options", HTTPOptionsSchema), ("logging_config", LoggingConfig)):
        if isinstance(config.get(key), dict):
            problems += _unknown(config[key], schema.model_fields, key)
    try:
        ServeDeploySchema.model_validate(config)
    except Exception as exc:  # pydantic's message already quotes the bad value
        problems.append(f"Serve rejects the config: {exc}")
    applications = config.get("applications")
    for app in applications if isinstance(applications, list) else []:
        if not isinstance(app, dict):  # (Serve's schema, above, has said what it must be)
            continue
        name = app.get("name", "?")
        where = f"applications[{name}]"
        problems += _unknown(app, ServeApplicationSchema.model_fields, where)
        if isinstance(app.get("runtime_env"), dict):
            problems += reject_secrets_in_env_vars(app["runtime_env"].get("env_vars"), f"{where}.runtime_env")
        settings, ours = None, is_builder(app.get("import_path"))
        if ours and isinstance(app.get("args") or {}, dict):  # (else Serve's said)
            try:
                reject_secrets_in_args(app.get("args"))
            except ValueError as exc:
                problems.append(f"{where}.{exc}")
            try:
                settings = app_settings(app)  # (with its runtime_env's env_vars, as Serve builds it)
            except Exception as exc:
                problems.append(f"{where}.args: {exc}")
                settings = None
        # Each custom model (`args.models`) is its own deployment, `Model.<name>`.
        custom = tuple(deployment_name(spec.name) for spec in settings.models) if settings is not None else ()
        # A model placed in the Ingress (`placement: ingress`) has no deployment of its own.
        placed = settings.placed_in_ingress() if settings is not None else {}
        names = tuple(n for n in DEPLOYMENT_NAMES + custom if n not in placed)
        model_names = tuple(n for n in MODEL_DEPLOYMENTS + custom if n not in placed)
        if settings is not None:
            problems += _autoscaler_visibility(app, settings, model_names, where)
            problems += _ingress_holds(app, settings, where)
        for dep in _entries(app):
            dname = dep.get("name", "?")
            dwhere = f"{where}.deployments[{dname}]"
            problems += _unknown(dep, DeploymentSchema.model_fields, dwhere)
            if ours and dname in placed:
                problems.append(
                    f"{dwhere}: args.{placed[dname]}.placement is 'ingress', so the app has no {dname} deployment "
                    f"(Serve would refuse the config): remove this entry; its batch knobs go in the Ingress's "
                    f"user_config under {dname!r}, its CPUs in the Ingress's ray_actor_options")
            elif ours and dname not in names:
                problems.append(f"{dwhere}: no deployment named {dname!r} (deployments: {', '.join(names)})")
            if dname == "Ingress" and settings is not None and "user_config" in dep:
                problems += _placed_batch_configs(dep["user_config"], placed, settings, dwhere)
            if dname == JOB_DEPLOYMENT and settings is not None and not settings.jobs.enabled:
                problems.append(f"{dwhere}: args.jobs.enabled is false, so the app has no {dname} deployment")
            if isinstance(dep.get("autoscaling_config"), dict):
                problems += _unknown(dep["autoscaling_config"], AutoscalingConfig.model_fields,
                                     f"{dwhere}.autoscaling_config")
            if isinstance(dep.get("ray_actor_options"), dict):
                problems += _unknown(dep["ray_actor_options"], RayActorOptionsSchema.model_fields,
                                     f"{dwhere}.ray_actor_options")
                if isinstance(dep["ray_actor_options"].get("runtime_env"), dict):
                    problems += reject_secrets_in_env_vars(dep["ray_actor_options"]["runtime_env"].get("env_vars"),
                                                           f"{dwhere}.ray_actor_options.runtime_env")
            if not ours:  # another application's deployments: Serve's schema only, not serve-app's batch rules
                continue
            if dname in model_names and "user_config" in dep:
                try:
                    batch = parse_batch_config(dep["user_config"], dname)
                except ValueError as exc:
                    problems.append(f"{dwhere}: {exc}")
                    continue
                if dname == "Translator" and settings is not None:
                    problems += _continuous_ignores(batch, settings.translation, f"{dwhere}.user_config")
                problems += _custom_ignores(batch, dname, f"{dwhere}.user_config")
            elif dname in model_names:  # Serve keeps the deployment's own user_config: the code's preset
                batch = default_batch(dname)
            else:
                continue
            ongoing = dep.get("max_ongoing_requests", MODEL_MAX_ONGOING_REQUESTS)  # (absent: the code's)
            if isinstance(ongoing, int) and ongoing < batch.max_batch_size:
                problems.append(
                    f"{dwhere}: max_ongoing_requests={ongoing}"
                    f"{'' if 'max_ongoing_requests' in dep else ' (the default)'} is below max_batch_size="
                    f"{batch.max_batch_size}{'' if 'user_config' in dep else ' (its default user_config)'}; a full "
                    "batch of single-record calls could never form")
    return problems


def _placed_batch_configs(user_config: Any, placed: dict[str, str], settings: Any, where: str) -> list[str]:
    """The Ingress's user_config: a batch config (as the model deployment's own user_config) per
    model placed in the Ingress, keyed by that model's deployment name, checked as that deployment's own."""
    from deployments.batch_config import parse_batch_config

    if not isinstance(user_config, dict):
        return [f"{where}.user_config: must map the names of models placed in the Ingress to their batch "
                f"config, got {user_config!r}"]
    problems = []
    for name, batch in user_config.items():
        if name not in placed:
            problems.append(f"{where}.user_config: {name!r} is not a model placed in the Ingress (placed: "
                            f"{', '.join(sorted(placed)) or 'none'}; set args.<model>.placement: ingress)")
            continue
        try:
            parsed = parse_batch_config(batch, name)
        except ValueError as exc:
            problems.append(f"{where}.user_config.{name}: {exc}")
            continue
        if name == "Translator":
            problems += _continuous_ignores(parsed, settings.translation, f"{where}.user_config.{name}")
        problems += _custom_ignores(parsed, name, f"{where}.user_config.{name}")
    return problems


def _custom_ignores(batch: Any, name: str, where: str) -> list[str]:
    """Your own model's batches are counted in inputs: a token budget would be silently ignored."""
    from deployments.model_module import DEPLOYMENT_PREFIX

    given = batch.user_config()
    if name.startswith(DEPLOYMENT_PREFIX) and "max_batch_tokens" in given:
        return [f"{where}.max_batch_tokens={given['max_batch_tokens']!r} has no effect on your own model (its "
                "batches are counted in inputs: max_batch_size): remove it"]
    return []


#: Translator batch knobs that only the static path (`@serve.batch` + generate) uses
_STATIC_ONLY_KNOBS = ("max_batch_tokens", "target_p99_batch_latency_s")


def _continuous_ignores(batch: Any, translation: Any, where: str) -> list[str]:
    """With `translation.scheduling: continuous` the decoding loop owns the batch: batch knobs of the
    static path would be silently ignored, so they are errors (the loop's own are args)."""
    if translation.scheduling != "continuous":
        return []
    given = batch.user_config()
    return [f"{where}.{knob}={given[knob]!r} has no effect with args.translation.scheduling="
            f"'continuous' (the decoding loop's limits are args.translation.max_running_sequences and "
            f"max_cached_tokens): remove it" for knob in _STATIC_ONLY_KNOBS if knob in given]


def _autoscaler_visibility(app: dict, settings: Any, model_names: tuple, where: str) -> list[str]:
    """Serve scales a model deployment on the calls in flight at its replicas; the ingress keeps
    at most `max_inflight_calls_per_model` there (per Ingress replica) and lets the rest share
    calls in its own queue, which the autoscaler cannot see. So it must allow at least
    max_replicas x target_ongoing_requests, or max_replicas can never be reached."""
    deps = {d.get("name"): d for d in _entries(app)}
    ingress = deps.get("Ingress", {})
    ingress_auto = ingress.get("autoscaling_config")
    ingresses = (ingress_auto.get("min_replicas", 1) if isinstance(ingress_auto, dict)
                 else ingress.get("num_replicas", 1))
    if not isinstance(ingresses, int) or ingresses < 1:
        return []
    allowed = settings.ingress.max_inflight_calls_per_model * ingresses
    problems = []
    for name in model_names:
        auto = deps.get(name, {}).get("autoscaling_config")
        if not isinstance(auto, dict):
            continue
        max_replicas, target = auto.get("max_replicas", 1), auto.get("target_ongoing_requests", 2)
        if not isinstance(max_replicas, int) or not isinstance(target, (int, float)):
            continue
        needed = max_replicas * target
        if allowed < needed:
            problems.append(
                f"{where}.args.ingress.max_inflight_calls_per_model="
                f"{settings.ingress.max_inflight_calls_per_model} x {ingresses} Ingress replica(s) = {allowed} "
                f"calls in flight, below {name}'s max_replicas={max_replicas} x target_ongoing_requests="
                f"{target:g} = {needed:g}: the autoscaler counts calls at the replicas, so {name} could never "
                f"reach {max_replicas} replicas; raise max_inflight_calls_per_model to at least "
                f"{math.ceil(needed / ingresses)}")
    return problems


def load_config(path: str | Path) -> dict[str, Any]:
    with open(path, encoding="utf-8") as f:
        return yaml.safe_load(f)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config", help="Serve config YAML")
    parser.add_argument("--port", type=int, help="override http_options.port")
    parser.add_argument("--host", help="override http_options.host")
    parser.add_argument("--write", help="write the (overridden) config here")
    ns = parser.parse_args(argv)
    config = load_config(ns.config)
    if ns.port or ns.host:
        http = config.setdefault("http_options", {})
        if ns.port:
            http["port"] = ns.port
        if ns.host:
            http["host"] = ns.host
    problems = check_config(config)
    if problems:
        print(f"{ns.config}: {len(problems)} problem(s):", file=sys.stderr)
        for p in problems:
            print(f"  - {p}", file=sys.stderr)
        return 1
    if ns.write:
        Path(ns.write).parent.mkdir(parents=True, exist_ok=True)
        Path(ns.write).write_text(yaml.safe_dump(config, sort_keys=False))
    print(f"{ns.config}: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
