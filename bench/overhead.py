"""Serve's overhead per request, apart from the model: CPU, throughput, latency, memory.

    flock /tmp/serve-app-cpu.lock .venv/bin/python -m bench.overhead \\
        --variant baseline --variant 'no-access-log:args.ingress.access_log=false' --duration-s 20

Each variant starts the project as `make run` does (config_check --port <free> --write,
then `python -m serve_app.run`), on a free port, waits for /readyz, warms up, then drives
one-record /translation requests at a fixed concurrency with wrk for --duration-s (texts
varied per request, so no cache can answer them) and reports:

- CPU ms per request of every process of that Ray cluster (psutil user+system over the
  launcher's process tree, before/after the load), split by kind: proxy, ingress replica,
  model replica, controller, raylet+gcs, dashboard, other;
- the model's own CPU ms per request (the Translator replica's `stats()["model_cpu_s"]`,
  the model thread's CPU time), and so the overhead = total - model;
- requests/s, p50/p99 latency (wrk), idle CPU of the tree (% of one core), PSS per kind.

A variant is `LABEL[:KEY=VALUE,...]`; KEY is one of
  env.NAME                    an environment variable of the launcher (Ray and Serve inherit it)
  args.SECTION.FIELD          an application arg (e.g. args.ingress.records_per_call=1)
  Translator.OPTION[.SUB]     a deployment option (Ingress, Translator, Embedder)
  logging_config.FIELD        a top-level key of the Serve config
  app=floor                   serve `bench.floor_app` instead (Serve's own floor: no serve-app code)
  config=FILE                 start from that checked-in config (serve_config.placed.yaml: the models
                              in the Ingress, which is then pinned to --replicas like a model)
Values are YAML (`false`, `64`, `WARNING`). Every variant pins the model deployments to
--replicas replicas (autoscaling would start replicas mid-measurement).

--memory also starts the baseline with 2 Translator replicas and reports the PSS of the
whole tree against 1 replica: the memory one extra model replica costs.
--profile DIR records py-spy (collapsed stacks) of the proxy, ingress and model replica
during the load of each variant and prints their hottest functions; profiling perturbs
the CPU figures of that run.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import httpx
import psutil
import yaml

from .load import POOL

ROOT = Path(__file__).resolve().parents[1]
APP_NAME = "serve-app"
MODEL_DEPLOYMENTS = ("Translator", "Embedder")
#: process kinds, in the order the table shows them
KINDS = ("proxy", "ingress", "model", "other replicas", "controller", "raylet+gcs", "dashboard", "drivers", "other")
READY_TIMEOUT_S = 150.0
STOP_TIMEOUT_S = 90.0


# --------------------------------------------------------------------------------------------
# Variants
# --------------------------------------------------------------------------------------------

@dataclass
class Variant:
    label: str
    env: dict[str, str] = field(default_factory=dict)
    overrides: list[tuple[str, Any]] = field(default_factory=list)
    floor: bool = False
    #: the checked-in Serve config it starts from (config=serve_config.placed.yaml: models in the Ingress)
    config: str = "serve_config.yaml"

    @classmethod
    def parse(cls, spec: str) -> "Variant":
        label, _, rest = spec.partition(":")
        variant = cls(label=label)
        for item in filter(None, (part.strip() for part in rest.split(","))):
            key, sep, raw = item.partition("=")
            if not sep:
                raise SystemExit(f"variant {spec!r}: {item!r} is not KEY=VALUE")
            if key == "app":
                if raw != "floor":
                    raise SystemExit(f"variant {spec!r}: app={raw!r}; only app=floor exists")
                variant.floor = True
            elif key == "config":
                if not (ROOT / raw).is_file():
                    raise SystemExit(f"variant {spec!r}: config={raw!r} is not a file of the project")
                variant.config = raw
            elif key.startswith("env."):
                variant.env[key[4:]] = raw
            else:
                variant.overrides.append((key, yaml.safe_load(raw)))
        return variant


def set_path(node: dict, path: list[str], value: Any, where: str) -> None:
    """node[path[0]][path[1]]... = value, creating mappings on the way; `where` names the override in errors."""
    for part in path[:-1]:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise SystemExit(f"{where}: {part!r} is not a mapping")
    node[path[-1]] = value


def apply_override(config: dict, key: str, value: Any) -> None:
    app = config["applications"][0]
    head, *path = key.split(".")
    if head == "args":
        set_path(app.setdefault("args", {}), path, value, key)
    elif head in {d["name"] for d in app.get("deployments", [])}:
        deployment = next(d for d in app["deployments"] if d["name"] == head)
        set_path(deployment, path, value, key)
    elif head in ("logging_config", "http_options", "proxy_location"):
        set_path(config, [head, *path], value, key)
    else:
        raise SystemExit(f"override {key!r}: starts with neither args., a deployment name nor a top-level key")


def pin_replicas(config: dict, replicas: int, translators: Optional[int] = None) -> None:
    """Model deployments at exactly `replicas`, the Translator at `translators` (default the same):
    no autoscaling during a measurement."""
    from serve_app.settings import load_settings

    app = config["applications"][0]
    # Models placed in the Ingress (placement: ingress) have no deployment: the Ingress holds them
    # and is pinned like them. The same test the builder and config_check make.
    holds_models = bool(load_settings(app.get("args")).placed_in_ingress())
    for deployment in app.get("deployments", []):
        if deployment["name"] in MODEL_DEPLOYMENTS or (holds_models and deployment["name"] == "Ingress"):
            deployment.pop("autoscaling_config", None)
            deployment["num_replicas"] = replicas
            if deployment["name"] == "Translator" and translators:
                deployment["num_replicas"] = translators


def floor_config(port: int) -> dict:
    return {
        "proxy_location": "HeadOnly",
        "http_options": {"host": "127.0.0.1", "port": port},
        "logging_config": {"enable_access_log": False},
        "applications": [{"name": "floor", "route_prefix": "/", "import_path": "bench.floor_app:app",
                          "deployments": [{"name": "Ingress"}, {"name": "Echo"}]}],
    }


def render_config(variant: Variant, port: int, replicas: int, workdir: Path,
                  translators: Optional[int] = None) -> Path:
    """The config `make run PORT=<port>` would serve, with the variant's changes."""
    out = workdir / f"{variant.label}.yaml"
    if variant.floor:
        config = floor_config(port)
        app = config["applications"][0]
        for override_key, value in variant.overrides:
            head, *path = override_key.split(".")
            if head in ("Ingress", "Echo"):
                set_path(next(d for d in app["deployments"] if d["name"] == head), path, value, override_key)
            else:
                apply_override(config, override_key, value)
    else:
        subprocess.run([sys.executable, "-m", "serve_app.config_check", str(ROOT / variant.config),
                        "--port", str(port), "--write", str(out)], check=True, cwd=ROOT,
                       stdout=subprocess.DEVNULL)
        config = yaml.safe_load(out.read_text())
        pin_replicas(config, replicas, translators)
        for override_key, value in variant.overrides:
            apply_override(config, override_key, value)
    out.write_text(yaml.safe_dump(config, sort_keys=False))
    return out


