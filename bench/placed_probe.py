"""`make run`'s embeddings under wrk, with environment variants interleaved: an A/B probe.

    .venv/bin/python -m bench.placed_probe --variant base: --variant user-loop:RAY_SERVE_RUN_USER_CODE_IN_SEPARATE_THREAD=0 \
        --rounds 2 [--spy]

Each round starts serve_config.placed.yaml (the bench's copy: cache off, a scratch port) once per
variant, in the order given, warms it 15 s at `--clients`, measures `--seconds` there and then
`--one-s` at 1 client, and stops it. `--spy` records the Ingress replicas with py-spy (raw stacks in
--out) during the first measurement. Ratios between variants of one round are what to read: this
machine's speed drifts between rounds. Needs wrk (apt) and, for --spy, py-spy (the bench extra).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

from bench.compare import load
from bench.compare.contenders import write_serve_app_config
from bench.load import POOL
from bench.peers.models import ROOT

PORT = 19527


def _ready(url: str, timeout_s: float = 180) -> float:
    start = time.monotonic()
    while time.monotonic() - start < timeout_s:
        try:
            if httpx.post(f"{url}/v1/embeddings", json={"input": "hello"}, timeout=5).status_code == 200:
                return time.monotonic() - start
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise TimeoutError(f"no answer from {url} in {timeout_s} s")


def run_variant(name: str, env: dict, args, out: Path) -> dict:
    config = write_serve_app_config("embeddings", PORT, out / f"{name}.yaml", config="serve_config.placed.yaml")
    proc = subprocess.Popen([sys.executable, "-m", "serve_app.run", str(config)],
                            env=dict(os.environ, PYTHONPATH=str(ROOT), RAY_USAGE_STATS_ENABLED="0",
                                     SERVE_APP_DRAIN_TIMEOUT_S="2", **env),
                            stdout=open(out / f"{name}.log", "w"), stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{PORT}"
    try:
        row = {"variant": name, "env": env, "ready_s": round(_ready(url), 1)}
        texts = load.write_texts(tuple(POOL), out / "texts.jsonl")
        target = load.Target(url, "/v1/embeddings", "embeddings", 1, tuple(POOL))
        load.run_closed(target, texts, args.clients, 15)
        spies = []
        if args.spy:
            pids = subprocess.run(["pgrep", "-f", "ServeReplica:serve-app:Ingress"], capture_output=True, text=True).stdout.split()
            spies = [subprocess.Popen(["py-spy", "record", "-p", pid, "-d", str(max(1, args.seconds - 5)), "-r", "50",
                                       "-f", "raw", "-o", str(out / f"{name}-spy-{pid}.txt"), "--nonblocking"],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for pid in pids]
        row["loaded"] = load.run_closed(target, texts, args.clients, args.seconds)
        for spy in spies:
            spy.wait()
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
                        help="NAME:VAR=VALUE,VAR=VALUE (NAME: for Ray's and the launcher's defaults)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=30)
    parser.add_argument("--one-s", type=float, default=20)
    parser.add_argument("--spy", action="store_true")
    parser.add_argument("--out", type=Path, default=Path("/tmp/placed-probe"))
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    variants = []
    for spec in args.variant:
        name, _, pairs = spec.partition(":")
        variants.append((name, dict(p.split("=", 1) for p in pairs.split(",") if p)))
    with open(args.out / "rows.jsonl", "a") as rows:
        for round_ in range(args.rounds):
            for name, env in variants:
                row = {"round": round_, **run_variant(name, env, args, args.out)}
                rows.write(json.dumps(row) + "\n")
                rows.flush()
                print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
