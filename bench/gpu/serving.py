"""The GPU profile's Serve application, started as users start it, checked, loaded over HTTP, stopped.

The config is deploy.serve_profiles' "gpu" profile for the "local" target (what serve_config.gpu.yaml
is), with only what must change here overridden: translation.model (the random M2M100-418M-sized
folder), min/max_new_tokens fixed, embeddings.model_path (the MiniLM-shaped BERT), the response cache
off, the job store under the run's folder, and `scheduling` (each start names its own). The Translator
keeps num_gpus 0.5 and min_replicas 2: two replicas share the GPU. (--tiny on a CPU box: num_gpus 0
and smaller num_cpus, so it fits 2 cores.) It is checked with serve_app.config_check, then served by
`python -m serve_app.run CONFIG` (what `make run` runs) with Serve's Python proxy and no dashboard.

Checks recorded before the load: /readyz 200, the Translator's replicas RUNNING (serve.status() from a
driver attached to this run's cluster), the GPU's compute processes (nvidia-smi) and whose they are,
/v1/models' device and dtype. The run is stopped as `make run` stops (SIGTERM: drain, then Serve and
Ray shut down); what is left of its process tree is killed (bench/compare/procs.py).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from bench.gpu.common import ROOT, Deadline, Plan, say

#: In a Serve run's log: the application will not start (an import error in the controller's build of
#: it), while `serve run` and the launcher keep running; seen on a GPU machine lacking a package.
APP_FAILED = r"Exception importing application|DEPLOY_FAILED"

#: ray_actor_options.num_cpus for --tiny on a 2-core box (the profile asks for 5 CPUs)
TINY_CPUS = {"Ingress": 0.1, "Translator": 0.25, "Embedder": 0.25}

_STATUS_SCRIPT = """
import json, sys, ray
from ray import serve
ray.init(address=sys.argv[1], namespace="serve", logging_level="ERROR", log_to_driver=False)
st = serve.status()
apps = {name: {"status": str(app.status), "deployments": {d: {"status": str(s.status),
        "replicas": {str(k): v for k, v in s.replica_states.items()}} for d, s in app.deployments.items()}}
        for name, app in st.applications.items()}
