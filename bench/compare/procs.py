"""Start a contender's server in its own process group, wait until it is ready, stop all of it."""

from __future__ import annotations

import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

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


def _tagged(tag: str) -> list[psutil.Process]:
    """Processes whose environment carries `tag` (inherited from the server we started)."""
    found = []
    for p in psutil.process_iter():
        try:
            if p.environ().get(SERVER_TAG_ENV) == tag:
                found.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


class Server:
    def __init__(self, argv: list[str], env: dict, log: Path, cwd: Path):
        self.log = log
        self._log_file = open(log, "wb")
        self._tag = f"{os.getpid()}-{time.monotonic_ns()}"
        self.proc = subprocess.Popen(argv, env={**env, SERVER_TAG_ENV: self._tag}, cwd=cwd,
                                     stdout=self._log_file, stderr=subprocess.STDOUT, start_new_session=True)

    def wait_ready(self, url: str, timeout_s: float) -> float:
        """Poll `url` until it answers 200; returns the seconds it took."""
        began = time.monotonic()
        while time.monotonic() - began < timeout_s:
            if self.proc.poll() is not None:
                raise ServerFailed(f"exited with {self.proc.returncode} before ready:\n{_log_tail(self.log)}")
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
        tree = list({p.pid: p for p in (*tree, *_tagged(self._tag))}.values())
        _, alive = psutil.wait_procs(tree, timeout=1)
        for p in alive:
            try:
                p.kill()
            except psutil.NoSuchProcess:
                pass
        psutil.wait_procs(alive, timeout=5)
        self._log_file.close()
