"""A real Redis for the tests: Debian's `redis-server` (`make install-test` installs it) on a free
port of 127.0.0.1, with its data in a temporary folder and AOF persistence (`appendfsync always`:
a SIGKILL loses no acknowledged write), stopped afterwards, also when the test fails."""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Optional

from tests.support import free_port

REDIS_SERVER = shutil.which("redis-server") or "/usr/bin/redis-server"


class RedisServer:
    def __init__(self, workdir: Path, password: Optional[str] = None):
        if not Path(REDIS_SERVER).exists():
            raise RuntimeError("redis-server is not installed: run `make install-test` (Debian's redis-server)")
        self.dir = Path(workdir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.password = password
        self.proc: Optional[subprocess.Popen] = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout_s: float = 15) -> "RedisServer":
        args = [REDIS_SERVER, "--bind", "127.0.0.1", "--port", str(self.port), "--dir", str(self.dir),
                "--appendonly", "yes", "--appendfsync", "always", "--save", "", "--daemonize", "no",
                "--logfile", str(self.dir / "redis.log")]
        if self.password:
            args += ["--requirepass", self.password]
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"redis-server exited: {(self.dir / 'redis.log').read_text()[-2000:]}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as s:
                    s.sendall(b"PING\r\n")
                    if s.recv(64):
                        return self
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("redis-server did not answer in time")

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)
            self.proc.wait(timeout=30)
        self.proc = None
