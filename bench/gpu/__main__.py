"""`python -m bench.gpu --out DIR [--quick]`: every phase of bench/gpu (see __init__), each in a process of its
own with a time budget; DIR/results.json and DIR/results.md are rewritten after each phase.

    python -m bench.gpu --out /tmp/gpu-run               # the GPU run (~6 min on an H200, models built first)
    python -m bench.gpu --out /tmp/gpu-tiny --device cpu --tiny   # the same flow on a CPU box, tiny model
    python -m bench.gpu --plot DIR/results.json          # results.png (and .md) from the JSON alone
    python -m bench.gpu --out DIR --join-interval-steps 8   # + continuous joining every 8 steps (in-process
                                                          # beside every step; the Serve start with it)

A phase that fails or overruns is reported (status, error) and the next one runs; one that overruns
gets SIGTERM (it stops its Serve run), then everything it started is killed by the tag in its environment.
"""

from __future__ import annotations

import argparse
import os
import platform
import signal
import subprocess
import sys
import time
import traceback
from pathlib import Path

from bench.gpu.common import ROOT, Deadline, plan_dict, plan_for, read_json, say, write_json

PHASES = ("build", "offline", "serve-static", "continuous", "serve-continuous")
#: seconds each phase may take at most: GPU run, --quick, --tiny on 2 CPU cores
CAPS = {"gpu": {"build": 90, "offline": 60, "serve-static": 170, "continuous": 170, "serve-continuous": 150},
        "quick": {"build": 90, "offline": 40, "serve-static": 120, "continuous": 80, "serve-continuous": 110},
        "tiny": {"build": 120, "offline": 90, "serve-static": 360, "continuous": 240, "serve-continuous": 300}}
#: a phase that cannot have this much is skipped
MINIMUM = {"build": 30, "offline": 20, "serve-static": 60, "continuous": 30, "serve-continuous": 75}
PHASE_TAG = "SERVE_APP_BENCH_GPU_PHASE"
QUIET_ENV = {"TRANSFORMERS_VERBOSITY": "error", "HF_HUB_OFFLINE": "1", "HF_HUB_DISABLE_PROGRESS_BARS": "1",
             "TOKENIZERS_PARALLELISM": "false", "PYTHONUNBUFFERED": "1", "RAY_USAGE_STATS_ENABLED": "0"}


def minimum(name: str, res: dict) -> float:
    """Seconds a phase needs to be worth starting; the second Serve run, what the first took to start
    and stop plus a few seconds per cell."""
    first = (res["phases"].get("serve-static", {}).get("result") or {})
    if name == "serve-continuous" and first.get("ready_s"):
        cells = len(res["plan"]["cells"])
        return max(MINIMUM[name], first["ready_s"] + 25 + 5 * cells + first.get("stop_s", 15))
    return MINIMUM[name]


def machine(device: str) -> dict:
    info = {"python": platform.python_version(), "cpus": os.cpu_count(), "host": platform.node(), "device": device}
    for name in ("torch", "transformers", "ray"):
        try:
            info[name] = __import__(name).__version__
        except Exception as exc:  # noqa: BLE001 - reported, not fatal
            info[name] = f"missing ({type(exc).__name__})"
    try:
        query = ["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"]
        info["gpu"] = subprocess.run(query, capture_output=True, text=True, timeout=20).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        info["gpu"] = None
    try:
        info["commit"] = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                        cwd=ROOT, timeout=10).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        pass
    return info


# ------------------------------------------------------------------ one phase (its own process)

def run_phase(args) -> int:
    def stop(*_):
        raise SystemExit(143)  # runs the phase's finally blocks (a Serve run is stopped)
    signal.signal(signal.SIGTERM, stop)
    work, out = Path(args.work), Path(args.out)
    plan = plan_for(args.tiny, args.quick)
    deadline = Deadline(args.deadline)
    result: dict = {}
    path = work / f"{args.phase}.json"

    def save() -> None:
        write_json(path, result)
    try:
        if args.phase == "build":
            from bench.gpu.models import build
            result.update(build(args.device, args.tiny))
        else:
            models = read_json(work / "build.json")
            offline = read_json(work / "offline.json") if (work / "offline.json").is_file() else {}
            limit = (offline.get("offline_limit") or {}).get("records_per_s")
            if args.phase == "offline":
                from bench.gpu.offline import run
                result.update(run(models["translation"], args.device, plan, deadline))
            elif args.phase == "continuous":
                from bench.gpu.continuous import run
                run(models["translation"], args.device, plan, deadline, result, save, args.join_interval_steps)
            else:
                from bench.gpu.serving import run
                scheduling = args.phase.split("-", 1)[1]
                result.update(run(models, plan, args, scheduling, limit, deadline, work, out))
    except BaseException as exc:  # noqa: BLE001 - the orchestrator reports it
        result["error"] = f"{type(exc).__name__}: {exc}\n{traceback.format_exc()[-3000:]}"
        save()
        say(f"phase {args.phase} failed: {result['error']}")
        return 1
    save()
    return 0


# ------------------------------------------------------------------ the orchestrator

def _kill_tagged(tag: str) -> int:
    from bench.compare.procs import kill, tagged

    found = tagged(tag, PHASE_TAG)
    kill(found, wait_s=10)
    return len(found)


def _end(proc: subprocess.Popen, grace_s: float) -> None:
    """SIGTERM a phase (it stops its Serve run in its finally blocks); wait up to `grace_s`."""
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(grace_s)
    except subprocess.TimeoutExpired:
        pass


