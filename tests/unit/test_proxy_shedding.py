"""HAProxy sends each Ingress replica no more than it holds and queues the rest (serve_app/proxy_shedding.py).

The config is Ray 2.60's own: `HAProxyApi` renders its template with the variable the launcher sets,
and the HAProxy binary Ray would start runs it in front of a stand-in replica (a threaded HTTP
server that holds model requests until the test lets them go), so the checks are on what HAProxy
does, not on the text of its config."""

from __future__ import annotations

import csv
import json
import socket
import subprocess
import threading
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest
import yaml

from serve_app import proxy
from serve_app.proxy_shedding import AppShedding, ProxyShedding, backend_name, shedding_for_config
from tests.support import free_port, wait_for

APP = {"name": "serve-app", "route_prefix": "/", "import_path": "serve_app.builder:build_app"}


def test_the_bound_is_what_each_ingress_replica_holds_admitted_plus_waiting():
    config = yaml.safe_load(open("serve_config.placed.yaml"))
    shedding = shedding_for_config(config).app("serve-app")
    ingress = config["applications"][0]["args"]["ingress"]
    assert shedding.max_requests_per_replica == ingress["max_inflight_requests"] + ingress["max_waiting_requests"]
    assert shedding.max_queue_wait_s == ingress["max_wait_s"]
    assert shedding.model_paths == ("/translation", "/embeddings", "/v1/embeddings", "/jobs")


def test_the_environment_and_the_settings_defaults_count_like_the_replicas(monkeypatch):
    monkeypatch.setenv("SERVE_APP_INGRESS_MAX_INFLIGHT_REQUESTS", "10")
    shedding = shedding_for_config({"applications": [dict(APP, args={"ingress": {"max_waiting_requests": 5}})]}).apps[0]
    assert (shedding.max_requests_per_replica, shedding.max_queue_wait_s, shedding.retry_after_s) == (15, 2.0, 2)


def test_several_applications_each_get_their_own_bound_and_routes():
    """(tests/unit/test_proxy_shedding_backends.py: in the HAProxy config, each in its own backend only)"""
    apps = [dict(APP, name="a", args={"ingress": {"max_inflight_requests": 8, "max_wait_s": 1}}),
            dict(APP, name="b", route_prefix="/b/", args={"ingress": {"max_inflight_requests": 4, "retry_after_s": 5}}),
            {"name": "other", "route_prefix": "/o", "import_path": "elsewhere:app"}]
    shedding = shedding_for_config({"applications": apps})
    a, b = shedding.app("a"), shedding.app("b")
    assert [app.backend for app in shedding.apps] == ["http-a", "http-b"]
    assert (a.max_requests_per_replica, a.max_queue_wait_s, a.retry_after_s) == (8, 1.0, 2)
    assert (b.max_requests_per_replica, b.max_queue_wait_s, b.retry_after_s) == (4, 2.0, 5)
    assert "/translation" in a.model_paths and "/b/translation" not in a.model_paths
    assert "/b/translation" in b.model_paths and "/translation" not in b.model_paths
    assert (a.model_path_prefixes, b.model_path_prefixes) == (("/models/",), ("/b/models/",))
    assert b.probe_paths == ("/b/healthz", "/b/readyz")
    assert not any(path.startswith("/o") for app in shedding.apps for path in app.model_paths)


def test_no_serve_app_application_leaves_haproxy_as_ray_configures_it():
    other = {"applications": [{"name": "x", "import_path": "elsewhere:app"}]}
    assert shedding_for_config(other) is None
    # (serve_app/proxy.py sets the value; test_proxy.py: where, and that a user's own value wins)
    value = shedding_for_config({"applications": [APP]}).fastinter_value()
    assert value.startswith('250ms\n    .if streq("${.SECTION}","http-serve-app")\n    default-server maxconn 64\n')
    assert value.endswith("\n    .endif\n    default-server fastinter 250ms")


# --- the HAProxy that Ray 2.60 configures with it ------------------------------------------------

