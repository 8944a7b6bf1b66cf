"""Every contender on the same model, machine and load generator, interleaved: `make bench`.

    python -m bench.compare [--profile default|full|smoke] [--out docs/benchmarks]
                            [--only naive,serve_app] [--workloads embeddings] [--rounds 2]

Per workload: the offline limit first, then each server in turn (start it, warm it
up, run its closed-loop cells and its open-loop cell at 50% of its own saturation,
stop it). Writes results.json, results.md and PNG plots into --out; the JSON is
rewritten after each contender, so a run cut short keeps what it measured.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import subprocess
import tempfile
import time
import urllib.request
from datetime import datetime, timezone
from pathlib import Path
from typing import Optional

from bench.compare import load, report, rounds, stats
from bench.compare.contenders import CONTENDERS, MAIN_PYTHON, OFFLINE, Contender, import_missing, contender_env
from bench.compare.machine import describe_machine, source_revision
from bench.compare.procs import Server, ServerFailed
from bench.compare.profiles import PROFILES, Profile
from bench.load import POOL
from bench.compare.peer_targets import ONNX_SUFFIX
from bench.peers.models import ENGINE_ENV, ROOT, WORKLOADS, project_batching

WARMUP_CONCURRENCY = 8


def log(message: str) -> None:
    print(f"[bench {datetime.now(timezone.utc):%H:%M:%S}] {message}", flush=True)


def run_offline(workload: str, profile: Profile, engine: str = "torch") -> dict:
    """The model alone, batch sizes 1..128 (bench.peers.offline); embeddings on `engine`."""
    env = dict(os.environ, **{ENGINE_ENV: engine})
    done = subprocess.run([str(MAIN_PYTHON), "-m", "bench.peers.offline", "--workload", workload,
                           "--seconds", str(profile.offline_s), "--json"],
                          cwd=ROOT, capture_output=True, text=True, check=True, env=env)
    result = json.loads(done.stdout.strip().splitlines()[-1])
    batches = {int(k): v for k, v in result["batches"].items()}
    full = project_batching(workload)[0]
    result["batches"] = batches
    result["project_batch"] = full
    result["full_batch_s"] = batches[full]["batch_s"] if full in batches else None
    return result


def body_kind(contender: Contender, workload: str) -> str:
    if contender.body_kind == "texts":
        return "texts"
    return "embeddings" if workload == "embeddings" else "translation"


def run_contender(contender: Contender, workload: str, profile: Profile, port: int, scratch: Path,
                  texts_file: Path, results: dict) -> None:
    url = f"http://127.0.0.1:{port}"
    began = time.monotonic()
    server = Server(contender.argv(workload, port, scratch), contender_env(contender, workload),
                    scratch / f"{contender.name}-{workload}.log", ROOT)
    try:
        ready_s = server.wait_ready(url + contender.ready_path, contender.ready_timeout_s)
        path, kind = WORKLOADS[workload].route, body_kind(contender, workload)
        targets = {r: load.Target(url, path, kind, r, tuple(POOL)) for r in profile.records}
        if not load.drain(targets[1]):
            raise ServerFailed(f"first request failed; log tail:\n{server.log.read_text(errors='replace')[-3000:]}")
        # Start-up as a user sees it: from the launch to the first answered request (a readiness
        # route can answer before the model is loaded, mosec's does).
        key = f"{contender.name}/{workload}"
        results["first_answer_s"][key] = round(server.since_start(), 1)
        results["memory"][key] = {"after_first_answer": server.memory()}
        log(f"{contender.name} ready in {ready_s:.1f} s, first answer at {results['first_answer_s'][key]} s, "
            f"PSS {results['memory'][key]['after_first_answer']['pss_mib']} MiB")
        if contender.info_path:
            with urllib.request.urlopen(url + contender.info_path, timeout=30) as resp:
                results["contender_info"][key] = json.loads(resp.read())
        load.run_closed(targets[1], texts_file, WARMUP_CONCURRENCY, profile.warmup_s)
        load.drain(targets[1])
        for records in profile.records:
            if contender.settle_s:
                # Before each request size, not once per workload: the previous size's lighter cells
                # (and its open-loop cell) last long enough for a downscale, and a replica then
                # loading its model inside this size's busiest cell would measure the start-up.
                busiest = max(profile.concurrencies_for(workload, records))
                log(f"{contender.name}: {contender.settle_s:g} s at {busiest} clients x {records} records "
                    "for its autoscaler to settle")
                load.run_closed(targets[records], texts_file, busiest, contender.settle_s)
                load.drain(targets[records])
            # Busiest first: a contender that scaled up in the warm-up is measured at the load it
            # scaled for before its downscale delay can pass (fewer clients cannot be hurt by it).
            for concurrency in sorted(profile.concurrencies_for(workload, records), reverse=True):
                cell = load.run_closed(targets[records], texts_file, concurrency, profile.cell_s[workload])
                results["cells"].append({"contender": contender.name, "workload": workload, "records": records,
                                         "mode": "closed", "concurrency": concurrency, **cell})
                log(f"{contender.name} {workload} x{records} c={concurrency}: {cell['records_per_s']} rec/s "
                    f"p99 {cell['p99_ms']} ms errors {cell['errors']}")
                load.drain(targets[records])
            rate = stats.half_load_rate(stats.saturation(results["cells"], contender.name, workload, records),
                                        profile.load_fraction)
            if rate:
                cell = load.run_open(targets[records], rate, profile.open_s[workload])
                results["cells"].append({"contender": contender.name, "workload": workload, "records": records,
                                         "mode": "open", **cell})
                log(f"{contender.name} {workload} x{records} open {rate:.1f} req/s: p50 {cell['p50_ms']} "
                    f"p99 {cell['p99_ms']} ms errors {cell['errors']}")
                load.drain(targets[records])
        if profile.storm_clients:
            cell = load.run_storm(targets[1], texts_file, profile.storm_clients, profile.storm_s)
            results["cells"].append({"contender": contender.name, "workload": workload, "records": 1,
                                     "mode": "storm", "concurrency": profile.storm_clients, **cell})
            log(f"{contender.name} {workload} storm of {profile.storm_clients}: {cell['goodput_rps']} ok/s, "
                f"statuses {cell['statuses']}, socket errors {cell['socket_errors']}")
            load.drain(targets[1])
        results["memory"][key]["after_load"] = server.memory()
        results["startup_s"][key] = round(ready_s, 1)
    except (ServerFailed, subprocess.SubprocessError, OSError, ValueError) as exc:
        log(f"{contender.name} {workload} FAILED: {exc}")
        results["failures"].append({"contender": contender.name, "workload": workload, "error": str(exc)[-1500:]})
    finally:
        server.stop()
        results["wall_s"][f"{contender.name}/{workload}"] = round(time.monotonic() - began, 1)


def merge_previous(previous: dict, fresh: dict) -> dict:
    """Keep the previous run's figures for the workloads this run does not measure."""
    if previous.get("profile") != fresh["profile"]:
        raise SystemExit(f"--append: results.json is from profile {previous.get('profile')!r}, "
                         f"this run is {fresh['profile']!r}")
    mine = set(fresh["workloads"])
    keep = lambda items: [x for x in items if x["workload"] not in mine]  # noqa: E731
    fresh["workloads"] = [w for w in previous["workloads"] if w not in mine] + fresh["workloads"]
    fresh["offline"] = {k: v for k, v in previous["offline"].items() if k not in mine}
    fresh["cells"], fresh["failures"] = keep(previous["cells"]), keep(previous["failures"])
    for key in ("contender_info", "startup_s", "first_answer_s", "memory", "wall_s"):
        fresh[key] = {k: v for k, v in previous.get(key, {}).items() if k.split("/", 1)[1] not in mine}
    fresh["started_at"] = f"{previous['started_at'].split(' .. ')[0]} .. {fresh['started_at']}"
    fresh["total_wall_s"] = previous.get("total_wall_s", 0)
    return fresh