# --------------------------------------------------------------------------------------------
# The running service and its processes
# --------------------------------------------------------------------------------------------

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def kind_of(proc: psutil.Process) -> str:
    try:
        cmd = " ".join(proc.cmdline()) or proc.name()
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return "other"
    with contextlib.suppress(psutil.Error, IndexError):
        if Path(proc.cmdline()[0]).name == "haproxy":  # RAY_SERVE_ENABLE_HA_PROXY=1: HAProxy in front
            return "proxy"
    if "ProxyActor" in cmd:
        return "proxy"
    replica = re.search(r"ServeReplica:[^:\s]+:(\w+)", cmd)
    if replica:
        # The measured model replica is the Translator (the floor app's: Echo); others idle here.
        return {"Ingress": "ingress", "Translator": "model", "Echo": "model"}.get(replica.group(1), "other replicas")
    if "ServeController" in cmd:
        return "controller"
    if "raylet" in cmd or "gcs_server" in cmd:
        return "raylet+gcs"
    # Drivers before the dashboard: their command lines hold the config's path, named after the variant.
    if "serve_app.run" in cmd or re.search(r"(^|/)serve\s+run\b", cmd):
        return "drivers"
    if "ray/dashboard/" in cmd or "ray-dashboard-" in cmd or "multiprocessing.forkserver" in cmd:
        return "dashboard"
    return "other"


