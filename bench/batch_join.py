"""Before/after of the model queue's join (issue 5), through Serve, one tree after the other.

Serve 2.60's `@serve.batch` forms its next batch from what arrives in `batch_wait_timeout_s`
while the previous batch is still computing; behind a slow model that feeds it 1-2 record
batches. Since 3a3dbb3 the replica's model queue joins every waiting call into the next batch.
This runs the same load against serve-app started from two source trees (e.g. a `git worktree`
of the commit before, and this one), with the model deployment pinned to a fixed replica count
so autoscaling does not blur the comparison:

    git worktree add /tmp/before 3a3dbb3~1 && ln -s $PWD/.venv /tmp/before/.venv
    flock /tmp/serve-app-cpu.lock .venv/bin/python -m bench.batch_join \\
        --tree before=/tmp/before --tree after=. --workload translation-transformers --json /tmp/join.jsonl

A tree may carry environment variables for its server: `--tree 'no-sharing=.:SERVE_APP_X=1,SERVE_APP_Y=2'`,
and deployment options merged into its config: `--option 'big=Translator.user_config.max_batch_size=64'`
(`TREE=DEPLOYMENT.key.path=YAML value`, repeatable; applied after the replica pinning), and the
checked-in config it starts from: `--config 'placed=serve_config.placed.yaml'` (the models in the
Ingress; pin it with `--option 'placed=Ingress.autoscaling_config={min_replicas: 2, max_replicas: 2}'`).

Per tree and workload it prints, as JSON lines: a burst (N one-record requests sent at once:
when each finished and the model batch it rode in, from the `X-Batch-Records` header), then
closed-loop cells (wrk, the `make bench` generator) at each client count, each with the batches
the model computed during it (`model_batches`: count, records per batch, model seconds per batch,
read from the cluster's metrics endpoint; bench/ray_metrics.py).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from pathlib import Path

import aiohttp
import yaml

from bench.compare import load
from bench.compare.contenders import MAIN_PYTHON, deep_update, write_serve_app_config
from bench.compare.procs import Server
from bench import ray_metrics
from bench.load import POOL
from bench.overhead import set_path
from bench.peers.models import WORKLOADS, build_marian_sized

ROOT = Path(__file__).resolve().parents[1]


def write_config(tree: Path, workload: str, port: int, replicas: int, out: Path,
                 options: dict | None = None, config: str = "serve_config.yaml") -> Path:
    """The bench's serve-app config from `tree`'s `config`, with the workload's model deployment
    pinned to `replicas` (autoscaling min = max; a config without that deployment, e.g. with the
    model placed in the Ingress, is pinned through `options`) and `options` (deployment name ->
    options) merged in."""
    deployments: dict = {WORKLOADS[workload].deployment: {
        "autoscaling_config": {"min_replicas": replicas, "max_replicas": replicas}}}
    for name, opts in (options or {}).items():
        deep_update(deployments.setdefault(name, {}), opts)
    return write_serve_app_config(workload, port, out, tree, deployments, config=config)


def parse_option(spec: str) -> tuple[str, dict]:
    """`TREE=Deployment.key.path=value` -> (tree, {Deployment: {key: {path: value}}}); the value is YAML."""
    tree, rest = spec.split("=", 1)
    path, value = rest.split("=", 1)
    node: dict = {}
    set_path(node, path.split("."), yaml.safe_load(value), spec)
    return tree, node


async def burst(url: str, route: str, n: int) -> dict:
    """n one-record requests at once: seconds to each answer and the model batch it rode in."""
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as session:
        began = time.perf_counter()

        async def one(i: int) -> tuple[float, int]:
            text = f"({i}) {POOL[i % len(POOL)]}"
            body = ({"input": text} if route == "/embeddings" else
                    {"payload": {"fromLang": "en", "toLang": "pt", "records": [{"id": "0", "text": text}]}})
            async with session.post(url + route, json=body, headers={"Cache-Control": "no-store"}) as resp:
                await resp.read()
                if resp.status != 200:
                    raise RuntimeError(f"burst request answered {resp.status}")
                return time.perf_counter() - began, int(resp.headers["X-Batch-Records"])

        done = sorted(await asyncio.gather(*(one(i) for i in range(n))))
    return {"requests": n, "all_done_s": round(done[-1][0], 2),
            "batch_records": sorted({b for _, b in done}), "finish_s": [round(t, 2) for t, _ in done]}


def parse_tree(spec: str) -> tuple[str, Path, dict]:
    """`name=path[:ENV=VALUE,...]` -> (name, path, env)."""
    name, rest = spec.split("=", 1)
    path, _, env_part = rest.partition(":")
    env = dict(item.split("=", 1) for item in env_part.split(",") if item)
    return name, Path(path).resolve(), env


def measure(name: str, tree: Path, extra_env: dict, workload: str, args, scratch: Path) -> list[dict]:
    port = args.port
    config = write_config(tree, workload, port, args.replicas, scratch / f"{name}-{workload}.yaml",
                          args.tree_options.get(name), args.tree_configs.get(name, "serve_config.yaml"))
    env = dict(os.environ, PYTHONPATH=str(tree), RAY_USAGE_STATS_ENABLED="0", SERVE_APP_DRAIN_TIMEOUT_S="2",
               SERVE_APP_CACHE_ENABLED="false", **extra_env)
    server = Server([str(MAIN_PYTHON), "-m", "serve_app.run", str(config)], env,
                    scratch / f"{name}-{workload}.log", tree)
    url, route = f"http://127.0.0.1:{port}", WORKLOADS[workload].route
    rows = []
    try:
        server.wait_ready(url + "/readyz", 240)
        kind = "embeddings" if workload == "embeddings" else "translation"
        texts_file = load.write_texts(tuple(POOL), scratch / "texts.jsonl")
        warm = load.Target(url, route, kind, 1, tuple(POOL))
        load.run_closed(warm, texts_file, 8, 3)
        load.drain(warm)
        options = args.tree_options.get(name, {})
        rows.append({"tree": name, "env": extra_env, "options": options, "workload": workload, "kind": "burst",
                     **asyncio.run(burst(url, route, args.burst))})
        metrics = ray_metrics.metrics_url(server.proc.pid)
        model = WORKLOADS[workload].deployment
        for records in args.records:
            target = load.Target(url, route, kind, records, tuple(POOL))
            for clients in args.clients:
                load.drain(target)
                cell_run = lambda: load.run_closed(target, texts_file, clients, args.cell_s)  # noqa: E731
                if metrics:
                    cell, batches = ray_metrics.batches_between(metrics, model, cell_run)
                else:
                    cell, batches = cell_run(), {"batches": None}
                rows.append({"tree": name, "env": extra_env, "options": options, "workload": workload, "kind": "closed",
                             "records": records,
                             "clients": clients, **cell, "model_batches": batches})
        for row in rows:
            print(json.dumps(row), flush=True)
        return rows
    finally:
        server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tree", action="append", required=True,
                        help="name=path[:ENV=VALUE,...] of a source tree and its server's env (repeat)")
    parser.add_argument("--option", action="append", default=[],
                        help="TREE=Deployment.key.path=value: a deployment option for that tree's config (repeat)")
    parser.add_argument("--config", action="append", default=[],
                        help="TREE=FILE: the checked-in config that tree starts from (default serve_config.yaml)")
    parser.add_argument("--workload", action="append", choices=sorted(WORKLOADS), required=True)
    parser.add_argument("--replicas", type=int, default=1, help="model deployment replicas (pinned)")
    parser.add_argument("--burst", type=int, default=32)
    parser.add_argument("--clients", type=int, nargs="+", default=[64])
    parser.add_argument("--records", type=int, nargs="+", default=[1])
    parser.add_argument("--cell-s", type=float, default=20.0)
    parser.add_argument("--port", type=int, default=9613)
    parser.add_argument("--json", type=Path, help="append the rows here too")
    args = parser.parse_args()
    trees = [parse_tree(t) for t in args.tree]
    args.tree_configs = dict(spec.split("=", 1) for spec in args.config)
    args.tree_options = {}
    for spec in args.option:
        tree, node = parse_option(spec)
        deep_update(args.tree_options.setdefault(tree, {}), node)
    if "translation-transformers" in args.workload:
        build_marian_sized()
    scratch = Path(os.environ.get("TMPDIR", "/tmp")) / "batch-join"
    scratch.mkdir(exist_ok=True)
    rows = []
    for workload in args.workload:
        for name, tree, env in trees:  # interleaved: every tree per workload, back to back
            rows += measure(name, tree, env, workload, args, scratch)
    if args.json:
        with args.json.open("a") as out:
            out.writelines(json.dumps(row) + "\n" for row in rows)


if __name__ == "__main__":
    sys.exit(main())