def write_outputs(results: dict, out: Path, with_plots: bool) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    (out / "results.md").write_text(report.markdown(results))
    if with_plots:
        report.plots(results, out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument("--profile", choices=sorted(PROFILES), default="default")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "benchmarks")
    parser.add_argument("--port", type=int, default=9561)
    parser.add_argument("--only", help="comma-separated contenders (default: all)")
    parser.add_argument("--workloads", help="comma-separated workloads (default: the profile's)")
    parser.add_argument("--append", action="store_true",
                        help="merge into --out's results.json (replacing these workloads' figures) instead of "
                             "starting afresh: a long run in several shorter locked steps")
    parser.add_argument("--rounds", type=int, default=1,
                        help="the whole run this many times, the contenders' order reversed in every other round, "
                             "each into --out/round-N, and issue 24's targets per round in --out/rounds.md (met "
                             "only if met in every round): the machine's drift between turns, measured")
    parser.add_argument("--storm-clients", type=int,
                        help="the client storm's size (default: the profile's; 0: no storm). Past what the Ingress "
                             "replicas admit and hold waiting (64 + 192 each in make run), HAProxy queues the rest "
                             "for up to ingress.max_wait_s, then answers 503")
    args = parser.parse_args()
    profile = PROFILES[args.profile]
    if args.rounds < 1 or (args.rounds > 1 and args.append):
        raise SystemExit(f"--rounds must be >= 1 and cannot be combined with --append, got {args.rounds}")
    if args.storm_clients is not None:
        if args.storm_clients < 0:
            raise SystemExit(f"--storm-clients must be >= 0, got {args.storm_clients}")
        profile = dataclasses.replace(profile, storm_clients=args.storm_clients)
    chosen = list(CONTENDERS)
    if args.only:  # in the order given (the first ones measured if a run is cut short)
        by_name = {c.name: c for c in CONTENDERS}
        if unknown := [n for n in args.only.split(",") if n not in by_name]:
            raise SystemExit(f"--only: unknown contenders {unknown}; known: {sorted(by_name)}")
        chosen = [by_name[n] for n in args.only.split(",")]
    if shutil.which("wrk") is None:
        raise SystemExit("the load generator wrk is not on PATH (Debian: apt-get install wrk)")
    workloads = tuple(args.workloads.split(",")) if args.workloads else profile.workloads
    if args.rounds == 1:
        run_once(args, profile, chosen, workloads, args.out)
        return
    done = []
    for index in range(args.rounds):  # each contender gets the early and the late turn (bench/compare/rounds.py)
        log(f"round {index + 1} of {args.rounds}")
        done.append(run_once(args, profile, rounds.round_order(chosen, index), workloads,
                             args.out / f"round-{index + 1}", index + 1))
        (args.out / "rounds.md").write_text(rounds.summary_markdown(done))
    log(f"{args.rounds} rounds: {args.out}/rounds.md")


