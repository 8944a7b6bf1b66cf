"""`make run`'s embeddings (or translation: --workload) under wrk, with environment or batch-knob variants
interleaved: an A/B probe.

    .venv/bin/python -m bench.placed_probe --variant base: --variant user-loop:RAY_SERVE_RUN_USER_CODE_IN_SEPARATE_THREAD=0 \
        --rounds 2 [--spy]
    .venv/bin/python -m bench.placed_probe --variant wait10:Embedder.batch_wait_timeout_s=0.01 \
        --variant wait0:Embedder.batch_wait_timeout_s=0 --clients 8,32,64 --seconds 20 --one-s 0

A variant's VAR=VALUE sets an environment variable; MODEL.KNOB=VALUE sets that model's batch knob in the
Ingress's user_config (a YAML value). Each round starts serve_config.placed.yaml (the bench's copy: cache
off, a scratch port) once per variant, in the order given (reversed every other round), warms it 15 s at the
most `--clients`, measures `--seconds` at each of `--clients` and then `--one-s` at 1 client (0: not), and
stops it. `--spy` records the Ingress replicas with py-spy (raw stacks in --out) during the first
measurement; `--cpu` splits the machine's CPU over the `--clients` measurements into the model threads, the
rest of the Ingress replicas (Serve's and our request path; ONNX Runtime's own pool threads, when it has
more than one, count here too), HAProxy and the rest (Ray's processes, the kernel), from /proc; wrk has
exited by the second reading, so its own CPU is not counted. Ratios between variants of one round are what
to read: this machine's speed drifts between rounds. Needs wrk (apt) and, for --spy, py-spy (the bench
extra).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import yaml

from bench.compare import load
from bench.compare.contenders import write_serve_app_config
from bench.load import POOL
from bench.peers.models import ROOT

PORT = 19527
_TICK_S = 1 / os.sysconf("SC_CLK_TCK")


def _thread_ticks() -> dict[tuple[str, str], tuple[str, str, int]]:
    """Every thread on the machine: (pid, tid) -> (process command line, thread name, CPU ticks)."""
    seen = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            for tid in os.listdir(f"/proc/{pid}/task"):
                stat = Path(f"/proc/{pid}/task/{tid}/stat").read_text()
                fields = stat[stat.rindex(")") + 2:].split()
                seen[(pid, tid)] = (command, stat[stat.index("(") + 1:stat.rindex(")")], int(fields[11]) + int(fields[12]))
        except (OSError, ValueError):  # gone meanwhile
            continue
    return seen


def _kind(command: str, thread: str) -> str:
    if "ServeReplica:serve-app:Ingress" in command:
        # ModelQueue names its threads "<Deployment>-model" in the OS too (deployments/model_queue.py).
        return "model threads" if "-mode" in thread else "Ingress request path"
    return "HAProxy" if "haproxy" in command else "Ray and the rest"


def cpu_split(before: dict, after: dict, seconds: float) -> dict[str, float]:
    """Cores each kind of thread used between two `_thread_ticks()` snapshots `seconds` apart."""
    cores: dict[str, float] = {}
    for key, (command, thread, ticks) in after.items():
        used = ticks - before.get(key, (command, thread, 0))[2]
        if used > 0:
            kind = _kind(command, thread)
            cores[kind] = cores.get(kind, 0.0) + used * _TICK_S / seconds
    return {kind: round(value, 3) for kind, value in sorted(cores.items(), key=lambda kv: -kv[1])}


#: --workload -> (route, body kind of bench.compare.load.Target): one text or record per request
ROUTES = {"embeddings": ("/v1/embeddings", "embeddings"), "translation-embedded": ("/translation", "translation")}


def _ready(url: str, timeout_s: float = 180, workload: str = "embeddings") -> float:
    route, kind = ROUTES[workload]
    body = load.Target(url, route, kind, 1, ("hello",)).body(0)
    start = time.monotonic()
    while time.monotonic() - start < timeout_s:
        try:
            if httpx.post(f"{url}{route}", json=body, timeout=5).status_code == 200:
                return time.monotonic() - start
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise TimeoutError(f"no answer from {url} in {timeout_s} s")


def split_variant(spec: str) -> tuple[str, dict, dict]:
    """`NAME:VAR=VALUE,MODEL.KNOB=VALUE` -> (name, environment, {model: {knob: value}} for the Ingress's
    user_config; each value read as YAML, so 0 is a number and null unsets a knob)."""
    name, _, pairs = spec.partition(":")
    env: dict = {}
    knobs: dict = {}
    for pair in filter(None, pairs.split(",")):
        key, equals, value = pair.partition("=")
        if not equals:
            raise ValueError(f"variant {spec!r}: {pair!r} is not VAR=VALUE or MODEL.KNOB=VALUE")
        if "." in key:  # the last dot: Model.iris.max_batch_size is Model.iris's max_batch_size
            model, _, knob = key.rpartition(".")
            knobs.setdefault(model, {})[knob] = yaml.safe_load(value)
        else:
            env[key] = value
    return name, env, knobs


def run_variant(name: str, env: dict, args, out: Path, knobs: dict | None = None) -> dict:
    config = write_serve_app_config(args.workload, PORT, out / f"{name}.yaml", config="serve_config.placed.yaml",
                                    deployments={"Ingress": {"user_config": knobs}} if knobs else None)
    proc = subprocess.Popen([sys.executable, "-m", "serve_app.run", "--address", "local", str(config)],
                            env=dict(os.environ, PYTHONPATH=str(ROOT), RAY_USAGE_STATS_ENABLED="0",
                                     SERVE_APP_DRAIN_TIMEOUT_S="2", **env),
                            stdout=open(out / f"{name}.log", "w"), stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{PORT}"
    try:
        row = {"variant": name, "workload": args.workload, "records": args.records, "env": env,
               **({"knobs": knobs} if knobs else {}),
               "ready_s": round(_ready(url, workload=args.workload), 1)}
        texts = load.write_texts(tuple(POOL), out / "texts.jsonl")
        target = load.Target(url, *ROUTES[args.workload], args.records, tuple(POOL))
        load.run_closed(target, texts, max(args.clients), 15)
        spies = []
        if args.spy:
            pids = subprocess.run(["pgrep", "-f", "ServeReplica:serve-app:Ingress"], capture_output=True, text=True).stdout.split()
            spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))  # the venv's, off PATH
            spies = [subprocess.Popen([spy, "record", "-p", pid, "-d", str(max(1, args.seconds - 5)), "-r", "50",
                                       "-f", "raw", "-o", str(out / f"{name}-spy-{pid}.txt"), "--nonblocking"],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for pid in pids]
        before, started = _thread_ticks() if args.cpu else {}, time.monotonic()
        loaded = {clients: load.run_closed(target, texts, clients, args.seconds) for clients in args.clients}
        row["loaded"] = loaded[args.clients[0]] if len(args.clients) == 1 else loaded
        if args.cpu:
            row["cores"] = cpu_split(before, _thread_ticks(), time.monotonic() - started)
        for spy in spies:
            spy.wait()
        if args.one_s > 0:
            row["one_client"] = load.run_closed(target, texts, 1, args.one_s)
        return row
    finally:
        os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--variant", action="append", required=True,
                        help="NAME:VAR=VALUE,MODEL.KNOB=VALUE (NAME: for Ray's and the launcher's defaults)")
    parser.add_argument("--workload", choices=sorted(ROUTES), default="embeddings",
                        help="what each request asks for, one text or record: embeddings, or translation en->pt")
    parser.add_argument("--records", type=int, default=1, help="texts (or records) per request")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--clients", type=lambda text: [int(c) for c in text.split(",")], default=[64],
                        help="closed-loop clients, or several: 8,32,64 (--spy records the first; --cpu all of them)")
    parser.add_argument("--seconds", type=float, default=30)
    parser.add_argument("--one-s", type=float, default=20)
    parser.add_argument("--spy", action="store_true")
    parser.add_argument("--cpu", action="store_true", help="the machine's CPU by kind of thread under load")
    parser.add_argument("--out", type=Path, default=Path("/tmp/placed-probe"))
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    variants = [split_variant(spec) for spec in args.variant]
    with open(args.out / "rows.jsonl", "a") as rows:
        for round_ in range(args.rounds):
            # the order reversed every other round: a machine that speeds up or slows down within a round
            # then favours no variant
            for name, env, knobs in variants if round_ % 2 == 0 else variants[::-1]:
                row = {"round": round_, **run_variant(name, env, args, args.out, knobs)}
                rows.write(json.dumps(row) + "\n")
                rows.flush()
                print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
