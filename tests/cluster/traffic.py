"""Clients of the local cluster, sending through the workers' Serve proxies as KubeRay's `serve`
Service spreads them, and a record of what each request got.

The Service: each request goes to a random worker whose proxy passes its readiness probe
(`/-/healthz`, probed every 0.5 s; a failed probe takes the endpoint out at once, as a
readinessProbe with failureThreshold 1 would). The head is never an endpoint
(`excludeHeadPodFromServeSvc`). A request whose connection broke on a pod that died (refused,
reset, or closed before an answer) is sent once more to another ready endpoint, as an ingress
controller retries another upstream on a connection error; both attempts are recorded, and the
tests tell such failures on the lost pod from failures on pods that stayed up.
"""

from __future__ import annotations

import random
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Callable, Collection, Optional

import httpx

def translation(n: int) -> dict:
    """A translation request of two records; `n` makes its texts unique, so that the response cache
    (which answers repeated texts without a model) does not hide the models' load."""
    return {"payload": {"fromLang": "en", "toLang": "pt",
                        "records": [{"id": "1", "text": f"Order {n} keeps the cluster answering."},
                                    {"id": "2", "text": f"Good morning, client {n}."}]}}


def embeddings(n: int) -> dict:
    return {"input": [f"Order {n} keeps the cluster answering.", f"Node {n} was lost."]}


#: The issue's bound while a pod is lost: every request answered within 10 s.
REQUEST_TIMEOUT_S = 10.0
#: Where no bound is asked (a ramp past what this machine serves, a pod rejoining, updates): a request
#: still unanswered after this long counts as failed.
PATIENT_TIMEOUT_S = 30.0
#: Sends after the first when a connection breaks (ingress-nginx's proxy-next-upstream-tries is 3 in all).
RESENDS = 2


@dataclass
class Attempt:
    endpoint: str
    status: Optional[int] = None  # None: no HTTP answer (transport error)
    error: Optional[str] = None
    retry_after: Optional[str] = None
    json_error_type: Optional[str] = None


@dataclass
class Request:
    route: str
    started: float
    #: sent as X-Request-Id: Serve logs it with every line of the request (finding a failure in the logs)
    request_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    ended: float = 0.0
    attempts: list[Attempt] = field(default_factory=list)

    @property
    def final(self) -> Attempt:
        return self.attempts[-1]

    @property
    def seconds(self) -> float:
        return self.ended - self.started

    @property
    def ok(self) -> bool:
        """Answered as the contract allows: 200, or 503 with Retry-After and the JSON error body."""
        final = self.final
        return final.status == 200 or (final.status == 503 and final.retry_after is not None
                                       and final.json_error_type is not None)


class ServiceEndpoints:
    """The ready worker proxies, as the `serve` Service's endpoint list."""

    def __init__(self, urls: Callable[[], list[str]], period_s: float = 0.5):
        self._urls = urls
        self._ready: list[str] = []
        self._stop = threading.Event()
        self._period_s = period_s
        self._client = httpx.Client(timeout=1.0)
        self._thread = threading.Thread(target=self._probe_forever, daemon=True)

    def start(self) -> "ServiceEndpoints":
        self._probe()
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._client.close()

    def _probe(self) -> None:
        ready = []
        for url in self._urls():
            try:
                if self._client.get(f"{url}/-/healthz").status_code == 200:
                    ready.append(url)
            except httpx.HTTPError:
                pass
        self._ready = ready

    def _probe_forever(self) -> None:
        while not self._stop.wait(self._period_s):
            self._probe()

    def ready(self) -> list[str]:
        return list(self._ready)

    def pick(self, exclude: Collection[str] = ()) -> Optional[str]:
        """A random ready endpoint, other than those in `exclude` where another is ready."""
        choices = [u for u in self._ready if u not in exclude] or self._ready
        return random.choice(choices) if choices else None


def _attempt(client: httpx.Client, url: str, route: str, body: dict, headers: dict, timeout_s: float) -> Attempt:
    attempt = Attempt(endpoint=url)
    try:
        r = client.post(f"{url}{route}", json=body, headers=headers, timeout=timeout_s)
    except httpx.TimeoutException as exc:
        attempt.error = f"timeout: {type(exc).__name__}"
        return attempt
    except httpx.HTTPError as exc:
        attempt.error = f"transport: {type(exc).__name__}: {exc}"[:200]
        return attempt
    attempt.status = r.status_code
    attempt.retry_after = r.headers.get("retry-after")
    if r.status_code != 200:
        try:
            attempt.json_error_type = r.json().get("error_type")
        except ValueError:
            attempt.json_error_type = None
    return attempt