def tree(root: psutil.Process) -> list[psutil.Process]:
    try:
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def titles(procs: list[psutil.Process]) -> dict[str, list[str]]:
    """Each kind's processes, by title (what `ps` shows), to check the classification."""
    out: dict[str, list[str]] = defaultdict(list)
    for p in procs:
        with contextlib.suppress(psutil.Error):
            out[kind_of(p)].append(" ".join(p.cmdline())[:90] or p.name())
    return dict(out)


def cpu_seconds(procs: list[psutil.Process]) -> dict[int, tuple[str, float]]:
    out = {}
    for p in procs:
        with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
            t = p.cpu_times()
            out[p.pid] = (kind_of(p), t.user + t.system)
    return out


def cpu_delta(before: dict, after: dict) -> dict[str, float]:
    """CPU seconds per kind between two snapshots (a process born in between counts from 0)."""
    by_kind: dict[str, float] = defaultdict(float)
    for pid, (kind, seconds) in after.items():
        by_kind[kind] += seconds - (before[pid][1] if pid in before else 0.0)
    return dict(by_kind)


def busiest(before: dict, after: dict, seconds: float, top: int = 8) -> list[tuple[int, str, float]]:
    """(pid, kind, % of one core) of the processes that used the most CPU between two snapshots."""
    used = [(pid, kind, 100 * (cpu - (before[pid][1] if pid in before else 0.0)) / seconds)
            for pid, (kind, cpu) in after.items()]
    return [(pid, kind, round(pct, 1)) for pid, kind, pct in sorted(used, key=lambda u: -u[2])[:top]]


def memory_mb(procs: list[psutil.Process]) -> dict[str, dict[str, float]]:
    """PSS and RSS (MB) per kind: PSS splits shared pages among the processes sharing them."""
    out: dict[str, dict[str, float]] = defaultdict(lambda: {"pss": 0.0, "rss": 0.0, "n": 0})
    for p in procs:
        with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
            info = p.memory_full_info()
            entry = out[kind_of(p)]
            entry["pss"] += info.pss / 2**20
            entry["rss"] += info.rss / 2**20
            entry["n"] += 1
    return {k: {m: round(v, 1) for m, v in d.items()} for k, d in out.items()}


class Service:
    """`python -m serve_app.run <config>` with the variant's environment; stopped (and its whole
    process tree killed if need be) on exit."""

    def __init__(self, config: Path, env: dict[str, str], log: Path):
        self.config, self.env, self.log = config, env, log
        self.port = yaml.safe_load(config.read_text())["http_options"]["port"]
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: Optional[subprocess.Popen] = None
        self.root: Optional[psutil.Process] = None

    def __enter__(self) -> "Service":
        env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0", PYTHONUNBUFFERED="1",
                   # Answers must come from the model: no response cache (where the setting exists).
                   SERVE_APP_CACHE_ENABLED="false",
                   PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
                   **self.env)
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen([sys.executable, "-m", "serve_app.run", str(self.config)], cwd=ROOT,
                                         env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        self.root = psutil.Process(self.proc.pid)
        try:
            self._wait_ready()
        except BaseException:
            self.__exit__()
            raise
        return self

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + READY_TIMEOUT_S
        with httpx.Client(timeout=5) as client:
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"launcher exited with {self.proc.returncode}:\n{self.log.read_text()[-3000:]}")
                with contextlib.suppress(httpx.HTTPError):
                    if client.get(f"{self.url}/readyz").status_code == 200:
                        return
                time.sleep(0.5)  # readiness can only be observed by asking
        raise RuntimeError(f"not ready after {READY_TIMEOUT_S} s:\n{self.log.read_text()[-3000:]}")

    def processes(self) -> list[psutil.Process]:
        return tree(self.root)

    def gcs_address(self) -> str:
        for p in self.processes():
            with contextlib.suppress(psutil.Error):
                cmd = p.cmdline()
                if "--address" in cmd and "run" in cmd:
                    return cmd[cmd.index("--address") + 1]
        raise RuntimeError("no `serve run --address` child found")

    def __exit__(self, *exc) -> None:
        if self.proc is None:
            return
        everything = self.processes()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)  # the launcher drains, then stops Serve and Ray
            try:
                self.proc.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                pass
        for p in everything:  # whatever outlived the launcher (it started them all)
            with contextlib.suppress(psutil.Error):
                p.kill()


