"""Locust glue shared by the scenarios: the user base class, response handling,
the SLO command-line flags and the `quitting` gate that sets the exit code.

Response handling:
  * 200 with a right body: success;
  * 200 with a wrong body: `resp.failure(...)`;
  * 503: *shed load*, not an error. It is recorded under the request name plus
    `" [shed]"` (its own stats row), and the user waits `Retry-After` seconds
    before its next request;
  * anything else (4xx, 5xx, timeouts, connection errors): failure.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any, Callable, Mapping, Optional

from locust import FastHttpUser, events
from locust.runners import WorkerRunner

import common
import slo

log = logging.getLogger("serve_app.load")


def _api_key() -> Optional[str]:
    """The service's API key: SERVE_APP_API_KEY, or the first key in the file SERVE_APP_API_KEY_FILE
    (in-cluster: the Secret serve-app-api-key, comma- or newline-separated keys); None: send none."""
    text = os.environ.get("SERVE_APP_API_KEY", "")
    path = os.environ.get("SERVE_APP_API_KEY_FILE")
    if not text and path:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    keys = [k for line in text.splitlines() if not line.strip().startswith("#") for k in line.replace(",", " ").split()]
    return keys[0] if keys else None


@events.init_command_line_parser.add_listener
def _add_arguments(parser, **_kw):
    defaults = slo.SLO_DEFAULTS
    # Exit code 1 when a limit is breached. Locust's own parser sets each flag from, last wins: the
    # default here, `[tool.locust]` in the working directory's pyproject.toml (the repository's:
    # run Locust from its root, as `make load` does), the environment variable, the command line.
    # Plain parser arguments, not an argument group: Locust's web UI reads attributes only its own
    # add_argument sets.
    parser.add_argument("--slo-max-error-ratio", type=float, env_var="LOCUST_SLO_MAX_ERROR_RATIO",
                        default=defaults["slo-max-error-ratio"],
                        help="Largest ratio of failed requests among those not shed (503). Default %(default)s.")
    parser.add_argument("--slo-p95-ms", type=float, env_var="LOCUST_SLO_P95_MS",
                        default=defaults["slo-p95-ms"],
                        help="Largest p95 response time in ms, over requests not shed. Default %(default)s.")
    parser.add_argument("--slo-max-shed-ratio", type=float, env_var="LOCUST_SLO_MAX_SHED_RATIO",
                        default=defaults["slo-max-shed-ratio"],
                        help="Largest ratio of requests answered 503 (shed). Default %(default)s.")
    parser.add_argument("--slo-off", action="store_true", env_var="LOCUST_SLO_OFF", default=False,
                        help="Print the verdict but leave the exit code to Locust (for exploratory runs).")
    parser.add_argument("--pacing", type=float, env_var="LOCUST_PACING", default=1.0,
                        help="Seconds between the starts of one user's requests (0: back to back). "
                        "Scenario users only; the stress matrix sets its own. Default %(default)s.")
    parser.add_argument("--cache-control", env_var="LOCUST_CACHE_CONTROL", default="no-cache",
                        help="Cache-Control header of every request. The default makes the service compute "
                        "every text (the scenarios repeat a small pool of sentences, which the ingress's "
                        "response cache would answer: that measures the cache, not the models); an empty "
                        "value lets the cache answer. Default %(default)s.")


@events.quitting.add_listener
def _slo_gate(environment, **_kw):
    if isinstance(environment.runner, WorkerRunner):
        return  # the master judges the aggregated figures
    options = environment.parsed_options
    if options is None:
        return
    fig = slo.slo_figures(
        (e.name, e.num_requests, e.num_failures, e.response_times)
        for e in environment.runner.stats.entries.values()
    )
    ok, line = slo.slo_verdict(fig, options.slo_max_error_ratio, options.slo_p95_ms,
                                  options.slo_max_shed_ratio)
    print(line, flush=True)
    if not options.slo_off:
        environment.process_exit_code = 0 if ok else 1


class ServeAppUser(FastHttpUser):
    """Paced user: one request every `pacing` seconds (start to start), or straight
    after the previous answer when that took longer; after a 503 it waits Retry-After."""

    abstract = True
    #: seconds between request starts; None: the --pacing option
    pacing: Optional[float] = None
    network_timeout = 90.0  # > the service's 60 s model deadline, so 504s arrive as 504s
    connection_timeout = 10.0

    def __init__(self, environment):
        super().__init__(environment)
        self._last_start = 0.0
        self._backoff_until = 0.0

    def _pacing(self) -> float:
        if self.pacing is not None:
            return self.pacing
        options = self.environment.parsed_options
        return getattr(options, "pacing", 1.0) if options is not None else 1.0

    def wait_time(self) -> float:
        now = time.monotonic()
        return max(0.0, self._last_start + self._pacing() - now, self._backoff_until - now)

    def back_off(self, seconds: float) -> None:
        self._backoff_until = max(self._backoff_until, time.monotonic() + seconds)

    def _post(self, path: str, name: str, body: Mapping[str, Any],
              checker: Callable[[Mapping[str, Any], Any], Optional[str]]) -> None:
        self._last_start = time.monotonic()
        options = self.environment.parsed_options
        cache_control = getattr(options, "cache_control", "no-cache") if options is not None else "no-cache"
        headers = {"Cache-Control": cache_control} if cache_control else {}
        key = _api_key()
        if key:
            headers["Authorization"] = f"Bearer {key}"
        with self.client.post(path, json=body, name=name, headers=headers, catch_response=True) as resp:
            outcome = common.classify(resp.status_code, resp.headers, resp.json, checker, body,
                                      error=getattr(resp, "error", None))
            if outcome.kind == "ok":
                resp.success()
            elif outcome.kind == "shed":
                resp.request_meta["name"] = name + slo.SHED_SUFFIX
                resp.success()
                self.back_off(outcome.retry_after_s)
            else:
                resp.failure(outcome.message)

    def translate(self, n_records: int, name: Optional[str] = None) -> None:
        self._post("/translation", name or f"/translation {n_records}rec",
                   common.translation_payload(n_records), common.check_translation)

    def embed(self, n_inputs: int, name: Optional[str] = None) -> None:
        self._post("/embeddings", name or f"/embeddings {n_inputs}in",
                   common.embeddings_payload(n_inputs), common.check_embeddings)
