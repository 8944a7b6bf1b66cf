"""Per-thread scheduler figures of running processes, over an interval (Linux /proc; no Ray needed).

    python -m bench.thread_sched "ServeReplica:serve-app:Translator" 20

For every process whose command line contains the pattern, its busiest threads over the interval:
share of the interval on a CPU, waiting on a run queue (runnable but another task had the core:
CPU contention), and neither (sleeping: blocked on I/O, a lock such as the GIL, or idle), with
voluntary and involuntary context switches per second. docs/benchmarks/translation-gap.md uses it
on the model threads of the Translator replicas under load.
"""

from __future__ import annotations

import argparse
import glob
import time


def matching(pattern: str) -> dict[int, str]:
    """pid -> command line of each process whose command line contains `pattern`."""
    found = {}
    for folder in glob.glob("/proc/[0-9]*"):
        try:
            with open(folder + "/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            continue
        if pattern in cmd:
            found[int(folder[6:])] = cmd
    return found


def thread_counters(pid: int) -> dict[int, tuple[int, int, int, int]]:
    """tid -> (ns on a CPU, ns waiting on a run queue, voluntary, involuntary context switches)."""
    out = {}
    for task in glob.glob(f"/proc/{pid}/task/*"):
        try:
            with open(task + "/schedstat") as f:
                on_cpu, waiting, _ = map(int, f.read().split())
            switches = {}
            with open(task + "/status") as f:
                for line in f:
                    if "ctxt_switches" in line:
                        key, value = line.split(":")
                        switches[key] = int(value)
            out[int(task.rsplit("/", 1)[1])] = (on_cpu, waiting, switches.get("voluntary_ctxt_switches", 0),
                                                switches.get("nonvoluntary_ctxt_switches", 0))
        except (OSError, ValueError):
            continue
    return out


def measure(pattern: str, interval_s: float, top: int = 5) -> list[dict]:
    procs = matching(pattern)
    before = {pid: thread_counters(pid) for pid in procs}
    began = time.monotonic()
    time.sleep(interval_s)
    elapsed = time.monotonic() - began
    rows = []
    for pid, cmd in procs.items():
        threads = []
        for tid, now in thread_counters(pid).items():
            then = before[pid].get(tid)
            if then is None:
                continue
            on_cpu, waiting, vol, invol = (a - b for a, b in zip(now, then))
            threads.append({"tid": tid, "on_cpu_pct": round(on_cpu / 1e9 / elapsed * 100, 1),
                            "runqueue_wait_pct": round(waiting / 1e9 / elapsed * 100, 1),
                            "sleeping_pct": round(100 - (on_cpu + waiting) / 1e9 / elapsed * 100, 1),
                            "voluntary_switches_per_s": round(vol / elapsed, 1),
                            "involuntary_switches_per_s": round(invol / elapsed, 1)})
        threads.sort(key=lambda t: -t["on_cpu_pct"])
        rows.append({"pid": pid, "cmd": cmd[:80], "threads": threads[:top]})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("pattern", help="a substring of the processes' command lines")
    parser.add_argument("interval_s", type=float, nargs="?", default=10.0)
    parser.add_argument("--top", type=int, default=5, help="busiest threads shown per process")
    args = parser.parse_args()
    for row in measure(args.pattern, args.interval_s, args.top):
        print(row["pid"], row["cmd"])
        for t in row["threads"]:
            print(f"  tid {t['tid']}: on a CPU {t['on_cpu_pct']:5.1f}%  run-queue wait {t['runqueue_wait_pct']:5.1f}%  "
                  f"sleeping {t['sleeping_pct']:5.1f}%  switches/s voluntary {t['voluntary_switches_per_s']:6.1f} "
                  f"involuntary {t['involuntary_switches_per_s']:6.1f}")


if __name__ == "__main__":
    main()
