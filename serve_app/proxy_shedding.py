"""HAProxy holds what the Ingress replicas cannot, so that a storm costs no Python time.

Each Ingress replica holds at most `ingress.max_inflight_requests` model requests plus
`ingress.max_waiting_requests` waiting for a slot (serve_app/admission.py) and answers anything past
that 503 + Retry-After at once. Behind HAProxy that refusal still costs the replica's Python a
request, and clients that ignore Retry-After send the next one at once: a storm of 800 such
clients on 2 replicas (512 held) made ~2,400 refusals a second on the cores the models needed, and
goodput fell to 0.20x capacity (docs/benchmarks/storm-run-400-800). So, per Ingress replica:

- HAProxy's `maxconn` is max_inflight_requests + max_waiting_requests: it never sends a replica more
  requests than the replica holds;
- the rest wait in HAProxy's queue, which costs no CPU, for at most max_wait_s (`timeout queue`);
  then HAProxy answers the ingress's 503 JSON body with Retry-After itself;
- requests leave the queue by class: probes (GET /healthz, /readyz) and keyed requests to other routes than
  admission's (model list, job status) first, then keyed model requests, then requests without an API key
  (other routes, then model routes). A storm without a key header (answered 401 where keys are on) never
  holds back a tenant's requests (HAProxy sees that a key is sent, not whether it is valid: one with any key waits
  as a tenant); with keys off every request is keyless and the order among routes stays.

Measured against refusing at once in HAProxy past one queued request per replica (the obvious
design, and issue 24's wording): at 800 clients that answered 21,500 503s a second, and the refusal
loop of the clients and HAProxy took the cores instead: 0.36x capacity, against 0.93x with the
queue (docs/benchmarks/proxy-queue-run). A refusal that waited paces a client that ignores
Retry-After; a prompt one does not.

Admission in the replica is unchanged (API-key fair share, the waiting room's deadline, draining)
and still has the last word; on a cluster, where every node's HAProxy holds this bound on its own,
it is what bounds a replica. Ray 2.60's HAProxy template has no setting for any of this, so it
rides in RAY_SERVE_HAPROXY_HEALTH_CHECK_FASTINTER, which Ray writes into each backend's
`default-server` line (haproxy_retry_policy rides in RAY_SERVE_HAPROXY_RETRY_ON the same way), set by
serve_app/proxy.py's proxy_environment unless the user set it; tests/unit/test_proxy_shedding.py renders Ray's
template with it and runs the HAProxy it configures.

Ray writes that one value into every backend, one per application, so each serve-app application's lines sit in
a block HAProxy keeps only in that application's own backend (`.if streq("${.SECTION}","http-<app name>")`, the
name Ray gives it; HAProxy 2.8's pseudo-variable): each backend holds its own application's bound, queue wait
and routes, and the backends of applications that are not serve-app's keep Ray's configuration (no `maxconn`).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Mapping, Optional

from .admission import MODEL_PATH_PREFIXES, MODEL_PATH_SUFFIX, MODEL_PATHS

#: The variable that carries the directives, and Ray 2.60's value for it when unset.
FASTINTER_VARIABLE = "RAY_SERVE_HAPROXY_HEALTH_CHECK_FASTINTER"
RAY_FASTINTER = "250ms"

#: How long a health check's answer may take (HAProxy's `timeout check`; see backend_directives).
HEALTH_CHECK_READ_TIMEOUT_S = 5.0

#: The probes: they leave HAProxy's queue first, key or not.
PROBE_PATHS = ("/healthz", "/readyz")

#: serve-app's applications in a Serve config, by import path.
SERVE_APP_IMPORT_PREFIX = "serve_app."

#: Serve's name for an application whose config names none.
SERVE_DEFAULT_APP_NAME = "default"


def backend_name(app_name: str) -> str:
    """The HAProxy backend Ray 2.60 makes for an HTTP application (HAProxyManager._generate_backend_name and
    get_safe_name; tests/unit/test_proxy_shedding.py compares them)."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", f"http-{app_name}".replace("#", "-").replace("/", "."))