def run_once(args, profile: Profile, chosen: list[Contender], workloads: tuple[str, ...], out: Path,
             round_number: Optional[int] = None) -> dict:
    """One run: per workload the offline limit, then each contender in `chosen`'s order; written to `out`
    (`round_number`: which of --rounds, in --out/round-N)."""
    results = {"profile": profile.name, "started_at": f"{datetime.now(timezone.utc):%Y-%m-%d %H:%M UTC}",
               "machine": describe_machine(), "revision": source_revision(), "workloads": list(workloads), "records": list(profile.records),
               "concurrencies": list(profile.concurrencies), "cell_s": profile.cell_s, "open_s": profile.open_s,
               "contenders": [c.name for c in chosen], "labels": {c.name: c.label for c in chosen},
               "offline": {}, "cells": [], "failures": [], "contender_info": {}, "startup_s": {}, "first_answer_s": {}, "memory": {},
               "wall_s": {}, **({"round": round_number} if round_number else {})}
    if args.append and (out / "results.json").is_file():
        results = merge_previous(json.loads((out / "results.json").read_text()), results)
    began = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="bench-compare-") as tmp:
        scratch = Path(tmp)
        texts_file = load.write_texts(tuple(POOL), scratch / "texts.jsonl")
        for workload in workloads:
            t0 = time.monotonic()
            results["offline"][workload] = run_offline(workload, profile)
            results["wall_s"][f"{OFFLINE}/{workload}"] = round(time.monotonic() - t0, 1)
            log(f"offline {workload}: {results['offline'][workload]['records_per_s']} rec/s "
                f"(batch {results['offline'][workload]['best_batch']})")
            if workload == "embeddings" and not import_missing("onnxruntime")():
                # make run serves embeddings on ONNX Runtime: its own offline limit and batch of 1
                onnx = results["offline"][f"{workload}{ONNX_SUFFIX}"] = run_offline(workload, profile, "onnx")
                log(f"offline {workload} (onnx): {onnx['records_per_s']} rec/s (batch {onnx['best_batch']}), "
                    f"batch of 1 {onnx['batches'][1]['batch_s'] * 1000:.2f} ms")
            for contender in chosen:
                reason = contender.unavailable_for(workload)
                if reason:
                    results["failures"].append({"contender": contender.name, "workload": workload, "error": reason})
                    continue
                run_contender(contender, workload, profile, args.port, scratch, texts_file, results)
                write_outputs(results, out, with_plots=False)
    results["total_wall_s"] = round(results.get("total_wall_s", 0) + time.monotonic() - began, 1)
    write_outputs(results, out, with_plots=True)
    log(f"done in {results['total_wall_s']:.0f} s: {out}/results.md")
    return results


if __name__ == "__main__":
    main()