# --------------------------------------------------------------------------------------------
# Load (wrk, one-record /translation with a varied text per request)
# --------------------------------------------------------------------------------------------

def wrk_script(records: int) -> str:
    pool = ",\n  ".join(json.dumps(s) for s in POOL)
    return f"""-- generated by bench/overhead.py: {records}-record /translation requests, every text different
local pool = {{
  {pool}
}}
local records = {records}
local i = 0
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
request = function()
  i = i + 1
  local parts = {{}}
  for k = 1, records do
    -- a number in front: every text differs, still one sentence (the model's work per record is unchanged)
    local text = "(" .. (i * records + k) .. ") " .. pool[((i + k) % #pool) + 1]
    parts[k] = string.format('{{"id":"%d","text":"%s"}}', k, text)
  end
  return wrk.format(nil, "/translation", nil,
    '{{"payload":{{"fromLang":"en","toLang":"pt","records":[' .. table.concat(parts, ",") .. ']}}}}')
end
done = function(summary, latency, requests)
  io.write(string.format("BENCH requests=%d p50_us=%d p99_us=%d\\n", summary.requests,
    latency:percentile(50), latency:percentile(99)))
end
"""


def drive(url: str, concurrency: int, duration_s: float, records: int, workdir: Path) -> dict:
    """Closed loop: `concurrency` connections, each sending the next request when answered."""
    if shutil.which("wrk") is None:
        raise SystemExit("bench.overhead needs wrk (apt-get install wrk): its client costs little CPU, "
                         "which matters when it shares 2 cores with the service")
    script = workdir / f"overhead-{records}.lua"
    script.write_text(wrk_script(records))
    threads = 1 if concurrency < 64 else 2  # one wrk thread keeps up with Serve here and costs least CPU
    out = subprocess.run(["wrk", "-t", str(threads), "-c", str(concurrency), "-d", f"{max(1, round(duration_s))}s",
                          "--timeout", "60s", "-s", str(script), url], capture_output=True, text=True).stdout
    m = re.search(r"BENCH requests=(\d+) p50_us=(\d+) p99_us=(\d+)", out)
    errors = re.search(r"Socket errors: (.*)", out)
    if not m:
        raise RuntimeError(f"could not read wrk's output:\n{out}")
    requests, p50, p99 = (int(g) for g in m.groups())
    # wrk counts answers that are not 2xx/3xx itself (a Lua counter would live in one thread's state only)
    non200 = int(re.search(r"Non-2xx or 3xx responses: (\d+)", out).group(1)) if "Non-2xx" in out else 0
    return {"requests": requests, "non200": non200, "socket_errors": errors.group(1) if errors else "",
            "requests_per_s": round(requests / duration_s, 1), "p50_ms": round(p50 / 1000, 1),
            "p99_ms": round(p99 / 1000, 1)}


# --------------------------------------------------------------------------------------------
# The model's own time, from the replica
# --------------------------------------------------------------------------------------------

class ModelStats:
    """The Translator replica's `stats()` through a DeploymentHandle, asked by a child process
    (`--stats-server`) connected to the service's cluster as a driver: Serve caches its handle
    routers per process, so a driver of one variant's cluster cannot be reused for the next."""

    def __init__(self, gcs_address: str):
        env = dict(os.environ, RAY_AUTH_MODE=os.environ.get("RAY_AUTH_MODE", "token"))  # as serve_app.run
        self._proc = subprocess.Popen([sys.executable, "-m", "bench.overhead", "--stats-server", gcs_address],
                                      cwd=ROOT, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                      stderr=subprocess.DEVNULL, text=True)

    def model_cpu_s(self) -> Optional[float]:
        self._proc.stdin.write("stats\n")
        self._proc.stdin.flush()
        line = self._proc.stdout.readline()
        if not line:
            raise RuntimeError("the stats server exited")
        return json.loads(line).get("model_cpu_s")

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._proc.stdin.close()
        try:
            self._proc.wait(30)
        except subprocess.TimeoutExpired:
            self._proc.kill()


