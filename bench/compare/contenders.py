"""How each contender is started (same model code, same port, same load generator)."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import yaml

from bench.peers.models import BENTOML_VENV, ENGINE_ENV, ROOT, project_args
from bench.peers.ray_serve_peer import REPLICAS_ENV
from tests.support import deep_update

MAIN_PYTHON = Path(sys.executable)
INFINITY_VENV = ROOT / ".bench-venvs" / "infinity"
SERVE_CONFIG = ROOT / "serve_config.yaml"


@dataclass(frozen=True)
class Contender:
    name: str
    label: str
    #: (workload, port, scratch folder) -> argv
    argv: Callable[[str, int, Path], list[str]]
    env: Callable[[str], dict] = lambda workload: {}
    ready_path: str = "/readyz"
    body_kind: str = "contract"  # "contract" (serve-app's) or "texts" (BentoML's)
    ready_timeout_s: float = 180.0
    #: GET path whose JSON is recorded (what the server says it runs), if any
    info_path: str | None = None
    #: why it cannot run here, if it cannot (recorded in the results instead of dropping it)
    unavailable: Callable[[], str | None] = lambda: None
    #: extra warm-up (s) at the workload's highest concurrency for a contender that scales itself:
    #: its autoscaler's replicas start during the warm-up, not inside the measured cells
    settle_s: float = 0.0
    #: the workloads it can serve (None: all)
    workloads: tuple[str, ...] | None = None

    def unavailable_for(self, workload: str) -> str | None:
        """Why it does not run this workload here, if it does not."""
        if self.workloads is not None and workload not in self.workloads:
            return f"{self.label} serves only {', '.join(self.workloads)}"
        return self.unavailable()


def _peer(module: str) -> Callable[[str, int, Path], list[str]]:
    return lambda workload, port, _: [str(MAIN_PYTHON), "-m", module, "--workload", workload, "--port", str(port)]


def _bentoml_argv(workload: str, port: int, _: Path) -> list[str]:
    service = "Embeddings" if workload == "embeddings" else "Translation"
    return [str(BENTOML_VENV / "bin" / "bentoml"), "serve", f"bench.peers.bentoml_service:{service}",
            "--host", "127.0.0.1", "--port", str(port), "--working-dir", str(ROOT)]


def _bentoml_missing() -> str | None:
    if not (BENTOML_VENV / "bin" / "bentoml").exists():
        return f"no BentoML venv at {BENTOML_VENV} (make bench creates it)"
    return None


def _infinity_argv(workload: str, port: int, _: Path) -> list[str]:
    return [str(INFINITY_VENV / "bin" / "python"), "-m", "bench.peers.infinity_peer", "--workload", workload,
            "--port", str(port)]


def _infinity_missing() -> str | None:
    if not (INFINITY_VENV / "bin" / "infinity_emb").exists():
        return f"no Infinity venv at {INFINITY_VENV} (make bench creates it)"
    return None


def import_missing(module: str) -> Callable[[], str | None]:
    def check() -> str | None:
        done = subprocess.run([str(MAIN_PYTHON), "-c", f"import {module}"], capture_output=True, text=True)
        return None if done.returncode == 0 else done.stderr.strip().splitlines()[-1]
    return check


def write_serve_app_config(workload: str, port: int, out: Path, tree: Path = ROOT,
                           deployments: dict | None = None, config: str = "serve_config.yaml") -> Path:
    """`tree`'s `config` (serve_config.yaml, or serve_config.placed.yaml: what `make run` serves) with the bench port, the
    workload's model args and `deployments` (name -> options merged in), checked by `tree`'s own
    config_check as `make run` does."""
    check = [str(MAIN_PYTHON), "-m", "serve_app.config_check"]
    env = dict(os.environ, PYTHONPATH=str(tree))
    subprocess.run([*check, str(tree / config), "--port", str(port), "--write", str(out)],
                   check=True, cwd=tree, env=env, capture_output=True)
    rendered = yaml.safe_load(out.read_text())
    for app in rendered["applications"]:
        if app["import_path"].startswith("serve_app."):
            deep_update(app.setdefault("args", {}), project_args(workload))
            for dep in app.get("deployments", []):
                deep_update(dep, (deployments or {}).get(dep["name"], {}))
    out.write_text(yaml.safe_dump(rendered, sort_keys=False))
    done = subprocess.run([*check, str(out)], cwd=tree, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise ValueError(f"serve-app config for {workload} is invalid: {done.stdout}{done.stderr}")
    return out


def _serve_app_start(config: str, deployments: dict | None = None) -> Callable[[str, int, Path], list[str]]:
    """argv of `make run CONFIG=<config>` for a workload: the launcher on the bench's copy of `config`
    (with `deployments` merged in, see write_serve_app_config)."""
    def argv(workload: str, port: int, scratch: Path) -> list[str]:
        written = write_serve_app_config(workload, port, scratch / config, config=config, deployments=deployments)
        return [str(MAIN_PYTHON), "-m", "serve_app.run", "--address", "local", str(written)]
    return argv


_serve_app_argv = _serve_app_start("serve_config.yaml")
_serve_app_placed_argv = _serve_app_start("serve_config.placed.yaml")
#: make run's start with every call waiting 10 ms for company, as before skip_batch_wait_when_alone (the
#: Translator) and before the Embedder's wait of 0 (docs/benchmarks/batch-wait-run)
_serve_app_placed_waits_argv = _serve_app_start("serve_config.placed.yaml", {"Ingress": {"user_config": {
    model: {"skip_batch_wait_when_alone": False, "batch_wait_timeout_s": 0.01} for model in ("Translator", "Embedder")}}})
#: make run's start with each embeddings batch one padded call, as before the Embedder's max_batch_tokens
_serve_app_placed_one_pass_argv = _serve_app_start("serve_config.placed.yaml", {"Ingress": {"user_config": {
    "Embedder": {"max_batch_tokens": None}}}})


def _ray_serve(name: str, replicas: int, layout: str) -> Contender:
    """Ray Serve alone with `replicas` replicas, each with the model on cores / replicas threads (ONNX Runtime)."""
    return Contender(name, f"Ray Serve alone, {layout} (ONNX Runtime)", _peer("bench.peers.ray_serve_peer"),
                     ready_path="/", workloads=("embeddings",),
                     env=lambda workload: {ENGINE_ENV: "onnx", REPLICAS_ENV: str(replicas)})


CONTENDERS: tuple[Contender, ...] = (
    Contender("naive", "Naive FastAPI", _peer("bench.peers.naive")),
    Contender("service_streamer", "service_streamer", _peer("bench.peers.streamer"),
              unavailable=import_missing("service_streamer")),
    Contender("mlpool", "MLPool", _peer("bench.peers.mlpool_peer"), unavailable=import_missing("ml_pool")),
    Contender("bentoml", "BentoML", _bentoml_argv, body_kind="texts", unavailable=_bentoml_missing,
              env=lambda workload: {"BENCH_WORKLOAD": workload, "BENTOML_DO_NOT_TRACK": "True",
                                    "BENTOML_HOME": str(ROOT / ".bench-venvs" / "bentoml-home")}),
    # The dedicated batching servers (issue 24), each with serve-app's batch cap and wait.
    Contender("mosec", "mosec", _peer("bench.peers.mosec_peer"), ready_path="/",
              unavailable=import_missing("mosec")),
    Contender("litserve", "LitServe", _peer("bench.peers.litserve_peer"), ready_path="/health",
              unavailable=import_missing("litserve")),
    # mosec with the model on ONNX Runtime, the engine `make run` serves embeddings on: the same model code.
    Contender("mosec_onnx", "mosec, embeddings on ONNX Runtime", _peer("bench.peers.mosec_peer"), ready_path="/",
              unavailable=import_missing("mosec"), workloads=("embeddings",),
              env=lambda workload: {"BENCH_EMBEDDINGS_ENGINE": "onnx"}),
    # Ray Serve alone: one @serve.batch deployment, nothing of serve-app on the request path, Ray started as
    # `make run` starts it, the model on ONNX Runtime (bench/peers/ray_serve_peer.py): what Serve itself costs.
    _ray_serve("ray_serve", 2, "2 replicas x 1 thread"),
    _ray_serve("ray_serve_one", 1, "1 replica x 2 threads"),
    # Embedding models only; its own venv (.bench-venvs/infinity); the torch engine (bench/peers/infinity_peer.py).
    Contender("infinity", "Infinity (torch engine)", _infinity_argv, ready_path="/health", info_path="/models",
              unavailable=_infinity_missing, workloads=("embeddings",),
              env=lambda workload: {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "DO_NOT_TRACK": "1",
                                    "INFINITY_ANONYMOUS_USAGE_STATS": "0"}),
    # Its autoscaler (cpu profile: upscale_delay_s 5 on a 15 s look-back) adds replicas within
    # ~20-40 s of sustained load, each loading its model: 45 s of warm-up lets that settle.
    # `make run CONFIG=serve_config.yaml` (until 2026-11-23 what `make run` served; the name is kept so
    # results stay comparable): each model in a deployment of its own, behind the Ingress. HAProxy in
    # front where a binary exists (serve_app/proxy.py).
    Contender("serve_app", "serve-app, models in deployments (serve_config.yaml)", _serve_app_argv, info_path="/v1/models",
              env=lambda workload: {"SERVE_APP_DRAIN_TIMEOUT_S": "2"}, settle_s=45.0),
    # The same start with `--proxy python` (SERVE_APP_PROXY=python): Serve's Python proxy, which turns each
    # HTTP request into an actor call to the Ingress replica; the default where no HAProxy binary exists.
    Contender("serve_app_python_proxy", "serve-app, Python proxy (--proxy python)", _serve_app_argv,
              info_path="/v1/models", env=lambda workload: {"SERVE_APP_DRAIN_TIMEOUT_S": "2", "SERVE_APP_PROXY": "python"},
              settle_s=45.0),
    # `make run` (serve_config.placed.yaml): every model inside the Ingress (placement: ingress), so a
    # request crosses no Ray call between processes; the Ingress autoscales 1-2 replicas like the models of cpu.
    Contender("serve_app_placed", "serve-app as `make run` starts it (serve_config.placed.yaml)",
              _serve_app_placed_argv, info_path="/v1/models", env=lambda workload: {"SERVE_APP_DRAIN_TIMEOUT_S": "2"},
              settle_s=45.0),
    # The same with every call waiting batch_wait_timeout_s (10 ms) for company, alone or not: the A/B of
    # skip_batch_wait_when_alone (docs/configuration.md).
    Contender("serve_app_placed_waits", "serve-app as `make run` starts it, every call waits 10 ms (skip_batch_wait_when_alone: false)",
              _serve_app_placed_waits_argv, info_path="/v1/models", env=lambda workload: {"SERVE_APP_DRAIN_TIMEOUT_S": "2"},
              settle_s=45.0),
    # The same with each embeddings batch of up to 64 texts one call padded to its longest text: the A/B of
    # the Embedder's max_batch_tokens (docs/benchmarks/batching.md).
    Contender("serve_app_placed_one_pass", "serve-app as `make run` starts it, each embeddings batch one padded call",
              _serve_app_placed_one_pass_argv, info_path="/v1/models",
              env=lambda workload: {"SERVE_APP_DRAIN_TIMEOUT_S": "2"}, settle_s=45.0, workloads=("embeddings",)),
    # The same with Serve's user code on a thread of its own (Ray's default): the A/B of make run's
    # ONE_NODE_SERVE_ENVIRONMENT (serve_app/run.py; docs/benchmarks/user-loop-run).
    Contender("serve_app_placed_user_thread", "serve-app as `make run` starts it, user code on Ray's own thread",
              _serve_app_placed_argv, info_path="/v1/models",
              env=lambda workload: {"SERVE_APP_DRAIN_TIMEOUT_S": "2", "RAY_SERVE_RUN_USER_CODE_IN_SEPARATE_THREAD": "1"},
              settle_s=45.0),
    # The same with `embeddings.engine: onnx` (ONNX Runtime). Its export is kept in ~/.cache/serve-app/onnx: the
    # first start on a machine makes it (~25 s more to the first answer), later ones load it.
    Contender("serve_app_placed_onnx", "serve-app as `make run` starts it, embeddings.engine onnx",
              _serve_app_placed_argv, info_path="/v1/models",
              env=lambda workload: {"SERVE_APP_DRAIN_TIMEOUT_S": "2", "SERVE_APP_EMBEDDINGS_ENGINE": "onnx"},
              unavailable=import_missing("onnxruntime"), settle_s=45.0, workloads=("embeddings",)),
)

#: The in-process ceiling, reported beside the servers.
OFFLINE = "offline"


def contender_env(contender: Contender, workload: str) -> dict:
    env = dict(os.environ, PYTHONPATH=str(ROOT), RAY_USAGE_STATS_ENABLED="0", PYTHONUNBUFFERED="1")
    env.update(contender.env(workload))
    return env