class StandInReplica(ThreadingHTTPServer):
    """Answers health checks and GETs at once; holds every POST until `release` is called, and
    records the paths it received, in order."""

    daemon_threads = True

    def __init__(self) -> None:
        self.seen: list[str] = []
        self.request_ids: list[str] = []  # each POST's x-request-id
        self.held = threading.Semaphore(0)
        self.lock = threading.Lock()
        super().__init__(("127.0.0.1", free_port()), _Handler)

    def release(self, count: int = 1) -> None:
        for _ in range(count):
            self.held.release()

    def posts(self) -> int:
        with self.lock:
            return sum(1 for path in self.seen if path != "GET /readyz")


#: POST paths the stand-in answers at once: (status, content type, body)
CANNED = {"/bare-500": (500, "", b"Internal Server Error"),  # Serve's fallback proxy, its replica died
          "/json-500": (500, "application/json", b'{"error": "x", "error_type": "model_crashed"}')}  # the Ingress's


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args) -> None:
        pass

    def _answer(self, status: int = 200, content_type: str = "application/json", body: bytes = b"{}") -> None:
        self.send_response(status)
        if content_type:
            self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        if self.path != "/-/healthz":
            with self.server.lock:
                self.server.seen.append(f"GET {self.path}")
        self._answer()

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        with self.server.lock:
            self.server.seen.append(f"POST {self.path}")
            self.server.request_ids.append(self.headers.get("x-request-id"))
        if self.path == "/crash":  # as a replica that dies holding it: the connection closed, no answer
            self.close_connection = True
        elif self.path in CANNED:
            self._answer(*CANNED[self.path])
        else:
            self.server.held.acquire(timeout=60)
            self._answer()