@dataclass(frozen=True)
class AppShedding:
    """What HAProxy sends each Ingress replica of one serve-app application, and how long the rest may wait
    (module docstring); `backend` is the application's HAProxy backend."""

    max_requests_per_replica: int
    max_queue_wait_s: float
    retry_after_s: int
    backend: str = backend_name("serve-app")
    #: admission's routes under each application's route prefix
    model_paths: tuple[str, ...] = MODEL_PATHS
    model_path_prefixes: tuple[str, ...] = MODEL_PATH_PREFIXES
    probe_paths: tuple[str, ...] = PROBE_PATHS

    def backend_directives(self) -> list[str]:
        """The lines the application's HAProxy backend gets after its `default-server maxconn` line."""
        timed_out = json.dumps({"error": "No Ingress replica could take the request within "
                                         f"{self.max_queue_wait_s:g} s (at capacity, or none ready); retry "
                                         f"after {self.retry_after_s} s.", "error_type": "overloaded"})
        lost = json.dumps({"error": "The Ingress replica holding this request stopped before it answered (a crash, "
                                    f"or its node was lost); retry after {self.retry_after_s} s.",
                           "error_type": "model_unavailable"})

        def answer(body: str) -> str:  # HAProxy's own JSON answer, with the replicas' Retry-After and request id
            return (f"content-type application/json string '{body}' hdr Retry-After {self.retry_after_s} "
                    "hdr X-Request-Id %[var(txn.serve_app_request_id)]")

        return [
            f"timeout queue {max(1, round(self.max_queue_wait_s * 1000))}ms",
            # Every request gets an id here if its client sent none, so a POST that HAProxy resends (its
            # replica died before answering) carries the same one: the job store knows a resent
            # submission by it (jobs/job.py's submission_key). Ray sets it only with a request router.
            # (an empty one too: it is no id, and the replica would answer an empty X-Request-ID)
            "http-request set-header x-request-id %[uuid] if !{ req.hdr(x-request-id),length gt 0 }",
            "http-request set-var(txn.serve_app_request_id) req.hdr(x-request-id)",  # (for HAProxy's own answers)
            "acl serve_app_model path " + " ".join(self.model_paths),
            "acl serve_app_model path_reg ^(" + "|".join(re.escape(p) for p in self.model_path_prefixes)
            + ")[^/]+" + re.escape(MODEL_PATH_SUFFIX) + "$",  # a model's predict route, not its card
            "acl serve_app_probe path " + " ".join(self.probe_paths),
            "acl serve_app_read method GET HEAD",  # a probe is a GET: a keyless POST to its path is not one
            "acl serve_app_keyed req.hdr(authorization) -m found",
            "acl serve_app_keyed req.hdr(x-api-key) -m found",
            # Lower classes leave the queue first: probes and status calls do not wait behind a storm, and
            # requests without a key wait behind every keyed one (the module's docstring).
            "http-request set-priority-class int(1) if serve_app_model serve_app_keyed",
            "http-request set-priority-class int(2) if !serve_app_model !serve_app_keyed !serve_app_probe"
            " || !serve_app_model !serve_app_keyed !serve_app_read",
            "http-request set-priority-class int(3) if serve_app_model !serve_app_keyed",
            # HAProxy's own 503s (queue timeout, no replica up): the ingress's body, not Ray's bare 500,
            # and the caller's request id echoed as the replicas do.
            f"http-error status 503 {answer(timed_out)}",
            # An Ingress replica that died holding the request (a model placed in it crashed, its node was lost)
            # and no other to resend it to: HAProxy's 502, which Ray's template turns into a bare text 500, or,
            # while no Ingress replica is up, Serve's fallback proxy's bare 500 (the replica it waited for died
            # too). Each is the 503 `model_unavailable` + Retry-After that a lost model replica gets; the Ingress
            # answers every error of its own in JSON, and never 502.
            f"http-error status 502 {answer(lost)}",
            "http-after-response set-status 503 if { status 502 }",
            f"http-response return status 503 {answer(lost)} "
            "if { status 500 } !{ res.hdr(content-type) -m sub json }",
            # A health check may take this long to be answered (a busy replica), as with Ray's default
            # `inter` of 5 s; a shorter `inter` (the RayServices: 1 s) then shortens only the check's
            # connect timeout, min(`timeout connect`, `inter`): an Ingress on a pod cut off from the
            # network is marked down within ~3 s, not 15 (tests/cluster/test_partition.py).
            f"timeout check {HEALTH_CHECK_READ_TIMEOUT_S:g}s",
        ]

    def block(self) -> list[str]:
        """This application's lines, kept by HAProxy in its own backend only (module docstring)."""
        return [f'.if streq("${{.SECTION}}","{self.backend}")',
                f"default-server maxconn {self.max_requests_per_replica}", *self.backend_directives(), ".endif"]


@dataclass(frozen=True)
class ProxyShedding:
    """Each serve-app application's AppShedding, for the HAProxy in front of a Serve config's applications."""

    apps: tuple[AppShedding, ...]

    def app(self, name: str) -> AppShedding:
        """The bound of the application named `name`."""
        return next(app for app in self.apps if app.backend == backend_name(name))

    def fastinter_value(self, fastinter: str = RAY_FASTINTER) -> str:
        """RAY_SERVE_HAPROXY_HEALTH_CHECK_FASTINTER's value: Ray writes `default-server fastinter <it> downinter
        ... check` into every backend, so the value ends that line after Ray's `fastinter`, adds each serve-app
        application's block (only its own backend keeps it), and opens a second `default-server` line for the rest
        of Ray's."""
        return "\n    ".join([fastinter, *(line for app in self.apps for line in app.block()),
                              f"default-server fastinter {fastinter}"])


def _under(prefix: str, paths: tuple[str, ...]) -> tuple[str, ...]:
    base = "/" + prefix.strip("/") if prefix.strip("/") else ""
    return tuple(base + path for path in paths)


def shedding_for_config(config: Mapping[str, Any]) -> Optional[ProxyShedding]:
    """The bound of each of a Serve config's serve-app applications (their `args:` and SERVE_APP_INGRESS_* as
    the replicas read them), each for its own HAProxy backend. None without a serve-app application."""
    from .app_settings import app_settings

    apps = []
    for app in config.get("applications") or []:
        if not str(app.get("import_path", "")).startswith(SERVE_APP_IMPORT_PREFIX):
            continue
        settings, prefix = app_settings(app).ingress, app.get("route_prefix") or "/"
        apps.append(AppShedding(
            max_requests_per_replica=settings.max_inflight_requests + settings.max_waiting_requests,
            max_queue_wait_s=settings.max_wait_s, retry_after_s=settings.retry_after_s,
            backend=backend_name(str(app.get("name") or SERVE_DEFAULT_APP_NAME)),
            model_paths=_under(prefix, MODEL_PATHS), model_path_prefixes=_under(prefix, MODEL_PATH_PREFIXES),
            probe_paths=_under(prefix, PROBE_PATHS)))
    return ProxyShedding(tuple(apps)) if apps else None