def launch(name: str, args, work: Path, timeout_s: float) -> dict:
    tag = f"{os.getpid()}-{name}-{time.monotonic_ns()}"
    argv = [sys.executable, "-m", "bench.gpu", "--phase", name, "--out", args.out, "--work", str(work),
            "--deadline", str(time.time() + timeout_s - 8), "--device", args.device]
    argv += ["--tiny"] * args.tiny + ["--quick"] * args.quick + ["--join-interval-steps", str(args.join_interval_steps)]
    env = {**os.environ, **QUIET_ENV, PHASE_TAG: tag}
    began = time.monotonic()
    say(f"=== phase {name} (at most {timeout_s:.0f} s)")
    proc = subprocess.Popen(argv, env=env, cwd=ROOT, start_new_session=True)
    status = "ok"
    try:
        code = proc.wait(timeout_s)
        status = "ok" if code == 0 else f"failed (exit {code})"
    except subprocess.TimeoutExpired:
        status = "timed out"
        _end(proc, 30)
    except BaseException:  # the whole run is stopped (SIGTERM from `timeout`): end the phase quickly
        _end(proc, 12)
        _kill_tagged(tag)
        raise
    killed = _kill_tagged(tag)
    path = work / f"{name}.json"
    result = read_json(path) if path.is_file() else None
    phase = {"status": status, "seconds": round(time.monotonic() - began, 1), "result": result}
    if killed:
        phase["killed_leftovers"] = killed
    if result and result.get("error"):
        phase["error"] = result["error"]
    say(f"=== phase {name}: {status} in {phase['seconds']} s")
    return phase


def orchestrate(args) -> int:
    from bench.gpu import report

    out = Path(args.out).resolve()
    work = out / "work"
    work.mkdir(parents=True, exist_ok=True)
    args.out = str(out)
    mode = "tiny" if args.tiny else "quick" if args.quick else "gpu"
    began = time.monotonic()
    res = {"started": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "mode": mode, "budget_s": args.budget_s,
           "machine": machine(args.device), "plan": plan_dict(plan_for(args.tiny, args.quick)), "phases": {}}
    say(f"bench.gpu {mode}: {res['machine']}")
    report.write(out, res)
    wanted = args.phases.split(",")

    def stopped(*_):
        raise SystemExit(143)
    signal.signal(signal.SIGTERM, stopped)
    try:
        run_phases(args, res, wanted, work, began)
    except SystemExit:
        say("bench.gpu stopped from outside (SIGTERM): writing what was measured")
        res["stopped"] = "SIGTERM"
        for name, phase in res["phases"].items():
            if phase.get("status") == "running":
                path = work / f"{name}.json"
                res["phases"][name] = {"status": "stopped (SIGTERM)",
                                       "result": read_json(path) if path.is_file() else None}
    res["wall_s"] = round(time.monotonic() - began, 1)
    report.write(out, res, with_plot=True)
    say(f"bench.gpu done in {res['wall_s']} s: " + ", ".join(f"{n} {p['status']}" for n, p in res["phases"].items()))
    print(report.markdown(res), flush=True)
    return 0


def run_phases(args, res: dict, wanted: list[str], work: Path, began: float) -> None:
    from bench.gpu import report

    out = Path(args.out)
    for name in PHASES:
        if name not in wanted:
            continue
        left = args.budget_s - (time.monotonic() - began) - 5
        timeout = min(CAPS[res["mode"]][name], left)
        if timeout < minimum(name, res):
            res["phases"][name] = {"status": f"skipped ({left:.0f} s left of the budget)"}
            say(f"=== phase {name} skipped: {left:.0f} s left")
            continue
        if name != "build" and res["phases"].get("build", {}).get("status", "ok") != "ok":
            res["phases"][name] = {"status": "skipped (no models)"}
            continue
        res["phases"][name] = {"status": "running"}
        res["phases"][name] = launch(name, args, work, timeout)
        res["wall_s"] = round(time.monotonic() - began, 1)
        report.write(out, res)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", help="folder for results.json, results.md, results.png and the Serve logs")
    parser.add_argument("--quick", action="store_true", help="fewer, shorter cells")
    parser.add_argument("--device", default=None, help="cuda (default) or cpu")
    parser.add_argument("--tiny", action="store_true", help="the tiny M2M100 fixture, sized for a 2-core CPU box")
    parser.add_argument("--budget-s", type=float, default=None, help="the whole run's time (default 375; tiny 1200)")
    parser.add_argument("--join-interval-steps", type=int, default=1,
                        help="continuous scheduling's translation.join_interval_steps for the serve-continuous start; "
                        "above 1 the in-process phase also runs a contender with it beside the every-step one")
    parser.add_argument("--phases", default=",".join(PHASES), help="comma-separated subset of " + ",".join(PHASES))
    parser.add_argument("--plot", help="a results.json to draw results.png (and results.md) from, instead of measuring")
    parser.add_argument("--phase", choices=PHASES, help=argparse.SUPPRESS)
    parser.add_argument("--work", help=argparse.SUPPRESS)
    parser.add_argument("--deadline", type=float, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.plot:
        from bench.gpu import report
        path = Path(args.plot)
        res = read_json(path)
        (path.parent / "results.md").write_text(report.markdown(res))
        return 0 if report.plot(res, path.with_suffix(".png")) else 1
    args.device = args.device or ("cpu" if args.tiny else "cuda")
    args.budget_s = args.budget_s or (1200 if args.tiny else 375)
    if args.phase:
        return run_phase(args)
    if not args.out:
        parser.error("--out is required")
    return orchestrate(args)


if __name__ == "__main__":
    sys.exit(main())