@pytest.fixture
def haproxy_in_front(tmp_path, request):
    """(HAProxy's URL, the stand-in replica) with SHEDDING, on a config Ray 2.60 rendered (RETRY_ON, as the
    launcher sets it, if the test's param names a request timeout)."""
    haproxy_module = pytest.importorskip("ray.serve._private.haproxy")
    from ray.serve.config import HTTPOptions

    binary = proxy.haproxy_binary()
    if binary is None:
        pytest.skip("no HAProxy binary")
    replica = StandInReplica()
    threading.Thread(target=replica.serve_forever, daemon=True).start()
    port = free_port()
    cfg = haproxy_module.HAProxyConfig(
        socket_path=str(tmp_path / "admin.sock"), server_state_base=str(tmp_path),
        server_state_file=str(tmp_path / "server-state"), enable_hap_optimization=False,
        stats_port=free_port(), metrics_port=free_port(), metrics_enabled=False, nbthread=2,
        http_options=HTTPOptions(host="127.0.0.1", port=port), has_received_routes=True,
        has_received_servers=True, health_check_fastinter=SHEDDING.fastinter_value(),
        **({"retry_on": proxy.haproxy_retry_policy(request.param)} if hasattr(request, "param") else {}))
    backend = haproxy_module.BackendConfig(
        name=backend_name("serve-app"), path_prefix="/", app_name="serve-app",
        servers=[haproxy_module.ServerConfig(name="replica", host="127.0.0.1", port=replica.server_address[1])])
    api = haproxy_module.HAProxyApi(cfg, {"serve-app": backend}, config_file_path=str(tmp_path / "haproxy.cfg"))
    api._generate_config_file_internal()
    checked = subprocess.run([binary, "-c", "-f", str(tmp_path / "haproxy.cfg")], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    process = subprocess.Popen([binary, "-db", "-f", str(tmp_path / "haproxy.cfg")],
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}"
    try:
        def ready() -> bool:  # (refused until HAProxy listens: one run in seven here failed on that)
            try:
                return httpx.get(f"{url}/readyz", timeout=2).status_code == 200
            except httpx.TransportError:
                return False
        wait_for(ready, 30, "HAProxy")
        with replica.lock:
            replica.seen.clear()
        yield url, replica, lambda: _queued(tmp_path / "admin.sock")
    finally:
        replica.release(100)
        process.kill()
        process.wait(10)
        replica.shutdown()
        replica.server_close()


def _queued(admin_socket) -> int:
    """Requests in the backend's queue, from HAProxy's admin socket (`show stat`, column qcur)."""
    with socket.socket(socket.AF_UNIX) as sock:
        sock.connect(str(admin_socket))
        sock.sendall(b"show stat\n")
        text = b"".join(iter(lambda: sock.recv(65536), b"")).decode()
    rows = csv.DictReader(text.lstrip("# ").splitlines())
    return sum(int(row["qcur"] or 0) for row in rows
               if row["pxname"] == backend_name("serve-app") and row["svname"] == "BACKEND")


#: The queue's wait long enough that the tests' steps fit in it on a loaded machine (1.5 s did not: a queued request
#: timed out before the next one was counted in the queue while ci-local ran beside the unit tests)
SHEDDING = ProxyShedding((AppShedding(max_requests_per_replica=2, max_queue_wait_s=4.0, retry_after_s=3),))


def _post(url: str, path: str = "/translation") -> httpx.Response:
    return httpx.post(url + path, json={"payload": {}}, timeout=30)


def test_haproxy_sends_a_replica_no_more_than_it_holds_and_queues_the_rest(haproxy_in_front):
    url, replica, queued_in_haproxy = haproxy_in_front
    with ThreadPoolExecutor(8) as pool:
        held = [pool.submit(_post, url) for _ in range(2)]
        wait_for(lambda: replica.posts() == 2, 10, "the replica to hold 2 requests")
        queued = [pool.submit(_post, url, path) for path in ("/v1/embeddings", "/models/iris/predict")]
        wait_for(lambda: queued_in_haproxy() == 2, 10, "2 requests in HAProxy's queue")
        assert replica.posts() == 2  # the replica got no more than it holds
        # Not a model route: it leaves the queue before the model requests queued ahead of it.
        status = pool.submit(httpx.get, f"{url}/readyz", timeout=30)
        wait_for(lambda: queued_in_haproxy() == 3, 10, "the GET in HAProxy's queue")
        replica.release()
        assert status.result().status_code == 200
        replica.release(4)
        assert [f.result().status_code for f in [*held, *queued]] == [200] * 4
    assert replica.seen[:3] == ["POST /translation"] * 2 + ["GET /readyz"]
    assert sorted(replica.seen[3:]) == ["POST /models/iris/predict", "POST /v1/embeddings"]


def test_requests_without_a_key_leave_the_queue_after_every_keyed_one(haproxy_in_front):
    """A storm without keys (401s where keys are on) must not hold back a tenant's requests; probes go first."""
    url, replica, queued_in_haproxy = haproxy_in_front
    keyed = {"Authorization": "Bearer k"}
    with ThreadPoolExecutor(8) as pool:
        held = [pool.submit(httpx.post, url + "/translation", json={}, headers=keyed, timeout=30) for _ in range(2)]
        wait_for(lambda: replica.posts() == 2, 10, "the replica to hold 2 requests")
        queued = [pool.submit(httpx.post, url + "/translation", json={}, timeout=30),  # keyless model route
                  pool.submit(httpx.get, url + "/v1/models", timeout=30),  # keyless, another route
                  pool.submit(httpx.post, url + "/v1/embeddings", json={}, headers={"X-API-Key": "k"}, timeout=30),
                  pool.submit(httpx.get, url + "/jobs/j1", headers=keyed, timeout=30),
                  pool.submit(httpx.get, url + "/readyz", timeout=30),
                  pool.submit(httpx.post, url + "/healthz", json={}, timeout=30)]  # keyless, not a probe: a POST
        wait_for(lambda: queued_in_haproxy() == 6, 10, "6 requests in HAProxy's queue")
        replica.release()  # one slot: the probe and the keyed status call pass, then the keyed model request
        wait_for(lambda: "POST /v1/embeddings" in replica.seen, 10, "the keyed model request")
        # One slot at a time again: two freed at once let both keyless requests race to the replica (a unit run
        # flake: their order there was not HAProxy's). The GET is answered at once and frees the slot again.
        replica.release()
        wait_for(lambda: "POST /healthz" in replica.seen, 10, "the keyless POST to a probe's path")
        replica.release()
        wait_for(lambda: replica.seen.count("POST /translation") == 3, 10, "the keyless model request")
        replica.release(10)
        assert [f.result().status_code for f in [*held, *queued]] == [200] * 8
    assert sorted(replica.seen[2:4]) == ["GET /jobs/j1", "GET /readyz"], replica.seen  # class 0, in arrival order
    assert replica.seen[4] == "POST /v1/embeddings" and replica.seen[7:] == ["POST /translation"], replica.seen
    assert sorted(replica.seen[5:7]) == ["GET /v1/models", "POST /healthz"], replica.seen  # class 2, in arrival order


def test_a_request_that_waits_longer_than_max_wait_s_gets_the_overloaded_503(haproxy_in_front):
    url, replica, _ = haproxy_in_front
    with ThreadPoolExecutor(4) as pool:
        held = [pool.submit(_post, url) for _ in range(2)]
        wait_for(lambda: replica.posts() == 2, 10, "the replica to hold 2 requests")
        timed_out = httpx.post(url + "/translation", json={"payload": {}}, headers={"X-Request-Id": "abc-1"},
                               timeout=30)  # queued; nothing frees within 4 s
        assert timed_out.headers["x-request-id"] == "abc-1"
        assert timed_out.status_code == 503, timed_out.text
        assert timed_out.headers["retry-after"] == "3"
        assert timed_out.headers["content-type"] == "application/json"
        body = json.loads(timed_out.text)
        assert body["error_type"] == "overloaded" and "within 4 s" in body["error"]
        assert "retry after 3 s" in body["error"]
        replica.release(2)
        assert [f.result().status_code for f in held] == [200, 200]
    assert replica.posts() == 2


def test_every_request_reaches_the_replica_with_a_request_id(haproxy_in_front):
    """A resent POST /jobs is known by its x-request-id: HAProxy gives one to a request that has none
    (before any retry), and keeps the client's."""
    url, replica, _ = haproxy_in_front
    replica.release(3)
    assert _post(url).status_code == 200
    assert httpx.post(url + "/translation", json={}, headers={"X-Request-Id": "abc-2"}, timeout=30).status_code == 200
    assert httpx.post(url + "/translation", json={}, headers={"X-Request-Id": ""}, timeout=30).status_code == 200
    generated, given, for_empty = replica.request_ids
    assert generated and len(generated) == 36 and given == "abc-2"
    assert len(for_empty) == 36  # an empty header is no id: it got one (it kept the empty one, as none)


@pytest.mark.parametrize("haproxy_in_front", [1.0], indirect=True)
def test_a_body_that_stalls_in_haproxy_gets_the_ingress_s_408_not_an_hour_s_wait(haproxy_in_front):
    """HAProxy buffers a body under 16 KiB before it sends the request on (to resend it if its replica dies); Ray 2.60
    sets no `timeout http-request`, so a client that stalled mid-body was held for `timeout client`, an hour, and
    never got the ingress's 408. Here the timeout is 1 s (the launcher's: body_timeout_s' default, 30 s)."""
    url, replica, _ = haproxy_in_front
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=20) as sock:
        sock.sendall(b"POST /translation HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 1000\r\n\r\n{\"payload\": ")  # then nothing more
        answer = b""
        while b"\r\n\r\n" not in answer or not answer.rstrip().endswith(b"}"):
            if not (chunk := sock.recv(65536)):
                break
            answer += chunk
    head, _, payload = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 408"), answer
    assert json.loads(payload)["error_type"] == "body_timeout"
    assert not any("/translation" in seen for seen in replica.seen)  # it never reached the replica