def stats_server(gcs_address: str) -> int:
    """Answer each line on stdin with the Translator's stats() as one JSON line."""
    import ray
    from ray import serve

    ray.init(address=gcs_address, namespace="serve", logging_level="ERROR", log_to_driver=False)
    if "Translator" in serve.status().applications[APP_NAME].deployments:
        ask = serve.get_deployment_handle("Translator", app_name=APP_NAME).stats.remote
    else:  # placed in the (pinned, single) Ingress replica
        ingress = serve.get_deployment_handle("Ingress", app_name=APP_NAME)
        ask = lambda: ingress.call_placed.remote("Translator", "stats")  # noqa: E731
    for _ in sys.stdin:
        print(json.dumps(ask().result(timeout_s=30)), flush=True)
    ray.shutdown()
    return 0


# --------------------------------------------------------------------------------------------
# py-spy
# --------------------------------------------------------------------------------------------

def start_profiles(procs: list[psutil.Process], duration_s: float, out_dir: Path, label: str) -> list:
    if shutil.which("py-spy") is None and not Path(sys.executable).with_name("py-spy").exists():
        raise SystemExit("--profile needs py-spy (pip install py-spy)")
    exe = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    out_dir.mkdir(parents=True, exist_ok=True)
    running = []
    for p in procs:
        kind = kind_of(p)
        if kind in ("proxy", "ingress", "model"):
            path = out_dir / f"{label}-{kind}-{p.pid}.txt"
            running.append((kind, path, subprocess.Popen(
                [exe, "record", "--pid", str(p.pid), "--duration", str(int(duration_s)), "--rate", "100",
                 "--nonblocking", "--format", "raw", "--threads", "-o", str(path)],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)))
    return running


def hottest(collapsed: Path, top: int = 12) -> tuple[int, list[tuple[str, float]], list[tuple[str, float]]]:
    """(samples, [(function, % inclusive)], [(function, % self)]) of a py-spy raw (collapsed) profile.

    Idle frames (threads waiting in select/epoll/sleep/wait) are left out, so the percentages
    are of the time the process was on CPU."""
    idle = re.compile(r"\b(select|poll|epoll_wait|_worker \(concurrent|wait \(threading|sleep|_wait_for_tstate_lock"
                      r"|run_forever|_run_once \(asyncio/base_events.py:\d+\)$)")
    inclusive: Counter = Counter()
    own: Counter = Counter()
    total = 0
    for line in collapsed.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames = [f for f in stack.split(";") if not f.startswith("thread ") and not f.startswith("process ")]
        if not frames or idle.search(frames[-1]):
            continue
        n = int(count)
        total += n
        own[_short(frames[-1])] += n
        for name in {_short(f) for f in frames}:
            inclusive[name] += n
    pct = lambda c: [(name, round(100 * n / max(total, 1), 1)) for name, n in c.most_common(top)]  # noqa: E731
    return total, pct(inclusive), pct(own)


def _short(frame: str) -> str:
    """`fn (path/to/module.py:12)` -> `fn (module.py)`."""
    m = re.match(r"(.*?) \((.*?)(?::\d+)?\)$", frame)
    if not m:
        return frame
    path = m.group(2)
    parts = path.split("/")
    where = "/".join(parts[-2:]) if len(parts) > 1 else path
    return f"{m.group(1)} ({where})"


# --------------------------------------------------------------------------------------------
# One variant
# --------------------------------------------------------------------------------------------

