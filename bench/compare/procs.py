"""Start a contender's server in its own process group, wait until it is ready, stop all of it."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Optional

import psutil

READY_POLL_S = 0.5
STOP_GRACE_S = 20.0


class ServerFailed(RuntimeError):
    """The server exited or never became ready; the message carries its log's tail."""


def _log_tail(log: Path, chars: int = 3000) -> str:
    try:
        return log.read_text(errors="replace")[-chars:]
    except OSError:
        return ""


#: environment variable stamped on each server so its descendants can be found after they detach
SERVER_TAG_ENV = "SERVE_APP_BENCH_SERVER"


def tagged(tag: str, env_name: str = SERVER_TAG_ENV) -> list[psutil.Process]:
    """Processes whose environment variable `env_name` is `tag` (inherited from what we started)."""
    found = []
    for p in psutil.process_iter():
        try:
            if p.environ().get(env_name) == tag:
                found.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


def kill(processes: list[psutil.Process], wait_s: float) -> None:
    """SIGKILL each of `processes` still alive and wait up to `wait_s` for them to go."""
    for p in processes:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(processes, timeout=wait_s)


def process_kind(cmdline: list[str], name: str = "") -> str:
    """What a process is, for a memory breakdown: a Ray worker's title (`ray::ServeReplica:serve-app:Ingress`
    -> `ServeReplica:serve-app:Ingress`, `ray::ServeController.listen_for_change` -> `ServeController`), a Ray
    dashboard module (`ray-dashboard-NodeHead-0 (...)` -> `ray-dashboard-NodeHead`), for an interpreter the
    module it runs (-m, or the first module a -c program imports) or its script's file name, else the
    executable's file name (`name` when the command line is unreadable)."""
    joined = " ".join(cmdline)
    titled = re.match(r"ray::([^\s.]+)", joined) or re.match(r"(ray-dashboard-[A-Za-z]+)", joined)
    if titled:
        return titled.group(1)
    if not cmdline:
        return name
    executable = Path(cmdline[0]).name
    if not executable.startswith("python"):
        return executable
    args = iter(cmdline[1:])
    for arg in args:
        if arg in ("-m", "-c"):
            program = next(args, "")
            if arg == "-m":
                return program
            imported = re.search(r"(?:from|import)\s+([\w.]+)", program)
            return imported.group(1) if imported else f"{executable} -c"
        if arg in ("-X", "-W"):
            next(args, None)
        elif not arg.startswith("-"):
            return Path(arg).name  # the script: a .py file or an installed entry point (`serve`)
    return executable


def tree_pss(processes: list[psutil.Process]) -> dict:
    """Memory of a process tree: the sum of PSS (proportional set size: each shared page divided among
    the processes that map it, so shared libraries and the model's shared weights count once) and, for
    comparison, of RSS (which counts a shared page once per process). Processes gone meanwhile, or
    not ours to read, are skipped; `processes` says how many were counted. `by_kind`: PSS MiB and
    process count per `process_kind` (where a tree with many processes keeps its memory)."""
    pss = rss = counted = 0
    by_kind: dict[str, dict] = {}
    for p in {p.pid: p for p in processes}.values():
        try:
            info = p.memory_full_info()
            kind = process_kind(p.cmdline(), p.name())
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
        pss, rss, counted = pss + info.pss, rss + info.rss, counted + 1
        entry = by_kind.setdefault(kind, {"pss_mib": 0.0, "processes": 0})
        entry["pss_mib"], entry["processes"] = entry["pss_mib"] + info.pss / 2**20, entry["processes"] + 1
    by_kind = {k: {"pss_mib": round(v["pss_mib"], 1), "processes": v["processes"]}
               for k, v in sorted(by_kind.items(), key=lambda kv: -kv[1]["pss_mib"])}
    return {"pss_mib": round(pss / 2**20, 1), "rss_mib": round(rss / 2**20, 1), "processes": counted,
            "by_kind": by_kind}


class Server:
    def __init__(self, argv: list[str], env: dict, log: Path, cwd: Path):
        self.log = log
        self._log_file = open(log, "wb")
        self._tag = f"{os.getpid()}-{time.monotonic_ns()}"
        self.started = time.monotonic()
        self.proc = subprocess.Popen(argv, env={**env, SERVER_TAG_ENV: self._tag}, cwd=cwd,
                                     stdout=self._log_file, stderr=subprocess.STDOUT, start_new_session=True)

    def since_start(self) -> float:
        """Seconds since the server was launched."""
        return time.monotonic() - self.started

    def wait_ready(self, url: str, timeout_s: float, fatal: Optional[str] = None) -> float:
        """Poll `url` until it answers 200; returns the seconds it took. `fatal`: a regular expression
        whose appearance in the log's tail means the server will never be ready (a Serve app that failed
        to import keeps its launcher running): it fails at once instead of after `timeout_s`."""
        began, pattern = time.monotonic(), re.compile(fatal) if fatal else None
        while time.monotonic() - began < timeout_s:
            if self.proc.poll() is not None:
                raise ServerFailed(f"exited with {self.proc.returncode} before ready:\n{_log_tail(self.log)}")
            if pattern is not None and pattern.search(_log_tail(self.log, 20_000)):
                raise ServerFailed(f"failed before ready ({fatal!r} in its log):\n{_log_tail(self.log)}")
            try:
                with urllib.request.urlopen(url, timeout=5) as resp:
                    if resp.status == 200:
                        return time.monotonic() - began
            except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
                pass
            time.sleep(READY_POLL_S)
        raise ServerFailed(f"not ready after {timeout_s:.0f} s:\n{_log_tail(self.log)}")

    def _tree(self) -> list[psutil.Process]:
        try:
            root = psutil.Process(self.proc.pid)
            return [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return []

    def processes(self) -> list[psutil.Process]:
        """Everything this server started: its process tree and the processes that carry its tag
        (Ray's daemons leave the tree), each once."""
        return list({p.pid: p for p in (*self._tree(), *tagged(self._tag))}.values())

    def memory(self) -> dict:
        """PSS (and RSS) of everything this server started (`processes`)."""
        return tree_pss(self.processes())

    def stop(self) -> None:
        """SIGTERM the group (graceful), then SIGKILL whatever of the process tree is left."""
        tree = self._tree()
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            self.proc.wait(STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            pass
        # Children that left the group (Ray's own daemons) or outlived their parent (MLPool's
        # worker processes were found orphaned after their server stopped): by pid and by tag.
        tree = list({p.pid: p for p in (*tree, *tagged(self._tag))}.values())
        _, alive = psutil.wait_procs(tree, timeout=1)
        kill(alive, wait_s=5)
        self._log_file.close()
