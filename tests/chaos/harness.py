"""A `serve run` of a checked-in config (serve_config.yaml unless told: the models in deployments of
their own, whose failure isolation most chaos tests measure) that a chaos test owns: started with overrides, observed
(replica PIDs, Ray's metrics port, logs), hurt (SIGKILL a replica, SIGTERM the whole run) and
stopped. Several Ray clusters may share the machine (other people's runs): everything here is
scoped to this run's own session (its Ray processes share the session id of `serve run`).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional

import httpx
import yaml

from serve_app import status
from serve_app.proxy import proxy_environment
from serve_app.proxy_shedding import shedding_for_config
from serve_app.run import lean_serve_environment
from tests.ray_metrics import metrics_url, session_folder
from tests.support import deep_update, free_port, make_status, metric_sum, scrape, session_pids, wait_for  # noqa: F401 (re-exported to the chaos tests)

ROOT = Path(__file__).resolve().parents[2]


def _sigint_as_in_a_terminal() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


class ServeRun:
    """One `serve run`, its own Ray cluster and its own port."""

    def __init__(self, workdir: Path, *, args: Optional[dict] = None,
                 deployments: Optional[dict[str, dict]] = None, env: Optional[dict[str, str]] = None,
                 proxy: Optional[str] = None, config: str = "serve_config.yaml"):
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.config_path = self.workdir / "serve_config.yaml"
        self.log_path = self.workdir / "serve.log"
        self.config = self._config(config, args or {}, deployments or {})
        self.env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0", PYTHONUNBUFFERED="1",
                        # Replicas push metrics to Ray's agent every second, not every 10 s.
                        RAY_metrics_report_interval_ms="1000", **(env or {}))
        # Each run its own job store (not `make run`'s .data/jobs.sqlite3); pass env to share one.
        self.env.setdefault("SERVE_APP_JOBS_STORE_PATH", str(self.workdir / "jobs.sqlite3"))
        # The HTTP proxy `make run` would pick (serve_app/proxy.py; SERVE_APP_PROXY=python runs the suite
        # on Serve's Python proxy), set in the environment so that `serve run` and the launcher agree.
        self.proxy_dir = Path(tempfile.mkdtemp(prefix="sa-", dir="/tmp"))  # Ray recreates it on a restart
        self.proxy, added = proxy_environment(proxy or self.env.get("SERVE_APP_PROXY", "auto"),
                                              self.proxy_dir, self.env,
                                              shedding=shedding_for_config(self.config))  # as make run's
        self.env.update(added)
        self.env.setdefault("RAY_SERVE_ENABLE_HA_PROXY", "1" if self.proxy == "haproxy" else "0")
        self.env.update(lean_serve_environment(self.env))  # Serve's control-plane ticks, as make run sets them
        self.proc: Optional[subprocess.Popen] = None
        #: `serve run` (what the integration tests use), or the `make run` launcher
        self.command = [str(Path(sys.executable).with_name("serve")), "run", "--address", "local"]  # issue 30: own Ray

    def _config(self, name: str, args: dict, deployments: dict[str, dict]) -> dict:
        """The checked-in config `name` on this run's port."""
        config = yaml.safe_load((ROOT / name).read_text())
        config["http_options"]["port"] = self.port
        app = config["applications"][0]
        # The tests hurt model computation, and send the same texts again from test to test:
        # the ingress's response cache would answer those without a model (pass
        # args={"cache": {"enabled": True}} to keep it).
        deep_update(app.setdefault("args", {}), {"cache": {"enabled": False}})
        deep_update(app["args"], args)
        for d in app["deployments"]:
            deep_update(d, deployments.get(d["name"], {}))
        return config

    def write_config(self) -> Path:
        self.config_path.write_text(yaml.safe_dump(self.config, sort_keys=False))
        return self.config_path

    # -- life cycle -------------------------------------------------------------------------
    def start(self, wait_ready: bool = True, timeout_s: float = 240) -> float:
        self.write_config()
        with open(self.log_path, "ab") as out:
            self.proc = subprocess.Popen(
                [*self.command, str(self.config_path)],
                cwd=ROOT, env=self.env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                # As in a terminal: a suite started in the background (`cmd &`, nohup) inherits SIGINT
                # ignored, and Python then never installs its KeyboardInterrupt handler, so the
                # Ctrl-C tests' `serve run` ignored the signal (seen: 60 s with no reaction).
                preexec_fn=_sigint_as_in_a_terminal,
            )
        start = time.monotonic()
        if wait_ready:
            self.wait_ready(timeout_s)
        return time.monotonic() - start

    def wait_ready(self, timeout_s: float = 240) -> None:
        def ready():
            if self.proc is not None and self.proc.poll() is not None:
                raise AssertionError(f"serve run exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                return httpx.get(f"{self.url}/readyz", timeout=5).status_code == 200
            except httpx.HTTPError:
                return False
        try:
            wait_for(ready, timeout_s, "/readyz 200", interval_s=0.25)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{self.log_tail()}") from None

    def stop(self, sig: int = signal.SIGTERM, timeout_s: float = 60) -> Optional[float]:
        """Signal `serve run`'s process group; return seconds until it exited (None: not running)."""
        if self.proc is None or self.proc.poll() is not None:  # never started, or a test stopped it
            shutil.rmtree(self.proxy_dir, ignore_errors=True)
            if self.proc is not None:
                status.remove_record(self.port, self.proc.pid)
            return None
        start = time.monotonic()
        os.killpg(self.proc.pid, sig)
        try:
            self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        took = time.monotonic() - start
        self._reap_session()
        shutil.rmtree(self.proxy_dir, ignore_errors=True)
        status.remove_record(self.port, self.proc.pid)  # a `make run` launcher killed outright leaves its own
        return took

    def _reap_session(self) -> None:
        """Ray processes of this run's session that outlived it (their own process groups)."""
        for pid in self.session_pids():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def log_tail(self, chars: int = 4000) -> str:
        return self.log_path.read_text(errors="replace")[-chars:] if self.log_path.exists() else ""

    # -- what runs where --------------------------------------------------------------------
    def session_pids(self) -> list[int]:
        """PIDs in this run's session (serve run started it: session id == its PID)."""
        return [] if self.proc is None else session_pids(self.proc.pid)

    def replica_pids(self, deployment: str) -> list[int]:
        """PIDs of this run's live replicas of `deployment` (by their Ray process title)."""
        if self.proc is None:
            return []
        out = subprocess.run(["ps", "-eo", "pid=,sid=,stat=,args="], capture_output=True, text=True).stdout
        pids = []
        for line in out.splitlines():
            pid, sid, stat, args = line.split(None, 3)
            if (int(sid) == self.proc.pid and not stat.startswith("Z")
                    and args.startswith(f"ray::ServeReplica:serve-app:{deployment}")):
                pids.append(int(pid))
        return pids

    def session_dir(self) -> Path:
        assert self.proc is not None
        return wait_for(lambda: session_folder(self.proc.pid), 30, "the Ray session folder")

    def scrape(self) -> dict[tuple[str, tuple], float]:
        """Ray's Prometheus endpoint of this run, as {(name, sorted labels): value}."""
        assert self.proc is not None
        url = metrics_url(self.proc.pid)
        assert url, "no metrics port file in this run's Ray session folder after 30 s"
        return scrape(url)

    def replica_logs(self, deployment: str) -> list[Path]:
        return sorted((self.session_dir() / "logs" / "serve").glob(f"replica_serve-app_{deployment}_*.log"))


def dashboard_url(run: ServeRun) -> str:
    """This run's Ray dashboard (another cluster on the machine may hold the default port)."""
    import re

    log = run.session_dir() / "logs" / "dashboard.log"

    def find():
        if not log.exists():
            return None
        m = re.search(r"Dashboard head http address: ([\d.]+:\d+)", log.read_text(errors="replace"))
        return m and m.group(1)

    return "http://" + wait_for(find, 60, "the dashboard address in dashboard.log")


def serve_details(run: ServeRun) -> dict:
    """Serve's own view (`serve status` data) through this run's dashboard REST API."""
    r = httpx.get(f"{dashboard_url(run)}/api/serve/applications/", timeout=10, headers=_auth_headers())
    r.raise_for_status()
    return r.json()


def _auth_headers() -> dict:
    token = Path.home() / ".ray" / "auth_token"
    return {"Authorization": f"Bearer {token.read_text().strip()}"} if token.exists() else {}


def deployment_details(run: ServeRun, deployment: str) -> Optional[dict]:
    """Serve's details of `deployment` (status, target_num_replicas, replicas with their ids and
    states), or None while it is missing (Serve rebuilding the application after new args)."""
    return serve_details(run)["applications"].get("serve-app", {}).get("deployments", {}).get(deployment)


def running_replica_ids(run: ServeRun, deployment: str) -> set[str]:
    """Ids of the replicas of `deployment` Serve lists as RUNNING (empty while it is missing)."""
    # While Serve rebuilds an application (new args) its deployments may be missing briefly.
    d = deployment_details(run, deployment)
    return {r["replica_id"] for r in d["replicas"] if r["state"] == "RUNNING"} if d else set()


#: Deployment overrides that pin the Ingress to two replicas, as the placed start's autoscaler runs
#: it under load (serve_config.placed.yaml: 1-2).
TWO_INGRESS_REPLICAS = {"Ingress": {"autoscaling_config": {"min_replicas": 2, "max_replicas": 2}}}


def wait_for_running_ingress(run: ServeRun, replicas: int, timeout_s: float = 120) -> None:
    """Until Serve lists at least `replicas` RUNNING Ingress replicas of `run`: through its dashboard, or through
    `make status` for a run of the `make run` launcher (it starts no dashboard)."""
    launcher = status.LAUNCHER_MODULE in run.command

    def running() -> int:
        if not launcher:
            return len(running_replica_ids(run, "Ingress"))
        deployments = make_status(run.port, run.env)[2].get("applications", {}).get("serve-app", {}).get("deployments")
        return (deployments or {}).get("Ingress", {}).get("replica_states", {}).get("RUNNING", 0)

    # `make status` starts a Ray driver each time: seconds of CPU on 2 cores, while the replicas start
    wait_for(lambda: running() >= replicas, timeout_s, f"{replicas} RUNNING Ingress replica(s)", 2.0 if launcher else 0.5)


def deployment_replicas(run: ServeRun, deployment: str) -> tuple[str, list[str]]:
    """(deployment status, [state of each replica]) as Serve reports them."""
    d = deployment_details(run, deployment)
    if d is None:
        raise KeyError(f"Serve reports no deployment {deployment!r} in serve-app")
    return d["status"], [r["state"] for r in d["replicas"]]


def serve_deploy(run: ServeRun, config: dict) -> float:
    """`serve deploy` of `config` to this run's cluster (token auth is on in Ray 2.60)."""
    path = run.workdir / "deploy.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    started = time.monotonic()
    done = subprocess.run([str(Path(sys.executable).with_name("serve")), "deploy", "-a", dashboard_url(run), str(path)],
                          cwd=ROOT, env=dict(run.env, RAY_AUTH_MODE="token"), capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    return time.monotonic() - started


class HAProxyLog:
    """HAProxy's log lines, received as syslog over UDP: pass `env` to a ServeRun
    (RAY_SERVE_HAPROXY_LOG_TARGET; Ray's default target, 127.0.0.1:514, has no listener)."""

    def __init__(self):
        import socket
        import threading

        self.lines: list[str] = []
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self._sock.bind(("127.0.0.1", 0))
        self.env = {"RAY_SERVE_HAPROXY_LOG_TARGET": f"127.0.0.1:{self._sock.getsockname()[1]}"}
        threading.Thread(target=self._receive, daemon=True).start()

    def _receive(self) -> None:
        while True:
            try:
                data = self._sock.recv(65535)
            except OSError:  # closed
                return
            self.lines.append(data.decode(errors="replace"))

    def requests(self, path: str) -> list[dict]:
        """The logged requests to `path` (HAProxy's `option httplog` format): accept time (epoch s),
        server, status and retries (`+N`: N of them went to another server)."""
        import re
        from datetime import datetime

        found = []
        pattern = re.compile(r"\[(\d+/\w+/\d+:\d+:\d+:\d+\.\d+)\] \S+ (\S+) \S+ (-?\d+) .* \d+/\d+/\d+/\d+/(\+?)(\d+) "
                             r"\d+/\d+ \"\w+ " + re.escape(path) + " ")
        for line in list(self.lines):
            m = pattern.search(line)
            if m:
                accepted = datetime.strptime(m.group(1), "%d/%b/%Y:%H:%M:%S.%f").timestamp()
                found.append({"accepted": accepted, "server": m.group(2), "status": int(m.group(3)),
                              "retries": int(m.group(5)), "redispatched": m.group(4) == "+"})
        return found

    def close(self) -> None:
        self._sock.close()