def measure(variant: Variant, args: argparse.Namespace, workdir: Path, translators: Optional[int] = None,
            load: bool = True) -> dict:
    translators = translators or args.replicas
    port = free_port()
    config = render_config(variant, port, args.replicas, workdir, translators)
    log = workdir / f"{variant.label}-t{translators}.log"
    result: dict[str, Any] = {"variant": variant.label, "env": variant.env,
                              "overrides": {k: v for k, v in variant.overrides}, "floor": variant.floor,
                              "model_replicas": args.replicas, "translator_replicas": translators}
    started = time.monotonic()
    with Service(config, variant.env, log) as service:
        result["ready_s"] = round(time.monotonic() - started, 1)
        stats = None if variant.floor or not load else ModelStats(service.gcs_address())
        try:
            drive(service.url, args.concurrency, args.warmup_s, args.records, workdir)  # JIT, caches, pools
            procs = service.processes()
            before = cpu_seconds(procs)
            time.sleep(args.idle_s)
            idle = cpu_delta(before, cpu_seconds(service.processes()))
            result["idle_cpu_pct_of_one_core"] = round(100 * sum(idle.values()) / args.idle_s, 1)
            result["processes"] = len(procs)
            result["process_titles"] = titles(procs)
            if load:
                profiles = (start_profiles(procs, args.duration_s, args.profile, variant.label)
                            if args.profile else [])
                model_before = stats.model_cpu_s() if stats else None
                before = cpu_seconds(service.processes())
                began = time.perf_counter()
                result.update(drive(service.url, args.concurrency, args.duration_s, args.records, workdir))
                wall = time.perf_counter() - began
                after = cpu_seconds(service.processes())
                model_after = stats.model_cpu_s() if stats else None
                spent = cpu_delta(before, after)
                result["busiest_pct_of_one_core"] = busiest(before, after, wall)
                n = max(result["requests"], 1)
                result["cpu_ms_per_request"] = {k: round(1000 * spent.get(k, 0.0) / n, 2) for k in KINDS}
                total = sum(spent.values())
                result["cpu_ms_per_request_total"] = round(1000 * total / n, 2)
                result["cpu_cores_busy"] = round(total / wall, 2)
                if model_before is not None and model_after is not None:
                    model_ms = 1000 * (model_after - model_before) / n
                elif variant.floor:
                    model_ms = 0.0  # the floor's "model" returns its input: all of it is Serve
                else:
                    model_ms = None
                result["model_cpu_ms_per_request"] = None if model_ms is None else round(model_ms, 2)
                result["overhead_cpu_ms_per_request"] = (
                    None if model_ms is None else round(1000 * total / n - model_ms, 2))
                for _, _, proc in profiles:
                    proc.wait(timeout=args.duration_s + 60)
                result["profiles"] = {}
                for kind, path, _ in profiles:
                    if path.exists():
                        samples, incl, own = hottest(path)
                        result["profiles"][f"{kind}:{path.name}"] = {"samples": samples, "inclusive": incl,
                                                                     "self": own}
            result["memory_mb"] = memory_mb(service.processes())
            result["pss_total_mb"] = round(sum(v["pss"] for v in result["memory_mb"].values()), 1)
        finally:
            if stats:
                stats.close()
    return result


# --------------------------------------------------------------------------------------------
# Report
# --------------------------------------------------------------------------------------------

def table(results: list[dict]) -> str:
    cols = ["variant", "req/s", "p50 ms", "p99 ms", "non200", "CPU ms/req", "model", "overhead",
            *KINDS, "idle %core", "PSS MB"]
    rows = [cols]
    for r in results:
        if "cpu_ms_per_request" not in r:
            continue
        fmt = lambda v: "n/a" if v is None else f"{v:g}"  # noqa: E731
        rows.append([r["variant"], fmt(r["requests_per_s"]), fmt(r["p50_ms"]), fmt(r["p99_ms"]), str(r["non200"]),
                     fmt(r["cpu_ms_per_request_total"]), fmt(r["model_cpu_ms_per_request"]),
                     fmt(r["overhead_cpu_ms_per_request"]),
                     *(fmt(r["cpu_ms_per_request"][k]) for k in KINDS),
                     fmt(r["idle_cpu_pct_of_one_core"]), fmt(r["pss_total_mb"])])
    widths = [max(len(row[i]) for row in rows) for i in range(len(cols))]
    return "\n".join("  ".join(cell.rjust(w) for cell, w in zip(row, widths)) for row in rows)


