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


class Server:
    def __init__(self, argv: list[str], env: dict, log: Path, cwd: Path):
        self.log = log
        self._log_file = open(log, "wb")
        self.proc = subprocess.Popen(argv, env=env, cwd=cwd, stdout=self._log_file, stderr=subprocess.STDOUT,
                                     start_new_session=True)

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
        _, alive = psutil.wait_procs(tree, timeout=1)
        for p in alive:  # children that left the group (Ray's own daemons), by pid
            try:
                p.kill()
            except psutil.NoSuchProcess:
                pass
        psutil.wait_procs(alive, timeout=5)
        self._log_file.close()
