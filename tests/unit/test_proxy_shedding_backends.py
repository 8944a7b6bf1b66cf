"""Each HAProxy backend holds its own application's bound (serve_app/proxy_shedding.py), read from HAProxy itself.

Ray 2.60 writes RAY_SERVE_HAPROXY_HEALTH_CHECK_FASTINTER into every backend, one per application: the largest
serve-app application's `maxconn` used to land in all of them, another serve-app application's and an
application of someone else's included. Here Ray's template renders a config with three applications, and HAProxy
(`-c`: it checks the config, starts nothing) reports through `.notice` lines, kept only where HAProxy keeps the
line above them, which backend got which `maxconn`, queue wait and routes."""

from __future__ import annotations

import re
import subprocess

import pytest

from serve_app import proxy
from serve_app.proxy_shedding import backend_name, shedding_for_config

APPS = [
    {"name": "a", "route_prefix": "/", "import_path": "serve_app.builder:build_app",
     "args": {"ingress": {"max_inflight_requests": 8, "max_waiting_requests": 2, "max_wait_s": 1}}},
    {"name": "b", "route_prefix": "/b", "import_path": "serve_app.builder:build_app",
     "args": {"ingress": {"max_inflight_requests": 4, "max_waiting_requests": 0, "max_wait_s": 3}}},
    {"name": "other", "route_prefix": "/o", "import_path": "elsewhere:app"},
]

#: The lines whose backend HAProxy reports, and what a report says.
REPORTED = re.compile(r"^(?P<indent> +)(?P<line>default-server .*maxconn \d+|timeout queue \d+ms"
                      r"|acl serve_app_probe path .*)$")
NOTICE = re.compile(r"'kept in (?P<section>[^:]+): (?P<line>[^']*)'")


def _kept_lines(tmp_path) -> dict[str, list[str]]:
    """backend -> the reported lines HAProxy kept in it, for a config Ray rendered with APPS' shedding."""
    haproxy_module = pytest.importorskip("ray.serve._private.haproxy")
    from ray.serve.config import HTTPOptions

    binary = proxy.haproxy_binary()
    if binary is None:
        pytest.skip("no HAProxy binary")
    cfg = haproxy_module.HAProxyConfig(
        socket_path=str(tmp_path / "admin.sock"), server_state_base=str(tmp_path),
        server_state_file=str(tmp_path / "server-state"), enable_hap_optimization=False, stats_port=18404,
        metrics_port=19101, metrics_enabled=False, nbthread=1, http_options=HTTPOptions(host="127.0.0.1", port=18000),
        has_received_routes=True, has_received_servers=True,
        health_check_fastinter=shedding_for_config({"applications": APPS}).fastinter_value())
    backends = {app["name"]: haproxy_module.BackendConfig(
        name=haproxy_module.HAProxyManager.get_safe_name(f"http-{app['name']}"), path_prefix=app["route_prefix"],
        app_name=app["name"], servers=[haproxy_module.ServerConfig(name="replica", host="127.0.0.1", port=30000 + i)])
        for i, app in enumerate(APPS)}
    path = tmp_path / "haproxy.cfg"
    haproxy_module.HAProxyApi(cfg, backends, config_file_path=str(path))._generate_config_file_internal()
    text = path.read_text()
    assert "backend http-other" in text
    path.write_text("\n".join(line if not (m := REPORTED.match(line)) else
                              f'{line}\n{m["indent"]}.notice "kept in ${{.SECTION}}: {m["line"]}"'
                              for line in text.splitlines()) + "\n")
    checked = subprocess.run([binary, "-c", "-f", str(path)], capture_output=True, text=True, timeout=60)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    kept: dict[str, list[str]] = {}
    for m in NOTICE.finditer(checked.stdout + checked.stderr):
        kept.setdefault(m["section"], []).append(m["line"])
    return kept


def test_each_backend_gets_its_own_application_s_bound_and_others_keep_ray_s(tmp_path):
    kept = _kept_lines(tmp_path)
    assert set(kept) == {"http-a", "http-b"}, kept  # the application that is not serve-app's: Ray's own backend
    assert [line for line in kept["http-a"] if "maxconn" in line] == ["default-server maxconn 10"]
    assert [line for line in kept["http-b"] if "maxconn" in line] == ["default-server maxconn 4"]
    assert "timeout queue 1000ms" in kept["http-a"] and "timeout queue 3000ms" in kept["http-b"]
    assert "acl serve_app_probe path /healthz /readyz" in kept["http-a"]
    assert "acl serve_app_probe path /b/healthz /b/readyz" in kept["http-b"]
    assert len(kept["http-a"]) == len(kept["http-b"]) == 3  # nothing of one application's in the other's backend


def test_backend_names_are_the_ones_ray_gives_an_application_s_backend():
    haproxy_module = pytest.importorskip("ray.serve._private.haproxy")
    for app in ("serve-app", "default", "a b#c/d", "ünï"):
        assert backend_name(app) == haproxy_module.HAProxyManager.get_safe_name(f"http-{app}")