def plot(results: list[dict], path: Path) -> None:
    """Stacked bars: CPU ms per request of each variant, by process kind, the model's part apart."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in results if "cpu_ms_per_request" in r]
    labels = [r["variant"] for r in rows]
    fig, ax = plt.subplots(figsize=(max(8, 1.2 * len(rows) + 3), 4.5))
    bottom = [0.0] * len(rows)

    def bar(values: list[float], name: str) -> None:
        ax.bar(labels, values, bottom=bottom, label=name)
        for i, v in enumerate(values):
            bottom[i] += v

    model = [r["model_cpu_ms_per_request"] or 0.0 for r in rows]
    bar(model, "model (Translator's model thread)")
    for kind in KINDS:
        values = [r["cpu_ms_per_request"][kind] - (model[i] if kind == "model" else 0.0) for i, r in enumerate(rows)]
        if any(v > 0.05 for v in values):
            bar(values, "model replica, Serve's part" if kind == "model" else kind)
    for i, r in enumerate(rows):
        ax.text(i, bottom[i] + 0.3, f"{r['requests_per_s']:g} req/s", ha="center", fontsize=8)
    ax.set_ylabel("CPU ms per request")
    ax.set_title("CPU per /translation request, by process")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1))
    ax.tick_params(axis="x", labelrotation=20, labelsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--variant", action="append", default=[], help="LABEL[:KEY=VALUE,...] (repeatable)")
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--duration-s", type=float, default=20)
    p.add_argument("--warmup-s", type=float, default=3)
    p.add_argument("--idle-s", type=float, default=5, help="idle window for the idle CPU figure")
    p.add_argument("--records", type=int, default=1, help="records per request")
    p.add_argument("--replicas", type=int, default=1, help="replicas of each model deployment")
    p.add_argument("--memory", action="store_true", help="also measure PSS with one more Translator replica")
    p.add_argument("--profile", type=Path, help="folder for py-spy profiles of proxy/ingress/model")
    p.add_argument("--json", type=Path, help="append every result (one JSON object per line) here")
    p.add_argument("--plot", type=Path, help="draw the CPU per request of each variant (PNG) here")
    p.add_argument("--replot", type=Path, metavar="JSONL",
                   help="with --plot: draw from the results a --json file holds instead of measuring")
    p.add_argument("--stats-server", metavar="GCS_ADDRESS", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.stats_server:
        return stats_server(args.stats_server)
    if args.replot:
        if not args.plot:
            raise SystemExit("--replot needs --plot OUT.png")
        plot([json.loads(line) for line in args.replot.read_text().splitlines() if line.strip()], args.plot)
        return 0
    variants = [Variant.parse(v) for v in args.variant] or [Variant("baseline")]
    results = []
    with tempfile.TemporaryDirectory(prefix="overhead-") as tmp:
        workdir = Path(tmp)
        for variant in variants:
            print(f"--- {variant.label}", file=sys.stderr, flush=True)
            try:
                result = measure(variant, args, workdir)
            except Exception as exc:  # one broken variant (it never got ready) must not lose the others
                result = {"variant": variant.label, "error": f"{type(exc).__name__}: {str(exc)[-1500:]}"}
            results.append(result)
            print(json.dumps(result), file=sys.stderr, flush=True)
            if args.json:
                with open(args.json, "a") as f:
                    f.write(json.dumps(result) + "\n")
        if args.memory:
            base = variants[0]
            more = measure(Variant(f"{base.label}+1", base.env, base.overrides, base.floor), args, workdir,
                           translators=args.replicas + 1, load=False)
            one = next(r for r in results if r["variant"] == base.label)
            extra = {"variant": base.label, "extra_translator_replica_pss_mb":
                     round(more["pss_total_mb"] - one["pss_total_mb"], 1),
                     "pss_total_mb": {args.replicas: one["pss_total_mb"], args.replicas + 1: more["pss_total_mb"]},
                     "model_replica_pss_rss_mb": {args.replicas: one["memory_mb"].get("model"),
                                                  args.replicas + 1: more["memory_mb"].get("model")}}
            results.append({"memory": extra, **more})
            print(json.dumps(extra), file=sys.stderr, flush=True)
            if args.json:
                with open(args.json, "a") as f:
                    f.write(json.dumps({"memory": extra, **more}) + "\n")
    print(table(results))
    if args.plot:
        plot(results, args.plot)
    for r in results:
        for name, prof in (r.get("profiles") or {}).items():
            print(f"\n{r['variant']} {name} ({prof['samples']} on-CPU samples); inclusive %:")
            for fn, pct in prof["inclusive"]:
                print(f"  {pct:5.1f}  {fn}")
            print("  self %:")
            for fn, pct in prof["self"]:
                print(f"  {pct:5.1f}  {fn}")
        if "memory" in r:
            m = r["memory"]
            print(f"\nmemory: one more Translator replica adds {m['extra_translator_replica_pss_mb']} MB PSS "
                  f"(tree PSS {m['pss_total_mb']}); model replicas PSS/RSS {m['model_replica_pss_rss_mb']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