print("STATUS_JSON " + json.dumps({"resources": ray.cluster_resources(), "applications": apps}, default=str))
"""


def app_config(models: dict, plan: Plan, tiny: bool, port: int, scheduling: str, work: Path,
               join_interval_steps: int = 1) -> dict:
    from deploy.serve_profiles import serve_config

    config = serve_config("gpu", "local")
    config["http_options"]["port"] = port
    app = config["applications"][0]
    args = app["args"]
    args["translation"].update(model=models["translation"], max_new_tokens=plan.decode_tokens,
                               min_new_tokens=plan.decode_tokens)
    args["translation"]["scheduling"] = scheduling  # the profile's own is continuous: each start names its own
    if scheduling != "static" and join_interval_steps > 1:
        args["translation"]["join_interval_steps"] = join_interval_steps
    args["embeddings"]["model_path"] = models["embeddings"]
    args["cache"] = {"enabled": False}
    args["jobs"] = {**args.get("jobs", {}), "store_path": str(work / f"jobs-{scheduling}.sqlite3")}
    if tiny:
        for dep in app["deployments"]:
            options = dep.setdefault("ray_actor_options", {})
            if dep["name"] == "Translator":
                options["num_gpus"] = 0
            if dep["name"] in TINY_CPUS:
                options["num_cpus"] = TINY_CPUS[dep["name"]]
    return config


def free_port(preferred: int | None = None) -> int:
    for port in ([preferred] if preferred else []) + [0]:
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return s.getsockname()[1]
    raise RuntimeError("no free port")


def get_json(url: str, timeout: float = 10) -> tuple[int, object]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.status, json.loads(resp.read() or b"null")
    except urllib.error.HTTPError as exc:
        body = exc.read()
        try:
            return exc.code, json.loads(body)
        except ValueError:
            return exc.code, body[:500].decode(errors="replace")


def _cmdlines(server) -> list[str]:
    import psutil

    lines = []
    for p in server.processes():
        try:
            lines.append(" ".join(p.cmdline()))
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            pass
    return lines


def gcs_address(server) -> str | None:
    """This run's GCS address, read from its own Ray processes (never another session's cluster)."""
    lines = _cmdlines(server)
    for line in lines:
        m = re.search(r"--gcs[-_]address[= ](\S+)", line)
        if m:
            return m.group(1)
    for line in lines:
        if "gcs_server" in line:
            port = re.search(r"--gcs_server_port[= ](\d+)", line)
            ip = re.search(r"--node[-_]ip[-_]address[= ](\S+)", line)
            if port:
                return f"{ip.group(1) if ip else '127.0.0.1'}:{port.group(1)}"
    return None


def serve_status(address: str | None) -> dict:
    if not address:
        return {"error": "no GCS address found among the run's processes"}
    env = dict(os.environ, RAY_AUTH_MODE=os.environ.get("RAY_AUTH_MODE", "token"))
    try:
        out = subprocess.run([sys.executable, "-c", _STATUS_SCRIPT, address], capture_output=True, text=True,
                             timeout=60, env=env, cwd=ROOT)
    except subprocess.TimeoutExpired:
        return {"error": "serve.status() took over 60 s"}
    for line in out.stdout.splitlines():
        if line.startswith("STATUS_JSON "):
            return json.loads(line[len("STATUS_JSON "):])
    return {"error": f"exit {out.returncode}: {(out.stderr or out.stdout)[-1500:]}"}


def gpu_processes(server) -> dict:
    """nvidia-smi's compute processes, each with its command line if it is one of this run's."""
    if not shutil.which("nvidia-smi"):
        return {"available": False}
    import psutil

    out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv"],
                         capture_output=True, text=True, timeout=20).stdout
    ours = {p.pid for p in server.processes()}
    procs = []
    for line in out.strip().splitlines()[1:]:
        pid_text, _, mem = line.partition(",")
        pid = int(pid_text.strip()) if pid_text.strip().isdigit() else -1
        try:
            title = " ".join(psutil.Process(pid).cmdline())[:120]
        except (psutil.Error, ValueError):
            title = "?"
        procs.append({"pid": pid, "used_memory": mem.strip(), "ours": pid in ours, "process": title})
    return {"available": True, "csv": out, "processes": procs, "count": len(procs)}


def translator_card(url: str) -> dict:
    status, body = get_json(f"{url}/v1/models")
    if status != 200 or not isinstance(body, dict):
        return {"status": status, "body": str(body)[:500]}
    card = next((m for m in body.get("data", []) if m.get("task") == "translation"), {})
    details = card.get("details", {})
    return {"status": status, "model": card.get("id"), "backend": card.get("backend"),
            "device": details.get("device"), "dtype": details.get("dtype"),
            "scheduling": details.get("scheduling"), "batching": card.get("batching"), "details": details}


def wait_replicas(server, want: int, timeout_s: float) -> dict:
    """serve.status() until the Translator has `want` RUNNING replicas (or the time is up)."""
    deadline = time.monotonic() + timeout_s
    status: dict = {}
    while True:
        status = serve_status(gcs_address(server))
        deployments = next(iter(status.get("applications", {}).values()), {}).get("deployments", {})
        running = deployments.get("Translator", {}).get("replicas", {}).get("RUNNING", 0)
        status["translator_running"] = running
        if running >= want or time.monotonic() > deadline:
            return status
        time.sleep(2)


def run(models: dict, plan: Plan, args, scheduling: str, offline_limit: float | None, deadline: Deadline,
        work: Path, out_dir: Path) -> dict:
    from bench.compare.procs import Server, ServerFailed
    from bench.gpu.http_load import run_cells, run_cell
    from serve_app.config_check import check_config

    port = free_port(9527 if args.device != "cpu" else None)
    config = app_config(models, plan, args.tiny, port, scheduling, work, getattr(args, "join_interval_steps", 1))
    problems = check_config(config)
    path = work / f"serve_config.{scheduling}.json"  # JSON is YAML: serve run reads it
    path.write_text(json.dumps(config, indent=1))
    result: dict = {"scheduling": scheduling, "port": port, "config_problems": problems, "config": str(path),
                    "translator_deployment": next(d for d in config["applications"][0]["deployments"]
                                                  if d["name"] == "Translator")}
    say(f"serve {scheduling}: config checked: {'; '.join(problems) if problems else 'no problems'}")
    env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0", PYTHONUNBUFFERED="1", SERVE_APP_PROXY="python",
               SERVE_APP_RAY_DASHBOARD="0", SERVE_APP_DRAIN_TIMEOUT_S="5")
    if args.device != "cpu":  # Ray's node gets the GPU whatever its own detection (NVML) finds
        env.setdefault("RAY_OVERRIDE_RESOURCES", json.dumps({"GPU": 1}))
    log = work / f"serve-{scheduling}.full.log"
    server = Server([sys.executable, "-m", "serve_app.run", str(path)], env, log, ROOT)
    url = f"http://127.0.0.1:{port}"
    try:
        try:
            result["ready_s"] = round(server.wait_ready(f"{url}/readyz", min(plan.ready_timeout_s,
                                                                             deadline.left() - 20),
                                                        fatal=APP_FAILED), 1)
        except ServerFailed as exc:
            result["error"] = f"not ready: {str(exc)[-1500:]}"
            result["readyz"] = get_json(f"{url}/readyz", 5)[1] if server.proc.poll() is None else None
            say(f"serve {scheduling}: {result['error']}\n/readyz: {result['readyz']}")
            return result
        say(f"serve {scheduling}: /readyz 200 after {result['ready_s']} s")
        status = wait_replicas(server, 2, 60)
        result["serve_status"] = status
        result["translator_running"] = status.get("translator_running")
        result["ray_gpus"] = status.get("resources", {}).get("GPU", 0)
        result["gpu_processes"] = gpu_processes(server)
        result["v1_models"] = translator_card(url)
        card = result["v1_models"]
        say(f"serve {scheduling}: Translator RUNNING replicas {result['translator_running']}, Ray GPUs "
            f"{result['ray_gpus']}, GPU processes {result['gpu_processes'].get('count', 'n/a')}, /v1/models device "
            f"{card.get('device')} dtype {card.get('dtype')} scheduling {card.get('scheduling')}")
        gpu = args.device != "cpu"
        device, dtype = ("cuda", "float16") if gpu else ("cpu", "float32")
        result["checks"] = {
            "translator_replicas_running_2": result["translator_running"] == 2,
            "gpu_compute_processes_2": result["gpu_processes"].get("count") == 2 if gpu else None,
            f"v1_models_device_{device}": str(card.get("device", "")).startswith(device),
            f"v1_models_dtype_{dtype}": card.get("dtype") == dtype,
            f"v1_models_scheduling_{scheduling}": card.get("scheduling") == scheduling}
        say(f"serve {scheduling}: checks {result['checks']}")
        if result["gpu_processes"].get("available"):
            say(f"serve {scheduling}: nvidia-smi:\n{result['gpu_processes']['csv'].strip()}")
        if status.get("error"):
            say(f"serve {scheduling}: serve.status(): {status['error']}")
        warm = run_cell(url, 16, 1, plan.warmup_seconds)
        say(f"serve {scheduling}: warm-up {warm['records_per_s']} records/s, statuses {warm['statuses']}")
        seconds = plan.cell_seconds if scheduling == "static" else plan.continuous_cell_seconds
        cells = list(plan.cells)
        result["cells"] = run_cells(url, cells, seconds, offline_limit, deadline, 24, f"serve {scheduling}")
        result["v1_models_after"] = translator_card(url)
        return result
    finally:
        stop(server, result, scheduling)
        keep_log(log, out_dir / f"serve-{scheduling}.log")


def stop(server, result: dict, scheduling: str) -> None:
    """SIGTERM to the launcher alone, as Ctrl-C on `make run` (it drains, then stops Serve and Ray; a
    signal to its whole process group would reach Ray's GCS too and leave the drain hanging), then
    whatever is left of its processes is killed."""
    began = time.monotonic()
    if server.proc.poll() is None:
        server.proc.send_signal(signal.SIGTERM)
        try:
            server.proc.wait(45)
        except subprocess.TimeoutExpired:
            pass
    result["launcher_exit"] = server.proc.poll()
    server.stop()
    result["stop_s"] = round(time.monotonic() - began, 1)
    result["left_running"] = len(_cmdlines(server))
    say(f"serve {scheduling}: stopped in {result['stop_s']} s (launcher exit {result['launcher_exit']}, "
        f"{result['left_running']} processes left)")


def keep_log(full: Path, kept: Path, limit: int = 300_000) -> None:
    """The launcher's log without the per-request access lines, its last `limit` characters."""
    try:
        lines = [line for line in full.read_text(errors="replace").splitlines() if '"event":"request"' not in line]
    except OSError:
        return
    kept.write_text("\n".join(lines)[-limit:] + "\n")