class Load:
    """`clients` closed-loop clients, half translating and half embedding, until stopped."""

    def __init__(self, endpoints: ServiceEndpoints, api_key: str, clients: int = 16,
                 timeout_s: float = REQUEST_TIMEOUT_S):
        self.timeout_s = timeout_s
        self.endpoints = endpoints
        self.headers = {"Authorization": f"Bearer {api_key}"}
        self.clients = clients
        self.requests: list[Request] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._client, args=(i,), daemon=True) for i in range(clients)]

    def __enter__(self) -> "Load":
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=self.timeout_s * (RESENDS + 1) + 5)

    def set_clients(self, clients: int) -> None:
        """Add clients (a ramp); never fewer than running."""
        while len(self._threads) < clients:
            t = threading.Thread(target=self._client, args=(len(self._threads),), daemon=True)
            self._threads.append(t)
            t.start()
        self.clients = len(self._threads)

    def _client(self, index: int) -> None:
        route, make_body = ("/translation", translation) if index % 2 == 0 else ("/embeddings", embeddings)
        sent = 0
        with httpx.Client() as client:
            while not self._stop.is_set():
                sent += 1
                body = make_body(index * 1_000_000 + sent)
                url = self.endpoints.pick()
                if url is None:
                    time.sleep(0.1)
                    continue
                req = Request(route=route, started=time.monotonic())
                headers = {**self.headers, "X-Request-Id": req.request_id}
                req.attempts.append(_attempt(client, url, route, body, headers, self.timeout_s))
                # A broken connection (refused, reset, or a response cut short) is sent again to another
                # ready pod, each pod once, at most RESENDS times: the routes are idempotent, and this
                # is what serve_app.client and an ingress controller's next-upstream retry do.
                tried = {url}
                while (len(req.attempts) <= RESENDS and req.final.status is None
                       and (req.final.error or "").startswith("transport")):
                    other = self.endpoints.pick(exclude=tried)
                    if other is None or other in tried:
                        break
                    tried.add(other)
                    req.attempts.append(_attempt(client, other, route, body, headers, self.timeout_s))
                req.ended = time.monotonic()
                with self._lock:
                    self.requests.append(req)
                if req.final.status == 503:  # honour Retry-After, briefly: the test's clients are polite
                    self._stop.wait(min(1.0, float(req.final.retry_after or 1)))

    def since(self, t0: float, t1: float = float("inf")) -> list[Request]:
        with self._lock:
            return [r for r in self.requests if t0 <= r.started < t1]

    def wait_answers(self, count: int, timeout_s: float, started_from: float = float("-inf")) -> None:
        """Until `count` more requests than now got a 200 (only those started at `started_from` or
        later count: a window's answers, as `since(started_from)` will read them)."""
        def answered() -> int:
            return sum(1 for r in self.since(started_from) if r.final.status == 200)

        target = answered() + count
        deadline = time.monotonic() + timeout_s
        while answered() < target:
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout_s} s waiting for {count} answered requests")
            time.sleep(0.2)


def summarize(requests: list[Request]) -> dict:
    """Counts a test prints and saves: statuses, retries, slowest answer."""
    statuses: dict[str, int] = {}
    for r in requests:
        key = str(r.final.status) if r.final.status is not None else (r.final.error or "?").split(":")[0]
        statuses[key] = statuses.get(key, 0) + 1
    return {
        "requests": len(requests),
        "statuses": statuses,
        "resent_to_another_pod": sum(1 for r in requests if len(r.attempts) > 1),
        "not_ok": sum(1 for r in requests if not r.ok),
        "slowest_s": round(max((r.seconds for r in requests), default=0.0), 2),
    }


def failures_after_loss(requests, lost_url=None, in_flight_until=float("-inf")):
    """Requests not answered as the contract allows, and attempts on pods that stayed up that failed.

    A surviving pod's HAProxy balances over every Ingress, so a response that the lost pod's Ingress
    was sending when it died reaches the client cut short through a surviving pod (the client sends
    it again). That is allowed for requests already in flight at the loss (started before
    `in_flight_until`), never for later ones: a 5xx other than 503 on a survivor never is."""
    not_ok = [r for r in requests if not r.ok]
    bad_on_survivors = [a for r in requests for a in r.attempts
                        if a.endpoint != lost_url
                        and ((a.status is None and r.started >= in_flight_until)
                             or (a.status is not None and a.status >= 500 and a.status != 503))]
    return not_ok, bad_on_survivors


def cut_in_flight(requests, lost_url, in_flight_until) -> int:
    return sum(1 for r in requests if r.started < in_flight_until
               for a in r.attempts if a.endpoint != lost_url and a.status is None)


def describe_failed(requests, t0: float, lost_url: str, most: int = 8) -> str:
    """The first failed requests: route, start relative to the kill, and each attempt."""
    return "; ".join(
        f"{r.route} {r.request_id} at {r.started - t0:+.1f} s: " + ", ".join(
            f"{'LOST ' if a.endpoint == lost_url else ''}{a.endpoint.split('//')[1]} {a.status or a.error}"
            for a in r.attempts)
        for r in requests[:most])
