"""The ingress's own metrics and its JSON access log (Serve's metrics count replicas and queues;
these count what clients see: requests by route and status, errors by type, latency by route).

Metrics go through `ray.serve.metrics` (exported on Ray's metrics port with the deployment,
replica and application tags Serve adds); outside a Serve replica (unit tests) only the
in-process tallies move. No Ray import at module level: unit tests never start Ray.
"""

from __future__ import annotations

import json
import logging
import re
from collections import Counter as Tally
from typing import Optional

from .errors import ERROR_TYPE_SCOPE_KEY

#: the access log: one JSON object per line, as the message of Serve's own log record
access_logger = logging.getLogger("ray.serve.serve_app.access")

#: where a route records how many records (texts) its request carried
RECORDS_SCOPE_KEY = "serve_app.records"
#: why admission refused a request (serve_app/admission.py): `capacity`, `fair_share` or `draining`
SHED_SCOPE_KEY = "serve_app.shed"

#: routes kept as metric labels; anything else is "other" (bounded label cardinality)
KNOWN_ROUTES = ("/translation", "/embeddings", "/v1/embeddings", "/healthz", "/readyz", "/v1/models",
                "/docs", "/openapi.json", "/jobs")

LATENCY_BOUNDARIES_S = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60]


#: custom model routes share one label (any name a client sends would otherwise become a label), as jobs do
PREDICT_ROUTE = re.compile(r"^/models/[^/]+/predict$")
JOB_ROUTE = re.compile(r"^/jobs/[^/]+$")


def route_path(scope: dict) -> str:
    """The request's path inside the app: Serve passes the full path with the application's
    `route_prefix` as `root_path` (`/b/translation`, `/b`), and the app's routes are `/translation`."""
    path, root = scope.get("path") or "", scope.get("root_path") or ""
    if root and path.startswith(root) and path[len(root):len(root) + 1] in ("/", ""):
        return path[len(root):] or "/"
    return path


def route_label(path: str) -> str:
    if PREDICT_ROUTE.match(path):
        return "/models/{name}/predict"
    if JOB_ROUTE.match(path):
        return "/jobs/{id}"
    return path if path in KNOWN_ROUTES else "other"


class RequestRecorder:
    """Counts every request (in process, and in Prometheus inside Serve) and logs it."""

    def __init__(self) -> None:
        self.requests: Tally = Tally()   # (route, status) -> count
        self.errors: Tally = Tally()     # (route, error_type) -> count
        self.shed: Tally = Tally()       # reason -> count (all of them 503s: overloaded, or shutting_down)
        self._prometheus: Optional[tuple] = None
        self._prometheus_tried = False

    def _metrics(self):
        if not self._prometheus_tried:
            self._prometheus_tried = True
            try:
                import ray
                from ray.serve import context

                if ray.is_initialized() and context._get_internal_replica_context() is not None:
                    from ray.serve.metrics import Counter, Histogram

                    self._prometheus = (
                        Counter("serve_app_requests_total", description="HTTP requests by route and status.",
                                tag_keys=("route", "status")),
                        Counter("serve_app_errors_total",
                                description="Error responses by route and error_type (the JSON body's).",
                                tag_keys=("route", "error_type")),
                        Histogram("serve_app_request_seconds",
                                  description="Request latency at the ingress, by route, in seconds.",
                                  boundaries=LATENCY_BOUNDARIES_S, tag_keys=("route",)),
                        Counter("serve_app_shed_total",
                                description="Requests the Ingress's admission refused (503), by reason: capacity "
                                "(the replica and its waiting room full), fair_share (the API key held its share), "
                                "draining (shutting down).", tag_keys=("reason",)),
                    )
            except Exception:  # pragma: no cover - metrics must never break a request
                logging.getLogger("serve_app").exception("ingress metrics unavailable")
        return self._prometheus

    def record(self, scope: dict, *, request_id: str, status: int, seconds: float, log: bool) -> None:
        route = route_label(route_path(scope))
        error_type = scope.get(ERROR_TYPE_SCOPE_KEY)
        if error_type is None and status >= 400:
            error_type = "http_error"
        self.requests[(route, status)] += 1
        if error_type:
            self.errors[(route, error_type)] += 1
        if shed := scope.get(SHED_SCOPE_KEY):
            self.shed[shed] += 1
        metrics = self._metrics()
        if metrics is not None:
            try:
                requests, errors, latency, refused = metrics
                requests.inc(tags={"route": route, "status": str(status)})
                if error_type:
                    errors.inc(tags={"route": route, "error_type": error_type})
                if shed:
                    refused.inc(tags={"reason": shed})
                latency.observe(seconds, tags={"route": route})
            except Exception:  # pragma: no cover
                logging.getLogger("serve_app").exception("could not record ingress metrics")
        if log:
            access_logger.info(json.dumps({
                "event": "request",
                "request_id": request_id,
                "method": scope.get("method"),
                "route": route,
                "path": scope.get("path"),
                "status": status,
                "records": scope.get(RECORDS_SCOPE_KEY),
                "latency_ms": round(seconds * 1000, 2),
                "error_type": error_type,
            }, ensure_ascii=False, separators=(",", ":")))
